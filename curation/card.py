"""The dataset card: README.md with the YAML header the Hub reads and a body people read.

The header is built as data and dumped with PyYAML (never by string pasting), so it always
parses: license ids in the Hub's spelling, task categories, size category, tags, the `configs`
entry that points `load_dataset` at the Parquet shards (so the JSONL copy and the report beside
them are not mistaken for data) and the features. Every statement of the body is computed from
the rows just written and the stores' funnels (`statements`), never written into the template:
"every row" is said only when every row has it, a kill rate only as measured (how many rows
have one, min and median), GPUs and toolchains as the rows name them, with `unknown` counted.
Values from the rows are put on one line and cannot open a table cell or a section.
"""

from __future__ import annotations

import statistics
from collections import Counter

import yaml

from curation import licenses
from curation.rows import DESCRIPTIONS, FEATURES
from miner import __version__
from wrappers.label import environment

TEMPLATE = "dataset_card.md.j2"
DATA_FILES = "data/train-*.parquet"
TAGS = ["cuda", "gpu-kernels", "code", "pytorch", "kernel-generation", "kminer"]
FIELDS = ("repo", "commit", "license", "strategy", "reference_kind", "kill_rate", "verification",
          "gpu", "toolchain", "kernel_time_us", "description_source", "curator",
          "kminer_version", "level", "kernels")  # fmt: skip  # the row fields the card reads
UNKNOWN = "unknown"


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


def inline(value) -> str:
    """A row's value as card text: one line, no table-cell break, no markup of its own."""
    text = " ".join(str(value).split())
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "'").replace("<", "&lt;")


def _share(values, missing: str = "none") -> str:
    counts = Counter(inline(v) if v else missing for v in values)
    return ", ".join(f"{k} {n}" for k, n in counts.most_common()) or "none"


def rate(value: float) -> str:
    """A kill rate as text, cut (not rounded) to two decimals: 0.999 never reads as 1.00."""
    return "1.0" if value >= 1.0 else f"{int(value * 100) / 100:.2f}"


def _toolchain(row: dict) -> str:
    chain = row["toolchain"] or {}
    if not any(chain.values()):
        return ""
    return " / ".join(chain.get(k) or UNKNOWN for k in ("nvcc", "torch", "cuda"))


def _of(part: int, whole: int) -> str:
    """'All 3 rows' or '2 of 3 rows': how many of the rows a statement is about."""
    return f"All {whole} rows" if part == whole else f"{part} of {whole} rows"


def _counted(values) -> str:
    """'A (2 rows), unknown (1 row)': each value the rows name, with an empty one counted."""
    counts = Counter(inline(v) if v else UNKNOWN for v in values)
    return ", ".join(f"{k} ({n} row{'s' * (n != 1)})" for k, n in counts.most_common())


def _verified(n: int, passed: int) -> str:
    if passed == n:
        return (
            f"Every row was verified on a GPU: the label of each of the {n} passed its test there"
        )
    if passed:
        return (
            f"{passed} of {n} rows were verified on a GPU (their label passed its test there); "
            f"the other {n - passed} are curator overrides, accepted without that pass "
            "(`verification`: override)"
        )
    return (
        f"No row was verified on a GPU: all {n} are curator overrides, accepted without a GPU "
        "pass (`verification`: override)"
    )


def _kills(rows: list[dict]) -> str:
    n = len(rows)
    kills = sorted(r["kill_rate"] for r in rows if r["kill_rate"] is not None)
    if not kills:
        return (
            f"No row has a measured kill rate: whether the tests of these {n} rows fail wrong "
            "kernels was not measured"
        )
    full = sum(k >= 1.0 for k in kills)
    said = (
        f"{_of(len(kills), n)} have a measured kill rate (the share of deliberately wrong "
        "variants of the label, such as no write, off by one or a swapped operator, that the "
        f"test fails): min {rate(kills[0])}, median {rate(statistics.median(kills))}; the test "
        f"fails every wrong variant in {_of(full, len(kills)).lower()}"
    )
    if len(kills) < n:
        said += f"; the other {n - len(kills)} have none measured"
    return said + (" (100 % of the wrong variants killed in every row)" if full == n else "")


def _span(values) -> str:
    values = sorted(values)
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]} to {values[-1]}"


def statements(rows: list[dict]) -> dict[str, str]:
    """Every claim the card makes about the rows, each computed from their fields."""
    n = len(rows)
    passed = sum(r["verification"] == "gpu_pass" for r in rows)
    curated = sum(bool(r["curator"]) for r in rows)
    timed = sum(r["kernel_time_us"] is not None for r in rows)
    own_refs = sum(r["reference_kind"] in ("cpp", "python") for r in rows)
    model_refs = sum(r["reference_kind"] == "llm" for r in rows)
    undescribed = sum(not r["description_source"] for r in rows)
    chained = sum(bool(_toolchain(r)) for r in rows)
    op_rows = [r for r in rows if r["level"] == "op"]
    return {
        "levels": (
            f"{_of(n - len(op_rows), n)} ask for one kernel (`level: kernel`)"
            + (
                f"; {len(op_rows)} ask for a whole op, a host function that launches "
                f"{_span(len(r['kernels']) for r in op_rows)} kernels (`level: op`, the kernels "
                "in `kernels`), judged by what the op returns"
                if op_rows
                else ""
            )
        ),
        "verified": _verified(n, passed),
        "accepted": (
            "Each row names the curator who accepted it (`curator`)"
            if curated == n
            else f"{_of(curated, n)} name the curator who accepted them; the others name none"
        ),
        "kill": _kills(rows),
        "gpus": f"GPUs the rows name (`gpu`): {_counted(r['gpu'] for r in rows)}",
        "toolchains": "Toolchains the rows name (`toolchain`, nvcc / torch / CUDA): "
        + _counted(_toolchain(r) for r in rows),
        "label_passes": (
            f'Writing `row["label"]` as the prediction passed on a GPU for '
            f"{_of(passed, n).lower()}"
            + (f"; for the other {n - passed} (overrides) it was not shown" if passed < n else "")
        ),
        "kernel_times": (
            f"{_of(timed, n)} have a `kernel_time_us`, measured once on their `gpu` with their "
            "`toolchain`; indicative only"
        ),
        "references": (
            f"{_of(own_refs, n)} compare with the repository's own CPU code or PyTorch reference"
            + (
                f"; {model_refs} with a reference written by a model, checked to run, "
                "not proven correct"
                if model_refs
                else ""
            )
            + (
                f"; {n - own_refs - model_refs} with a reference of no known kind"
                if n - own_refs - model_refs
                else ""
            )
        ),
        "descriptions": (
            f"{_of(undescribed, n)} have no description of what the kernel computes (neither "
            "the repository nor a model gave one); their instruction relies on the signatures "
            "and the reference the test embeds"
            if undescribed
            else "Every row's instruction describes what the kernel computes "
            f"(`description_source`: {_share(r['description_source'] for r in rows)})"
        ),
        "reproducible": (
            f"{_of(chained, n)} record the toolchain their verification ran with; exported by "
            f"kminer {', '.join(sorted({inline(r['kminer_version']) or UNKNOWN for r in rows}))}"
        ),
    }


def render(
    report: dict,
    rows: list[dict],
    repo_id: str = "OWNER/NAME",
    pretty_name: str = "kminer CUDA kernels",
) -> str:
    """The card's text for `rows` (their light fields) and the export `report`."""
    by_repo = Counter(r["repo"] for r in rows if r["level"] != "op")
    ops_by_repo = Counter(r["repo"] for r in rows if r["level"] == "op")
    by_source = Counter((r["repo"], r["commit"][:12], r["license"]) for r in rows)
    funnel = []
    for f in report["workdirs"]:
        name = f["repo"].get("public_url") or f["workdir"]
        funnel.append(
            {
                "name": inline(name),
                "found": f.get("found", 0),
                "unit_compiles": f.get("unit_compiles", 0),
                "label_builds": f.get("label_builds", 0),
                "tests": f.get("tests", 0),
                "passes": f.get("passes", 0),
                "accepted": f["accepted"],
                "exported": by_repo.get(name, 0),
                "op_rows": ops_by_repo.get(name, 0),
            }
        )
    if len(funnel) > 1:
        total = {k: sum(f[k] for f in funnel) for k in funnel[0] if k != "name"}
        funnel.append({"name": "**all**", **total})
    licensed = all(r["license"] and r["license"] != UNKNOWN for r in rows)
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
            said=statements(rows),
            kind="open-source " if licensed else "",
            funnel=funnel,
            dropped=report["dropped"],
            allow_license=[inline(x) for x in report["options"]["allow_license"]],
            exclude=[inline(x) for x in report["options"]["exclude"]],
            include_overrides=report["options"].get("include_overrides", False),
            overlap=report["options"]["exclude_overlap"],
            threshold=report["options"]["near_dup_threshold"],
            cross_threshold=report["options"]["cross_repo_threshold"],
            sources=[
                {"repo": inline(r), "commit": inline(c), "license": inline(lic), "rows": n}
                for (r, c, lic), n in sorted(by_source.items())
            ],
            schema=[
                {"name": n, "type": _type(f), "meaning": DESCRIPTIONS[n]}
                for n, f in FEATURES.items()
            ],
            strategies=_share(r["strategy"] for r in rows),
            reference_kinds=_share(r["reference_kind"] for r in rows),
            description_sources=_share(r["description_source"] for r in rows),
        )
    )


def read_header(text: str) -> dict:
    """The YAML header of a card (what the Hub reads); {} when there is none."""
    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---", 4)
    return yaml.safe_load(text[4:end]) if end > 0 else {}
