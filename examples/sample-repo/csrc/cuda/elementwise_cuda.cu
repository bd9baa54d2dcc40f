#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "elementwise_kernel.cuh"

void scaled_add_forward_cuda(at::Tensor a, at::Tensor b, float alpha,
                             at::Tensor output) {
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous(),
              "scaled_add: inputs must be contiguous");
  const int n = output.numel();
  if (n == 0) return;

  c10::cuda::CUDAGuard device_guard(a.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND_HALF(
      a.scalar_type(), "scaled_add_forward_cuda", [&] {
        scaled_add_cuda_kernel<scalar_t>
            <<<GET_BLOCKS(n), THREADS_PER_BLOCK, 0, stream>>>(
                n, a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                static_cast<scalar_t>(alpha), output.data_ptr<scalar_t>());
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// input: (batch, channels, *spatial) viewed as (batch, channels, spatial)
void bias_silu_forward_cuda(at::Tensor input, at::Tensor bias,
                            at::Tensor output) {
  TORCH_CHECK(input.is_contiguous() && bias.is_contiguous(),
              "bias_silu: inputs must be contiguous");
  const int n = output.numel();
  if (n == 0) return;
  const int batch = input.size(0);
  const int channels = input.size(1);
  const int spatial = n / (batch * channels);

  c10::cuda::CUDAGuard device_guard(input.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "bias_silu_forward_cuda", [&] {
    bias_silu_cuda_kernel<scalar_t>
        <<<GET_BLOCKS(n), THREADS_PER_BLOCK, 0, stream>>>(
            input.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
            output.data_ptr<scalar_t>(), batch, channels, spatial);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
