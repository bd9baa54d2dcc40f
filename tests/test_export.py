"""Export of accepted candidates as a Hugging Face dataset, and publish --dry-run.

The stores are built from the fixture repositories under tests/fixtures/export: discovered for
real, each kernel given a label, a test and a reference file and a passing verification, then
accepted by a curator. The export runs through the real CLI; the rows are loaded back with
`datasets` both ways and compared field by field with the store and the files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from curation import dedup
from curation.card import read_header
from curation.export import Drop, ExportError, Options, export
from curation.instructions import derive_instruction
from curation.reviews import Decision, Reviews
from curation.rows import FEATURES
from miner import __version__
from miner.candidate import Provenance, StageName, StageResult, Status
from miner.clone import folder_commit
from miner.discover import discover
from miner.license import detect_license
from miner.repo_model import to_candidate
from miner.store import Store

FIXTURES = Path(__file__).parent / "fixtures" / "export"
SECRETS = {"HF_TOKEN": "hf_SeCrEt0123456789abcdef", "OPENAI_API_KEY": "sk-SeCrEt9876543210"}


def label_for(cand) -> str:
    fn = cand.kernel.name.removesuffix("_kernel")
    return (
        f"// kminer label {cand.id}: from {cand.provenance.repo_url} @ {cand.provenance.commit}\n"
        "#include <torch/extension.h>\n\n"
        f"{cand.kernel.source}\n\n"
        f"void {fn}(torch::Tensor input, torch::Tensor output) {{\n"
        f"  // launches {cand.kernel.name} over input.numel() elements\n}}\n\n"
        f'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("{fn}", &{fn}); }}\n'
    )


def build_workdir(repo: Path, workdir: Path, url: str | None = None) -> Store:
    """A store as `kminer mine` + verify + a curator would leave it: every kernel accepted."""
    disc = discover(repo)
    license_id, _ = detect_license(repo)
    url = url or f"https://example.org/{repo.name}"
    commit = folder_commit(repo)
    store = Store.open(workdir)
    repo_id = store.upsert_repo(url, commit, license=license_id, root=str(repo))
    for fk in disc.kernels:
        cand = to_candidate(fk, disc, Provenance(repo_url=url, commit=commit, license=license_id))
        fn = cand.kernel.name.removesuffix("_kernel")
        files = {
            f"labels/{cand.id}.cu": label_for(cand),
            f"tests/{cand.id}.py": f'"""kminer test: {cand.kernel.name}."""\nFUNCTION = "{fn}"\n',
            f"references/{cand.id}.cpp": f"void {fn}_cpu(at::Tensor input, at::Tensor output);\n",
        }
        for rel, text in files.items():
            (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (workdir / rel).write_text(text)
        cand.wrapper.strategy, cand.wrapper.functions = "mined", [fn]
        cand.wrapper.label_path = f"labels/{cand.id}.cu"
        cand.reference.kind, cand.reference.path = "cpp", f"references/{cand.id}.cpp"
        cand.unit.compiled_types = ["float", "double"] if cand.kernel.templated else []
        cand.tests.path, cand.tests.cases_source = f"tests/{cand.id}.py", "mined"
        cand.tests.num_cases, cand.tests.num_shapes = 7, 3
        cand.tests.dtypes = ["float32", "float64"] if cand.kernel.templated else ["float32"]
        metrics = {
            "outcome": "pass",
            "kill_rate": 1.0,
            "kernel_time_us": 12.5,
            "gpu": "NVIDIA H100 80GB HBM3",
            "torch": "2.11.0+cu130",
            "cuda": "13.0",
            "nvcc": "13.0.88",
            "cases": [{"id": "recorded_0", "shape": [[1000], [1000]]}],
        }
        cand.set_stage(StageName.VERIFY, StageResult(status=Status.OK, metrics=metrics))
        store.save(cand, repo_id)
        Reviews(store).write(cand.id, 0, "ann", "accept", decision=Decision.ACCEPTED)
    return store


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    out = {}
    for name in ("alpha", "beta", "gamma", "nolicense"):
        build_workdir(FIXTURES / name, base / name).close()
        out[name] = base / name
    return out


def kminer(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "miner.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.fixture(scope="module")
def exported(workdirs, tmp_path_factory):
    """alpha + beta + gamma exported through the CLI with the benchmark excluded."""
    out = tmp_path_factory.mktemp("dataset")
    args = [
        "export",
        "-w",
        str(workdirs["alpha"]),
        "-w",
        str(workdirs["beta"]),
        "-w",
        str(workdirs["gamma"]),
        "--out",
        str(out),
        "--exclude",
        str(FIXTURES / "benchmark"),
    ]
    done = kminer(*args, env=SECRETS)
    assert done.returncode == 0, done.stderr
    assert "3 rows exported" in done.stdout, done.stdout
    return out


def by_kernel(workdir: Path) -> dict:
    store = Store.open(workdir)
    found = {(c.kernel.name, c.kernel.file): c for c in store.iter_candidates()}
    store.close()
    return found


def test_rows_load_back_identically_and_match_the_store(exported, workdirs, tmp_path):
    from datasets import load_dataset

    by_folder = load_dataset(str(exported), split="train", cache_dir=str(tmp_path / "a"))
    by_parquet = load_dataset(
        "parquet", data_dir=str(exported / "data"), split="train", cache_dir=str(tmp_path / "b")
    )
    assert by_folder.features == by_parquet.features == FEATURES
    assert by_folder.to_list() == by_parquet.to_list()
    rows = {r["kernel_name"]: r for r in by_folder.to_list()}
    assert set(rows) == {"bias_leaky_relu_kernel", "clamp_kernel", "softplus_kernel"}
    jsonl = [json.loads(line) for line in (exported / "train.jsonl").read_text().splitlines()]
    assert jsonl == by_folder.to_list()
    alpha = by_kernel(workdirs["alpha"])
    cand = alpha[("bias_leaky_relu_kernel", "ops/bias_act.cu")]
    row = rows["bias_leaky_relu_kernel"]
    wd = workdirs["alpha"]
    assert row["id"] == cand.id and row["repo"] == "https://example.org/alpha"
    assert row["label"] == (wd / cand.wrapper.label_path).read_text()
    assert row["test_code"] == (wd / cand.tests.path).read_text()
    assert row["reference_code"] == (wd / cand.reference.path).read_text()
    assert (row["commit"], row["path"]) == (cand.provenance.commit, "ops/bias_act.cu")
    assert (row["line_start"], row["line_end"]) == (cand.kernel.start_line, cand.kernel.end_line)
    assert (row["filename"], row["license"], row["op"]) == ("bias_act.cu", "MIT", "bias_leaky_relu")
    assert row["dtypes"] == ["float32", "float64"] and (row["num_cases"], row["num_shapes"]) == (
        7,
        3,
    )
    assert (row["kill_rate"], row["kernel_time_us"]) == (1.0, 12.5)
    assert row["toolchain"] == {"nvcc": "13.0.88", "torch": "2.11.0+cu130", "cuda": "13.0"}
    assert (row["strategy"], row["cases_source"], row["reference_kind"]) == (
        "mined",
        "mined",
        "cpp",
    )
    assert row["curator"] == "ann" and row["reviewed_at"].endswith("+00:00")
    assert row["kminer_version"] == __version__ and row["instruction_edited"] is False
    # the repository's comment above the kernel is the description, carried into both texts
    assert row["description_source"] == "comment"
    assert "per-channel bias" in row["instruction_complete"]
    assert "`slope` (`float`): scalar" in row["instruction_complete"]
    assert "`output` (`T* __restrict__`): output (written)" in row["instruction_complete"]
    assert row["instruction"] == derive_instruction(row["instruction_complete"])
    assert row["instruction"].startswith("Write the CUDA kernel `bias_leaky_relu_kernel`")
    assert "cpp_extension builds. It adds a per-channel bias" in row["instruction"]
    assert (
        "Expose `void bias_leaky_relu(torch::Tensor input, torch::Tensor output)`"
        in row["instruction"]
    )


def test_copies_across_repositories_collapse_to_one_row(exported, workdirs):
    report = json.loads((exported / "export_report.json").read_text())
    drops = {(d["kernel"], d["repo"]): d for d in report["drops"]}
    alpha = by_kernel(workdirs["alpha"])
    near = drops[("bias_leaky_relu_kernel", "https://example.org/beta")]
    assert near["reason"] == Drop.NEAR_DUPLICATE and 0.85 <= float(near["detail"].split()[1]) < 1
    assert near["kept"] == alpha[("bias_leaky_relu_kernel", "ops/bias_act.cu")].id
    exact = drops[("clamp_kernel", "https://example.org/beta")]
    assert exact["reason"] == Drop.DUPLICATE  # only comments and whitespace differ
    assert exact["kept"] == alpha[("clamp_kernel", "ops/clamp.cu")].id


def test_license_filter_and_exclude_leave_rows_out_with_their_reasons(exported, workdirs, tmp_path):
    report = json.loads((exported / "export_report.json").read_text())
    reasons = {d["kernel"]: (d["reason"], d["detail"]) for d in report["drops"]}
    assert reasons["row_max_kernel"][0] == Drop.LICENSE
    assert "GPL-3.0-only is not permissive" in reasons["row_max_kernel"][1]
    assert reasons["saxpy_kernel"][0] == Drop.CONTAMINATED
    assert "level1_saxpy.py" in reasons["saxpy_kernel"][1]
    assert report["dropped"] == {
        "license": 1,
        "contaminated": 1,
        "near_duplicate": 1,
        "duplicate": 1,
    }
    # without --exclude and with GPL allowed, both come back
    opts = Options(
        workdirs=[workdirs["beta"], workdirs["gamma"]],
        out=tmp_path / "o",
        allow_license=["GPL-3.0-only"],
    )
    again = export(opts)
    assert again["rows"] == 5 and again["dropped"] == {}  # beta's 4 kernels and gamma's


def test_card_header_parses_and_its_numbers_match_the_rows(exported):
    from datasets import load_dataset

    text = (exported / "README.md").read_text()
    head = read_header(text)
    rows = load_dataset(str(exported), split="train").to_list()
    assert sorted(head["license"]) == ["apache-2.0", "mit"]
    assert head["size_categories"] == ["n<1K"] and "cuda" in head["tags"]
    assert head["task_categories"] == ["text-generation"]
    assert head["configs"][0]["data_files"] == [{"split": "train", "path": "data/train-*.parquet"}]
    assert [f["name"] for f in head["dataset_info"]["features"]] == list(FEATURES)
    assert f"\n{len(rows)} CUDA tasks cut from 2 open-source repositories" in text
    assert "| https://example.org/alpha | 2 | " in text  # found, ... exported
    funnel = [ln.split("|") for ln in text.splitlines() if ln.startswith("| https://example.org/")]
    exported_col = {cells[1].strip(): int(cells[8]) for cells in funnel if len(cells) == 11}
    assert exported_col == {
        "https://example.org/alpha": 2,
        "https://example.org/beta": 1,
        "https://example.org/gamma": 0,
    }
    assert "| **all** | 7 | " in text
    sources = {cells[1].strip(): int(cells[4]) for cells in funnel if len(cells) == 6}
    assert sources == {"https://example.org/alpha": 2, "https://example.org/beta": 1}
    for reason in ("license: 1", "contaminated: 1", "duplicate: 1", "near_duplicate: 1"):
        assert f"- {reason}\n" in text
    assert "| `kill_rate` | float64 |" in text and "| `dtypes` | list<string> |" in text


def test_no_secret_reaches_any_exported_file(exported):
    for path in exported.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in SECRETS.values():
                assert secret.encode() not in data, path


def test_curator_edits_win_and_an_edited_complete_text_derives_the_short_one(workdirs, tmp_path):
    store = Store.open(workdirs["alpha"])
    cands = {c.kernel.name: c for c in store.iter_candidates()}
    clamp, bias = cands["clamp_kernel"], cands["bias_leaky_relu_kernel"]
    Reviews(store).write(
        clamp.id, 1, "bo", "edit_instruction", instruction="Clamp x into [lo, hi]."
    )
    complete = (
        "Write a clamp kernel.\n\n## What it computes\nClamps each value of `x`.\n\n"
        "## Constraints\n- dtypes: float32\n"
    )
    Reviews(store).write(bias.id, 1, "bo", "edit_instruction", instruction_complete=complete)
    store.close()
    try:
        export(Options(workdirs=[workdirs["alpha"]], out=tmp_path / "o"))
        rows = {
            json.loads(x)["kernel_name"]: json.loads(x)
            for x in (tmp_path / "o" / "train.jsonl").read_text().splitlines()
        }
        assert rows["clamp_kernel"]["instruction"] == "Clamp x into [lo, hi]."
        assert rows["clamp_kernel"]["instruction_edited"] is True
        assert rows["bias_leaky_relu_kernel"]["instruction_complete"] == complete
        assert rows["bias_leaky_relu_kernel"]["instruction"] == (
            "Write a clamp kernel. It clamps each value of `x`. It must support float32."
        )
    finally:
        store = Store.open(workdirs["alpha"])
        for cand in (clamp, bias):
            v = Reviews(store).get(cand.id)["version"]
            Reviews(store).write(
                cand.id, v, "bo", "edit_instruction", instruction=None, instruction_complete=None
            )
        store.close()


def test_a_failed_export_leaves_the_previous_one_and_says_why(workdirs, tmp_path):
    out = tmp_path / "o"
    export(Options(workdirs=[workdirs["alpha"]], out=out))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    done = kminer(
        "export",
        "-w",
        str(workdirs["alpha"]),
        "--out",
        str(out),
        "--exclude",
        str(tmp_path / "missing.cu"),
    )
    assert done.returncode == 1 and "missing.cu: no such file or folder" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    done = kminer("export", "-w", str(tmp_path / "nowhere"), "--out", str(out))
    assert done.returncode == 1 and "no kminer store there" in done.stderr
    with pytest.raises(ExportError, match="at least one"):
        export(Options(workdirs=[], out=out))


def test_publish_dry_run_lists_every_operation_and_touches_no_network(exported):
    done = kminer(
        "publish",
        str(exported),
        "--repo-id",
        "kminer/cuda-kernels",
        "--private",
        "--revision",
        "v1",
        "--dry-run",
        env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": ""},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "create_repo dataset kminer/cuda-kernels private=True (if it does not exist)"
    assert lines[1] == "create_branch v1 on kminer/cuda-kernels (if it does not exist)"
    added = [ln.split()[1] for ln in lines if ln.startswith("add ")]
    files = sorted(p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file())
    assert sorted(added) == files
    assert "data/train-00000-of-00001.parquet" in added and "README.md" in added
    assert (
        lines[-2] == "delete data/* files on kminer/cuda-kernels@v1 that this export does not have"
    )
    assert lines[-1] == 'commit "kminer export: 3 rows" to kminer/cuda-kernels@v1'


def test_publish_refuses_a_missing_card_unknown_licenses_an_empty_set_and_local_paths(
    workdirs, exported, tmp_path
):
    import shutil

    no_card = tmp_path / "no_card"
    shutil.copytree(exported, no_card)
    (no_card / "README.md").unlink()
    unknown = tmp_path / "unknown"
    export(Options(workdirs=[workdirs["nolicense"]], out=unknown, allow_license=["unknown"]))
    local = tmp_path / "local"
    build_workdir(FIXTURES / "gamma", tmp_path / "wd", url=str(FIXTURES / "gamma")).close()
    export(Options(workdirs=[tmp_path / "wd"], out=local, allow_license=["GPL-3.0-only"]))
    empty = tmp_path / "empty"
    done = kminer("export", "-w", str(workdirs["gamma"]), "--out", str(empty))
    assert done.returncode == 1 and "nothing exported" in done.stderr  # the GPL row is dropped
    assert not empty.exists()  # an empty export writes no folder; its report goes beside it
    assert json.loads((tmp_path / "empty.export_report.json").read_text())["dropped"] == {
        "license": 1
    }
    # a 0-row dataset can still be made by hand: publish refuses it
    from datasets import Dataset

    shutil.copytree(exported, empty)
    shard = empty / "data" / "train-00000-of-00001.parquet"
    Dataset.from_dict({k: [] for k in FEATURES}, features=FEATURES).to_parquet(str(shard))
    for folder, message in (
        (no_card, "no dataset card"),
        (unknown, "1 rows have an unknown license"),
        (empty, "the dataset is empty"),
        (local, "rows name a local path as their repository"),
    ):
        done = kminer("publish", str(folder), "--repo-id", "o/n", "--dry-run")
        assert done.returncode == 1, folder
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = kminer("publish", str(exported), "--repo-id", "no-slash", "--dry-run")
    assert done.returncode == 2 and "expected OWNER/NAME" in done.stderr
    # a mapped source fixes the local path
    export(
        Options(
            workdirs=[tmp_path / "wd"],
            out=local,
            allow_license=["GPL-3.0-only"],
            sources={str(FIXTURES / "gamma"): "https://example.org/gamma"},
        )
    )
    assert kminer("publish", str(local), "--repo-id", "o/n", "--dry-run").returncode == 0
    (row,) = [json.loads(x) for x in (local / "train.jsonl").read_text().splitlines()]
    assert row["label"].startswith(f"// kminer label {row['id']}: from https://example.org/gamma @")
    assert str(FIXTURES) not in (local / "train.jsonl").read_text()


def test_near_duplicate_search_matches_exact_jaccard():
    base = " ".join(f"x{i} = y[{i}] * {i} + z;" for i in range(60))
    edited = base.replace("x30 =", "w30 =").replace("x45 =", "w45 =")
    other = " ".join(f"q{i} = r[{i}] - {i};" for i in range(60))
    toks = [dedup.tokens(s) for s in (base, edited, other)]
    exact = dedup.jaccard(dedup.shingles(toks[0]), dedup.shingles(toks[1]))
    estimate = float((dedup.signature(toks[0]) == dedup.signature(toks[1])).mean())
    assert 0.85 < exact < 0.99 and abs(estimate - exact) < 0.1
    pairs = dedup.near_pairs(toks, 0.85)
    assert [(i, j) for i, j, _ in pairs] == [(0, 1)] and pairs[0][2] == pytest.approx(exact)
    rows = [
        {"id": "b", "kill_rate": 1.0, "num_cases": 5, "num_shapes": 3},
        {"id": "a", "kill_rate": 0.5, "num_cases": 9, "num_shapes": 3},
        {"id": "c", "kill_rate": 1.0, "num_cases": 5, "num_shapes": 3},
    ]
    dropped = dedup.find_duplicates(rows, [base, edited, "// note\n" + base])
    assert dropped == {1: (0, "near_duplicate", pytest.approx(exact)), 2: (0, "duplicate", 1.0)}


def test_derived_instruction_is_deterministic_and_reads_free_text():
    complete = (
        "Write the CUDA kernel `k` and the host function `f` that launches it.\n\n"
        "## What it computes\nComputes the sum of each row. Rows are contiguous.\n\n"
        "## Binding\n`void f(Tensor x, Tensor out)`, bound with m.def.\n\n"
        "## Constraints\n- dtypes: float32, float16\n"
    )
    expected = (
        "Write the CUDA kernel `k` and the host function `f` that launches it. It "
        "computes the sum of each row. Expose `void f(Tensor x, Tensor out)` with "
        "pybind11. It must support float32, float16."
    )
    assert derive_instruction(complete) == derive_instruction(complete) == expected
    assert derive_instruction("Just sum the rows.\n\nMore text.") == "Just sum the rows."
    assert yaml.safe_load("a: 1") == {"a": 1}


def test_model_descriptions_are_checked_stored_and_asked_once(tmp_path):
    from llm_server import FakeLLM, load

    from wrappers.llm.client import LLMClient

    workdirs = {"alpha": tmp_path / "alpha"}
    build_workdir(FIXTURES / "alpha", workdirs["alpha"]).close()

    def run(server):
        def client(store):
            return LLMClient(store, base_url=server.base_url, api_key="k", model="fake-model")

        opts = Options(workdirs=[workdirs["alpha"]], out=tmp_path / "o", describe_with=client)
        return export(opts)

    with FakeLLM(load("describe/bias_leaky_relu_kernel")) as server:
        report = run(server)
        first = server.chat_requests("[kminer:describe]")
        fixes = server.chat_requests("[kminer:describe-fix]")
    assert len(fixes) == 1 and "too short" in fixes[0]["last_user"]
    asked = {r["last_user"].split("kernel=")[1].split()[0] for r in first}
    assert asked == {"bias_leaky_relu_kernel", "clamp_kernel"}
    bias_prompt = next(r["last_user"] for r in first if "kernel=bias_leaky" in r["last_user"])
    assert "The repository says of it" in bias_prompt and "per-channel bias" in bias_prompt
    assert [f["kernel"] for f in report["describe_failures"]] == ["clamp_kernel"]  # no recording
    rows = {
        json.loads(x)["kernel_name"]: json.loads(x)
        for x in (tmp_path / "o" / "train.jsonl").read_text().splitlines()
    }
    bias = rows["bias_leaky_relu_kernel"]
    assert bias["description_source"] == "llm" and "(i / inner) % channels" in bias["instruction"]
    assert rows["clamp_kernel"]["description_source"] == "comment"  # the model failed: repo's
    store = Store.open(workdirs["alpha"])
    bias_id = bias["id"]
    tried = [
        (a["attempt"], a["passed"]) for a in store.attempts(bias_id) if a["step"] == "describe"
    ]
    store.close()
    assert tried == [(1, False), (2, True)]
    with FakeLLM(load("describe/bias_leaky_relu_kernel")) as server:  # a rerun: nothing new
        run(server)
        assert server.chat_requests("kernel=bias_leaky_relu_kernel") == []


def test_copies_between_repositories_need_less_similarity_than_siblings_within_one():
    base = [f"v{i} = in[{i} * stride] * w{i % 7} + b;" for i in range(40)]
    copy = list(base)
    for i in range(0, 40, 2):  # a reformatted, partly renamed copy
        copy[i] = f"u{i} = in[{i} * stride] * w{i % 7} + b;"
    a, b = " ".join(base), " ".join(copy)
    sim = dedup.jaccard(dedup.shingles(dedup.tokens(a)), dedup.shingles(dedup.tokens(b)))
    assert 0.5 <= sim < 0.7
    ranked = {"kill_rate": 1.0, "num_cases": 5, "num_shapes": 3}

    def rows(*specs):
        return [{"id": str(i), **ranked, "repo": r, "name": n} for i, (r, n) in enumerate(specs)]

    same_repo = rows(("r1", "three_nn_forward_cuda_kernel"), ("r1", "three_nn_backward_kernel"))
    assert dedup.find_duplicates(same_repo, [a, b]) == {}  # siblings at this similarity stay
    other_name = rows(("r1", "three_nn_forward_cuda_kernel"), ("r2", "ball_query_kernel"))
    assert dedup.find_duplicates(other_name, [a, b]) == {}
    same_stem = rows(("r1", "three_nn_forward_cuda_kernel"), ("r2", "three_nn_kernel_fast"))
    assert dedup.find_duplicates(same_stem, [a, b]) == {1: (0, "near_duplicate", sim)}
    assert dedup.name_stem("three_nn_kernel_fast") == dedup.name_stem(
        "three_nn_forward_cuda_kernel"
    )
    # not transitive: a row is dropped only as the copy of a row that stays
    chain = [" ".join(base[:30]), " ".join(base[5:35]), " ".join(base[10:40])]
    sets = [dedup.shingles(dedup.tokens(c)) for c in chain]
    near, far = dedup.jaccard(sets[0], sets[1]), dedup.jaccard(sets[0], sets[2])
    assert dedup.jaccard(sets[1], sets[2]) == pytest.approx(near) and far < near
    three = [{"id": str(i), **ranked, "repo": "r", "name": f"k{i}"} for i in range(3)]
    dropped = dedup.find_duplicates(three, chain, threshold=(near + far) / 2)
    assert dropped == {1: (0, "near_duplicate", pytest.approx(near))}  # 2 stays: 1 is gone


def test_the_report_names_repositories_not_paths_of_this_machine(exported, workdirs):
    report = (exported / "export_report.json").read_text()
    assert str(workdirs["alpha"]) not in report and str(FIXTURES) not in report
    assert json.loads(report)["workdirs"][0]["repo"]["url"] == "https://example.org/alpha"


def set_verify(workdir: Path, kernel: str, metrics: dict, override: bool | None = None) -> str:
    """Give one candidate new verify metrics (and, when asked, an override accept); its id."""
    store = Store.open(workdir)
    try:
        cand = next(c for c in store.iter_candidates() if c.kernel.name == kernel)
        cand.set_stage(StageName.VERIFY, StageResult(status=Status.OK, metrics=metrics))
        store.save(cand)
        if override is not None:
            reviews = Reviews(store)
            version = reviews.get(cand.id)["version"]
            reviews.write(
                cand.id, version, "cy", "override_accept", decision=Decision.ACCEPTED,
                override=override,
            )  # fmt: skip
        return cand.id
    finally:
        store.close()


def card_line(text: str, start: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(start)]
    return line


def test_the_card_states_only_what_the_rows_measured(tmp_path):
    """beta's 4 kernels: kill rate 1.0, kill rate 0.5, a pass with no GPU or toolchain recorded,
    and a curator override whose test was weak; exported with --include-overrides."""
    from datasets import load_dataset

    wd = tmp_path / "beta"
    build_workdir(FIXTURES / "beta", wd).close()
    passed = {"outcome": "pass", "kernel_time_us": 3.0}
    set_verify(wd, "saxpy_kernel", {**passed, "kill_rate": 0.5, "gpu": "NVIDIA H200",
                                     "nvcc": "12.8", "torch": "2.7.0", "cuda": "12.8"})  # fmt: skip
    set_verify(wd, "clamp_kernel", {**passed, "kill_rate": 1.0})  # no gpu, no toolchain
    override_id = set_verify(wd, "softplus_kernel", {"outcome": "weak_test"}, override=True)
    out = tmp_path / "o"
    done = kminer("export", "-w", str(wd), "--out", str(out), "--include-overrides")
    assert done.returncode == 0, done.stderr
    rows = load_dataset(str(out), split="train").to_list()
    text = (out / "README.md").read_text()
    verification = {r["id"]: r["verification"] for r in rows}
    assert verification[override_id] == "override"
    assert sorted(verification.values()) == ["gpu_pass"] * 3 + ["override"]
    override = next(r for r in rows if r["id"] == override_id)
    assert override["kill_rate"] is None and override["gpu"] == "" and override["curator"] == "cy"
    assert not any(override["toolchain"].values())
    # each sentence, against figures counted here from the rows
    assert card_line(text, "- 3 of 4 rows were verified on a GPU").endswith(
        "the other 1 are curator overrides, accepted without that pass (`verification`: override)."
    )
    assert "Every row was verified" not in text
    kills = sorted(r["kill_rate"] for r in rows if r["kill_rate"] is not None)
    assert kills == [0.5, 1.0, 1.0]
    kill = card_line(text, "- 3 of 4 rows have a measured kill rate")
    assert "min 0.50, median 1.0;" in kill and "every wrong variant in 2 of 3 rows" in kill
    assert kill.endswith("the other 1 have none measured.") and "100 %" not in text
    gpus = Counter(r["gpu"] or "unknown" for r in rows)
    assert gpus == {"NVIDIA H100 80GB HBM3": 1, "unknown": 2, "NVIDIA H200": 1}
    assert card_line(text, "- GPUs the rows name (`gpu`): ") == (
        "- GPUs the rows name (`gpu`): unknown (2 rows), NVIDIA H100 80GB HBM3 (1 row), "
        "NVIDIA H200 (1 row)."
    )
    assert card_line(text, "- Toolchains the rows name").endswith(
        ": unknown (2 rows), 13.0.88 / 2.11.0+cu130 / 13.0 (1 row), 12.8 / 2.7.0 / 12.8 (1 row)."
    )
    assert sum(r["kernel_time_us"] is not None for r in rows) == 3
    assert "- Kernel times: 3 of 4 rows have a `kernel_time_us`" in text
    assert "passed on a GPU for 3 of 4 rows; for the other 1 (overrides) it was not shown." in text
    assert "- Each row names the curator who accepted it" in text
    assert "2 of 4 rows record the toolchain their verification ran with" in text
    assert "curator overrides included (--include-overrides)" in text
    report = json.loads((out / "export_report.json").read_text())
    assert report["verification"] == {"gpu_pass": 3, "override": 1}
    assert report["options"]["include_overrides"] is True
    # without the option the override is left out, with its reason, and the card says "every"
    again = export(Options(workdirs=[wd], out=out))
    assert again["rows"] == 3 and again["dropped"] == {"override": 1}
    (drop,) = again["drops"]
    assert drop["id"] == override_id and "verify outcome weak_test" in drop["detail"]
    text = (out / "README.md").read_text()
    assert "- Every row was verified on a GPU: the label of each of the 3 passed" in text
    assert "min 0.50, median 1.0;" in text and "100 %" not in text


def op_label(cands: list, repo: Path) -> str:
    """What the mined wrapper makes for each kernel of delta's scan: the whole host function
    with both kernels (the same task text for both candidates, a header naming each)."""
    source = (repo / "ops" / "scan.cu").read_text()
    return (
        "#include <torch/extension.h>\n// kminer-label-body-begin\n"
        + source.split("#include <cuda_runtime.h>\n", 1)[1]
        + '\nvoid kminer_bind(pybind11::module_& m) { m.def("prefix_sum", &prefix_sum); }\n'
    )


def test_a_multi_kernel_op_is_one_op_row_and_each_kernel_a_row_given_the_rest(tmp_path):
    """delta's prefix_sum launches two kernels: their labels are the same op. The export makes
    an op row for it (both kernels asked for, the lower kill rate) and keeps each kernel's row,
    whose instruction gives the rest of the file with that kernel's body left to write."""
    from datasets import load_dataset

    from curation import ops

    wd = tmp_path / "delta"
    store = build_workdir(FIXTURES / "delta", wd)
    cands = list(store.iter_candidates())
    body = op_label(cands, FIXTURES / "delta")
    for cand in cands:
        (wd / cand.wrapper.label_path).write_text(f"// kminer label {cand.id}\n{body}")
        cand.wrapper.functions = ["prefix_sum"]
        store.save(cand)
    store.close()
    kills = {"block_sums_kernel": 1.0, "add_offsets_kernel": 0.75}
    for name, kill in kills.items():
        set_verify(wd, name, {"outcome": "pass", "kill_rate": kill, "gpu": "NVIDIA H100"})
    out = tmp_path / "o"
    done = kminer("export", "-w", str(wd), "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = load_dataset(str(out), split="train", cache_dir=str(tmp_path / "c1")).to_list()
    assert sorted(r["level"] for r in rows) == ["kernel", "kernel", "op"]
    (op,) = [r for r in rows if r["level"] == "op"]
    assert op["kernels"] == ["block_sums_kernel", "add_offsets_kernel"]  # in the label's order
    assert op["kill_rate"] == 0.75 and op["verification"] == "gpu_pass"
    commit = cands[0].provenance.commit
    names = op["kernels"]
    assert op["id"] == ops.op_id(op["repo"], commit, "prefix_sum", names)
    assert op["id"] not in {c.id for c in cands}
    assert op["instruction"].startswith("Write the host function `prefix_sum` and the CUDA")
    assert "launches 2 kernels" in op["instruction"]
    for head in ("__global__ void block_sums_kernel(const float* x, float* block_sums, int n)",
                 "__global__ void add_offsets_kernel(const float* x, const float* block_sums, "
                 "float* y, int n)"):  # fmt: skip
        assert f"- `{head}`" in op["instruction_complete"]
    assert "## Given code" not in op["instruction_complete"]
    for row in (r for r in rows if r["level"] == "kernel"):
        (name,) = row["kernels"]
        other = next(n for n in names if n != name)
        assert row["kernel_name"] == name and row["kill_rate"] == kills[name]
        assert row["instruction"].startswith(f"Write the body of the CUDA kernel `{name}`.")
        assert f"other kernels it launches (`{other}`)" in row["instruction"]
        given = row["instruction_complete"].split("## Given code\n", 1)[1]
        assert row["instruction"].endswith(given.strip())  # the short one carries the code too
        own = next(c for c in cands if c.kernel.name == name).kernel.source
        theirs = next(c for c in cands if c.kernel.name == other).kernel.source
        mine = given.split(f"void {name}(", 1)[1].split("\n}", 1)[0]
        unique = [
            ln for ln in own.split("{", 1)[1].splitlines() if ln.strip(" }") and ln not in theirs
        ]
        assert "// your code here" in mine and unique and not any(ln in given for ln in unique)
        assert theirs.strip() in given  # the other kernel, verbatim
        assert "void prefix_sum(" in given and row["label"].count("__global__") == 2
    text = (out / "README.md").read_text()
    assert card_line(text, "- 2 of 3 rows ask for one kernel").startswith(
        "- 2 of 3 rows ask for one kernel (`level: kernel`); 1 ask for a whole op, a host "
        "function that launches 2 kernels (`level: op`"
    )
    funnel = [ln.split("|") for ln in text.splitlines() if ln.startswith("| https://example.org/")]
    assert [(int(c[8]), int(c[9])) for c in funnel if len(c) == 11] == [(2, 1)]
    report = json.loads((out / "export_report.json").read_text())
    assert report["levels"] == {"kernel": 2, "op": 1}
    # one kernel rejected: the op row stays (every kernel of it passed), measured by both
    store = Store.open(wd)
    reviews = Reviews(store)
    adder = next(c.id for c in store.iter_candidates() if c.kernel.name == "add_offsets_kernel")
    reviews.write(adder, reviews.get(adder)["version"], "ann", "reject", decision=Decision.REJECTED)
    store.close()
    again = export(Options(workdirs=[wd], out=out))
    rows = load_dataset(str(out), split="train", cache_dir=str(tmp_path / "c2")).to_list()
    assert again["levels"] == {"kernel": 1, "op": 1}
    (op_again,) = [r for r in rows if r["level"] == "op"]
    assert op_again["id"] == op["id"] and op_again["kill_rate"] == 0.75
    # a kernel whose own test was weak (its variants never ran): no op row, and why
    set_verify(wd, "add_offsets_kernel", {"outcome": "weak_test", "kill_rate": 0.0})
    third = export(Options(workdirs=[wd], out=out))
    assert third["levels"] == {"kernel": 1} and third["dropped"] == {"op_incomplete": 1}
    (drop,) = third["drops"]
    assert "add_offsets_kernel: weak_test" in drop["detail"]
    # a kernel of the label tested only through another label (its own launcher): the op's
    # test may never run it, so no op row either
    set_verify(wd, "add_offsets_kernel", {"outcome": "pass", "kill_rate": 1.0})
    adder_cand = next(c for c in cands if c.kernel.name == "add_offsets_kernel")
    (wd / adder_cand.wrapper.label_path).write_text(label_for(adder_cand))
    fourth = export(Options(workdirs=[wd], out=out))
    assert fourth["dropped"] == {"op_incomplete": 1}
    assert "add_offsets_kernel: not tested with this label" in fourth["drops"][0]["detail"]
