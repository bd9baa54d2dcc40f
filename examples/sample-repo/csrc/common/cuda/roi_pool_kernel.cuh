// ROI center pooling: every output bin takes the bilinear sample at the
// centre of its bin (a sampling_ratio == 1 RoIAlign without averaging).
#ifndef TINYOPS_ROI_POOL_KERNEL_CUH
#define TINYOPS_ROI_POOL_KERNEL_CUH

#include "helpers.cuh"

// input:  (N, C, H, W)
// rois:   (R, 5) as [batch_index, x1, y1, x2, y2] in input-image coordinates
// output: (R, C, pooled_height, pooled_width)
template <typename T>
__global__ void roi_center_pool_forward_cuda_kernel(
    const int nthreads, const T* input, const T* rois, T* output,
    const T spatial_scale, const int channels, const int height,
    const int width, const int pooled_height, const int pooled_width) {
  CUDA_1D_KERNEL_LOOP(index, nthreads) {
    const int pw = index % pooled_width;
    const int ph = (index / pooled_width) % pooled_height;
    const int c = (index / pooled_width / pooled_height) % channels;
    const int n = index / pooled_width / pooled_height / channels;

    const T* roi = rois + n * 5;
    const int batch = static_cast<int>(roi[0]);
    const T x1 = roi[1] * spatial_scale;
    const T y1 = roi[2] * spatial_scale;
    const T x2 = roi[3] * spatial_scale;
    const T y2 = roi[4] * spatial_scale;

    const T roi_w = max_val(x2 - x1, T(1));
    const T roi_h = max_val(y2 - y1, T(1));
    const T bin_w = roi_w / static_cast<T>(pooled_width);
    const T bin_h = roi_h / static_cast<T>(pooled_height);

    const T y = y1 + (static_cast<T>(ph) + T(0.5)) * bin_h;
    const T x = x1 + (static_cast<T>(pw) + T(0.5)) * bin_w;

    const T* plane = input + (batch * channels + c) * height * width;
    output[index] = bilinear_interpolate(plane, height, width, y, x);
  }
}

#endif  // TINYOPS_ROI_POOL_KERNEL_CUH
