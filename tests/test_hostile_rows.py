"""Hostile exports: what a row, a card or an output folder could be made to claim or destroy.

A row claims only what was measured and a card only what the rows hold; an export that writes
no row, or that would write through a link, over a file it did not write or into a workdir,
changes nothing and says why in one line; publish uploads only the export's own files; nothing
that looks like a credential reaches an exported file or the terminal. The stores are real
(SQLite, built from tests/fixtures/export as `kminer mine` + verify + a curator leave them).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from test_export import FIXTURES, build_workdir, card_line, kminer, set_verify

from curation.card import read_header
from curation.export import EmptyExport, Options, export
from curation.reviews import Decision, Reviews
from miner.store import Store

H100 = {"gpu": "NVIDIA H100 80GB HBM3", "nvcc": "13.0.88", "torch": "2.11.0+cu130", "cuda": "13.0"}
GH_TOKEN = "ghp_" + "A1b2" * 9
OPENAI_KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx"
ENV_SECRET = "plain-looking-secret-4242"  # matches no token format: found as $OPENAI_API_KEY
KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU"


def snapshot(root: Path) -> dict:
    """Every file's bytes and every link's target under `root` (links are not followed)."""
    found = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(here) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_file():
                found[rel] = path.read_bytes()
            else:
                found[rel] = "dir"
    return found


def one_line_error(done, phrase: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0], done.stderr


def rows_of(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def alpha_base(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("alpha") / "alpha"
    build_workdir(FIXTURES / "alpha", base).close()
    return base


@pytest.fixture
def alpha(alpha_base, tmp_path) -> Path:
    """A private copy of alpha's workdir (2 accepted GPU passes) to make hostile."""
    return Path(shutil.copytree(alpha_base, tmp_path / "alpha"))


# --- override rows --------------------------------------------------------------------------

OVERRIDES = {  # clamp_kernel's verify metrics, its review's override flag, what the drop says
    "weak_test_override": ({"outcome": "weak_test"}, True, "verify outcome weak_test"),
    "weak_kills_override": ({"outcome": "pass", "kill_rate": 0.5, **H100}, True, "override"),
    "reverified_mismatch": ({"outcome": "mismatch", "kill_rate": 1.0, **H100}, None, "mismatch"),
}


@pytest.mark.parametrize("kind", OVERRIDES)
def test_an_override_row_is_left_out_unless_asked_and_then_says_so(alpha, tmp_path, kind):
    metrics, override, detail = OVERRIDES[kind]
    cand_id = set_verify(alpha, "clamp_kernel", metrics, override=override)
    report = export(Options(workdirs=[alpha], out=tmp_path / "o"))
    (drop,) = report["drops"]
    assert (drop["id"], drop["reason"]) == (cand_id, "override") and detail in drop["detail"]
    assert [r["verification"] for r in rows_of(tmp_path / "o")] == ["gpu_pass"]
    export(Options(workdirs=[alpha], out=tmp_path / "o", include_overrides=True))
    row = next(r for r in rows_of(tmp_path / "o") if r["id"] == cand_id)
    assert row["verification"] == "override"
    assert row["kill_rate"] == metrics.get("kill_rate") and row["gpu"] == metrics.get("gpu", "")
    assert "1 of 2 rows were verified on a GPU" in (tmp_path / "o" / "README.md").read_text()


def test_an_included_override_never_wins_over_a_gpu_pass_copy(alpha, tmp_path):
    beta = tmp_path / "beta"
    build_workdir(FIXTURES / "beta", beta).close()
    dropped_id = set_verify(alpha, "bias_leaky_relu_kernel", {"outcome": "weak_test"}, True)
    report = export(Options(workdirs=[alpha, beta], out=tmp_path / "o", include_overrides=True))
    drop = next(d for d in report["drops"] if d["id"] == dropped_id)
    assert drop["reason"] == "near_duplicate"  # alpha comes first, but its copy is an override
    kept = next(r for r in rows_of(tmp_path / "o") if r["kernel_name"] == "bias_leaky_relu_kernel")
    assert kept["id"] == drop["kept"] and kept["verification"] == "gpu_pass"
    assert kept["repo"] == "https://example.org/beta"


# --- a card that could lie ------------------------------------------------------------------


def test_a_card_of_overrides_only_claims_no_gpu_pass_and_no_kill_rate(alpha, tmp_path):
    for kernel in ("clamp_kernel", "bias_leaky_relu_kernel"):
        set_verify(alpha, kernel, {"outcome": "crash"}, override=True)
    export(Options(workdirs=[alpha], out=tmp_path / "o", include_overrides=True))
    text = (tmp_path / "o" / "README.md").read_text()
    assert card_line(text, "- No row was verified on a GPU: all 2 are curator overrides")
    assert card_line(text, "- No row has a measured kill rate")
    assert "Every row was verified" not in text and "100 %" not in text
    assert "GPUs the rows name (`gpu`): unknown (2 rows)." in text
    assert "passed on a GPU for 0 of 2 rows; for the other 2 (overrides) it was not shown" in text


def test_a_kill_rate_just_under_one_never_reads_as_all_killed(alpha, tmp_path):
    for kernel in ("clamp_kernel", "bias_leaky_relu_kernel"):
        set_verify(alpha, kernel, {"outcome": "pass", "kill_rate": 0.999, **H100})
    export(Options(workdirs=[alpha], out=tmp_path / "o"))
    text = (tmp_path / "o" / "README.md").read_text()
    kill = card_line(text, "- All 2 rows have a measured kill rate")
    assert "min 0.99, median 0.99;" in kill and "every wrong variant in 0 of 2 rows" in kill
    assert "100 %" not in text and "1.00" not in text and "1.0" not in kill


def test_a_gpu_name_cannot_forge_a_line_or_a_cell_of_the_card(alpha, tmp_path):
    forged = "H100 | 9 | 9 |\n- Every row was verified on a GPU: forged\n## Sources"
    set_verify(alpha, "clamp_kernel", {"outcome": "pass", "kill_rate": 1.0, **H100, "gpu": forged})
    set_verify(alpha, "bias_leaky_relu_kernel", {"outcome": "weak_test"}, override=True)
    export(Options(workdirs=[alpha], out=tmp_path / "o", include_overrides=True))
    text = (tmp_path / "o" / "README.md").read_text()
    assert not [ln for ln in text.splitlines() if ln.startswith("- Every row was verified")]
    assert text.count("\n## Sources\n") == 1 and read_header(text)["license"] == "mit"
    gpus = card_line(text, "- GPUs the rows name")
    assert r"H100 \| 9 \| 9 \| - Every row was verified on a GPU: forged ## Sources (1 row)" in gpus
    assert [r["gpu"] for r in rows_of(tmp_path / "o") if r["gpu"]] == [forged]  # the row: as is


# --- empty exports --------------------------------------------------------------------------


def _reject_all(workdir: Path) -> Path:
    store = Store.open(workdir)
    reviews = Reviews(store)
    for cand_id, review in reviews.all(Decision.ACCEPTED).items():
        reviews.write(cand_id, review["version"], "cy", "reject", decision=Decision.REJECTED)
    store.close()
    return workdir


def _all_overrides(workdir: Path) -> Path:
    for kernel in ("clamp_kernel", "bias_leaky_relu_kernel"):
        set_verify(workdir, kernel, {"outcome": "weak_test"}, override=True)
    return workdir


def _all_secrets(workdir: Path) -> Path:  # found only once the rows are read and staged
    for label in (workdir / "labels").iterdir():
        label.write_text(label.read_text() + f"// deploy token {GH_TOKEN}\n")
    return workdir


def _all_gpl(workdir: Path) -> Path:
    gamma = workdir.parent / "gamma"
    build_workdir(FIXTURES / "gamma", gamma).close()
    return gamma


EMPTY = {
    "nothing_accepted": (_reject_all, "no accepted candidates in the workdirs"),
    "all_overrides": (_all_overrides, "left out: override 2"),
    "all_secrets": (_all_secrets, "left out: secret 2"),
    "all_license": (_all_gpl, "left out: license 1"),
}


@pytest.mark.parametrize("case", EMPTY)
def test_an_empty_export_leaves_the_previous_one_byte_for_byte(alpha, tmp_path, case):
    make_empty, why = EMPTY[case]
    out = tmp_path / "o"
    export(Options(workdirs=[alpha], out=out))
    before = snapshot(out)
    workdir = make_empty(alpha)
    done = kminer("export", "-w", str(workdir), "--out", str(out))
    beside = tmp_path / "o.export_report.json"
    one_line_error(done, "nothing exported: ")
    assert why in done.stderr and f"{out} left as it was; report: {beside}" in done.stderr
    assert snapshot(out) == before  # data, card, train.jsonl and its report; no staging left
    report = json.loads(beside.read_text())
    assert report["rows"] == 0 and GH_TOKEN not in beside.read_text()
    # the next export that writes rows replaces the previous one and the stale report goes
    fresh = tmp_path / "fresh"
    build_workdir(FIXTURES / "alpha", fresh).close()
    assert export(Options(workdirs=[fresh], out=out))["rows"] == 2 and not beside.exists()


def test_an_empty_export_to_a_new_folder_creates_nothing_there(alpha, tmp_path):
    _reject_all(alpha)
    out = tmp_path / "new" / "o"
    with pytest.raises(EmptyExport, match="no accepted candidates") as caught:
        export(Options(workdirs=[alpha], out=out))
    assert (
        not out.exists() and caught.value.report_path == tmp_path / "new" / "o.export_report.json"
    )


# --- links, files where folders belong, workdirs --------------------------------------------


def _precious(tmp: Path) -> Path:
    keep = tmp / "precious"
    keep.mkdir()
    (keep / "train-00000-of-00001.parquet").write_bytes(b"not kminer's")
    return keep


def _out_is_file(tmp, alpha):
    (tmp / "ds").write_text("a file the user keeps")
    return ["--out", str(tmp / "ds")], "is a file, not a folder"


def _out_is_dangling_link(tmp, alpha):
    (tmp / "ds").symlink_to(tmp / "nowhere")
    return ["--out", str(tmp / "ds")], "is a symbolic link to nothing"


def _data_is_link(tmp, alpha):
    (tmp / "ds").mkdir()
    (tmp / "ds" / "data").symlink_to(_precious(tmp), target_is_directory=True)
    return ["--out", str(tmp / "ds")], "data is a symbolic link"


def _card_is_link(tmp, alpha):
    (tmp / "ds").mkdir()
    (tmp / "notes.md").write_text("the user's notes")
    (tmp / "ds" / "README.md").symlink_to(tmp / "notes.md")
    return ["--out", str(tmp / "ds")], "README.md is a symbolic link"


def _data_is_file(tmp, alpha):
    (tmp / "ds").mkdir()
    (tmp / "ds" / "data").write_text("a file")
    return ["--out", str(tmp / "ds")], "a file where the shards' folder belongs"


def _card_is_folder(tmp, alpha):
    (tmp / "ds" / "README.md").mkdir(parents=True)
    (tmp / "ds" / "README.md" / "draft.md").write_text("draft")
    return ["--out", str(tmp / "ds")], "README.md is a folder where a file belongs"


def _data_holds_foreign_file(tmp, alpha):
    (tmp / "ds" / "data").mkdir(parents=True)
    (tmp / "ds" / "data" / "notes.txt").write_text("mine")
    return ["--out", str(tmp / "ds")], "holds notes.txt, not one of the export's shards"


def _out_is_workdir(tmp, alpha):
    return ["--out", str(alpha)], "is inside --workdir"


def _out_inside_workdir(tmp, alpha):
    return ["--out", str(alpha / "dataset")], "is inside --workdir"


def _workdir_inside_out_data(tmp, alpha):
    (tmp / "ds").mkdir()
    shutil.move(alpha, tmp / "ds" / "data")
    return ["-w", str(tmp / "ds" / "data"), "--out", str(tmp / "ds")], "export replaces it"


def _workdir_is_empty_folder(tmp, alpha):
    (tmp / "empty").mkdir()
    return ["-w", str(tmp / "empty"), "--out", str(tmp / "ds")], "no kminer store there"


def _workdir_db_is_garbage(tmp, alpha):
    (tmp / "fake").mkdir()
    (tmp / "fake" / "kminer.db").write_bytes(b"garbage, not SQLite")
    return ["-w", str(tmp / "fake"), "--out", str(tmp / "ds")], "is not a kminer store"


def _workdir_db_is_foreign_sqlite(tmp, alpha):
    (tmp / "other").mkdir()
    with sqlite3.connect(tmp / "other" / "kminer.db") as conn:
        conn.execute("create table notes (body text)")
    return ["-w", str(tmp / "other"), "--out", str(tmp / "ds")], "is not a kminer store"


def _workdir_twice(tmp, alpha):
    return ["-w", str(alpha), "-w", str(alpha), "--out", str(tmp / "ds")], "is given twice"


def _threshold_out_of_range(tmp, alpha):
    return ["--out", str(tmp / "ds"), "--near-dup-threshold", "1.5"], "must be in (0, 1]"


REFUSED = [_out_is_file, _out_is_dangling_link, _data_is_link, _card_is_link, _data_is_file,
           _card_is_folder, _data_holds_foreign_file, _out_is_workdir, _out_inside_workdir,
           _workdir_inside_out_data, _workdir_is_empty_folder, _workdir_db_is_garbage,
           _workdir_db_is_foreign_sqlite, _workdir_twice, _threshold_out_of_range]  # fmt: skip


@pytest.mark.parametrize("setup", REFUSED, ids=lambda f: f.__name__.strip("_"))
def test_an_export_that_would_harm_a_folder_is_refused_in_one_line(alpha, tmp_path, setup):
    args, phrase = setup(tmp_path, alpha)
    if "-w" not in args:
        args = ["-w", str(alpha), *args]
    before = snapshot(tmp_path)
    done = kminer("export", *args)
    one_line_error(done, phrase)
    assert snapshot(tmp_path) == before  # nothing written, deleted or followed


# --- publish --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published(alpha_base, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("published") / "o"
    export(Options(workdirs=[alpha_base], out=out))
    return out


SHARD = "data/train-00000-of-00001.parquet"


def _link_card(ds: Path) -> None:
    (ds / "README.md").rename(ds.parent / "card.md")
    (ds / "README.md").symlink_to(ds.parent / "card.md")


def _link_shard(ds: Path) -> None:
    (ds / SHARD).rename(ds.parent / "shard.parquet")
    (ds / SHARD).symlink_to(ds.parent / "shard.parquet")


def _link_data(ds: Path) -> None:
    (ds / "data").rename(ds.parent / "data")
    (ds / "data").symlink_to(ds.parent / "data", target_is_directory=True)


def _foreign_file(ds: Path) -> None:
    (ds / "data" / ".env").write_text(f"HF_TOKEN=hf_{'x' * 34}\n")


def _incomplete_set(ds: Path) -> None:
    (ds / SHARD).rename(ds / "data" / "train-00000-of-00002.parquet")


def _old_export(ds: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(ds / SHARD)
    pq.write_table(table.drop_columns(["verification"]), ds / SHARD)


PUBLISH_REFUSED = {
    "card_is_link": (_link_card, "README.md is a symbolic link"),
    "shard_is_link": (_link_shard, "holds train-00000-of-00001.parquet, a symbolic link"),
    "data_is_link": (_link_data, "data is a symbolic link"),
    "foreign_file_in_data": (_foreign_file, "holds .env, not one of the export's shards"),
    "incomplete_shard_set": (_incomplete_set, "not one complete train-*-of-* set"),
    "rows_without_verification": (_old_export, "do not say how they were verified"),
}


@pytest.mark.parametrize("case", PUBLISH_REFUSED)
def test_publish_uploads_nothing_but_the_exports_own_files(published, tmp_path, case):
    make, phrase = PUBLISH_REFUSED[case]
    ds = Path(shutil.copytree(published, tmp_path / "ds"))
    make(ds)
    done = kminer("publish", str(ds), "--repo-id", "o/n", "--dry-run", env={"HF_TOKEN": ""})
    one_line_error(done, phrase)
    assert done.stdout == ""  # no operation planned


# --- secrets in a row's texts ---------------------------------------------------------------


def _edit(workdir: Path, kernel: str, rel_of, extra: str) -> None:
    store = Store.open(workdir)
    cand = next(c for c in store.iter_candidates() if c.kernel.name == kernel)
    store.close()
    path = workdir / rel_of(cand)
    path.write_text(path.read_text() + extra)


@pytest.fixture(scope="module")
def secret_export(tmp_path_factory):
    """beta's 4 kernels, each with a credential in one text, and negate (clean texts) mined
    from a clone URL that carries a token; exported through the CLI."""
    base = tmp_path_factory.mktemp("secrets")
    beta, neg = base / "beta", base / "negate"
    build_workdir(FIXTURES / "beta", beta).close()
    build_workdir(
        FIXTURES / "nolicense", neg, url=f"https://bot:{GH_TOKEN}@example.org/neg"
    ).close()
    _edit(beta, "bias_leaky_relu_kernel", lambda c: c.wrapper.label_path, f"// {ENV_SECRET}\n")
    _edit(beta, "saxpy_kernel", lambda c: c.tests.path, f'API_KEY = "{OPENAI_KEY}"\n')
    _edit(beta, "clamp_kernel", lambda c: c.reference.path, f"// clone with {GH_TOKEN}\n")
    store = Store.open(beta)
    softplus = next(c for c in store.iter_candidates() if c.kernel.name == "softplus_kernel")
    key = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_BODY}\n-----END OPENSSH PRIVATE KEY-----"
    Reviews(store).write(softplus.id, 1, "cy", "edit_instruction",
                         instruction_complete=f"Write softplus.\n\n{key}\n")  # fmt: skip
    store.close()
    out = base / "o"
    args = ["export", "-w", str(beta), "-w", str(neg), "--out", str(out)]
    done = kminer(*args, "--allow-license", "unknown", env={"OPENAI_API_KEY": ENV_SECRET})
    assert done.returncode == 0, done.stderr
    return out, done


SECRETS_IN_ROWS = {  # kernel: (the secret, the field its row is dropped for; None: kept clean)
    "bias_leaky_relu_kernel": (ENV_SECRET, "label holds the value of $OPENAI_API_KEY"),
    "saxpy_kernel": (OPENAI_KEY, "test_code holds what looks like an OpenAI key"),
    "clamp_kernel": (GH_TOKEN, "reference_code holds what looks like a GitHub token"),
    "softplus_kernel": (KEY_BODY, "instruction_complete holds what looks like a private key"),
    "negate_kernel": (GH_TOKEN, None),
}


@pytest.mark.parametrize("kernel", SECRETS_IN_ROWS)
def test_a_credential_in_a_row_reaches_no_exported_file(secret_export, kernel):
    out, done = secret_export
    secret, why = SECRETS_IN_ROWS[kernel]
    for path in out.parent.rglob("*"):
        if path.is_file() and (out in path.parents or path.name.endswith("report.json")):
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in done.stdout + done.stderr
    report = json.loads((out / "export_report.json").read_text())
    drops = {d["kernel"]: d for d in report["drops"]}
    rows = {r["kernel_name"]: r for r in rows_of(out)}
    if why is None:  # the row stays, naming its repository without the clone's credentials
        assert rows[kernel]["repo"] == "https://example.org/neg" and kernel not in drops
        assert rows[kernel]["label"].startswith(f"// kminer label {rows[kernel]['id']}: from https")
    else:
        assert kernel not in rows and drops[kernel]["reason"] == "secret"
        assert drops[kernel]["detail"].startswith(why)
    assert report["dropped"] == {"secret": 4} and report["rows"] == 1
