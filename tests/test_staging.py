"""A launcher that copies host data into a device buffer it is handed (wrappers.staging), and
the CPU function its op's CPU twin calls at the same place (testgen.call_site_twin)."""

from __future__ import annotations

import pytest
from test_reference import _adapted_candidate, _built
from test_staging_gpu import KERNEL, LAUNCHER

from miner.candidate import Reference
from miner.discover import discover
from testgen.reference import RepoRefs, find_reference, locate
from wrappers.adapter import adapt
from wrappers.signature import parse_signature
from wrappers.staging import staging

CUDA_OP = (
    "template <typename T>\n"
    "void cuda_Pool_updateOutput(Book &m, at::Tensor &input, at::Tensor &output) {\n"
    "  auto &rules = m.rules;\n  Int maxActive = rules[0][1];\n  Int nRows = rules[0][3];\n"
    "  Int nPlanes = input.size(1);\n"
    "  auto buffer = at::empty({(int)rules[1].size()}, at::CUDA(at::kInt));\n"
    "  auto iF = input.data_ptr<T>();\n  auto oF = output.data_ptr<T>();\n"
    "  pool_fp<T>(iF, oF, nRows, maxActive, nPlanes, &rules[1][0], buffer.data_ptr<Int>());\n}\n"
)
CPU_SIDE = (
    "using Int = int;\n"
    "template <typename T>\n"
    "void Pool_ForwardPass(T *in, T *out, Int nRows, Int maxActive, Int nPlanes, Int *rules) {\n"
    "  for (Int row = 0; row < nRows; row++) {\n"
    "    Int *r = rules + row * (1 + maxActive);\n"
    "    for (Int i = 1; i <= r[0]; i++)\n"
    "      for (Int p = 0; p < nPlanes; p++) out[row * nPlanes + p] += in[r[i] * nPlanes + p];\n"
    "  }\n}\n"
    "template <typename T>\n"
    "void Pool_Shifted(T *in, T *out, Int nRows, Int maxActive, Int nPlanes, Int *rules) {}\n"
    "template <typename T>\n"
    "void cpu_Pool_updateOutput(Book &m, at::Tensor &input, at::Tensor &output) {\n"
    "  auto &rules = m.rules;\n  Int maxActive = rules[0][1];\n  Int nRows = rules[0][3];\n"
    "  Int nPlanes = input.size(1);\n"
    "  Pool_Shifted<T>(input.data_ptr<T>(), output.data_ptr<T>(), nRows, maxActive, nPlanes,\n"
    "                  &rules[1][1]);\n"
    "  Pool_ForwardPass<T>(input.data_ptr<T>(), output.data_ptr<T>(), nRows, maxActive,\n"
    "                      nPlanes, &rules[1][0]);\n}\n"
)


def test_the_adapter_copies_host_data_to_the_host_and_makes_the_staging_buffer():
    """The copy's source is handed a host copy of its tensor; the buffer it is copied into is
    made by the adapter in the copy's size and is no parameter of the binding. A source that
    a launch also takes (the kernel reads it where it is) stays on the device."""
    params = parse_signature(LAUNCHER, "pool_fp").params
    found = staging(LAUNCHER, "pool_fp", params)
    assert found.host_in == {"rules_cpu"}
    assert found.buffers == {"rules_gpu": ("sizeof(Int) * nRows * (1 + maxActive)", "rules_cpu")}
    sig, text = adapt(parse_signature(LAUNCHER, "pool_fp"), KERNEL + LAUNCHER)
    assert [n for _, n in sig.params] == ["in", "out", "nRows", "maxActive", "nPlanes", "rules_cpu"]
    assert "auto kminer_rules_cpu = rules_cpu.to(at::kCPU).contiguous();" in text
    data = "kminer_rules_cpu.view(at::kByte).reshape(-1)"
    assert (
        "auto kminer_rules_gpu = at::empty({std::max<int64_t>(static_cast<int64_t>(sizeof(Int) "
        f"* nRows * (1 + maxActive)), {data}.numel())}}, in.options().dtype(at::kByte));\n"
        f"  kminer_rules_gpu.narrow(0, 0, {data}.numel()).copy_({data});"
    ) in text
    assert "kminer_rules_cpu.data_ptr<Int>(), reinterpret_cast<Int *>(kminer_rules_gpu" in text
    read_in_place = LAUNCHER.replace("nPlanes, rules_gpu);", "nPlanes, rules_cpu);")
    found = staging(read_in_place, "pool_fp", params)
    assert found.host_in == set() and found.buffers == {}
    sig, text = adapt(parse_signature(read_in_place, "pool_fp"), KERNEL + read_in_place)
    assert "rules_gpu" in [n for _, n in sig.params] and "kCPU" not in text
    sized_by_local = LAUNCHER.replace("sizeof(Int) * nRows", "sizeof(Int) * rows_")
    assert staging(sized_by_local, "pool_fp", params).buffers == {}


@pytest.mark.slow
def test_the_cpu_twin_called_where_the_cuda_op_calls_the_launcher_is_its_reference(tmp_path):
    """`cpu_Pool_updateOutput` calls `Pool_ForwardPass` with the arguments
    `cuda_Pool_updateOutput` gives `pool_fp` (its locals read back), the staging buffer left
    out: that one is the reference, whatever its name; `Pool_Shifted`, called with another
    rule-book address, is not."""
    import torch

    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "cuda").mkdir(parents=True)
    (repo / "cpu").mkdir()
    (repo / "cuda" / "pool.cu").write_text(KERNEL + LAUNCHER + CUDA_OP)
    (repo / "cpu" / "pool.cpp").write_text(CPU_SIDE)
    cand = _adapted_candidate(work, LAUNCHER, "pool_fp", "pool_fp_", "cuda/pool.cu", KERNEL)
    refs = RepoRefs(discover(repo))
    loc = locate(cand, refs, (work / "label.cu").read_text())
    assert not isinstance(loc, str), loc
    assert (loc.mechanism, loc.cpu.names[0], loc.via) == (
        "call-site twin",
        "Pool_ForwardPass",
        "cpu_Pool_updateOutput",
    )
    ref = find_reference(cand, repo, work, refs)
    assert isinstance(ref, Reference), ref
    assert (ref.function, ref.file) == ("Pool_ForwardPass", "cpu/pool.cpp")
    mod = _built(tmp_path, "kminer_ref_pool", work / ref.path)
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    out = torch.zeros(2, 3)
    rules = torch.tensor([2, 0, 3, 1, 2, -1], dtype=torch.int32)  # row 0: x0 + x3; row 1: x2
    mod.reference(x, out, 2, 2, 3, rules)
    torch.testing.assert_close(out, torch.stack([x[0] + x[3], x[2]]))
    # where the CPU op passes other arguments, nothing is taken
    (repo / "cpu" / "pool.cpp").write_text(CPU_SIDE.replace("&rules[1][0]", "&rules[1][2]"))
    why = locate(cand, RepoRefs(discover(repo)), (work / "label.cu").read_text())
    assert isinstance(why, str)


def test_a_cpu_twin_taking_the_rule_book_as_a_container_is_called_with_a_tensors_numbers():
    """SparseConvNet's CUDA op hands its launcher `&_rules[0][0]` where the CPU op hands its
    twin `_rules` (a `const RuleBook &`): the same argument, and the twin's adapter fills the
    container from the tensor the label's binding takes in the pointer's place. A container
    the callee may write is no input, and takes no adapter."""
    from testgen.call_site_twin import _normal

    assert _normal("&_rules[0][0]", {}) == _normal("_rules", {}) == "_rules"
    assert _normal("&rules[1][0]", {}) == "&rules[1][0]"  # a row past the first: not the same
    twin = (
        "template <typename T>\nvoid Pool_BackwardPass(T *d_in, T *d_out, Int batchSize, "
        "Int maxActive, Int nPlanes, const RuleBook &rules, bool average) {}\n"
    )
    aliases = "using Int = int32_t;\nusing RuleBook = std::vector<std::vector<Int>>;\n"
    sig, text = adapt(parse_signature(twin, "Pool_BackwardPass"), aliases)
    assert [t for t, _ in sig.params][5] == "at::Tensor"
    assert "std::vector<int32_t> kminer_rules_row(kminer_rules_t.data_ptr<int32_t>()," in text
    assert "std::vector<std::vector<int32_t>> kminer_rules{kminer_rules_row};" in text
    assert "static_cast<Int>(nPlanes), kminer_rules, static_cast<bool>(average)" in text
    written = twin.replace("const RuleBook &rules", "RuleBook &rules")
    assert adapt(parse_signature(written, "Pool_BackwardPass"), aliases) is None
