"""References for rule-book launchers from the CPU op's own tensor loop (testgen.op_loop), on a
small repository shaped like SparseConvNet: a CUDA op that gets a rule book from its metadata
object and hands it, with pointers into its tensors and sizes read off them, to a pointer
launcher; a CPU twin that gets the same rule book the same way and loops over it with tensor
code."""

from __future__ import annotations

import pytest
from test_reference import _adapted_candidate, _built

from miner.candidate import Reference
from miner.discover import discover
from testgen.op_loop import definitions
from testgen.probe_inputs import drafts
from testgen.probe_slots import Slot, slots_for
from testgen.reference import RepoRefs, find_reference, locate

TYPES = (
    "#pragma once\n#include <vector>\nusing Int = int32_t;\n"
    "using RuleBook = std::vector<std::vector<Int>>;\n"
)
KERNELS = """#include "../types.h"
#include "../meta.h"
template <typename T>
__global__ void conv_fp(T *iF, T *oF, T *w, const Int *rules, Int nHot, Int ip, Int is,
                        Int op, Int os) {
  for (Int n = threadIdx.x; n < nHot; n += blockDim.x)
    for (Int j = 0; j < op; j++) {
      T acc = 0;
      for (Int k = 0; k < ip; k++) acc += iF[rules[2 * n] * is + k] * w[k * op + j];
      oF[rules[2 * n + 1] * os + j] += acc;
    }
}
"""
ONE_GROUP = """template <typename T>
void dConv_forward(T *inFeatures, T *outFeatures, T *w, const Int *rules, Int nHot,
                   Int input_nPlanes, Int input_stride, Int output_nPlanes, Int output_stride) {
  conv_fp<T><<<1, 32>>>(inFeatures, outFeatures, w, rules, nHot, input_nPlanes, input_stride,
                        output_nPlanes, output_stride);
}
"""
LAUNCHER = """template <typename T>
double dConv_forward2(T *inFeatures, T *outFeatures, T *w, RuleBook _rules, Int input_nPlanes,
                      Int input_stride, Int output_nPlanes, Int output_stride) {
  double flops = 0;
  for (auto &r : _rules) {
    dConv_forward(inFeatures, outFeatures, w, r.data(), (Int)(r.size() / 2), input_nPlanes,
                  input_stride, output_nPlanes, output_stride);
    w += input_nPlanes * output_nPlanes;
    flops += r.size() / 2;
  }
  return flops;
}
"""
CUDA_OP = """template <typename T>
double cuda_Conv_updateOutput(at::Tensor &size, Meta &m, at::Tensor &input_features,
                              at::Tensor &output_features, at::Tensor &weight) {
  const auto &_rules = m.getRuleBook(size, true);
  Int ip = weight.size(1);
  Int op = weight.size(2);
  output_features.resize_({m.getNActive(size), op});
  auto iF = input_features.data_ptr<T>();
  auto oF = output_features.data_ptr<T>();
  output_features.zero_();
  return dConv_forward2<T>(iF, oF, weight.data_ptr<T>(), _rules, ip, ip, op, op);
}
"""
CPU_OP = """#include "../types.h"
#include "../meta.h"
#include <torch/extension.h>
template <typename T>
at::Tensor rows_of(at::Tensor &src, Int nRules, const Int *rules) {
  auto out = at::empty({nRules, src.size(1)}, src.options());
  for (Int i = 0; i < nRules; ++i) out[i] = src[rules[2 * i]];
  return out;
}
template <typename T>
double cpu_Conv_updateOutput(at::Tensor &size, Meta &m, at::Tensor &input_features,
                             at::Tensor &output_features, at::Tensor &weight) {
  const auto &_rules = m.getRuleBook(size, true);
  output_features.resize_({m.getNActive(size), weight.size(2)});
  output_features.zero_();
  double flops = 0;
  for (Int i = 0; i < (Int)_rules.size(); ++i) {
    const auto &r = _rules[i];
    Int nRules = r.size() / 2;
    flops += nRules;
    auto rows = at::matmul(rows_of<T>(input_features, nRules, &r[0]), weight.select(0, i));
    for (Int k = 0; k < nRules; ++k) output_features[r[2 * k + 1]] += rows[k];
  }
  return flops;
}
"""
META = "#pragma once\nstruct Meta {\n  RuleBook getRuleBook(at::Tensor &s, bool b);\n  Int getNActive(at::Tensor &s);\n};\n"  # noqa: E501


def _repo(root) -> None:
    (root / "csrc" / "cuda").mkdir(parents=True)
    (root / "csrc" / "cpu").mkdir(parents=True)
    (root / "csrc" / "types.h").write_text(TYPES)
    (root / "csrc" / "meta.h").write_text(META)
    (root / "csrc" / "cuda" / "conv.cu").write_text(KERNELS + ONE_GROUP + LAUNCHER + CUDA_OP)
    (root / "csrc" / "cpu" / "conv.cpp").write_text(CPU_OP)


def _reference(tmp_path, launcher: str, text: str) -> tuple:
    repo, work = tmp_path / "repo", tmp_path / "work"
    _repo(repo)
    cand = _adapted_candidate(work, text, launcher, "conv_fp", "csrc/cuda/conv.cu", context=TYPES)
    return cand, repo, work, find_reference(cand, repo, work, RepoRefs(discover(repo)))


def test_a_rule_book_launcher_gets_the_cpu_ops_loop_on_its_own_arguments(tmp_path):
    """The CPU twin's loop, with its tensors rebuilt from the launcher's pointers in the shapes
    the CUDA op gives them (weight's sizes 1 and 2 are `ip` and `op`; the output is resized to
    `op` columns) and the relation it guarantees between numbers and shapes checked."""
    cand, repo, work, ref = _reference(tmp_path, "dConv_forward2", LAUNCHER)
    assert isinstance(ref, Reference), ref
    assert ref.function == "cpu_Conv_updateOutput"
    text = (work / ref.path).read_text()
    assert "auto weight = w.view({-1, input_nPlanes, output_nPlanes});" in text
    assert "auto output_features = outFeatures.view({-1, output_nPlanes});" in text
    assert "auto input_features = inFeatures;" in text  # no shape in the CUDA op: as passed
    assert "for (Int i = 0; i < (Int)_rules.size(); ++i)" in text and "return flops;" in text
    assert "getRuleBook" not in text.split("kminer_oploop_dConv_forward2(")[1]  # no metadata
    assert "zero_()" not in text.split("kminer_oploop_dConv_forward2(")[1]  # the op's, not ours
    assert "rows_of" in text  # the helpers the loop calls come along
    # the CPU op reads its rule book from another call than the CUDA op: no reference
    (repo / "csrc" / "cpu" / "conv.cpp").write_text(
        CPU_OP.replace("getRuleBook(size, true)", "getRuleBook(size, false)")
    )
    why = locate(cand, RepoRefs(discover(repo)), (work / "label.cu").read_text())
    assert isinstance(why, str)  # a loop over another rule book is no reference


def test_a_launcher_of_one_group_is_the_rule_book_helper_on_a_book_of_that_group(tmp_path):
    _, _, work, ref = _reference(tmp_path, "dConv_forward", ONE_GROUP)
    assert isinstance(ref, Reference), ref
    text = (work / ref.path).read_text()
    assert "std::vector<Int>(kminer_first, kminer_first + 2 * nHot)" in text
    assert "kminer_oploop_dConv_forward2<T>(inFeatures, outFeatures, w, kminer_book_" in text
    # the probe makes the count from the entries the index tensor holds, a stride the CUDA op
    # passes as the size another parameter holds from that one
    params = [("at::Tensor", n) for n in ("inFeatures", "outFeatures", "w", "rules")] + [
        ("int64_t", n)
        for n in ("nHot", "input_nPlanes", "input_stride", "output_nPlanes", "output_stride")
    ]
    slots = slots_for(params, [(text, [n for _, n in params])])
    assert slots[4] == Slot("count", factors=(3,), width=2)
    assert slots[6] == Slot("product", factors=(5,)) and slots[8] == Slot("product", factors=(7,))
    for _, args in drafts(slots, 6)[:12]:
        assert args[4] == args[3].numel() // 2 and args[6] == args[5] and args[8] == args[7]
    # tensors the reference views in a shape of the numbers come in that shape; the rule
    # book's entries have distinct input and distinct output rows (the forward adds into its
    # output rows unguarded)
    assert slots[2].facts.view == (("n",), ("slot", 5), ("slot", 7))
    assert slots[1].facts.view == (("n",), ("slot", 7)) and slots[3].facts.columns == 2
    for _, args in drafts(slots, 6)[:12]:
        assert args[2].shape == (6, args[5], args[7]) and args[1].shape == (6, args[7])
        pairs = args[3].view(-1, 2)
        for column in (pairs[:, 0], pairs[:, 1]):
            assert len(column.unique()) == len(column) and 0 <= column.min() <= column.max() < 6


def test_a_buffer_the_loop_overwrites_must_come_cleared_and_the_probe_drafts_it_so(tmp_path):
    """`at::matmul_out(dw, ...)` into a slice of the weight's gradient overwrites it, where the
    kernel adds to it: the CUDA op's caller clears it, so the reference refuses a call that
    does not, and the probe drafts zeros for it. A stride the op computes as a product of sizes
    is made from them, not drafted."""
    backward = CPU_OP + (
        "template <typename T>\n"
        "void cpu_Conv_backward(at::Tensor &size, Meta &m, at::Tensor &input_features,\n"
        "                       at::Tensor &d_output_features, at::Tensor &d_weight) {\n"
        "  const auto &_rules = m.getRuleBook(size, true);\n"
        "  for (Int i = 0; i < (Int)_rules.size(); ++i) {\n"
        "    const auto &r = _rules[i];\n    Int nRules = r.size() / 2;\n"
        "    auto dw = d_weight.select(0, i);\n"
        "    at::matmul_out(dw, rows_of<T>(input_features, nRules, &r[0]).t(),\n"
        "                   rows_of<T>(d_output_features, nRules, &r[1]));\n  }\n}\n"
    )
    launcher = (
        "template <typename T>\n"
        "void dConv_backward_dW2(T *inFeatures, T *dOutFeatures, T *dw, RuleBook _rules,\n"
        "                        Int input_nPlanes, Int output_nPlanes, Int nGroups, Int is) {\n"
        "  for (auto &r : _rules) conv_fp<T><<<1, 32>>>(inFeatures, dOutFeatures, dw, r.data(),\n"
        "                                                r.size() / 2, 1, 1, 1, 1);\n}\n"
    )
    cuda_op = (
        "template <typename T>\n"
        "void cuda_Conv_backward(at::Tensor &size, Meta &m, at::Tensor &input_features,\n"
        "                        at::Tensor &d_output_features, at::Tensor &d_weight) {\n"
        "  const auto &_rules = m.getRuleBook(size, true);\n"
        "  Int ip = d_weight.size(1);\n  Int op = d_weight.size(2);\n"
        "  dConv_backward_dW2<T>(input_features.data_ptr<T>(), d_output_features.data_ptr<T>(),\n"
        "                        d_weight.data_ptr<T>(), _rules, ip, op, 1, ip * op);\n}\n"
    )
    repo, work = tmp_path / "repo", tmp_path / "work"
    _repo(repo)
    (repo / "csrc" / "cpu" / "conv.cpp").write_text(backward)
    with open(repo / "csrc" / "cuda" / "conv.cu", "a") as f:
        f.write(launcher + cuda_op)
    cand = _adapted_candidate(
        work, launcher, "dConv_backward_dW2", "conv_fp", "csrc/cuda/conv.cu", context=TYPES
    )
    ref = find_reference(cand, repo, work, RepoRefs(discover(repo)))
    assert isinstance(ref, Reference), ref
    text = (work / ref.path).read_text()
    assert 'TORCH_CHECK(dw.eq(0).all().item<bool>(), "kminer: dw != 0");' in text
    assert "TORCH_CHECK(is == input_nPlanes * output_nPlanes" in text
    params = [
        ("at::Tensor", "inFeatures"), ("at::Tensor", "dOutFeatures"), ("at::Tensor", "dw"),
        ("std::vector<std::vector<int32_t>>", "_rules"), ("int64_t", "input_nPlanes"),
        ("int64_t", "output_nPlanes"), ("int64_t", "nGroups"), ("int64_t", "is"),
    ]  # fmt: skip
    slots = slots_for(params, [(text, [n for _, n in params])])
    assert slots[2].facts.zeros and slots[7] == Slot("product", factors=(4, 5))
    for _, args in drafts(slots, 5)[:12]:
        assert not args[2].any() and args[7] == args[4] * args[5]


def test_definitions_read_each_local_once_with_its_initializer():
    body = "{\n  const auto &_rules = m.get(a, b);\n  Int ip = w.size(1);\n  Int ip = 3;\n}"
    found = {k: v[0] for k, v in definitions(body).items()}
    assert found == {"_rules": "m.get(a, b)", "ip": "w.size(1)"}


@pytest.mark.slow
def test_the_lifted_reference_builds_and_computes_the_launchers_result(tmp_path):
    import torch

    _, _, work, ref = _reference(tmp_path, "dConv_forward2", LAUNCHER)
    mod = _built(tmp_path, "kminer_ref_oploop", work / ref.path)
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    w = torch.ones(2, 2, 3)
    w[1] *= 2
    out = torch.zeros(4, 3)
    flops = mod.reference(x, out, w, [[0, 1, 2, 3], [1, 1]], 2, 2, 3, 3)
    want = torch.zeros(4, 3)
    want[1] += x[0].sum()
    want[3] += x[2].sum()
    want[1] += 2 * x[1].sum()
    torch.testing.assert_close(out, want)
    assert flops == 3
    with pytest.raises(RuntimeError, match="kminer: not"):
        mod.reference(x, out, w, [[0, 1]], 2, 5, 3, 3)  # a stride the CUDA op never passes
