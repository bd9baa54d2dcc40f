// Row-wise reductions over a (rows, cols) matrix, one block per row.
// Both kernels expect blockDim.x == THREADS_PER_BLOCK (a power of two).
#ifndef TINYOPS_SOFTMAX_KERNEL_CUH
#define TINYOPS_SOFTMAX_KERNEL_CUH

#include "helpers.cuh"

// output[r, :] = softmax(input[r, :])
template <typename T>
__global__ void row_softmax_cuda_kernel(const T* input, T* output,
                                        const int rows, const int cols) {
  __shared__ T buffer[THREADS_PER_BLOCK];
  const int tid = threadIdx.x;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in_row = input + static_cast<long long>(row) * cols;
    T* out_row = output + static_cast<long long>(row) * cols;

    T local_max = in_row[0];
    for (int c = tid; c < cols; c += blockDim.x)
      local_max = max_val(local_max, in_row[c]);
    buffer[tid] = local_max;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) buffer[tid] = max_val(buffer[tid], buffer[tid + s]);
      __syncthreads();
    }
    const T row_max = buffer[0];
    __syncthreads();

    T local_sum = T(0);
    for (int c = tid; c < cols; c += blockDim.x)
      local_sum += exp(in_row[c] - row_max);
    buffer[tid] = local_sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) buffer[tid] += buffer[tid + s];
      __syncthreads();
    }
    const T denom = buffer[0];
    __syncthreads();

    for (int c = tid; c < cols; c += blockDim.x)
      out_row[c] = exp(in_row[c] - row_max) / denom;
  }
}

// output[r] = sum(input[r, :])
template <typename T>
__global__ void row_sum_cuda_kernel(const T* input, T* output, const int rows,
                                    const int cols) {
  __shared__ T partial[THREADS_PER_BLOCK];
  const int tid = threadIdx.x;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* in_row = input + static_cast<long long>(row) * cols;
    T acc = T(0);
    for (int c = tid; c < cols; c += blockDim.x) acc += in_row[c];
#if __CUDA_ARCH__ >= 700
    // Volta+: reduce inside each warp with shuffles, then across warps.
    const int lane = tid & 31;
    const int warp = tid >> 5;
    acc = warp_reduce_sum(acc);
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      const int num_warps = (blockDim.x + 31) >> 5;
      acc = lane < num_warps ? partial[lane] : T(0);
      acc = warp_reduce_sum(acc);
      if (lane == 0) output[row] = acc;
    }
#else
    // Older GPUs: plain shared-memory tree reduction.
    partial[tid] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) partial[tid] += partial[tid + s];
      __syncthreads();
    }
    if (tid == 0) output[row] = partial[0];
#endif
    __syncthreads();
  }
}

#endif  // TINYOPS_SOFTMAX_KERNEL_CUH
