"""What discovery knows of a repository, and the candidate each kernel it found becomes.

Discovery, launch-site search and the stages all speak of these two records; they sit apart
from the code that fills them so that none of those modules has to import another's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from miner.aliases import QualifierAliases
from miner.candidate import (
    Candidate,
    Kernel,
    Param,
    Provenance,
    Reason,
    StageName,
    StageResult,
    Status,
    TemplateParam,
    candidate_id,
)
from miner.filemodel import FileModel, KernelDef
from miner.sources import Inventory
from miner.textprep import readable


@dataclass
class FoundKernel:
    """A kernel definition plus where it lives; the Candidate is built from this."""

    kdef: KernelDef
    file: str
    line: int  # of the __global__ token
    start_line: int
    end_line: int
    source: str  # latin-1 view of its text
    from_macro: str = ""
    parse_fallback: bool = False


@dataclass
class Discovery:
    root: Path
    inventory: Inventory
    models: dict[str, FileModel]
    aliases: QualifierAliases
    kernels: list[FoundKernel] = field(default_factory=list)
    launches: dict[int, list] = field(default_factory=dict)  # id(kdef) → [LaunchSite]
    declarations: int = 0
    instantiations: int = 0
    parse_errors: list[str] = field(default_factory=list)  # files with syntax errors


def to_candidate(fk: FoundKernel, disc: Discovery, prov: Provenance) -> Candidate:
    kd = fk.kdef
    kernel = Kernel(
        name=kd.name,
        namespace="::".join(n for n in kd.namespace if not n.startswith("extern")),
        file=fk.file,
        line=fk.line,
        start_line=fk.start_line,
        end_line=fk.end_line,
        params=[Param(type=t, name=n, text=x) for t, n, x in kd.params],
        template_params=[TemplateParam(**tp) for tp in kd.template_params],
        specialization=kd.specialization,
        qualifiers=kd.qualifiers,
        source=readable(fk.source),
        from_macro=fk.from_macro,
        parse_fallback=fk.parse_fallback,
    )
    cand = Candidate(
        id=candidate_id(prov.repo_url, prov.commit, kernel),
        provenance=prov,
        kernel=kernel,
        launches=disc.launches.get(id(kd), []),
    )
    reason = (
        Reason.PARSE_FALLBACK
        if fk.parse_fallback
        else (None if cand.launches else Reason.NOT_LAUNCHED)
    )
    detail = f"{len(cand.launches)} launch sites" if cand.launches else "never launched"
    cand.set_stage(StageName.DISCOVER, StageResult(status=Status.OK, reason=reason, detail=detail))
    return cand
