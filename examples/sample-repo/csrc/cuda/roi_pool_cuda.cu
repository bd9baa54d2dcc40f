#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "roi_pool_kernel.cuh"

void roi_center_pool_forward_cuda(at::Tensor input, at::Tensor rois,
                                  at::Tensor output, int pooled_height,
                                  int pooled_width, float spatial_scale) {
  TORCH_CHECK(input.is_contiguous() && rois.is_contiguous(),
              "roi_center_pool: inputs must be contiguous");
  const int output_size = output.numel();
  if (output_size == 0) return;
  const int channels = input.size(1);
  const int height = input.size(2);
  const int width = input.size(3);

  c10::cuda::CUDAGuard device_guard(input.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(
      input.scalar_type(), "roi_center_pool_forward_cuda", [&] {
        roi_center_pool_forward_cuda_kernel<scalar_t>
            <<<GET_BLOCKS(output_size), THREADS_PER_BLOCK, 0, stream>>>(
                output_size, input.data_ptr<scalar_t>(),
                rois.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(),
                static_cast<scalar_t>(spatial_scale), channels, height, width,
                pooled_height, pooled_width);
      });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
