// Pairwise IoU between two sets of axis-aligned boxes.
#ifndef TINYOPS_BOX_IOU_KERNEL_CUH
#define TINYOPS_BOX_IOU_KERNEL_CUH

#include "helpers.cuh"

struct Box {
  float x1, y1, x2, y2;

  __host__ __device__ float area() const {
    const float w = x2 - x1, h = y2 - y1;
    return (w > 0.f && h > 0.f) ? w * h : 0.f;
  }
};

__device__ __forceinline__ Box load_box(const float* ptr) {
  Box b;
  b.x1 = ptr[0];
  b.y1 = ptr[1];
  b.x2 = ptr[2];
  b.y2 = ptr[3];
  return b;
}

__device__ __forceinline__ float intersection_area(const Box& a, const Box& b) {
  Box inter;
  inter.x1 = fmaxf(a.x1, b.x1);
  inter.y1 = fmaxf(a.y1, b.y1);
  inter.x2 = fminf(a.x2, b.x2);
  inter.y2 = fminf(a.y2, b.y2);
  return inter.area();
}

__device__ __forceinline__ float box_iou(const Box& a, const Box& b) {
  const float inter = intersection_area(a, b);
  const float uni = a.area() + b.area() - inter;
  return inter / fmaxf(uni, 1e-6f);
}

// boxes_a: (num_a, 4), boxes_b: (num_b, 4) as [x1, y1, x2, y2]
// ious: (num_a, num_b)
__global__ void box_iou_cuda_kernel(const float* boxes_a, const float* boxes_b,
                                    float* ious, const int num_a,
                                    const int num_b) {
  CUDA_1D_KERNEL_LOOP(index, num_a * num_b) {
    const int i = index / num_b;
    const int j = index % num_b;
    ious[index] = box_iou(load_box(boxes_a + i * 4), load_box(boxes_b + j * 4));
  }
}

#endif  // TINYOPS_BOX_IOU_KERNEL_CUH
