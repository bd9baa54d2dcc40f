"""A verification bundle: what a GPU box needs to run the candidates' tests, in one tar.gz.

The GPU box has python, torch and pytest and nothing of kminer, so the bundle carries plain files
and the runner (testgen/runner.py as `run.py`, standard library only). kminer is needed on this
side alone: to write the bundle from the candidates (`write_bundle`) and to read the box's
results.json back into each candidate's `verify` stage (`ingest`).

The tar is byte-for-byte the same for the same inputs (sorted members, fixed times and owners), so
a bundle can be compared or cached by its hash.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from miner import sandbox, supervisor, toolchain
from miner.candidate import Candidate, Reason, StageName, StageResult, Status
from miner.versions import code_version
from testgen.cases import MIN_CASES, MIN_SHAPES
from testgen.standalone import PREBUILD, RUNNER
from wrappers import batching

log = logging.getLogger(__name__)

REASONS = {
    "mismatch": Reason.MISMATCH,
    "build_error": Reason.BUILD_ERROR,
    "import_error": Reason.IMPORT_ERROR,
    "crash": Reason.CRASH,
    "timeout": Reason.TIMEOUT,
    "no_reference": Reason.NO_REFERENCE,
    "weak_test": Reason.WEAK_TEST,
    "nondeterministic": Reason.NONDETERMINISTIC,
    "reference_disagrees": Reason.REFERENCE_DISAGREES,
    "no_cases": Reason.NO_CASES,  # the reference refused every case: nothing judged the kernel
    "internal_error": Reason.INTERNAL_ERROR,
}
README = """kminer verification bundle: {count} candidates.

Needs python >= 3.11 with a CUDA build of torch, pytest and ninja, and nvcc on PATH.
In this folder:

    python run.py --out results.json            # everything
    python run.py --out results.json --resume   # go on after an interruption

Options: --jobs N (parallel builds; default by cores and memory), --gpu-jobs N (parallel GPU
runs; default four per GPU), --only ID ..., --build-timeout S, --run-timeout S, --rebuild.
Before the tests, run.py builds the labels, variants and references many to one extension
(prebuild.py; --no-prebuild turns that off), and each test imports its module from there.
Extensions are cached in .build/, so a second run builds nothing it built before.

Each candidate's test is run in two processes (KMINER_PHASE=build, then run), then again for
each wrong variant of its label: a test that passes a variant makes the outcome `weak_test`.
Bring results.json back and read it in with testgen.bundle.ingest.

Every test runs inside kminer's execution boundary (sandbox.py): no tokens in its environment,
no network, a private temp dir, limits, a timeout that ends its whole process tree. bin/bwrap,
when present, is the bubblewrap of the machine that made the bundle: where neither the GPU box's
own nor that one runs, a seccomp filter refuses sockets instead of a network namespace.
results.json's `sandbox` says what this machine gave.

Layout: manifest.json, tests/<id>.py, labels/<id>.cu, references/<id>.cpp,
variants/<id>.<n>.<kind>.cu, run.py, prebuild.py, batching.py, toolchain.py, sandbox.py,
supervisor.py, bin/bwrap.
"""


@dataclass
class BundleInfo:
    path: Path
    ids: list[str] = field(default_factory=list)  # the candidates in the bundle
    skipped: dict[str, str] = field(default_factory=dict)  # candidate id -> why it is not


class _Skip(Exception):
    pass


def _read(workdir: Path, rel: str, what: str) -> bytes:
    path = workdir / rel
    if not rel or not path.is_file():
        raise _Skip(f"{what} missing: {rel or '(no path)'}")
    return path.read_bytes()


def _entry(workdir: Path, cand: Candidate) -> tuple[dict, dict[str, bytes]]:
    """The manifest entry of one candidate and the files it brings (bundle path -> bytes)."""
    cid = cand.id
    label = f"labels/{cid}{Path(cand.wrapper.label_path).suffix or '.cu'}"
    files = {
        f"tests/{cid}.py": _read(workdir, cand.tests.path, "test"),
        label: _read(workdir, cand.wrapper.label_path, "label"),
    }
    entry = {"id": cid, "test": f"tests/{cid}.py", "label": label, "reference": None}
    entry.update(min_cases=MIN_CASES, min_shapes=MIN_SHAPES)  # fewer valid ones: weak_test
    built = cand.stage(StageName.BUILD)
    if built is not None and built.seconds:  # the box's prebuild builds heavy labels alone
        entry["build_s"] = round(built.seconds, 1)
    if cand.reference.path:
        rel = f"references/{cid}{Path(cand.reference.path).suffix or '.cpp'}"
        files[rel] = _read(workdir, cand.reference.path, "reference")
        entry["reference"] = rel
    variants = []
    kinds = cand.tests.variant_kinds
    for n, src in enumerate(cand.tests.variants):
        kind = kinds[n] if n < len(kinds) else ""
        try:
            data = _read(workdir, src, "variant")
        except _Skip as e:
            log.warning("%s: %s (left out of the bundle)", cid, e)
            continue
        rel = f"variants/{cid}.{n}.{kind or 'variant'}{Path(src).suffix or '.cu'}"
        files[rel] = data
        variants.append({"kind": kind, "path": rel})
    entry["variants"] = variants
    return entry, files


_ANGLE_INCLUDE = re.compile(rb"^[ \t]*#[ \t]*include[ \t]*<([\w.+-]+)/", re.MULTILINE)


def _header_libraries(files: dict[str, bytes]) -> dict[str, bytes]:
    """The header-only libraries the bundle's sources include (`<Eigen/Dense>` from this
    machine's /usr/include/eigen3), as include/<lib>/<folder>/...: the GPU box has none, and
    its builds find them there (toolchain.header_library_dirs, through CPATH)."""
    tops = {m.group(1).decode() for text in files.values() for m in _ANGLE_INCLUDE.finditer(text)}
    out: dict[str, bytes] = {}
    for lib_dir in map(Path, toolchain.header_library_dirs()):
        for top in sorted(tops):
            folder = lib_dir / top
            if not folder.is_dir():
                continue
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                rel = path.relative_to(lib_dir).as_posix()
                out[f"include/{lib_dir.name}/{rel}"] = path.read_bytes()
    return out


def write_bundle(workdir: Path | str, cands: list[Candidate], out_path: Path | str) -> BundleInfo:
    """Write the bundle of every candidate that has a test (`tests.path`); a candidate whose files
    are missing from the workdir is left out and named in `skipped`, never fatal."""
    workdir, out_path = Path(workdir), Path(out_path)
    info = BundleInfo(out_path)
    manifest: list[dict] = []
    files: dict[str, bytes] = {}
    for cand in sorted(cands, key=lambda c: c.id):
        if not cand.tests.path:
            continue
        try:
            entry, extra = _entry(workdir, cand)
        except _Skip as e:
            info.skipped[cand.id] = str(e)
            continue
        manifest.append(entry)
        files.update(extra)
        info.ids.append(cand.id)
    files.update(_header_libraries(files))
    files["manifest.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
    files["README.txt"] = README.format(count=len(manifest)).encode()
    files["run.py"] = RUNNER.read_bytes()
    files["prebuild.py"] = PREBUILD.read_bytes()
    files["batching.py"] = Path(batching.__file__).read_bytes()
    files["toolchain.py"] = Path(toolchain.__file__).read_bytes()
    files["sandbox.py"] = Path(sandbox.__file__).read_bytes()
    files["supervisor.py"] = Path(supervisor.__file__).read_bytes()
    if sandbox.bwrap_tool():  # namespaces for the tests on a GPU box that has no bubblewrap
        files["bin/bwrap"] = Path(sandbox.bwrap_tool()).read_bytes()
    root = out_path.name.removesuffix(".gz").removesuffix(".tgz").removesuffix(".tar")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        out_path.open("wb") as raw,
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in sorted(files):
            member = tarfile.TarInfo(f"{root or 'bundle'}/{name}")
            member.size = len(files[name])
            member.mode = 0o755 if name in ("run.py", "bin/bwrap") else 0o644
            tar.addfile(member, io.BytesIO(files[name]))
    return info


def verify_key(cand: Candidate) -> str:
    """What a verdict depends on: the label, the test, the reference and the runner's code."""
    parts = [code_version(__name__), cand.wrapper.label_hash, cand.tests.hash, cand.reference.hash]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _bad(path: Path, why: str) -> ValueError:
    return ValueError(f"{path}: not a kminer results file ({why})")


def _check(path: Path, data) -> dict[str, dict]:
    """The entries of a results.json, checked enough that ingesting cannot half-fail."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise _bad(path, "no 'entries' object")
    for eid, e in data["entries"].items():
        if not isinstance(e, dict):
            raise _bad(path, f"entry {eid} is not an object")
        if e.get("outcome") != "pass" and e.get("outcome") not in REASONS:
            raise _bad(path, f"entry {eid} has outcome {e.get('outcome')!r}")
        if e.get("kill_rate") is not None and not isinstance(e["kill_rate"], int | float):
            raise _bad(path, f"entry {eid} has kill_rate {e['kill_rate']!r}")
        if any(not isinstance(e.get(k) or 0, int | float) for k in ("build_s", "run_s")):
            raise _bad(path, f"entry {eid} has build_s/run_s that are not numbers")
        if not isinstance(e.get("cases", []), list):
            raise _bad(path, f"entry {eid} has cases that are not a list")
    return data["entries"]


def ingest(results_path: Path | str, cands: list[Candidate]) -> list[Candidate]:
    """Set the `verify` stage of every candidate that results.json has an entry for; return them.

    Ids that match no candidate are logged and skipped (a bundle may be older than the store); a
    file that is not a results file raises ValueError with a one-line message."""
    path = Path(results_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise _bad(path, str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    entries = _check(path, data)
    by_id = {c.id: c for c in cands}
    unknown = sorted(set(entries) - set(by_id))
    if unknown:
        log.warning("%s: %d ids match no candidate: %s", path, len(unknown), ", ".join(unknown))
    done = []
    for eid, e in entries.items():
        cand = by_id.get(eid)
        if cand is None:
            continue
        outcome = e["outcome"]
        metrics = {"outcome": outcome, "kill_rate": e.get("kill_rate")}
        metrics["kernel_time_us"] = e.get("kernel_time_us")
        metrics.update({k: str(data.get(k) or "") for k in ("gpu", "torch", "cuda", "nvcc")})
        metrics["cases"] = e.get("cases") or []
        metrics["variants"] = [
            {k: v.get(k) for k in ("kind", "outcome", "detail")}
            for v in e.get("variants") or []
            if isinstance(v, dict)
        ]
        valid = [c for c in metrics["cases"] if isinstance(c, dict) and c.get("ok") is not None]
        metrics["valid_cases"] = len(valid)  # cases the reference accepted as input
        metrics["valid_shapes"] = len({json.dumps(c.get("shape")) for c in valid})
        seconds = sum(float(e.get(k) or 0.0) for k in ("build_s", "run_s"))
        result = StageResult(
            status=Status.OK if outcome == "pass" else Status.ERROR,
            reason=REASONS.get(outcome),
            detail=str(e.get("detail") or "")[:300],
            key="" if outcome == "internal_error" else verify_key(cand),
            seconds=round(seconds, 3),
            metrics=metrics,
        )
        cand.set_stage(StageName.VERIFY, result)
        done.append(cand)
    return done
