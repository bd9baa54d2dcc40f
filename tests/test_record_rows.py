"""A test's call too large to record is kept as its first rows, with its reference's call."""

import torch
from conftest import write_tree

from miner.discover import discover
from testgen.cases import _cut_not_a_count
from testgen.inputs import RecordedCall, record_repo_calls
from testgen.reference import RepoRefs
from testgen.standalone.record_rows import cut_call, rows_cut

BINDING = """#include <torch/extension.h>
at::Tensor partition_forward(const at::Tensor& x, int B, int window);
at::Tensor spread_forward(const at::Tensor& x, int height, int window);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("partition_forward", &partition_forward);
  m.def("spread_forward", &spread_forward);
}
"""
OPS = """from . import _ext


def partition(x, batch, window):
    return _ext.partition_forward(x, batch, window)
"""
# Swin-Transformer's window test, at a size the recorder does not keep (4.9 M elements)
TEST = """import torch
from winops.ops import partition


def partition_ref(x, window):
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window, window, C)


def test_partition():
    x = torch.randn(300, 64, 64, 4)
    expected = partition_ref(x.clone(), 8)
    torch.testing.assert_close(partition(x, 300, 8), expected)
"""


def test_a_call_too_large_to_record_is_kept_as_its_first_rows_with_its_reference(tmp_path):
    repo = write_tree(
        tmp_path / "repo",
        {
            "winops/__init__.py": "",
            "winops/ops.py": OPS,
            "winops/src/bind.cpp": BINDING,
            "tests/test_partition.py": TEST,
        },
    )
    recorded = record_repo_calls(repo, tmp_path / "cache")
    (call,) = recorded["partition_forward"]
    assert call.rows_cut == [300, 16, [1]]  # 16 rows of 64 x 64 x 4 fit; `batch` was 300
    assert tuple(call.args[0].shape) == (16, 64, 64, 4) and call.args[1:] == [16, 8]
    assert call.returned == []  # what the whole call returned is not what its rows would
    (ref,) = [r for r in recorded.refs if r.function == "partition_ref"]
    assert ref.partners == [call] and torch.equal(ref.args[0], call.args[0])
    # run again on the rows kept: its result is its result for them
    assert tuple(ref.result[0].shape) == (16 * 64, 8, 8, 4)
    x = ref.args[0]
    windows = x.view(16, 8, 8, 8, 8, 4).permute(0, 1, 3, 2, 4, 5).reshape(-1, 8, 8, 4)
    assert torch.equal(ref.result[0], windows)

    refs = RepoRefs(discover(repo))
    assert _cut_not_a_count(call, refs) == ""  # `B` is named as a count
    spread = RecordedCall("spread_forward", call.args, {}, rows_cut=[300, 16, [1]])
    why = _cut_not_a_count(spread, refs)
    assert "`height`, which is not named as a count" in why


def test_only_the_rows_of_the_items_are_cut():
    big = torch.zeros(300, 64, 64, 4)
    assert rows_cut([big, torch.zeros(300, 2), 300], 1 << 22) == (300, 16)
    assert rows_cut([big[:, :, :2], 300], 1 << 22) is None  # not too large: nothing to cut
    # the row count sizes another dimension too (a pairwise matrix): no cut
    assert rows_cut([torch.zeros(3000, 3000)], 1 << 22) is None
    # a tensor without those rows is too large itself
    assert rows_cut([big, torch.zeros(5, 1 << 22)], 1 << 22) is None
    # two too-large tensors of different row counts
    assert rows_cut([big, torch.zeros(301, 64, 64, 4)], 1 << 22) is None
    # a row too wide for even one row to fit
    assert rows_cut([torch.zeros(2, 1 << 23)], 1 << 22) is None
    args, kwargs, mark = cut_call((big, 300, 7), {"n": 300, "flag": True}, 1 << 22)
    assert tuple(args[0].shape) == (16, 64, 64, 4) and args[1:] == (16, 7)
    assert kwargs == {"n": 16, "flag": True} and mark == [300, 16, [1, "n"]]
    args[0].fill_(1.0)  # a copy: the test's own tensor is not changed through it
    assert big.abs().sum() == 0
