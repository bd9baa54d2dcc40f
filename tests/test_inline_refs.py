"""Expected values a test computes in line become references (testgen/standalone/inline_refs.py),
paired with the extension call through a wrapper that transposes what it wrote."""

import ast
import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from testgen.inputs import record_repo_calls
from testgen.python_reference import _outputs, adapter, pair
from testgen.standalone import inline_refs
from testgen.vendor import vendor_function

FIXTURE = Path(__file__).parent / "fixtures" / "pyrefrepo"


def _lifted(source: str) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(source))
    return {fn.name: ast.unparse(fn) for fn in inline_refs.lifted_functions(tree)}


def test_the_expected_side_of_a_check_is_lifted_from_what_the_op_side_does_not_share():
    lifted = _lifted(
        """
        import torch
        from pkg import op

        def test_op(device):
            import numpy as np
            x = torch.rand(4, 3, device=device)
            out = op(x)
            total = []
            for row in x:
                total.append(np.float32(row.sum()))
            expected = torch.tensor(total)
            assert torch.allclose(out, expected)
            assert out.shape == expected.shape
        """
    )
    (name,) = lifted
    assert name == "expected_of_test_op"
    body = lifted[name]
    assert body.startswith("def expected_of_test_op(x):")  # `row`, bound by the loop, is none
    assert "import numpy as np" in body  # the test's own import travels inside it
    assert " op(" not in body and "torch.rand" not in body  # the op's side stays in the test


def test_literal_answers_shapes_and_foreign_helpers_are_not_lifted():
    lifted = _lifted(
        """
        import torch
        from pkg import op, helper

        def test_literal(device):
            out = op(torch.ones(3, device=device))
            expected = torch.tensor([1.0, 2.0, 3.0], device=device)
            assert torch.allclose(out, expected)

        def test_helper():
            x = torch.rand(3)
            assert torch.equal(op(x), helper(x))

        def test_shape():
            x = torch.rand(3)
            assert op(x).shape == x.shape
        """
    )
    assert lifted == {}  # `device` only places a literal; `helper` is the package's own code


def test_the_recorder_keeps_what_the_lifted_statements_read_and_computed_without_rerunning():
    tree = ast.parse((FIXTURE / "tests" / "test_nearest.py").read_text())
    source = ast.unparse(inline_refs.apply(tree, "tests/test_nearest.py"))
    lines = [ln.strip() for ln in source.splitlines()]
    first = lines.index("center_ = center.unsqueeze(2).repeat(1, 1, xyz.shape[1], 1)")
    last = lines.index("expected_idx = dist.topk(k=3, dim=2, largest=False)[1].transpose(2, 1)")
    name = "'tests/test_nearest.py', 'expected_idx_of_test_nearest'"
    assert lines[first - 1] == f"__kminer_inline_args__({name}, [center, xyz])"
    assert lines[last + 1] == f"__kminer_inline_result__({name}, expected_idx)"
    assert "def expected_idx_of_test_nearest" not in source  # computed once, by the test
    at = lines.index("idx = nearest(3, xyz, center)")  # its partners: the calls made here
    assert (
        lines[at - 1] == "with __kminer_inline_op__('tests/test_nearest.py', "
        "['expected_idx_of_test_nearest']):"
    )


def test_a_lifted_reference_pairs_through_a_transposing_wrapper_and_runs_alone(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    recorded = record_repo_calls(repo, tmp_path / "cache")
    assert len(recorded["nearest"]) == 4  # (k = 3 and k = 1, for m = 5 and m = 4)
    lifted = [r for r in recorded.refs if r.function == "expected_idx_of_test_nearest"]
    assert len(lifted) == 2  # its partners: the calls of the statement its check compares
    assert all(c.args[7] == 3 for r in lifted for c in r.partners)
    (p,) = [p for p in pair(recorded.refs, "nearest", repo, "void") if "nearest" in p.function]
    assert (p.file, p.function) == ("tests/test_nearest.py", "expected_idx_of_test_nearest")
    assert p.params == {"center": ("arg", 1), "xyz": ("arg", 0)}
    # written into `idx` (the integer output) as the wrapper transposed it back; `dist2` (a
    # second output the test's expression never computes) is left out of the comparison
    assert p.outputs == [("arg", 2, [0, 2, 1])]
    assert p.unchecked == [3]
    assert p.fixed == {}  # b, n, m, k: lengths of the tensors' dimensions, not fixed values

    body = vendor_function(repo, p.file, p.function)
    code = body + adapter(p, ["xyz", "center", "idx", "dist2", "b", "n", "m", "k"])
    assert "UNCHECKED = [3]" in code
    namespace: dict = {}
    exec(compile(code, "reference.py", "exec"), namespace)
    xyz, center = torch.randn(3, 12, 3), torch.randn(3, 7, 3)  # a shape no test used
    idx, dist2 = torch.zeros(3, 7, 3, dtype=torch.int32), torch.zeros(3, 7, 3)
    namespace["reference"](xyz, center, idx, dist2, 3, 12, 7, 3)
    d = torch.cdist(center, xyz)
    want = d.topk(3, dim=2, largest=False).indices
    assert torch.equal(idx.long(), want)


def test_a_square_output_tries_each_order_its_shape_allows():
    out = torch.arange(8.0).reshape(2, 2, 2)
    call = SimpleNamespace(args=[torch.zeros(4), torch.zeros(2, 2, 2)])
    ref = SimpleNamespace(result=[out])
    first, others = _outputs([(call, ref)], {0}, "void")
    assert first == [("arg", 1)]  # as it is, first
    assert others[0] == [("arg", 1, [0, 2, 1])]  # then reordered: the last two swapped first
    assert len(others) == 3  # (of the five other orders: a few tries, each a sandbox run)


def test_a_tensor_the_wrapper_hands_over_transposed_is_read_back_in_its_order():
    from testgen.python_reference import _tensor_sources

    x = torch.randn(2, 5, 3)
    call = SimpleNamespace(args=[x.transpose(1, 2).contiguous(), torch.zeros(2, 3, 5)])
    found = _tensor_sources([(call, {"x": x})], "x")
    assert found == {(0, (0, 2, 1))}  # binding argument 0 is x.permute(0, 2, 1)
    assert _tensor_sources([(call, {"x": x.clone()})], "x") == found
    assert _tensor_sources([(call, {"x": torch.randn(2, 5, 3)})], "x") == set()


def test_the_adapter_hands_the_function_its_tensor_in_the_order_the_test_had_it():
    from testgen.python_reference import Pairing

    p = Pairing("double_last", "t.py", {"x": ("arg", 0, [0, 2, 1])}, [("arg", 1, [0, 2, 1])])
    code = "def double_last(x):\n    return x * 2\n" + adapter(p, ["xt", "out"])
    namespace: dict = {}
    exec(compile(code, "reference.py", "exec"), namespace)
    x = torch.randn(2, 5, 3)
    out = torch.zeros(2, 3, 5)  # the binding's layout: channels first
    namespace["reference"](x.transpose(1, 2).contiguous(), out)
    assert torch.equal(out, (x * 2).transpose(1, 2))


def test_a_recorded_call_too_large_to_embed_comes_over_as_its_first_rows():
    from testgen.cases import MAX_ELEMENTS, embeddable

    n = MAX_ELEMENTS // 3  # (two tensors of 3 columns: twice what fits)
    feats, coors = torch.rand(n, 3), torch.randint(-1, 20, (n, 3), dtype=torch.int32)
    rows, args = embeddable([feats, coors, 1], ["feats", "coors", "reduce_type"])
    assert 0 < rows < n and args[0].shape == (rows, 3) and args[2] == 1
    assert torch.equal(args[1], coors[:rows])  # the first rows, as recorded
    small = [feats[:5], coors[:5], 1]
    assert embeddable(small, ["feats", "coors", "reduce_type"]) == (0, small)
    table = torch.rand(1, 2 * MAX_ELEMENTS)  # one row: nothing to cut
    assert embeddable([table], ["table"]) == (0, None)


def test_a_grid_too_large_to_embed_comes_over_as_a_corner():
    """torchmcubes' example runs marching cubes on a 128^3 field: no rows to cut, so a corner
    of it (each dimension halved, the largest first, until it fits) is the call; not where an
    integer argument is one of its sizes, which the kernel is told too."""
    from testgen.cases import MAX_ELEMENTS, cropped

    field = torch.rand(128, 128, 128)
    (corner, thresh) = cropped([field, 15.0])
    assert corner.numel() <= MAX_ELEMENTS and thresh == 15.0
    assert corner.shape == (64, 128, 128) and torch.equal(corner, field[:64])
    assert cropped([field, 128]) is None  # a size the kernel is also told
    assert cropped([field, torch.zeros(3)]) is None  # more than one tensor
    assert cropped([torch.rand(1, 2 * MAX_ELEMENTS)]) is None  # one row: no grid


def test_a_mode_string_passed_through_the_repositorys_converter_is_its_enumerators_number():
    from testgen.carry import _mode_number
    from testgen.interp import Unmappable

    converter = """inline reduce_t convert_reduce_type(const std::string &reduce_type) {
      if (reduce_type == "max") return reduce_t::MAX;
      else if (reduce_type == "mean") return reduce_t::MEAN;
      TORCH_CHECK(false, "no such type");
    }"""
    header = SimpleNamespace(
        code="typedef enum { SUM = 0, MEAN = 1, MAX = 2 } reduce_t;\n"
        "enum class other_t { MAX = 7 };"
    )
    refs = SimpleNamespace(
        definition=lambda name, host_side=False: "item" if name == "convert_reduce_type" else None,
        text=lambda item: converter,
        disc=SimpleNamespace(models={"h.cuh": header}),
    )
    env = {"reduce_type": "max"}
    assert _mode_number("convert_reduce_type(reduce_type)", env, refs) == 2  # reduce_t's MAX
    assert _mode_number("convert_reduce_type(reduce_type)", {"reduce_type": "mean"}, refs) == 1
    with pytest.raises(Unmappable):
        _mode_number("convert_reduce_type(reduce_type)", {"reduce_type": "sum"}, refs)


def test_recorded_calls_the_pytorch_reference_raises_on_are_left_out():
    from testgen.cases import BaseCall
    from testgen.generate import _within_reference

    code = (
        "import torch\n\n\ndef reference(x, out):\n"
        "    out.copy_(torch.stack([r for r in x if r.sum() > 0]).sum(0))\n"
    )
    good = BaseCall([torch.ones(3, 2), torch.zeros(2)], "t")
    empty = BaseCall([-torch.ones(3, 2), torch.zeros(2)], "t")  # no row to stack
    kept, why = _within_reference([empty, good], code)
    assert len(kept) == 1 and kept[0] is good
    assert "raises" in why[0] and "non-empty" in why[0]
    kept, why = _within_reference([empty], code)  # on none: all stay (and fail as cases)
    assert kept[0] is empty and why == []
