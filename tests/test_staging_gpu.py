"""The adapter over a launcher that stages host data (wrappers.staging), built and run on a GPU:
the rule book is handed to the launcher's copy from the host, the buffer it is copied into is
the adapter's own, and the kernel's result is the CPU loop's."""

from __future__ import annotations

import pytest

from wrappers.adapter import adapt
from wrappers.signature import parse_signature

KERNEL = (
    "using Int = int;\n"
    "template <typename T>\n"
    "__global__ void pool_fp_(T *in, T *out, Int nRows, Int maxActive, Int nPlanes, Int *rules) {\n"
    "  for (Int row = blockIdx.x; row < nRows; row += gridDim.x) {\n"
    "    Int *r = rules + row * (1 + maxActive);\n"
    "    for (Int i = 1; i <= r[0]; i++)\n"
    "      for (Int p = threadIdx.x; p < nPlanes; p += blockDim.x)\n"
    "        out[row * nPlanes + p] += in[r[i] * nPlanes + p];\n"
    "  }\n}\n"
)
LAUNCHER = (
    "template <typename T>\n"
    "void pool_fp(T *in, T *out, Int nRows, Int maxActive, Int nPlanes, Int *rules_cpu,\n"
    "             Int *rules_gpu) {\n"
    "  cudaMemcpy(rules_gpu, rules_cpu, sizeof(Int) * nRows * (1 + maxActive),\n"
    "             cudaMemcpyHostToDevice);\n"
    "  pool_fp_<T><<<nRows, 32>>>(in, out, nRows, maxActive, nPlanes, rules_gpu);\n"
    "}\n"
)


@pytest.mark.gpu
def test_a_staging_launcher_runs_behind_its_adapter_on_the_gpu(tmp_path):
    import torch
    from torch.utils import cpp_extension

    sig, text = adapt(parse_signature(LAUNCHER, "pool_fp"), KERNEL + LAUNCHER)
    source = (
        "#include <torch/extension.h>\n"
        + KERNEL
        + LAUNCHER
        + text
        + f'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("run", &{sig.name}); }}\n'
    )
    (tmp_path / "staged.cu").write_text(source)
    mod = cpp_extension.load(
        "kminer_staged", [str(tmp_path / "staged.cu")], build_directory=str(tmp_path)
    )
    x = torch.randn(40, 5, dtype=torch.float64, device="cuda")
    n_rows, max_active = 7, 3
    rules = torch.full((n_rows, 1 + max_active), -1, dtype=torch.int32)
    for row in range(n_rows):
        picked = torch.randperm(40)[: 1 + row % max_active]
        rules[row, 0] = len(picked)
        rules[row, 1 : 1 + len(picked)] = picked
    out = torch.zeros(n_rows, 5, dtype=torch.float64, device="cuda")
    mod.run(x, out, n_rows, max_active, 5, rules.cuda())  # on the device: the adapter copies it
    torch.cuda.synchronize()
    want = torch.stack(
        [x[rules[r, 1 : 1 + rules[r, 0]].long().cuda()].sum(0) for r in range(n_rows)]
    )
    torch.testing.assert_close(out, want)
    # a rule book whose last row counts one entry more than a row holds: the kernel reads past
    # the part the launcher copies, where the buffer holds the rest of the host tensor
    flat = torch.cat([rules.reshape(-1), torch.tensor([5, 9], dtype=torch.int32)])
    start = (n_rows - 1) * (1 + max_active)
    flat[start : start + 1 + max_active] = torch.tensor([max_active + 1, 1, 2, 3])
    out.zero_()
    mod.run(x, out, n_rows, max_active, 5, flat.cuda())
    torch.cuda.synchronize()
    torch.testing.assert_close(out[-1], x[[1, 2, 3, 5]].sum(0))
