#include <torch/extension.h>

void roi_center_pool_forward_cuda(at::Tensor input, at::Tensor rois,
                                  at::Tensor output, int pooled_height,
                                  int pooled_width, float spatial_scale);
void scaled_add_forward_cuda(at::Tensor a, at::Tensor b, float alpha,
                             at::Tensor output);
void bias_silu_forward_cuda(at::Tensor input, at::Tensor bias,
                            at::Tensor output);
void box_iou_forward_cuda(at::Tensor boxes_a, at::Tensor boxes_b,
                          at::Tensor ious);
void box_iou_forward_cpu(at::Tensor boxes_a, at::Tensor boxes_b,
                         at::Tensor ious);
void row_softmax_forward_cuda(at::Tensor input, at::Tensor output);
void row_sum_forward_cuda(at::Tensor input, at::Tensor output);

at::Tensor roi_center_pool_forward(at::Tensor input, at::Tensor rois,
                                   int64_t pooled_height, int64_t pooled_width,
                                   double spatial_scale) {
  auto output = at::zeros({rois.size(0), input.size(1), pooled_height,
                           pooled_width},
                          input.options());
  roi_center_pool_forward_cuda(input.contiguous(), rois.contiguous(), output,
                               pooled_height, pooled_width, spatial_scale);
  return output;
}

at::Tensor scaled_add_forward(at::Tensor a, at::Tensor b, double alpha) {
  auto output = at::empty_like(a);
  scaled_add_forward_cuda(a.contiguous(), b.contiguous(), alpha, output);
  return output;
}

at::Tensor bias_silu_forward(at::Tensor input, at::Tensor bias) {
  auto output = at::empty_like(input);
  bias_silu_forward_cuda(input.contiguous(), bias.contiguous(), output);
  return output;
}

at::Tensor box_iou_forward(at::Tensor boxes_a, at::Tensor boxes_b) {
  auto ious = at::zeros({boxes_a.size(0), boxes_b.size(0)}, boxes_a.options());
  if (boxes_a.is_cuda()) {
    box_iou_forward_cuda(boxes_a.contiguous(), boxes_b.contiguous(), ious);
  } else {
    box_iou_forward_cpu(boxes_a, boxes_b, ious);
  }
  return ious;
}

at::Tensor row_softmax_forward(at::Tensor input) {
  auto output = at::empty_like(input);
  row_softmax_forward_cuda(input.contiguous(), output);
  return output;
}

at::Tensor row_sum_forward(at::Tensor input) {
  auto output = at::zeros({input.size(0)}, input.options());
  row_sum_forward_cuda(input.contiguous(), output);
  return output;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("roi_center_pool_forward", &roi_center_pool_forward,
        "ROI center pooling forward (CUDA)");
  m.def("scaled_add_forward", &scaled_add_forward, "a + alpha * b (CUDA)");
  m.def("bias_silu_forward", &bias_silu_forward, "silu(x + bias) (CUDA)");
  m.def("box_iou_forward", &box_iou_forward, "pairwise box IoU (CPU/CUDA)");
  m.def("row_softmax_forward", &row_softmax_forward, "row softmax (CUDA)");
  m.def("row_sum_forward", &row_sum_forward, "row sum (CUDA)");
}
