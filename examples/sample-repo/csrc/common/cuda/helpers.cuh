// Shared CUDA helpers for tinyops kernels.
#ifndef TINYOPS_COMMON_CUDA_HELPERS_CUH
#define TINYOPS_COMMON_CUDA_HELPERS_CUH

#include <cuda_runtime.h>

#define CUDA_1D_KERNEL_LOOP(i, n)                              \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += blockDim.x * gridDim.x)

#define THREADS_PER_BLOCK 256
#define MAX_GRID_BLOCKS 4096

inline int GET_BLOCKS(int n) {
  int blocks = (n + THREADS_PER_BLOCK - 1) / THREADS_PER_BLOCK;
  if (blocks < 1) blocks = 1;
  return blocks < MAX_GRID_BLOCKS ? blocks : MAX_GRID_BLOCKS;
}

template <typename T>
__device__ __forceinline__ T max_val(T a, T b) {
  return a > b ? a : b;
}

// Logistic sigmoid; exp() resolves to the float or double overload.
template <typename T>
__device__ __forceinline__ T device_sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}

// SiLU / swish: x * sigmoid(x).
template <typename T>
__device__ __forceinline__ T device_silu(T x) {
  return x * device_sigmoid(x);
}

// Bilinear sample of one (height, width) plane at continuous (y, x).
// Samples further than one pixel outside the plane are zero.
template <typename T>
__device__ T bilinear_interpolate(const T* data, const int height,
                                  const int width, T y, T x) {
  if (y < T(-1) || y > T(height) || x < T(-1) || x > T(width)) return T(0);
  if (y <= T(0)) y = T(0);
  if (x <= T(0)) x = T(0);

  int y_low = static_cast<int>(y);
  int x_low = static_cast<int>(x);
  int y_high, x_high;
  if (y_low >= height - 1) {
    y_high = y_low = height - 1;
    y = T(y_low);
  } else {
    y_high = y_low + 1;
  }
  if (x_low >= width - 1) {
    x_high = x_low = width - 1;
    x = T(x_low);
  } else {
    x_high = x_low + 1;
  }

  const T ly = y - T(y_low), lx = x - T(x_low);
  const T hy = T(1) - ly, hx = T(1) - lx;
  const T v1 = data[y_low * width + x_low];
  const T v2 = data[y_low * width + x_high];
  const T v3 = data[y_high * width + x_low];
  const T v4 = data[y_high * width + x_high];
  return hy * hx * v1 + hy * lx * v2 + ly * hx * v3 + ly * lx * v4;
}

// Sum of `val` over the 32 lanes of a warp; lane 0 holds the result.
template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T val) {
  for (int offset = 16; offset > 0; offset >>= 1)
    val += __shfl_down_sync(0xffffffffu, val, offset);
  return val;
}

#endif  // TINYOPS_COMMON_CUDA_HELPERS_CUH
