// Elementwise kernels: scaled add and fused bias + SiLU.
#ifndef TINYOPS_ELEMENTWISE_KERNEL_CUH
#define TINYOPS_ELEMENTWISE_KERNEL_CUH

#include "helpers.cuh"

// out = a + alpha * b
template <typename T>
__global__ void scaled_add_cuda_kernel(const int n, const T* a, const T* b,
                                       const T alpha, T* out) {
  CUDA_1D_KERNEL_LOOP(i, n) { out[i] = a[i] + alpha * b[i]; }
}

// input: (batch, channels, spatial), bias: (channels,)
// output = silu(input + bias[channel])
template <typename T>
__global__ void bias_silu_cuda_kernel(const T* input, const T* bias,
                                      T* output, const int batch,
                                      const int channels, const int spatial) {
  CUDA_1D_KERNEL_LOOP(index, batch * channels * spatial) {
    const int c = (index / spatial) % channels;
    output[index] = device_silu(input[index] + bias[c]);
  }
}

#endif  // TINYOPS_ELEMENTWISE_KERNEL_CUH
