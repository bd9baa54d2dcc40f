"""The dataset card: README.md with the YAML header the Hub reads and a body people read.

The header is built as data and dumped with PyYAML (never by string pasting), so it always
parses: license ids in the Hub's spelling, task categories, size category, tags, the `configs`
entry that points `load_dataset` at the Parquet shards (so the JSONL copy and the report beside
them are not mistaken for data) and the features. Every number in the body is counted from the
rows just written and the stores' funnels.
"""

from __future__ import annotations

from collections import Counter

import yaml

from curation import licenses
from curation.rows import DESCRIPTIONS, FEATURES
from miner import __version__
from wrappers.label import environment

TEMPLATE = "dataset_card.md.j2"
DATA_FILES = "data/train-*.parquet"
TAGS = ["cuda", "gpu-kernels", "code", "pytorch", "kernel-generation", "kminer"]


def size_category(n: int) -> str:
    for bound, name in (
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
    ):
        if n < bound:
            return name
    return "1M<n<10M"


def header(rows: list[dict], pretty_name: str) -> dict:
    hub = licenses.hub_ids([r["license"] for r in rows]) or ["other"]
    return {
        "license": hub[0] if len(hub) == 1 else hub,
        "pretty_name": pretty_name,
        "language": ["en"],
        "task_categories": ["text-generation"],
        "size_categories": [size_category(len(rows))],
        "tags": TAGS,
        "configs": [
            {"config_name": "default", "data_files": [{"split": "train", "path": DATA_FILES}]}
        ],
        "dataset_info": {"features": FEATURES._to_yaml_list()},
    }


def _type(feature) -> str:
    if isinstance(feature, dict):
        return "struct{" + ", ".join(f"{k}: {_type(v)}" for k, v in feature.items()) + "}"
    inner = getattr(feature, "feature", None)
    return f"list<{_type(inner)}>" if inner is not None else getattr(feature, "dtype", str(feature))


def _share(values) -> str:
    counts = Counter(v or "none" for v in values)
    return ", ".join(f"{k} {n}" for k, n in counts.most_common()) or "none"


def render(
    report: dict,
    rows: list[dict],
    repo_id: str = "OWNER/NAME",
    pretty_name: str = "kminer CUDA kernels",
) -> str:
    """The card's text for `rows` (their light fields) and the export `report`."""
    by_repo = Counter(r["repo"] for r in rows)
    by_source = Counter((r["repo"], r["commit"][:12], r["license"]) for r in rows)
    funnel = []
    for f in report["workdirs"]:
        name = f["repo"].get("public_url") or f["workdir"]
        funnel.append(
            {
                "name": name,
                "found": f.get("found", 0),
                "unit_compiles": f.get("unit_compiles", 0),
                "label_builds": f.get("label_builds", 0),
                "tests": f.get("tests", 0),
                "passes": f.get("passes", 0),
                "accepted": f["accepted"],
                "exported": by_repo.get(name, 0),
            }
        )
    if len(funnel) > 1:
        total = {k: sum(f[k] for f in funnel) for k in funnel[0] if k != "name"}
        funnel.append({"name": "**all**", **total})
    kills = [r["kill_rate"] for r in rows if r["kill_rate"] is not None]
    yaml_header = yaml.safe_dump(header(rows, pretty_name), sort_keys=False, allow_unicode=True)
    return (
        environment()
        .get_template(TEMPLATE)
        .render(
            yaml_header=yaml_header,
            pretty_name=pretty_name,
            repo_id=repo_id,
            rows=len(rows),
            kminer_version=__version__,
            mean_kill_rate=sum(kills) / len(kills) if kills else 0.0,
            full_kill=sum(k >= 1.0 for k in kills),
            funnel=funnel,
            dropped=report["dropped"],
            allow_license=report["options"]["allow_license"],
            exclude=report["options"]["exclude"],
            overlap=report["options"]["exclude_overlap"],
            threshold=report["options"]["near_dup_threshold"],
            cross_threshold=report["options"]["cross_repo_threshold"],
            sources=[
                {"repo": r, "commit": c, "license": lic, "rows": n}
                for (r, c, lic), n in sorted(by_source.items())
            ],
            schema=[
                {"name": n, "type": _type(f), "meaning": DESCRIPTIONS[n]}
                for n, f in FEATURES.items()
            ],
            strategies=_share(r["strategy"] for r in rows),
            reference_kinds=_share(r["reference_kind"] for r in rows),
            description_sources=_share(r["description_source"] for r in rows),
            no_description=sum(1 for r in rows if not r["description_source"]),
        )
    )


def read_header(text: str) -> dict:
    """The YAML header of a card (what the Hub reads); {} when there is none."""
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---", 4)
    return yaml.safe_load(text[4:end]) if end > 0 else {}
