"""The repository's CPU driver of an op (a Python function beside the CUDA one) as its reference."""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import mined_labels

from miner.candidate import StageName, Status
from miner.discover import discover
from testgen.driver_twin import driver_twins
from testgen.generate import generate_for
from testgen.inputs import record_repo_calls
from testgen.reference import RepoRefs

FIXTURE = Path(__file__).parent / "fixtures" / "boxrepo"


def test_the_cpu_driver_beside_the_cuda_one_and_how_the_binding_arguments_map():
    refs = RepoRefs(discover(FIXTURE))
    (twin,) = driver_twins(refs, "points_in_boxes_all_forward")
    assert (twin.cuda_driver, twin.cpu_driver) == ("points_in_boxes_all", "points_in_boxes_cpu")
    assert (twin.module, twin.cpu_binding) == ("ext_module", "points_in_boxes_cpu_forward")
    # boxes.contiguous(), points.contiguous(), and the tensor the CUDA driver returns
    assert twin.args == (("param", "boxes"), ("param", "points"), ("output",))
    # no CUDA driver calls the CPU binding; `points_in_boxes_first` drives no binding itself
    assert driver_twins(refs, "points_in_boxes_cpu_forward") == []


def test_a_driver_whose_binding_argument_is_computed_gives_no_twin(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "repo")
    init = tmp_path / "repo" / "boxops" / "ops.py"
    init.write_text(init.read_text().replace("(boxes.contiguous(),", "(boxes * 2,"))
    assert driver_twins(RepoRefs(discover(tmp_path / "repo")), "points_in_boxes_all_forward") == []


@pytest.mark.slow
def test_the_kernel_is_checked_against_the_cpu_driver_over_its_own_binding(tmp_path):
    """No PyTorch function beside the op in the tests, no CPU function of the launcher's
    parameters: the reference is `points_in_boxes_cpu` as written, with its extension module
    built from the CPU binding's C++; the one recorded call of one sample gets more points."""
    repo, work = tmp_path / "repo", tmp_path / "work"
    shutil.copytree(FIXTURE, repo)
    cand = mined_labels(repo, work)["points_in_boxes_all_kernel"]
    generate_for(cand, RepoRefs(discover(repo)), record_repo_calls(repo, work / "rec"), work)
    done = cand.stage(StageName.TESTGEN)
    assert done.status == Status.OK, done.detail
    assert (cand.reference.kind, cand.reference.function) == ("python", "points_in_boxes_cpu")
    assert done.metrics["num_shapes"] >= 3  # rows of points drawn and cut within the sample
    namespace: dict = {}
    code = (work / cand.reference.path).read_text()
    exec(compile(code, "reference.py", "exec"), namespace)  # builds the CPU binding
    boxes = torch.tensor([[[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 4.0]]])
    points = torch.tensor([[[1.5, 1.5], [2.5, 3.0], [5.0, 5.0]]])
    out = torch.zeros(1, 3, 2, dtype=torch.int)
    namespace["reference"](boxes, points, out)
    assert out[0].tolist() == [[1, 1], [0, 1], [0, 0]]  # (point, box), as the CUDA driver's
    assert "(1, 3, 2) from the CPU driver, (1, 2, 3) written" in _refused(namespace, boxes, points)


def _refused(namespace, boxes, points) -> str:
    """A buffer of another layout than the CPU driver's result: refused, not mis-copied."""
    try:
        namespace["reference"](boxes, points, torch.zeros(1, 2, 3, dtype=torch.int))
    except RuntimeError as e:
        return str(e)
    return ""
