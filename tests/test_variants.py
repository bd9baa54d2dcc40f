"""Wrong variants of a label (testgen.variants): the right site changes, nothing else does."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testgen.variants import MAX_PER_KIND, Variant, VariantKind, derive_variants

FIXTURES = Path(__file__).parent / "fixtures" / "variants"
KINDS = list(VariantKind)


def _label(name: str) -> tuple[str, str]:
    text = (FIXTURES / name).read_text()
    return text, re.match(r"// kminer label \S+: (\S+)", text).group(1)


def _body_span(text: str, kernel: str) -> tuple[int, int]:
    """Offsets of the kernel's `{...}` (the fixtures have no braces in comments or strings)."""
    m = re.search(rf"__global__\s+void\s+{kernel}\s*\(", text)
    start = text.index("{", text.index(")", m.end()))
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return start, i + 1
    raise AssertionError("unbalanced braces")


def _strip_comment(v: Variant) -> str:
    lines = v.text.split("\n")
    assert lines[1] == f"// kminer variant: {v.kind}: {v.description}"
    return "\n".join(lines[:1] + lines[2:])


def _change(label: str, v: Variant) -> tuple[int, str, str]:
    """(offset, old, new) of the one contiguous edit between the label and the variant."""
    text = _strip_comment(v)
    a = 0
    while a < min(len(label), len(text)) and label[a] == text[a]:
        a += 1
    b = 0
    while b < min(len(label), len(text)) - a and label[-1 - b] == text[-1 - b]:
        b += 1
    return a, label[a : len(label) - b], text[a : len(text) - b]


def _by_kind(variants: list[Variant]) -> dict[VariantKind, list[Variant]]:
    return {k: [v for v in variants if v.kind == k] for k in KINDS}


FIXTURE_KERNELS = sorted(p.name for p in FIXTURES.glob("*.cu"))


@pytest.mark.parametrize("name", FIXTURE_KERNELS)
def test_fixture_variants_change_only_the_kernel_body(name):
    label, kernel = _label(name)
    variants = derive_variants(label, kernel)
    lo, hi = _body_span(label, kernel)
    assert {v.kind for v in variants} == set(KINDS)
    for v in variants:
        assert "\n" not in v.description and v.kind in KINDS
        at, old, new = _change(label, v)
        assert old != new
        assert lo <= at and at + len(old) <= hi, (v.description, old, new)
    kinds = [v.kind for v in variants]
    assert kinds == sorted(kinds, key=KINDS.index)  # grouped by kind, in a fixed order
    assert all(len(vs) <= MAX_PER_KIND for vs in _by_kind(variants).values())
    assert len({v.text for v in variants}) == len(variants)


@pytest.mark.parametrize("name", FIXTURE_KERNELS)
def test_deterministic(name):
    label, kernel = _label(name)
    assert derive_variants(label, kernel) == derive_variants(label, kernel)


def test_loop_macro_kernel():
    label, kernel = _label("loop_macro.cu")
    got = _by_kind(derive_variants(label, kernel))
    _, old, new = _change(label, got[VariantKind.NO_WRITE][0])
    assert old == "" and new.split() == ["return;"]
    assert "__global__ void affine_forward_kernel(" in label
    body = _strip_comment(got[VariantKind.NO_WRITE][0])
    assert "const int channels, scalar_t* output) {\n  return;\n  CUDA_1D_KERNEL_LOOP" in body
    off = got[VariantKind.OFF_BY_ONE][0]
    assert "CUDA_1D_KERNEL_LOOP(index, (nthreads) - 1) {" in off.text
    assert off.description.startswith("CUDA_1D_KERNEL_LOOP bound nthreads -> (nthreads) - 1")
    assert "#define CUDA_1D_KERNEL_LOOP(i, n)" in off.text  # the macro itself is untouched
    # the outermost operator of the stored value first, then the ones below it
    swaps = [_change(label, v)[1:] for v in got[VariantKind.OP_SWAP]]
    assert swaps[0] == ("+", "-")
    assert "* scale - shift * (c + 1);" in got[VariantKind.OP_SWAP][0].text
    assert all(old in "+-*/" for old, _ in swaps)
    assert "(c + 1)" in got[VariantKind.OP_SWAP][1].text  # never the index `c`'s `%`


def test_template_kernel_guard_and_specialization():
    label, kernel = _label("template_guard.cu")
    got = _by_kind(derive_variants(label, kernel))
    # `if (idx >= n) return;` skips work: the skip range grows, the last row goes unwritten
    assert _change(label, got[VariantKind.OFF_BY_ONE][0])[1:] == ("", " - 1")
    assert "if (idx >= n - 1) return;" in got[VariantKind.OFF_BY_ONE][0].text
    assert "for (int k = 0; k < K - 1; ++k)" in got[VariantKind.OFF_BY_ONE][1].text
    swaps = got[VariantKind.OP_SWAP]
    assert "out[idx] = acc - bias[0];" in swaps[0].text
    assert "acc -= row[k] * w[k];" in swaps[1].text
    assert "acc += row[k] + w[k];" in swaps[2].text
    spec_lo = label.index("template <>")
    for v in got[VariantKind.OP_SWAP] + got[VariantKind.OFF_BY_ONE]:
        assert _change(label, v)[0] < spec_lo
        assert "const scalar_t* row = a + idx * K;" in v.text  # pointer arithmetic stays


def test_shared_memory_kernel():
    label, kernel = _label("shared_reduce.cu")
    got = _by_kind(derive_variants(label, kernel))
    assert "{\n  return;\n  __shared__ float buf[BLOCK];" in got[VariantKind.NO_WRITE][0].text
    offs = [v.text for v in got[VariantKind.OFF_BY_ONE]]
    assert "for (int i = tid; i < n - 1; i += BLOCK)" in offs[0]
    # a halving loop gets its bound raised (s > 1), never lowered into an endless loop
    assert any("s > 0 + 1;" in t for t in offs)
    assert not any("s > 0 - 1" in t for t in offs)
    swaps = got[VariantKind.OP_SWAP]
    assert "output[blockIdx.x] = buf[0] - n;" in swaps[0].text
    assert any("buf[tid] -= buf[tid + s];" in v.text for v in swaps)


def test_atomic_output():
    label, kernel = _label("atomic_scatter.cu")
    got = _by_kind(derive_variants(label, kernel))
    assert "i < numel - 1;" in got[VariantKind.OFF_BY_ONE][0].text
    assert [v.description.split(" (line")[0] for v in got[VariantKind.OP_SWAP]] == [
        "`*` -> `+` in `src[i] * weight`"
    ]
    assert "atomicAdd(&out[index[i]], src[i] + weight);" in got[VariantKind.OP_SWAP][0].text


# small inline labels ------------------------------------------------------------------------
HEAD = "// kminer label x: {k} (test)\n#include <cuda_runtime.h>\n// kminer-label-body-begin\n"
TAIL = "void kminer_bind(int) {}\n// kminer-label-body-end\n"


def _inline(kernel: str, code: str) -> str:
    return HEAD.format(k=kernel) + code + TAIL


def test_unknown_kernel_is_a_one_line_value_error():
    text = _inline("k", "__global__ void k(float* o) { o[0] = 1; }\n")
    with pytest.raises(ValueError) as err:
        derive_variants(text, "missing_kernel")
    assert "missing_kernel" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError):  # a __device__ function is no kernel
        derive_variants(_inline("d", "__device__ float d(float x) { return x + 1; }\n"), "d")


def test_only_the_named_kernel_changes():
    other = "__global__ void other(float* o, int n) {\n  if (threadIdx.x < n) o[0] = o[1] + 2;\n}\n"
    mine = "__global__ void mine(float* o, int n) {\n  if (threadIdx.x < n) o[1] = o[0] * 3;\n}\n"
    text = _inline("mine", other + mine)
    for v in derive_variants(text, "mine"):
        assert other in v.text
    assert {v.kind for v in derive_variants(text, "other")} == set(KINDS)


def test_store_index_when_no_comparison():
    text = _inline(
        "k",
        "__global__ void k(const float* a, float* out) {\n"
        "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  out[i] = a[i] * 2.f;\n}\n",
    )
    offs = [v for v in derive_variants(text, "k") if v.kind == VariantKind.OFF_BY_ONE]
    assert len(offs) == 1 and "out[i + 1] = a[i] * 2.f;" in offs[0].text


def test_gather_without_value_arithmetic_swaps_in_the_index():
    text = _inline(
        "g",
        "__global__ void g(const float* src, const int* idx, float* out, int n,"
        " int k) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < n) out[i] = src[idx[i] * k + 1];\n}\n",
    )
    swaps = [v for v in derive_variants(text, "g") if v.kind == VariantKind.OP_SWAP]
    assert "out[i] = src[idx[i] + k + 1];" in swaps[0].text
    # `+ 1` -> `- 1` is a shift by two: it comes after every other operator
    assert all("* k - 1" not in v.text for v in swaps)


def test_unit_steps_come_after_every_other_operator():
    """NMS: `start = tid + 1` skips the box itself; `tid - 1` adds it and the box before, whose
    bits the host loop never reads, so the variant equals the label. Other operators first."""
    text = _inline(
        "nms",
        "__global__ void nms(const float* boxes, unsigned long long* mask, int n, int blocks) {\n"
        "  int tid = threadIdx.x;\n  int start = 0;\n"
        "  if (blockIdx.x == blockIdx.y) start = tid + 1;\n"
        "  unsigned long long t = 0;\n"
        "  for (int i = start; i < n; i++) if (boxes[i] > boxes[tid]) t |= 1ULL << i;\n"
        "  mask[tid * blocks + blockIdx.y] = t;\n}\n",
    )
    swaps = [v for v in derive_variants(text, "nms") if v.kind == VariantKind.OP_SWAP]
    assert "tid - 1" not in swaps[0].text and any("tid - 1" in v.text for v in swaps)


def test_value_operators_before_index_operators():
    text = _inline(
        "k",
        "__global__ void k(const float* a, float* out, int n, int w) {\n"
        "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < n) out[i * w + 1] = a[i + w] - a[i];\n}\n",
    )
    swaps = [v for v in derive_variants(text, "k") if v.kind == VariantKind.OP_SWAP]
    assert len(swaps) == 1 and "= a[i + w] + a[i];" in swaps[0].text


def test_an_output_written_through_a_store_helper_gets_operators_beside_direct_stores():
    """mamba's scan writes its states `x[...] = ...` directly and its output through
    `store_output<K>(out, out_vals, ...)`: the output's data flow is mutated too (before, only
    the states', which the test may not compare). `load_input<K>(...)` stores nothing."""
    text = _inline(
        "k",
        "template <typename K> __device__ void load_input(const float* p, float* v, int n) {}\n"
        "template <typename K> __device__ void store_output(float* p, float* v, int n) {}\n"
        "__global__ void k(const float* u, float* x, float* out, float d, int n) {\n"
        "  float vals[4];\n  load_input<int>(u, vals, n);\n"
        "  x[threadIdx.x] = d * n;\n"
        "  float res[1][2];\n  res[0][0] = vals[0] - d;\n  store_output<int>(out, res[0], n);\n}\n",
    )
    swaps = [v.description for v in derive_variants(text, "k") if v.kind == VariantKind.OP_SWAP]
    assert any("`vals[0] - d`" in d for d in swaps) and any("`d * n`" in d for d in swaps)


def test_how_many_elements_a_store_helper_writes_is_swapped_after_what_it_writes():
    """mamba's `store_output<K>(out, vals, params.seqlen - chunk * kChunkSize)`: with one chunk
    `chunk` is 0, so `-` -> `+` changes nothing the test sees; its backward's first op_swap
    survived and the device call ended before the next one was built."""
    text = _inline(
        "k",
        "struct P { int seqlen; };\n"
        "template <typename K> __device__ void store_output(float* p, float* v, int n) {}\n"
        "__global__ void k(float* out, const float* a, P params) {\n"
        "  constexpr int kChunk = 64;\n"
        "  for (int chunk = 0; chunk < 4; ++chunk) {\n"
        "    float vals[2];\n    vals[0] = a[chunk] * 2.f;\n"
        "    store_output<int>(out, vals, params.seqlen - chunk * kChunk);\n  }\n}\n",
    )
    swaps = [v.description for v in derive_variants(text, "k") if v.kind == VariantKind.OP_SWAP]
    assert "`a[chunk] * 2.f`" in swaps[0]
    assert any("`params.seqlen - chunk * kChunk`" in d for d in swaps[1:])


def test_qualifier_macro_and_qualified_name():
    code = (
        "#define GLOBAL __global__\nnamespace ns {\nGLOBAL void k(float* o, int n) {\n"
        "  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = o[i] * 0.5f;\n}\n}\n"
    )
    text = _inline("ns::k", code)
    got = _by_kind(derive_variants(text, "ns::k"))
    assert {k for k, vs in got.items() if vs} == set(KINDS)
    assert "i < n - 1;" in got[VariantKind.OFF_BY_ONE][0].text
    assert "o[i] = o[i] + 0.5f;" in got[VariantKind.OP_SWAP][0].text


def test_empty_kernel_has_no_no_write():
    got = derive_variants(_inline("k", "__global__ void k() {}\n"), "k")
    assert got == []


def test_comment_after_the_first_line():
    text = _inline("k", "__global__ void k(float* o, int n) { if (threadIdx.x < n) o[0] = 1; }\n")
    for v in derive_variants(text, "k"):
        first, comment, *_ = v.text.split("\n")
        assert first == text.split("\n")[0]
        assert comment.startswith(f"// kminer variant: {v.kind.value}: ")


# compile check ------------------------------------------------------------------------------
NVCC = shutil.which("nvcc") or (
    "/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None
)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not available")
@pytest.mark.parametrize("name", FIXTURE_KERNELS)
def test_fixture_variants_compile(name, tmp_path):
    """Every variant of the device-only fixtures goes through nvcc's front end (`-cuda`: the
    full C++/CUDA parse and type check, templates instantiated by the host launcher; this nvcc
    has no `-fsyntax-only`)."""
    label, kernel = _label(name)
    for i, text in enumerate([label] + [v.text for v in derive_variants(label, kernel)]):
        src = tmp_path / f"v{i}.cu"
        src.write_text(text)
        cmd = [NVCC, "-x", "cu", "-std=c++17", "-cuda", str(src), "-o", str(tmp_path / "v.ii")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"variant {i} of {name}:\n{text[:400]}\n{proc.stderr}"


def test_loop_macro_bound_is_the_argument_not_a_letter_of_the_index():
    """mmcv's deform col2im: `CUDA_1D_KERNEL_LOOP(index, n)`: the `n` of `index` is no bound."""
    text = _inline(
        "k",
        "#define CUDA_1D_KERNEL_LOOP(i, n) for (int i = blockIdx.x * blockDim.x + threadIdx.x;"
        " i < (n); i += blockDim.x * gridDim.x)\n"
        "__global__ void k(const int n, const float* x, float* y) {\n"
        "  CUDA_1D_KERNEL_LOOP(index, n) { y[index] = x[index] * 2.0f; }\n}\n",
    )
    (off, *_) = [v for v in derive_variants(text, "k") if v.kind == VariantKind.OFF_BY_ONE]
    assert "CUDA_1D_KERNEL_LOOP(index, (n) - 1) {" in off.text


def test_a_kernel_after_code_the_grammar_cannot_read_still_gets_its_variants():
    """SparseConvNet calls a macro as a statement with no semicolon (`FOO(T, 64, 16)`) before
    its rule-book kernels; the grammar loses every definition after it, so the kernel is read
    alone (its span and the preprocessor lines), its edits still made on the label's text."""
    label = (
        "using Int = int;\n"
        "#define FOO(T, K, V) { if (n % K == 0) { k<T, K, V><<<1, K>>>(o, i, n); return; } }\n"
        "template <typename T>\nvoid launch(T *o, T *i, Int *rules,\n\t\tInt n) {\n"
        "  FOO(T, 64, 16)\n  FOO(T, 32, 8)\n  assert(false);\n}\n"
        "template <>\nvoid launch<double>(double *o, double *i, Int *rules,\n\t\tInt n) {\n"
        "  FOO(double, 32, 8)\n  FOO(double, 16, 4)\n  assert(false);\n}\n"
        "template <typename T, Int K, Int V>\n__global__ void\nk(T *o, T *i, Int n) {\n"
        "  for (int x = threadIdx.x; x < n; x += blockDim.x) o[x] += i[x] * 2;\n}\n"
    )
    found = derive_variants(label, "k")
    kinds = {v.kind for v in found}
    assert {VariantKind.NO_WRITE, VariantKind.OFF_BY_ONE, VariantKind.OP_SWAP} <= kinds
    head = label[: label.index("__global__")]
    for v in found:
        text = re.sub(r"^// kminer variant:.*\n", "", v.text, flags=re.MULTILINE)
        assert text.startswith(head) and text != label  # only the kernel's body changed
