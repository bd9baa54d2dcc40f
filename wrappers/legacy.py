"""Old PyTorch extension code, built on today's torch without editing the mined kernel.

Extensions written for torch < 1.11 include THC headers (removed since), take a THCState from
`at::globalContext().lazyInitCUDA()` (now void), allocate with `THCudaMalloc`, multiply with
`THCudaBlas_*`, check with `THCudaCheck`/`AT_CHECK`, and dispatch on `x.type()` (which no longer
converts to a ScalarType). A label or reference made from such code gets, instead of the removed
headers, one compatibility block (`COMPAT_CUDA` for labels, `COMPAT_CPU` for CPU references)
that gives those names their meaning on today's torch, and the few textual rewrites a block
cannot do. Each rewrite that fired is listed in the file's header, so a reader sees exactly what
differs from the repository's code. Code that uses none of this is left byte for byte as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miner.unit import THC_DEVICE_COMPAT

# headers torch no longer ships; THCAtomics.cuh stays (torch keeps it for such code)
_REMOVED_INCLUDE = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*[<\"]THC/(?!THCAtomics\.cuh)\w+\.(?:h|cuh)[>\"][ \t]*$",
    re.MULTILINE,
)
# what the CPU block answers: AT_CHECK, THArgCheck/THError, AT_DISPATCH_*(x.type(), ...),
# TH's CPU BLAS (THFloatBlas_gemm, THDoubleBlas_gemv)
_OLD_CPU = re.compile(
    r"\bAT_CHECK\b|\bTH(?:ArgCheck|Error)\b|\bTH(?:Float|Double)Blas_(?:gemm|gemv)\b"
    r"|\bAT_DISPATCH_\w+\s*\([^,;]*\.\s*type\s*\(\s*\)"
)
# text the block cannot fix: the old lazyInitCUDA returned the THCState, today's returns void
_REWRITES = (
    (
        "lazyInitCUDA() as THCState",
        re.compile(r"\bat::globalContext\(\)\s*\.\s*(?:lazyInitCUDA|getTHCState)\s*\(\s*\)"),
        "kminer_thc_state()",
    ),
)

# TH's CPU BLAS, column-major as BLAS is (beta == 0: C is not read, as BLAS promises)
CPU_BLAS = """\
template <typename T>
inline void kminer_cpu_gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, T alpha,
                            const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                            int64_t ldc) {
  const bool at = ta != 'n' && ta != 'N', bt = tb != 'n' && tb != 'N';
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      T sum = 0;
      for (int64_t l = 0; l < k; ++l)
        sum += (at ? a[l + i * lda] : a[i + l * lda]) * (bt ? b[j + l * ldb] : b[l + j * ldb]);
      c[i + j * ldc] = beta == T(0) ? alpha * sum : alpha * sum + beta * c[i + j * ldc];
    }
}
template <typename T>
inline void kminer_cpu_gemv(char trans, int64_t m, int64_t n, T alpha, const T* a, int64_t lda,
                            const T* x, int64_t incx, T beta, T* y, int64_t incy) {
  const bool t = trans != 'n' && trans != 'N';
  const int64_t rows = t ? n : m, inner = t ? m : n;
  for (int64_t i = 0; i < rows; ++i) {
    T sum = 0;
    for (int64_t l = 0; l < inner; ++l) sum += (t ? a[l + i * lda] : a[i + l * lda]) * x[l * incx];
    y[i * incy] = beta == T(0) ? alpha * sum : alpha * sum + beta * y[i * incy];
  }
}
#define KMINER_TH_BLAS(T, GEMM, GEMV)                                                          \\
  inline void GEMM(char ta, char tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,    \\
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {         \\
    kminer_cpu_gemm<T>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);                 \\
  }                                                                                           \\
  inline void GEMV(char trans, int64_t m, int64_t n, T alpha, const T* a, int64_t lda,        \\
                   const T* x, int64_t incx, T beta, T* y, int64_t incy) {                    \\
    kminer_cpu_gemv<T>(trans, m, n, alpha, a, lda, x, incx, beta, y, incy);                   \\
  }
KMINER_TH_BLAS(float, THFloatBlas_gemm, THFloatBlas_gemv)
KMINER_TH_BLAS(double, THDoubleBlas_gemm, THDoubleBlas_gemv)"""

COMPAT_CPU = (
    """\
#ifndef KMINER_LEGACY_TORCH_CPU
#define KMINER_LEGACY_TORCH_CPU 1
namespace detail {  // AT_DISPATCH_*(x.type(), ...): the old type property gives its ScalarType
inline at::ScalarType scalar_type(const at::DeprecatedTypeProperties& t) { return t.scalarType(); }
}  // namespace detail
#ifndef AT_CHECK
#define AT_CHECK TORCH_CHECK
#endif
#ifndef THArgCheck
#define THArgCheck(cond, arg, ...) TORCH_CHECK(cond, "argument ", arg, ": " __VA_ARGS__)
#endif
#ifndef THError
#define THError(...) TORCH_CHECK(false, __VA_ARGS__)
#endif
"""
    + CPU_BLAS
    + """
#endif"""
)

COMPAT_CUDA = (
    """\
#ifndef KMINER_LEGACY_TORCH_CUDA
#define KMINER_LEGACY_TORCH_CUDA 1
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/DeviceUtils.cuh>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
struct THCState;  // THC's state is gone: everything it held is torch's current CUDA context
inline THCState* kminer_thc_state() { return nullptr; }
#define THCudaCheck(expr) C10_CUDA_CHECK(expr)
#define THCState_getCurrentStream(state) at::cuda::getCurrentCUDAStream().stream()
#define THCudaMalloc(state, size) c10::cuda::CUDACachingAllocator::raw_alloc(size)
#define THCudaFree(state, ptr) c10::cuda::CUDACachingAllocator::raw_delete(ptr)
"""
    + THC_DEVICE_COMPAT
    + """
inline cublasOperation_t kminer_blas_op(char t) {
  return t == 't' || t == 'T' ? CUBLAS_OP_T : t == 'c' || t == 'C' ? CUBLAS_OP_C : CUBLAS_OP_N;
}
#define KMINER_THC_GEMM(NAME, T, CALL)                                                        \\
  inline void NAME(THCState*, char ta, char tb, int64_t m, int64_t n, int64_t k, T alpha,     \\
                   const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,            \\
                   int64_t ldc) {                                                             \\
    TORCH_CUDABLAS_CHECK(CALL(at::cuda::getCurrentCUDABlasHandle(), kminer_blas_op(ta),       \\
                              kminer_blas_op(tb), m, n, k, &alpha, a, lda, b, ldb, &beta, c,  \\
                              ldc));                                                          \\
  }
KMINER_THC_GEMM(THCudaBlas_Sgemm, float, cublasSgemm)
KMINER_THC_GEMM(THCudaBlas_Dgemm, double, cublasDgemm)
#define KMINER_THC_GEMM_BATCHED(NAME, T, CALL)                                                \\
  inline void NAME(THCState*, char ta, char tb, int64_t m, int64_t n, int64_t k, T alpha,     \\
                   const T* a[], int64_t lda, const T* b[], int64_t ldb, T beta, T* c[],      \\
                   int64_t ldc, int64_t batches) {                                            \\
    TORCH_CUDABLAS_CHECK(CALL(at::cuda::getCurrentCUDABlasHandle(), kminer_blas_op(ta),       \\
                              kminer_blas_op(tb), m, n, k, &alpha, a, lda, b, ldb, &beta, c,  \\
                              ldc, batches));                                                 \\
  }
KMINER_THC_GEMM_BATCHED(THCudaBlas_SgemmBatched, float, cublasSgemmBatched)
KMINER_THC_GEMM_BATCHED(THCudaBlas_DgemmBatched, double, cublasDgemmBatched)
#define KMINER_THC_GEMV(NAME, T, CALL)                                                        \\
  inline void NAME(THCState*, char trans, int64_t m, int64_t n, T alpha, const T* a,          \\
                   int64_t lda, const T* x, int64_t incx, T beta, T* y, int64_t incy) {       \\
    TORCH_CUDABLAS_CHECK(CALL(at::cuda::getCurrentCUDABlasHandle(), kminer_blas_op(trans), m,  \\
                              n, &alpha, a, lda, x, incx, &beta, y, incy));                   \\
  }
KMINER_THC_GEMV(THCudaBlas_Sgemv, float, cublasSgemv)
KMINER_THC_GEMV(THCudaBlas_Dgemv, double, cublasDgemv)
#endif"""
)


@dataclass
class Modernized:
    includes: list[str]
    codes: list[str]  # the code parts given, in their order
    rewrites: list[str] = field(default_factory=list)  # what differs from the repository's code


def modernize(includes: list[str], codes: list[str], cuda: bool = True) -> Modernized:
    """`includes` (lines) and `codes` (the parts of a label's or reference's body) made to build
    on today's torch; unchanged when they use nothing old. The CUDA block comes with a removed THC
    header (what used to define its names), so a repository that defines them itself keeps its
    own."""
    removed = [ln.strip() for ln in includes if _REMOVED_INCLUDE.match(ln)]
    rewrites = [f"dropped {ln}" for ln in removed]
    for name, pattern, replacement in _REWRITES:
        done = [pattern.subn(replacement, code) for code in codes]
        codes = [code for code, _ in done]
        if n := sum(n for _, n in done):
            rewrites.append(f"{name} -> {replacement} ({n}x)")
    code = "\n".join(codes)
    codes, defined = _define_state(codes)
    if defined:
        rewrites.append(f"extern THCState *{defined} -> defined here (as nullptr)")
    cuda_block = cuda and bool(removed or rewrites)
    old_cpu = sorted({m.group(0).split("(")[0].strip() for m in _OLD_CPU.finditer(code)})
    if not (cuda_block or old_cpu or removed):
        return Modernized(includes, codes)
    blocks = [COMPAT_CPU, *([COMPAT_CUDA] if cuda_block else [])]
    if old_cpu:
        rewrites.append(
            "compat block for "
            + ", ".join("x.type() dispatch" if w.startswith("AT_DISPATCH") else w for w in old_cpu)
        )
    if cuda_block:
        rewrites.append("compat block for THC (state, streams, malloc, cuBLAS, checks)")
    kept = [ln for ln in includes if not _REMOVED_INCLUDE.match(ln)]
    return Modernized([*kept, *blocks], codes, list(dict.fromkeys(rewrites)))


_EXTERN_STATE = re.compile(r"^[ \t]*extern[ \t]+THCState[ \t]*\*[ \t]*(\w+)[ \t]*;", re.MULTILINE)


def _define_state(codes: list[str]) -> tuple[list[str], str]:
    """`extern THCState *state;` is defined in another file of the repository, which a label
    does not have: passed to THCudaBlas_* it would be an undefined symbol at import."""
    text = "\n".join(codes)
    found = _EXTERN_STATE.search(text)
    if not found or re.search(rf"THCState\s*\*\s*{found.group(1)}\s*=", text):
        return codes, ""
    name = found.group(1)
    return [_EXTERN_STATE.sub(r"THCState *\1 = kminer_thc_state();", c) for c in codes], name


def header_lines(rewrites: list[str]) -> list[str]:
    """The comment lines a file lists its legacy rewrites with (none when it has none)."""
    if not rewrites:
        return []
    return ["// kminer: legacy torch API made to build on today's torch (wrappers/legacy.py):"] + [
        f"//   {r}" for r in rewrites
    ]
