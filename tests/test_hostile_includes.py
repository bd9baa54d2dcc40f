"""Hostile includes: a mined kernel that would make nvcc read a file of this machine (an absolute
path, a path out of the checkout, a torch-looking path that climbs out) is refused at closure
with `include_outside`; a chain too deep for any compiler ends as `include_too_deep`, never as a
silent empty closure; and no rendered unit or label ever carries such an include."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import git_repo
from typer.testing import CliRunner

from miner.cli.app import app
from miner.includes import MAX_INCLUDE_DEPTH, exists_on_system, include_problem, is_torch_header

runner = CliRunner()
KERNEL = "__global__ void scale_kernel(float* x, int n) { if (threadIdx.x < n) x[0] *= 2; }\n"
HOST = "void run(float* x, int n) { scale_kernel<<<1, 256>>>(x, n); }\n"


def mine(repo: Path, wd: Path, stages: str = "discover,closure,compile") -> list[dict]:
    res = runner.invoke(app, ["mine", str(repo), "--workdir", str(wd), "--stages", stages])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["candidates", "--workdir", str(wd), "--json"])
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "include",
    [
        '#include "/etc/passwd"',
        "#include </etc/shadow>",
        '#include "../../../etc/hostname"',
        "#include </proc/self/environ>",
        '#include "/dev/zero"',
        '#include "csrc/../../../../etc/hosts"',
    ],
)
def test_an_include_of_a_host_file_is_refused_at_closure(tmp_path, include):
    repo = git_repo(tmp_path / "r", {"csrc/ops.cu": f"{include}\n" + KERNEL + HOST})
    wd = tmp_path / "wd"
    (row,) = mine(repo, wd)
    closure = row["stages"]["closure"]
    assert (closure["status"], closure["reason"]) == ("error", "include_outside")
    assert include.split()[1].strip('"<>') in closure["detail"]
    compile_ = row["stages"]["compile"]
    assert (compile_["status"], compile_["reason"]) == ("skipped", "upstream_failed")
    assert not (wd / "units").exists() or not any((wd / "units").iterdir())
    logs = "".join(p.read_text(errors="replace") for p in (wd / "logs").glob("*"))
    assert "root:" not in logs and "HOSTNAME" not in logs


def test_a_host_include_in_a_header_the_kernel_uses_is_refused(tmp_path):
    files = {
        "csrc/helper.cuh": '#pragma once\n#include "/etc/passwd"\n'
        "__device__ float twice(float x) { return 2 * x; }\n",
        "csrc/ops.cu": '#include "helper.cuh"\n'
        "__global__ void k(float* x) { x[threadIdx.x] = twice(x[threadIdx.x]); }\n"
        "void run(float* x) { k<<<1, 32>>>(x); }\n",
    }
    (row,) = mine(git_repo(tmp_path / "r", files), tmp_path / "wd")
    closure = row["stages"]["closure"]
    assert closure["reason"] == "include_outside" and "csrc/helper.cuh" in closure["detail"]


def test_includes_inside_the_checkout_stay_allowed(tmp_path):
    files = {
        "csrc/common/helper.cuh": "#pragma once\n__device__ float twice(float x) { return 2*x; }\n",
        "csrc/ops/ops.cu": '#include "../common/helper.cuh"\n#include <cstdio>\n'
        "__global__ void k(float* x) { x[threadIdx.x] = twice(x[threadIdx.x]); }\n"
        "void run(float* x) { k<<<1, 32>>>(x); }\n",
    }
    (row,) = mine(git_repo(tmp_path / "r", files), tmp_path / "wd", "discover,closure")
    assert row["stages"]["closure"]["status"] == "ok"


def test_a_chain_deeper_than_any_compiler_is_its_own_reason(tmp_path):
    depth = MAX_INCLUDE_DEPTH + 40
    files = {f"csrc/h{i}.cuh": f'#include "h{i + 1}.cuh"\n' for i in range(depth)}
    files[f"csrc/h{depth}.cuh"] = "#define DEEP 1\n"
    files["csrc/ops.cu"] = '#include "h0.cuh"\n' + KERNEL + HOST
    (row,) = mine(git_repo(tmp_path / "r", files), tmp_path / "wd")
    closure = row["stages"]["closure"]
    assert (closure["status"], closure["reason"]) == ("error", "include_too_deep")
    assert "csrc/ops.cu" in closure["detail"] and str(MAX_INCLUDE_DEPTH) in closure["detail"]


def test_an_include_cycle_is_not_too_deep(tmp_path):
    files = {
        "csrc/a.cuh": '#pragma once\n#include "b.cuh"\n',
        "csrc/b.cuh": '#pragma once\n#include "a.cuh"\n',
        "csrc/ops.cu": '#include "a.cuh"\n' + KERNEL + HOST,
    }
    (row,) = mine(git_repo(tmp_path / "r", files), tmp_path / "wd", "discover,closure")
    assert row["stages"]["closure"]["status"] == "ok"


@pytest.mark.parametrize(
    "header",
    [
        "/etc/passwd",
        "../../../../etc/passwd",
        "cuda_runtime.h/../../../../etc/passwd",
        "ATen/../../../../../etc/passwd",
        "torch/../../../../../../etc/shadow",
    ],
)
def test_no_rendered_include_can_name_a_host_file(header):
    assert not exists_on_system(header) and not is_torch_header(header)


def test_include_problem_tells_inside_from_outside():
    assert include_problem("/etc/passwd", "a/b.cu").startswith("#include of an absolute path")
    assert "leaves the checkout" in include_problem("../../x.h", "a/b.cu")
    assert include_problem("../x.h", "a/b.cu") == ""  # a/../x.h: still inside
    assert include_problem("ATen/ATen.h", "a/b.cu") == ""
