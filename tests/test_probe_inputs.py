"""Inputs drafted for an op no test calls and kept where its CPU implementation, built with
AddressSanitizer, runs them clean (testgen/probe_inputs.py)."""

from __future__ import annotations

import pytest
import torch

from testgen.cases import BaseCall, plan
from testgen.probe_inputs import KEEP, TIES, _edges_checked, asan_build, drafts, probed_calls
from testgen.probe_slots import TensorFacts, read_facts, slots_for

LABEL = """
at::Tensor scatter_rows_cuda(const at::Tensor feats, const at::Tensor idx,
                             const at::Tensor coords, const int s) {
  int c = feats.size(1);
  int n = idx.size(0);
  scatter_rows_kernel<<<n, c>>>(feats.data_ptr<float>(), idx.data_ptr<int>(),
                                coords.data_ptr<int>(), c);
  return feats;
}
"""
PARAMS = [
    ("const at::Tensor", "feats"),
    ("const at::Tensor", "idx"),
    ("const at::Tensor", "coords"),
    ("const int", "s"),
]

# the CPU twin: rows of `feats` added into `s` rows at `idx` (no guard for a negative index),
# and a sum of four ints per row of `coords`, whose code reads only its first size
REFERENCE = r"""
#include <torch/extension.h>
std::vector<at::Tensor> scatter_rows_cpu(const at::Tensor f, const at::Tensor ix,
                                         const at::Tensor co, const int s) {
  int n = ix.size(0), c = f.size(1), m = co.size(0);
  auto out = torch::zeros({s, c}, f.options());
  auto sums = torch::zeros({m}, co.options());
  const int* index = ix.data_ptr<int>();
  for (int i = 0; i < n; i++)
    for (int j = 0; j < c; j++)
      out.data_ptr<float>()[index[i] * c + j] += f.data_ptr<float>()[i * c + j];
  for (int i = 0; i < m; i++)
    for (int k = 0; k < 4; k++) sums.data_ptr<int>()[i] += co.data_ptr<int>()[4 * i + k];
  return {out, sums};
}
void kminer_bind(pybind11::module_& m) { m.def("reference", &scatter_rows_cpu); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }
"""
TWIN_NAMES = ["f", "ix", "co", "s"]


def test_the_code_says_each_tensors_dtype_rank_and_checked_sizes():
    code = """
      TORCH_CHECK(boxes.size(1) == 7);
      auto acc = points.accessor<float, 3>();
      int64_t* order = keep.data_ptr<int64_t>();
      TORCH_CHECK(mask.scalar_type() == at::kBool);
      AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "f", [&] { x.data_ptr<scalar_t>(); });
      int* corners = nbr.data_ptr<int>() + i * 8;
      float* plane = p.data_ptr<float>() + b * 3 * n;
    """
    facts = {name: TensorFacts() for name in ("boxes", "points", "keep", "mask", "x", "nbr", "p")}
    for name, f in facts.items():
        read_facts(code, name, f)
    assert facts["boxes"].fixed_dims == {1: 7} and facts["boxes"].ndim == 2
    assert facts["points"].ndim == 3 and facts["points"].dtype == torch.float32
    assert facts["keep"].dtype == torch.int64
    assert facts["mask"].dtype == torch.bool
    assert facts["x"].dtype == torch.float32  # a dispatch's template type
    # rows of eight read from a pointer stepped by a literal: the last dimension is 8
    assert facts["nbr"].row == 8 and facts["nbr"].shape(5, 0) == [5, 8]
    assert facts["p"].row is None and facts["p"].shape(5, 0) == [5]  # a product, no row width
    # a size counted from the end (PyTorch-Encoding's rectify: `output.size(-2)`) needs as many
    out = TensorFacts()
    read_facts(
        "const int64_t h = output.size(-2); const int64_t w = output.size( -1 );", "output", out
    )
    assert out.ndim == 2


def test_rows_read_through_a_pointer_to_the_data_fix_the_last_dimension():
    """OpenPCDet's boxes_iou_bev_cpu takes `const float *boxes_a = boxes_a_tensor.data<float>();`
    and reads `boxes_a + i * 7`: boxes of seven numbers each (drafted (16, 16) before, which a
    kernel reading rows by the tensor's stride would take for 16-wide boxes). A pointer stepped
    by two widths, or by a product, says nothing."""
    code = """
      const float *boxes_a = boxes_a_tensor.data<float>();
      float* const pts = pts_tensor.data_ptr<float>();
      int *mixed = mixed_tensor.data_ptr<int>();
      float *ans = ans_tensor.data<float>();
      for (int i = 0; i < n; i++) {
        out[i] = iou(boxes_a + i * 7, pts[j * 3 + 2]);
        mixed[i * 4] = mixed[k * 2];
        ans[i * m + j] = ans[i * 3 * c];
      }
    """
    facts = {
        n: TensorFacts() for n in ("boxes_a_tensor", "pts_tensor", "mixed_tensor", "ans_tensor")
    }
    for name, f in facts.items():
        read_facts(code, name, f)
    assert facts["boxes_a_tensor"].row == 7 and facts["boxes_a_tensor"].shape(5, 0) == [5, 7]
    assert facts["pts_tensor"].row == 3
    assert facts["mixed_tensor"].row is None and facts["ans_tensor"].row is None


HANDED = """
template <typename T>
void pool_rois_cpu_kernel(const int nthreads, const T* bottom_data,
                          const T* bottom_rois,  // int roi_cols, (commented out, a comma)
                          T* top_data) {
  int roi_cols = 5;
  for (int n = 0; n < nthreads; n++) {
    const T* offset_rois = bottom_rois + n * roi_cols;
    top_data[n] = offset_rois[1] + offset_rois[4] * bottom_data[0];
  }
}
template <typename T>
__global__ void pool_rois_kernel(const int nthreads, const T* bottom_data, const T* rois,
                                 T* top) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < nthreads; i += 4) {
    top[i] = rois[i * 5 + 1] + rois[i * 5 + 4] * bottom_data[0];
  }
}
at::Tensor pool_rois(const at::Tensor& input, const at::Tensor& rois, const at::Tensor& pts) {
  auto out = at::empty({rois.size(0)}, input.options());
  pool_rois_cpu_kernel<float>(rois.size(0), input.data<float>(), rois.data<float>(),
                              out.data<float>());
  pool_rois_kernel<float><<<GET_BLOCKS(rois.size(0)), 256, 0, stream>>>(
      rois.size(0), input.contiguous().data_ptr<float>(), rois.contiguous().data_ptr<float>(),
      out.data_ptr<float>());
  both_widths(pts.data_ptr<float>());
  return out;
}
void both_widths(const float* p) { float a = p[i * 3] + p[j * 4]; }
"""


def test_rows_of_data_handed_to_a_function_or_a_kernel_fix_the_last_dimension():
    """maskrcnn-benchmark's ROIAlign hands `rois.data<scalar_t>()` to a CPU loop that steps it
    by `int roi_cols = 5` and to a kernel that steps it by `n * 5`: rows of five (drafted as one
    long row before, which every draft read past). A loop index is no width (`int n = 0`), and
    a pointer stepped by two widths says nothing."""
    facts = {n: TensorFacts() for n in ("input", "rois", "pts", "out")}
    for name, f in facts.items():
        read_facts(HANDED, name, f)
    assert facts["rois"].row == 5 and facts["rois"].shape(6, 0) == [6, 5]
    assert facts["input"].row is None and facts["pts"].row is None
    assert facts["out"].row is None  # written by index only
    cpu_only = HANDED[: HANDED.index("template <typename T>\n__global__")]
    cpu_only += HANDED[HANDED.index("at::Tensor pool_rois") :].replace("pool_rois_kernel", "f")
    found = TensorFacts()
    read_facts(cpu_only, "rois", found)
    assert found.row == 5  # the local constant alone


RELAYED = """
#ifdef TORCH_OLD
#define DATA_PTR data
#else
#define DATA_PTR data_ptr
#endif
__global__ void blend_kernel(int b, int c, int m, int n, const float* __restrict__ feats,
                             const int* __restrict__ idx, const float* __restrict__ w,
                             float* __restrict__ out) {
  idx += blockIdx.x * n * 3;
  w += blockIdx.x * n * 3;
  for (int i = threadIdx.x; i < c * n; i += blockDim.x) {
    const int j = i % n;
    out[i] = feats[idx[j * 3 + 0]] * w[j * 3 + 0] + feats[idx[j * 3 + 1]] * w[j * 3 + 1];
  }
}
void blend_launcher(int b, int c, int m, int n, const float* feats, const int* idx,
                    const float* w, float* out) {
  blend_kernel<<<b, 256>>>(b, c, m, n, feats, idx, w, out);
}
at::Tensor blend(at::Tensor feats, at::Tensor idx, at::Tensor w) {
  at::Tensor out = torch::zeros({feats.size(0), feats.size(1), idx.size(1)}, feats.options());
  blend_launcher(feats.size(0), feats.size(1), feats.size(2), idx.size(1),
                 feats.DATA_PTR<float>(), idx.DATA_PTR<int>(), w.DATA_PTR<float>(),
                 out.DATA_PTR<float>());
  return out;
}
"""


def test_rows_of_data_relayed_through_a_launcher_under_a_data_macro_fix_the_last_dimension():
    """torch-points-kernels reads a tensor's data through `DATA_PTR` (a macro for `data` or
    `data_ptr` by torch version) and hands it to a launcher that hands it on to the kernel,
    which alone steps it by rows of 3. Before, the probe saw neither the dtype nor the rows:
    it drafted `idx` as (n, n), the CPU twin read n neighbours a row where the kernel reads 3,
    and every drafted case disagreed on the GPU."""
    params = [("at::Tensor", "feats"), ("at::Tensor", "idx"), ("at::Tensor", "w")]
    slots = slots_for(params, [(RELAYED, [n for _, n in params])])
    feats, idx, w = (s.facts for s in slots)
    assert idx.dtypes == [torch.int32] and feats.dtypes == [torch.float32]
    assert idx.row == 3 and w.row == 3 and feats.row is None
    assert idx.shape(10, 0) == [10, 3]
    unrelayed = RELAYED.replace("blend_kernel<<<b, 256>>>(b, c, m, n, feats, idx, w, out)", "")
    assert slots_for(params, [(unrelayed, [n for _, n in params])])[1].facts.row is None


def test_rois_handed_to_a_cpu_loop_are_drafted_as_rows_it_reads_clean(tmp_path):
    """The probe's calls of a ROI op whose CPU twin reads rows of five only inside the loop it
    hands the data to: each kept call has rois of five columns, with as many rows as drafted."""
    reference = tmp_path / "pool_rois.cpp"
    reference.write_text(
        "#include <torch/extension.h>\n"
        + HANDED[: HANDED.index("template <typename T>\n__global__")]
        + """
at::Tensor pool_rois_cpu(const at::Tensor& input, const at::Tensor& rois) {
  auto out = at::zeros({rois.size(0)}, input.options());
  pool_rois_cpu_kernel<float>(rois.size(0), input.data_ptr<float>(), rois.data_ptr<float>(),
                              out.data_ptr<float>());
  return out;
}
void kminer_bind(pybind11::module_& m) { m.def("reference", &pool_rois_cpu); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }
"""
    )
    params = [("const at::Tensor&", "input"), ("const at::Tensor&", "rois")]
    text = reference.read_text()
    calls = probed_calls(params, [(text, ["input", "rois"])], reference, tmp_path / "probes")
    assert isinstance(calls, list) and calls, calls
    for call in calls:
        _, rois = call.args
        assert rois.dim() == 2 and rois.shape[1] == 5, rois.shape
    assert len({c.args[1].shape[0] for c in calls}) == 3  # three sizes, as any probe drafts


COMPOSITE = """
std::vector<at::Tensor> aggregate_backward_cpu(const at::Tensor GE, const at::Tensor A,
                                               const at::Tensor X, const at::Tensor C,
                                               const at::Tensor S) {
  auto gradA = (GE.unsqueeze(1) * (X.unsqueeze(2).expand({X.size(0), X.size(1),
    C.size(0), C.size(1)}) - C.unsqueeze(0).unsqueeze(0))).sum(3);
  auto gradX = at::bmm(A, GE);
  auto gradS = (gradA * S.view({1, 1, C.size(0)})).sum(0).sum(0);
  return {gradA, gradX, gradS};
}
"""


def test_ranks_read_from_aten_ops_a_composite_cpu_twin_applies():
    """PyTorch-Encoding's CPU backward passes are ATen composites that read no size of most
    tensors: `at::bmm(A, GE)` takes batches of matrices, `X.unsqueeze(2).expand({4 sizes})`
    makes a 3-d X 4-d, `S.view({1, 1, K})` is K numbers (the unit dims are the view's, not
    S's: a 3-d S drafted from it never fit), `devicetensor<scalar_t, 3>(G)` is a 3-d view."""
    names = ["GE", "A", "X", "C", "S"]
    facts = {n: TensorFacts() for n in names}
    for name, f in facts.items():
        read_facts(COMPOSITE, name, f)
    assert (facts["GE"].ndim, facts["A"].ndim) == (3, 3)  # exactly: no wider draft
    assert facts["GE"].fixed_rank == 3 and facts["X"].ndim == 3
    assert facts["C"].ndim == 2 and facts["S"].ndim == 1
    typed = TensorFacts()
    read_facts("auto G = devicetensor<scalar_t, 3>(GSL_);", "GSL_", typed)
    assert typed.ndim == 3


def test_a_composite_cpu_twin_gets_drafts_in_the_ranks_its_aten_ops_take(tmp_path):
    reference = tmp_path / "aggregate.cpp"
    reference.write_text(
        "#include <torch/extension.h>\n"
        + COMPOSITE
        + "void kminer_bind(pybind11::module_& m) {\n"
        + '  m.def("reference", &aggregate_backward_cpu);\n}\n'
        + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }\n"
    )
    params = [("const at::Tensor", n) for n in ("GE", "A", "X", "C", "S")]
    text = reference.read_text()
    calls = probed_calls(params, [(text, [n for _, n in params])], reference, tmp_path / "p")
    assert isinstance(calls, list) and calls, calls  # before: no draft ran clean
    for call in calls:
        ge, a, x, _, s = call.args
        assert (ge.dim(), a.dim(), x.dim(), s.dim()) == (3, 3, 3, 1)


def test_a_draft_the_twin_refuses_is_refused_not_a_memory_error(tmp_path):
    """A C++ exception (a TORCH_CHECK refusing the draft) used to end the probe's process in a
    sanitizer CHECK failure (`real___cxa_throw` not found: the C++ runtime came after it), so
    every refused draft read as a memory error and the reason said `asan`."""
    reference = tmp_path / "refuses.cpp"
    reference.write_text(
        "#include <torch/extension.h>\n"
        "at::Tensor refuses(const at::Tensor x) {\n"
        '  TORCH_CHECK(x.dim() == 7, "seven dims, please");\n  return x * 2;\n}\n'
        'void kminer_bind(pybind11::module_& m) { m.def("reference", &refuses); }\n'
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }\n"
    )
    why = probed_calls([("const at::Tensor", "x")], [], reference, tmp_path / "p")
    assert isinstance(why, str) and "(raised)" in why and "asan" not in why, why


def test_the_codes_own_type_names_and_row_strides_are_read():
    """SparseConvNet reads every index as `data_ptr<Int>()` under `using Int = int32_t;`, and
    steps a feature matrix by `stride(0)`: an Int tensor of rank 2, not a float vector."""
    from wrappers.adapter import aliases as type_aliases

    code = """
      using Int = int32_t;
      typedef long long index_t;
      template <Int d> using Point = std::array<Int, d>;
      auto r = rules.data_ptr<Int>();
      auto o = offsets.data_ptr<index_t>();
      float v = feats.data_ptr<float>()[row * feats.stride(0) + j];
    """
    aliases = type_aliases(code)
    assert aliases["Int"] == "int32_t" and aliases["index_t"] == "long long"
    facts = {name: TensorFacts() for name in ("rules", "offsets", "feats")}
    for name, f in facts.items():
        read_facts(code, name, f, aliases)
    assert facts["rules"].dtype == torch.int32 and facts["offsets"].dtype == torch.int64
    assert facts["feats"].ndim == 2  # a row's stride: the rows have columns
    unaliased = TensorFacts()
    read_facts(code, "rules", unaliased)
    assert unaliased.dtype == torch.float32  # unknown to the table: taken for a template type


def test_typed_views_copies_and_index_tables_are_read_as_the_code_uses_them():
    """spconv-derived code reads tensors through typed views (`tv::torch2tv<const int>(pairs)
    .subview(i, inverse)`: int, and two indices deep into a table of rank 3) and counts through
    a host copy (`auto num = indiceNum.to({torch::kCPU}); num.data_ptr<int>()`). An integer
    table's rows hold distinct indices: a kernel writing through a row would race on a repeat."""
    code = """
      auto numCpu = indiceNum.to({torch::kCPU});
      auto nHot = numCpu.data_ptr<int>()[i];
      gather(tv::torch2tv<scalar_t>(buffer), tv::torch2tv<const int>(pairs).subview(i, inverse));
      auto ndim = filters.dim() - 2;
    """
    facts = {name: TensorFacts() for name in ("indiceNum", "pairs", "buffer", "filters", "other")}
    for name, f in facts.items():
        read_facts(code, name, f)
    assert facts["indiceNum"].dtype == torch.int32 and facts["indiceNum"].ndim == 1
    assert facts["pairs"].dtype == torch.int32 and facts["pairs"].ndim == 3
    assert facts["buffer"].dtype == torch.float32 and facts["buffer"].ndim == 1
    assert facts["filters"].ndim == 3  # `dim() - 2` spatial dimensions: one at least
    assert facts["other"].dtypes == []  # nothing said: no dtype noted
    slots = slots_for(
        [("at::Tensor", "pairs"), ("at::Tensor", "indiceNum")], [(code, ["pairs", "indiceNum"])]
    )
    pairs, num = drafts(slots, 7)[0][1]
    assert pairs.shape == (7, 7, 7) and num.shape == (7,)
    rows = pairs.reshape(-1, 7)
    assert all(len(set(r.tolist())) == 7 for r in rows)  # 7 distinct of the 8 in [-1, 7)
    assert rows.min() == -1 and rows.max() == 6
    assert (num.min(), num.max()) == (-1, 6)  # a vector: every value of the range, as before


def test_drafts_start_from_the_widest_range_and_the_size_itself():
    slots = slots_for(PARAMS, [(LABEL, [n for _, n in PARAMS])])
    assert [s.kind for s in slots] == ["tensor", "tensor", "tensor", "int"]
    assert slots[1].facts.dtype == torch.int32 and slots[0].facts.ndim == 2
    made = drafts(slots, 7)
    combo, (feats, idx, coords, s) = made[0]
    assert coords.shape == (7,) and coords.dtype == torch.int32
    assert combo == (0, 0, 0, 0)
    assert feats.shape == (7, 7) and feats.dtype == torch.float32
    assert idx.shape == (7,) and idx.dtype == torch.int32 and s == 7
    assert idx.min() == -1 and idx.max() == 6  # both ends of [-1, n) are there
    # the next drafts step one slot at a time; a wider tensor comes after its value ranges
    assert made[1][0] in {(0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0)}
    ranks = [args[2].dim() for _, args in made]
    assert ranks.index(2) > ranks.index(1) == 0
    assert len({c for c, _ in made}) == len(made)


def test_a_string_parameter_tries_the_modes_the_code_names():
    """pytorch_sparse's spmm_value_bw takes `std::string reduce`, read through a dispatch
    macro's table of words; a comparison names a mode too. A string the code names no word
    for is no draft."""
    from testgen.probe_slots import string_modes

    table = 'const std::map<std::string, R> reduce2REDUCE = {\n  {"sum", SUM}, {"mean", MEAN},\n};'
    code = table + '\nif (reduce == "max") {}\nTORCH_CHECK(false, "bad reduce");'
    assert string_modes(code, "reduce") == ("max", "sum", "mean")
    params = [("torch::Tensor", "x"), ("std::string", "reduce")]
    slots = slots_for(params, [(code, ["x", "reduce"])])
    assert [s.kind for s in slots] == ["tensor", "str"] and slots[1].modes == ("max", "sum", "mean")
    made = drafts(slots, 5)
    assert made[0][1][1] == "max"  # the compared word first
    assert [args[1] for combo, args in made if combo[0] == 0] == ["max", "sum", "mean"]
    assert slots_for(params, [("int f(std::string reduce);", ["x", "reduce"])]) is None


def test_an_enum_parameter_is_drafted_at_each_of_its_values():
    """inplace_abn's forward_cuda takes `Activation activation` (`enum class Activation {
    LeakyReLU, ELU, Identity }`), which its binding takes as an integer: no call could be
    drafted for it before. Each value is a mode; a valued enum keeps its values."""
    from testgen.probe_slots import enum_values

    code = "enum class Activation { LeakyReLU, ELU, Identity };\nenum Pool : int { MAX = 2, AVG };"
    assert enum_values(code, "Activation") == (0, 1, 2)
    assert enum_values(code, "const Pool&") == (2, 3)
    assert enum_values(code, "Other") == ()
    params = [("at::Tensor&", "x"), ("Activation", "activation")]
    slots = slots_for(params, [(code, ["x", "activation"])])
    assert [s.kind for s in slots] == ["tensor", "enum"] and slots[1].modes == (0, 1, 2)
    assert [args[1] for combo, args in drafts(slots, 5) if combo[0] == 0] == [0, 1, 2]
    assert slots_for(params, [("void f(at::Tensor& x);", ["x", "activation"])]) is None


def test_an_optional_tensor_is_drafted_present():
    """pyg-lib's sampled_op takes `at::optional<at::Tensor> left_index`; before, such a
    parameter (a bias, an index) left its host function with no drafts at all."""
    params = [("const at::Tensor&", "x"), ("const at::optional<at::Tensor>", "index")]
    code = "auto rows = index.value().data_ptr<int64_t>();"
    slots = slots_for(params, [(code, ["x", "index"])])
    assert [s.kind for s in slots] == ["tensor", "tensor"]
    assert slots[1].facts.dtype == torch.int64


def test_a_host_function_of_lists_or_no_tensor_gets_no_drafts(tmp_path):
    listed = [("std::vector<float>", "scales"), ("at::Tensor", "x")]
    assert slots_for(listed, []) is None
    assert slots_for([("std::vector<std::vector<int>>", "g"), ("at::Tensor", "x")], []) is None
    assert slots_for([("int", "n"), ("float", "alpha")], []) is None
    why = probed_calls(listed, [], tmp_path / "none.cpp", tmp_path)
    assert isinstance(why, str) and "no call can be drafted" in why


@pytest.mark.slow
def test_the_kept_calls_are_those_the_asan_build_runs_clean(tmp_path):
    reference = tmp_path / "scatter_rows.cpp"
    reference.write_text(REFERENCE)
    texts = [(LABEL, [n for _, n in PARAMS]), (REFERENCE, TWIN_NAMES)]
    calls = probed_calls(PARAMS, texts, reference, tmp_path / "probes")
    assert isinstance(calls, list) and len(calls) == 3 * KEEP  # KEEP calls per size
    # each size's best draft first, then the runners-up, which hold other index ranges
    assert [c.args[0].shape[0] for c in calls] == [16, 7, 29] * KEEP
    assert all(
        not torch.equal(a.args[1], b.args[1]) or not torch.equal(a.args[2], b.args[2])
        for a, b in zip(calls[:3], calls[3:6], strict=True)
    )
    for call in calls:
        feats, idx, coords, s = call.args
        assert "AddressSanitizer" in call.origin
        assert idx.min() >= 0, "the unguarded index may not be -1"
        assert idx.max() < s and idx.numel() <= feats.shape[0]
        assert coords.dim() == 2 and coords.shape[1] >= 4  # four ints per row
    assert max(int(c.args[1].max()) for c in calls) > 4  # a full range, not a token one
    # the build is cached by the reference's text: a second probe compiles nothing
    built = list((tmp_path / "probes").rglob("*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert len(probed_calls(PARAMS, texts, reference, tmp_path / "probes")) == 3 * KEEP
    assert built[0].stat().st_mtime_ns == mtime


def test_drafts_come_by_steps_without_enumerating_every_choice():
    import itertools

    from testgen.probe_inputs import _by_steps

    counts = [8, 2, 5, 1, 3]
    every = sorted(itertools.product(*map(range, counts)), key=lambda c: (sum(c), c))
    assert list(_by_steps(counts)) == every
    first = list(itertools.islice(_by_steps([8] * 10), 96))  # 8**10 tuples: never listed
    assert first[0] == (0,) * 10 and len(set(first)) == 96
    assert all(sum(a) <= sum(b) for a, b in itertools.pairwise(first))


def test_a_list_of_index_groups_is_drafted_as_wide_as_the_code_counts_its_entries():
    """A rule book (`std::vector<std::vector<int32_t>>`) gets groups whose entries are as
    wide as the loop over it counts them (`r.size() / 2`), each index column of a group
    distinct (a kernel writing each output once a group would race on a repeated one) and
    below n; where no code says the width, no draft."""
    from testgen.probe_inputs import _groups
    from testgen.probe_slots import group_width

    params = [("at::Tensor", "feats"), ("std::vector<std::vector<int32_t>>", "_rules")]
    code = "for (auto &r : _rules) {\n  Int nHot = r.size() / 2;\n  f(feats, &r[0], nHot);\n}"
    assert group_width(code, "_rules") == 2
    assert group_width(code.replace("/ 2", "/ 3"), "_rules") == 3
    assert group_width(code, "feats") is None
    indexed = "for (int i = 0; i < g.size(); i++) {\n  const auto &r = g[i];\n  f(r.size() / 4);"
    assert group_width(indexed, "g") == 4
    slots = slots_for(params, [(code, ["feats", "_rules"])])
    assert slots is not None and (slots[1].kind, slots[1].width) == ("intlists", 2)
    assert slots_for(params, [("f(feats, _rules);", ["feats", "_rules"])]) is None
    made = drafts(slots, 16)
    groups = made[0][1][1]
    assert len(groups) == 3 and all(len(g) == 32 for g in groups)  # 3 groups of 16 pairs
    for group in groups:
        inputs, outputs = group[0::2], group[1::2]
        assert len(set(inputs)) == len(inputs) and len(set(outputs)) == len(outputs)
        assert all(0 <= v < 16 for v in group)
    gen = torch.Generator().manual_seed(0)
    assert [len(g) for g in _groups(3, 8, (1, 2), gen)] == [6]


def test_where_no_draft_wrote_floats_come_with_ties_and_tensors_a_dimension_wider():
    """A max-pool's backward writes only where the output equals the input: on continuous
    random data no draft writes anything. The second round's floats hold three values (ties
    anywhere the indices lead) and its tensors try one dimension more first (rows that a
    stride steps over, which a `data_ptr` alone never says)."""
    params = [("at::Tensor", "x"), ("at::Tensor", "y"), ("int64_t", "stride")]
    code = "f(x.data_ptr<float>(), y.data_ptr<float>(), stride);"
    slots = slots_for(params, [(code, ["x", "y", "stride"])])
    plain, tied = drafts(slots, 16), drafts(slots, 16, floats=TIES)
    assert [tuple(a.shape) for a in plain[0][1][:2]] == [(16,), (16,)]
    assert [tuple(a.shape) for a in tied[0][1][:2]] == [(16, 16), (16, 16)]
    for _, args in tied[:10]:
        for t in args[:2]:
            assert set(t.unique().tolist()) <= {-0.5, 0.0, 0.5}
    assert len(plain[0][1][0].unique()) == 16  # the first round's data is continuous


def test_a_view_in_a_shape_of_the_numbers_is_the_drafts_shape_and_a_tile_tries_each_count():
    """`w.view({-1, groups, planes})` says the weight's shape in the numbers the call takes: the
    draft is made in it (n where it says -1), so the numbers and the tensor agree in every
    draft; a view of a name that is no parameter says nothing. At a tile size each clean draft
    is followed by itself with each count of a rule book's entries (whole tiles, or a few)."""
    from testgen.probe_inputs import _tile_combos

    params = [("at::Tensor", "w"), ("at::Tensor", "rules"), ("at::Tensor", "x")]
    params += [("int64_t", "groups"), ("int64_t", "planes"), ("int64_t", "nHot")]
    code = (
        "auto weight = w.view({-1, groups, planes});\nauto y = x.view({-1, local});\n"
        'TORCH_CHECK(rules.numel() >= 2 * nHot, "pairs");\n'
        "f(weight, y, rules.data_ptr<int>(), nHot);"
    )
    slots = slots_for(params, [(code, [n for _, n in params])])
    assert slots[0].facts.view == (("n",), ("slot", 3), ("slot", 4))
    assert not slots[2].facts.view and slots[2].facts.rank == 2  # `local` is no parameter
    assert slots[1].facts.columns == 2 and slots[5].kind == "count"
    made = drafts(slots, 8)
    for combo, args in made[:20]:
        assert args[0].shape == (8, args[3], args[4]), combo
        assert args[5] == args[1].numel() // 2 and args[1].numel() in (16, 4)
    clean = [(8, made[0][0]), (8, made[3][0])]
    combos = _tile_combos(slots, clean, 24)
    firsts = sorted({c[:1] + c[2:] for c in combos})
    assert len(combos) == 2 * len(firsts) and {c[1] for c in combos} == {0, 1}
    assert combos[1] == (*combos[0][:1], 1, *combos[0][2:])  # its other count right after it


@pytest.mark.slow
def test_tile_sizes_try_only_the_drafts_that_ran_clean(tmp_path):
    """A kernel the host code picks by tile alignment is probed at the tile sizes too, with the
    drafts that ran clean at the probe's own sizes only (its tensors are larger)."""
    reference = tmp_path / "scatter_rows.cpp"
    reference.write_text(REFERENCE)
    texts = [(LABEL, [n for _, n in PARAMS]), (REFERENCE, TWIN_NAMES)]
    calls = probed_calls(PARAMS, texts, reference, tmp_path / "probes", tile_sizes=(48,))
    assert isinstance(calls, list)
    square, taller = calls[: 4 * KEEP], calls[4 * KEEP :]
    assert [c.args[0].shape[0] for c in square] == [16, 7, 29, 48] * KEEP
    for call in square[3::4]:
        feats, idx, _, s = call.args
        assert feats.shape == (48, 48) and idx.min() >= 0 and idx.max() < s
    # then each clean tile draft with its feature rows one taller than the tile (the reference
    # reads idx.size(0) rows of them: the extra row is never read, and the draft runs clean)
    assert taller and len(taller) <= KEEP
    for call in taller:
        feats, idx, _, s = call.args
        assert feats.shape == (49, 48) and idx.shape[0] == 48


def test_a_tile_size_past_the_largest_tile_keeps_a_rule_book_as_tall():
    """mmcv's sparse max-pool backward, drafted at 65 (one past the largest tile: the kernel
    for counts of 64 and more): features a dimension wider, two gradients, a rule book and its
    counts. At 2^18 elements no such draft was kept and every wrong variant of that kernel
    passed; its embedded tensors (2.5 MB of test) are the cost."""
    from testgen.probe_inputs import MAX_TILE_ELEMENTS, _elements

    shapes = [(65, 65, 65), (65, 65), (65, 65), (65, 65, 65), (65, 65)]
    draft = [torch.empty(s, device="meta") for s in shapes]  # counted, never allocated
    assert _elements(draft) <= MAX_TILE_ELEMENTS
    wider = torch.empty(65, 65, 65, 65, device="meta")
    assert _elements([*draft, wider]) > MAX_TILE_ELEMENTS  # a rank more


# reads one entry of each of n rows c wide: a wrong width reads far past a 1-D tensor
FAR_REFERENCE = r"""
#include <torch/extension.h>
at::Tensor last_row_cpu(const at::Tensor x, const int c, const int n) {
  auto out = torch::zeros({1}, x.options());
  out.data_ptr<float>()[0] = x.data_ptr<float>()[(n - 1) * c] + 1;
  return out;
}
void kminer_bind(pybind11::module_& m) { m.def("reference", &last_row_cpu); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }
"""


@pytest.mark.slow
def test_a_read_far_past_a_tensor_is_seen_through_its_fences(tmp_path):
    """An index far past a tensor's end lands in other live memory, where AddressSanitizer
    sees nothing; each tensor of a draft sits between poisoned fences, so it is a report."""
    reference = tmp_path / "last_row.cpp"
    reference.write_text(FAR_REFERENCE)
    params = [("const at::Tensor", "x"), ("const int", "c"), ("const int", "n")]
    texts = [(FAR_REFERENCE, ["x", "c", "n"])]
    calls = probed_calls(params, texts, reference, tmp_path / "probes")
    assert isinstance(calls, list) and calls
    for call in calls:
        x, c, n = call.args
        assert 0 <= (n - 1) * c < x.numel(), (x.shape, c, n)


PER_IMAGE_REFERENCE = r"""
#include <torch/extension.h>
at::Tensor per_image_cpu(const at::Tensor rois, const at::Tensor grad, int64_t b_size) {
  auto out = torch::zeros({b_size, 4}, grad.options());
  for (int n = 0; n < rois.size(0); n++) {
    int b = rois.data_ptr<float>()[n * 5];  // a region's batch column, read as an index
    out.data_ptr<float>()[b * 4 + n % 4] += grad.data_ptr<float>()[n];
  }
  return out;
}
void kminer_bind(pybind11::module_& m) { m.def("reference", &per_image_cpu); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }
"""


@pytest.mark.slow
def test_edge_values_a_drafted_call_does_not_run_clean_are_not_its_cases(tmp_path):
    """A drafted region's batch column of 1.4 runs clean; negated it indexes image -1, and the
    CPU twin writes before its output (PyTorch-Encoding's RoIAlign backward test passed its
    cases, then died at exit of the corrupted heap). The probe checks each kept call's edge
    values the same way, and the plan makes cases of the clean ones only."""
    reference = tmp_path / "per_image.cpp"
    reference.write_text(PER_IMAGE_REFERENCE)
    module = asan_build(reference, "kminer_edges", tmp_path / "m" / "kminer_edges.so")
    assert module is not None
    rois = torch.tensor([[1.4, 0.5, 0.5, 2.0, 2.0]] * 3)
    (call,) = _edges_checked(module, "kminer_edges", [BaseCall([rois, torch.rand(3), 2], "t")], ())
    assert "negative" not in call.edges and "zeros" in call.edges
    ids = {c["id"] for c in plan([call], ["float32"], whole=True).cases}
    assert ids == {"recorded_0"} | {f"edge_{e}" for e in call.edges if e != "zeros"}  # (boxes)
    unchecked = BaseCall([rois, torch.rand(3), 2], "t")  # a recorded call: every edge
    assert "edge_negative" in {c["id"] for c in plan([unchecked], ["float32"]).cases}


def test_a_dispatchs_per_branch_type_name_is_no_alias():
    """kminer's adapter names the dtype per branch (`using scalar_t = float;`, then `double`):
    the name stands for no one type, and a tensor read as it is drafted as the dispatch's
    float, which a twin of `float *` takes."""
    adapter = (
        "void kminer_k(at::Tensor x) {\n"
        "  if (x.scalar_type() == at::kFloat) {\n    using scalar_t = float;\n"
        "    k<scalar_t><<<1, 1>>>(x.data_ptr<scalar_t>());\n  }\n"
        "  if (x.scalar_type() == at::kDouble) {\n    using scalar_t = double;\n"
        "    k<scalar_t><<<1, 1>>>(x.data_ptr<scalar_t>());\n  }\n}\n"
    )
    (slot,) = slots_for([("at::Tensor", "x")], [(adapter, ["x"])])
    assert slot.facts.dtype == torch.float32
    aliased = "using Int = int32_t;\n" + adapter.replace("data_ptr<scalar_t>", "data_ptr<Int>")
    (slot,) = slots_for([("at::Tensor", "x")], [(aliased, ["x"])])
    assert slot.facts.dtype == torch.int32


def test_rows_that_start_with_a_count_are_drafted_as_a_partition_of_the_indices():
    """SparseConvNet's active pooling reads, per output row, a count and then that many input
    rows, and its backward writes each listed input row plainly: a row listed twice (in one
    table row or two) races on the GPU. The table is drafted in rows of the width the code
    steps by, each count within the row, every index once in the whole table."""
    cpu = """
void pool_bp(float *d_in, float *d_out, Int batchSize, Int maxActive, Int nPlanes,
             const RuleBook &rules) {
  for (Int s = 0; s < batchSize; s++) {
    const Int *r = &rules[0][s * (maxActive + 1)];
    Int nActive = *r++;
    while (nActive-- > 0) {
      float *inp = &d_in[(*r++) * nPlanes];
      for (Int p = 0; p < nPlanes; p++) inp[p] = d_out[s * nPlanes + p];
    }
  }
}
"""
    params = [("at::Tensor", "a"), ("at::Tensor", "b"), ("int64_t", "batch"),
              ("int64_t", "most"), ("int64_t", "planes"), ("at::Tensor", "rules")]  # fmt: skip
    names = ["d_in", "d_out", "batchSize", "maxActive", "nPlanes", "rules"]
    slots = slots_for(params, [(cpu, names)])
    assert slots[5].facts.counted == 3  # rows as wide as maxActive + 1
    assert all(s.facts is None or s.facts.counted is None for s in slots[:5])
    tables = 0
    for _, args in drafts(slots, 16):
        table, most = args[5], args[3]
        assert table.shape == (16, most + 1)
        counts = table[:, 0]
        assert bool((counts >= 0).all()) and bool((counts <= most).all())
        listed = [int(i) for row in table for i in row[1 : 1 + int(row[0])]]
        assert len(listed) == len(set(listed))  # each index in one row, once
        tables += bool(listed)
        assert not table.is_floating_point()
    assert tables > 0
    # without the count read, rows of that stride are no counted table
    plain = cpu.replace("Int nActive = *r++;", "Int nActive = 2;")
    assert slots_for(params, [(plain, names)])[5].facts.counted is None


# sizes its output itself (SparseConvNet's output_features.resize_({nActive, nOut}))
RESIZING_REFERENCE = r"""
#include <torch/extension.h>
void relu_rows_cpu(at::Tensor &x, at::Tensor &out, at::Tensor &w) {
  out.resize_({x.size(0), w.size(1)});
  for (int64_t i = 0; i < x.size(0); i++)
    for (int64_t j = 0; j < w.size(1); j++) {
      float s = 0;
      for (int64_t k = 0; k < w.size(0); k++)
        s += std::max(x.data_ptr<float>()[i * x.stride(0) + k], 0.f) *
             w.data_ptr<float>()[k * w.size(1) + j];
      out.data_ptr<float>()[i * w.size(1) + j] = s;
    }
}
void kminer_bind(pybind11::module_& m) { m.def("reference", &relu_rows_cpu); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { kminer_bind(m); }
"""


@pytest.mark.slow
def test_an_output_the_code_resizes_grows_unfenced_for_a_taller_input(tmp_path):
    """At a tile size each clean draft also comes with one tensor a row taller than the tile
    (the rows past the last whole tile go to a kernel of their own). An output the code
    resizes to the input's rows grows in place: fenced, it would write into its own fence
    and every taller input would be refused."""
    reference = tmp_path / "relu_rows.cpp"
    reference.write_text(RESIZING_REFERENCE)
    params = [("at::Tensor &", "x"), ("at::Tensor &", "out"), ("at::Tensor &", "w")]
    texts = [(RESIZING_REFERENCE, ["x", "out", "w"])]
    slots = slots_for(params, texts)
    assert slots[1].facts.resized and not slots[0].facts.resized
    calls = probed_calls(params, texts, reference, tmp_path / "probes", tile_sizes=(48,))
    assert isinstance(calls, list)
    shapes = [tuple(c.args[0].shape) for c in calls]
    assert (48, 48) in shapes and (49, 48) in shapes  # the taller input ran clean


SPARSE_GRID = """
template <unsigned NDim>
std::vector<at::Tensor> pairs_cuda(at::Tensor indices, int64_t batchSize,
                                   std::vector<int64_t> outShape, std::vector<int64_t> kernelSize,
                                   std::vector<int64_t> dilation, int64_t _subM) {
  bool subM = _subM != 0;
  auto coorDim = indices.size(1) - 1;
  TORCH_CHECK(kernelSize.size() == coorDim, "kernel");
  TORCH_CHECK(outShape.size() == coorDim, "shape");
  auto grid = tv::torch2tv<const int>(indices);
  pairs_kernel<<<1, 32>>>(grid, batchSize);
  return {indices};
}
void kminer_bind(pybind11::module_& m) { m.def("pairs_cuda", &pairs_cuda<2>); }
"""
GRID_PARAMS = [
    ("at::Tensor", "indices"),
    ("int64_t", "batchSize"),
    ("std::vector<int64_t>", "outShape"),
    ("std::vector<int64_t>", "kernelSize"),
    ("std::vector<int64_t>", "dilation"),
    ("int64_t", "_subM"),
]


def test_lists_of_numbers_per_dimension_and_their_coordinates_are_drafted_together():
    """A sparse convolution's host function (spconv's `std::vector<int64_t>` kernel size,
    dilation and output shape, checked to be as long as the coordinate table has columns after
    the batch's): each list as long as the bound instantiation says (`<2>`), the shape n, the
    kernel 3 and the dilation 1 first; the table NDim + 1 wide, its rows distinct cells of the
    grid, never negative (a grid smaller than its coordinates, or a cell at -1, is addressed out
    of bounds inside the code's own buffers, where the sanitizer's fences are not); an int64
    the code reads as `!= 0` a flag."""
    names = [n for _, n in GRID_PARAMS]
    slots = slots_for(GRID_PARAMS, [(SPARSE_GRID, names)])
    assert slots is not None
    assert [s.kind for s in slots] == ["tensor", "int", "ints", "ints", "ints", "flag"]
    assert [s.width for s in slots[2:5]] == [2, 2, 2]
    assert [s.first for s in slots[2:5]] == [None, 3, 1]
    table = slots[0].facts
    assert table.fixed_dims == {1: 3} and table.coordinates and table.dtype == torch.int32
    made = drafts(slots, 16)
    _, args = made[0]
    indices, batch, shape, kernel, dilation, sub = args
    assert list(indices.shape) == [16, 3] and int(indices.min()) >= 0 and int(indices.max()) < 16
    assert len({tuple(r) for r in indices.tolist()}) == 16  # every cell once
    assert (batch, shape, kernel, dilation, sub) == (16, [16, 16], [3, 3], [1, 1], 0)
    assert {a[5] for _, a in made} == {0, 1}  # the mode off, then on (not sizes: all on)
    for _, other in made:
        assert other[2] == [16, 16]  # the shape is never smaller than the coordinates
        assert int(other[0].min()) >= 0
    assert {tuple(a[3]) for _, a in made} >= {(3, 3), (16, 16), (1, 1)}
    # the length a check says, literally, wins over the instantiation's; without either, 3
    literal = SPARSE_GRID.replace("kernelSize.size() == coorDim", "kernelSize.size() == 3")
    assert slots_for(GRID_PARAMS, [(literal, names)])[3].width == 3
    bare = slots_for(GRID_PARAMS, [(SPARSE_GRID.replace("<2>", ""), names)])
    assert bare[2].width == 3 and bare[0].facts.fixed_dims == {1: 4}  # the table follows
    unlinked = SPARSE_GRID.replace("== coorDim", "> 0").replace("<2>", "")
    alone = slots_for(GRID_PARAMS, [(unlinked, names)])
    assert alone[0].facts.fixed_dims == {} and not alone[0].facts.coordinates


@pytest.mark.slow
def test_a_pragma_clause_the_repository_never_compiled_with_openmp_builds_without_it(tmp_path):
    """PyTorch-Encoding's ROIAlign CPU loop (copied from MXNet) reads `#pragma omp parallel for
    num_threads(engine::OpenMP::Get()->...)`, and nothing defines `engine`: its setup.py passes
    no -fopenmp, so torch's build ignores the pragma. Built with -fopenmp only, the reference
    never built and its op got no drafted calls."""
    from testgen.probe_inputs import asan_build

    source = tmp_path / "ref.cpp"
    source.write_text(
        "#include <torch/extension.h>\n"
        "at::Tensor reference(at::Tensor x) {\n"
        "  auto y = x.clone();\n  float* p = y.data_ptr<float>();\n"
        "#pragma omp parallel for num_threads(engine::OpenMP::Get()->Count())\n"
        "  for (int i = 0; i < y.numel(); ++i) p[i] *= 2;\n  return y;\n}\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("reference", &reference); }\n'
    )
    built = asan_build(source, "kminer_probe_pragma", tmp_path / "out" / "m.so")
    assert built is not None and built.is_file()


@pytest.mark.slow
def test_floats_the_code_takes_as_indices_are_drafted_inside_the_tensors_they_index(tmp_path):
    """maskrcnn-benchmark's ROIAlign CPU loop (PyTorch-Encoding's copy) casts a region's first
    column to the batch it reads: drafted at random, every draft's batch was negative and read
    before the input (314 drafts, all AddressSanitizer reports: no call, no test). Where drafts
    read out of bounds, floats are drafted again in [0, n)."""
    reference = tmp_path / "pick.cpp"
    reference.write_text(
        "#include <torch/extension.h>\n"
        "at::Tensor pick(const at::Tensor& input, const at::Tensor& rois) {\n"
        "  TORCH_CHECK(rois.size(1) == 3);\n"
        "  auto out = at::zeros({rois.size(0)}, input.options());\n"
        "  const float* r = rois.data_ptr<float>();\n"
        "  const float* x = input.data_ptr<float>();\n"
        "  float* o = out.data_ptr<float>();\n"
        "  for (int i = 0; i < rois.size(0); ++i) {\n"
        "    int b = r[i * 3];\n"
        "    o[i] = x[b * input.size(1)] * r[i * 3 + 1] + r[i * 3 + 2];\n"
        "  }\n  return out;\n}\n"
        'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("reference", &pick); }\n'
    )
    params = [("const at::Tensor&", "input"), ("const at::Tensor&", "rois")]
    text = reference.read_text()
    calls = probed_calls(params, [(text, ["input", "rois"])], reference, tmp_path / "probes")
    assert isinstance(calls, list) and calls, calls
    for call in calls:
        feats, rois = call.args
        assert rois.shape[1] == 3 and rois.is_floating_point()
        assert rois[:, 0].min() >= 0 and rois[:, 0].max() < feats.shape[0]
