// CPU implementation of pairwise box IoU; mirrors box_iou_cuda_kernel.
#include <ATen/ATen.h>

#include <algorithm>

namespace {

inline float box_area(const float* b) {
  const float w = b[2] - b[0], h = b[3] - b[1];
  return (w > 0.f && h > 0.f) ? w * h : 0.f;
}

inline float box_iou_single(const float* a, const float* b) {
  const float x1 = std::max(a[0], b[0]);
  const float y1 = std::max(a[1], b[1]);
  const float x2 = std::min(a[2], b[2]);
  const float y2 = std::min(a[3], b[3]);
  const float w = x2 - x1, h = y2 - y1;
  const float inter = (w > 0.f && h > 0.f) ? w * h : 0.f;
  const float uni = box_area(a) + box_area(b) - inter;
  return inter / std::max(uni, 1e-6f);
}

}  // namespace

void box_iou_forward_cpu(at::Tensor boxes_a, at::Tensor boxes_b,
                         at::Tensor ious) {
  TORCH_CHECK(boxes_a.scalar_type() == at::kFloat &&
                  boxes_b.scalar_type() == at::kFloat,
              "box_iou: boxes must be float32");
  auto a = boxes_a.contiguous();
  auto b = boxes_b.contiguous();
  const int num_a = a.size(0);
  const int num_b = b.size(0);
  const float* pa = a.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* out = ious.data_ptr<float>();
  for (int i = 0; i < num_a; ++i) {
    for (int j = 0; j < num_b; ++j) {
      out[i * num_b + j] = box_iou_single(pa + i * 4, pb + j * 4);
    }
  }
}
