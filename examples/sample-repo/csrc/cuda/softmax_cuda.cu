#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "softmax_kernel.cuh"

// One block per row, capped at MAX_GRID_BLOCKS (the kernels grid-stride).
static inline int row_blocks(int rows) {
  return rows < MAX_GRID_BLOCKS ? rows : MAX_GRID_BLOCKS;
}

// input, output: (rows, cols)
void row_softmax_forward_cuda(at::Tensor input, at::Tensor output) {
  TORCH_CHECK(input.is_contiguous(), "row_softmax: input must be contiguous");
  const int rows = input.size(0);
  const int cols = input.size(1);
  if (rows == 0 || cols == 0) return;

  c10::cuda::CUDAGuard device_guard(input.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "row_softmax_forward_cuda", [&] {
    row_softmax_cuda_kernel<scalar_t>
        <<<row_blocks(rows), THREADS_PER_BLOCK, 0, stream>>>(
            input.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(), rows, cols);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// input: (rows, cols), output: (rows,)
void row_sum_forward_cuda(at::Tensor input, at::Tensor output) {
  TORCH_CHECK(input.is_contiguous(), "row_sum: input must be contiguous");
  const int rows = input.size(0);
  const int cols = input.size(1);
  if (rows == 0) return;

  c10::cuda::CUDAGuard device_guard(input.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "row_sum_forward_cuda", [&] {
    row_sum_cuda_kernel<scalar_t>
        <<<row_blocks(rows), THREADS_PER_BLOCK, 0, stream>>>(
            input.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(), rows, cols);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
