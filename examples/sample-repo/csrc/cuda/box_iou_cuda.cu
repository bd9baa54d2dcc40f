#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "box_iou_kernel.cuh"

void box_iou_forward_cuda(at::Tensor boxes_a, at::Tensor boxes_b,
                          at::Tensor ious) {
  TORCH_CHECK(boxes_a.scalar_type() == at::kFloat &&
                  boxes_b.scalar_type() == at::kFloat,
              "box_iou: boxes must be float32");
  TORCH_CHECK(boxes_a.is_contiguous() && boxes_b.is_contiguous(),
              "box_iou: boxes must be contiguous");
  const int num_a = boxes_a.size(0);
  const int num_b = boxes_b.size(0);
  const int output_size = num_a * num_b;
  if (output_size == 0) return;

  c10::cuda::CUDAGuard device_guard(boxes_a.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  box_iou_cuda_kernel<<<GET_BLOCKS(output_size), THREADS_PER_BLOCK, 0,
                        stream>>>(boxes_a.data_ptr<float>(),
                                  boxes_b.data_ptr<float>(),
                                  ious.data_ptr<float>(), num_a, num_b);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
