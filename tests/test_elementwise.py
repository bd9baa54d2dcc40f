"""A host function that uses each tensor only as n elements takes inputs by rule; one that
reads a size, an index or an integer tensor does not."""

import torch

from testgen.elementwise import elementwise_tensors
from testgen.made_inputs import ELEMENTWISE_ORIGIN, RULE_SIZES, elementwise_calls

LABEL = """
template <typename T>
__global__ void leaky(T *x, T *y, int n, T alpha) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 1024)
    y[i] = x[i] > 0 ? x[i] : x[i] * alpha;
}
template <typename T>
void cuda_leaky(at::Tensor &input, at::Tensor &output, T alpha) {
  output.resize_as_(input);
  auto n = input.numel();  // input.size(1) in a comment does not count
  leaky<T><<<16, 1024>>>(input.data_ptr<T>(), output.data_ptr<T>(), n, alpha);
}
template <typename T>
void cpu_leaky(at::Tensor &input, at::Tensor &output, T alpha) {
  auto rows = input.size(0);  // the CPU branch is no part of the label's contract
}
void leaky_forward(at::Tensor &input, at::Tensor &output, double alpha) {
  CHECK_CUDA(input);
  if (input.device().type() == torch::kCUDA)
    cuda_leaky<float>(input, output, alpha);
  else
    cpu_leaky<float>(input, output, alpha);
}
void per_row(at::Tensor &input, at::Tensor &noise, double alpha) {
  auto planes = input.size(1);
  leaky<float><<<16, 1024>>>(input.data_ptr<float>(), noise.data_ptr<float>(), planes, alpha);
}
void gather(at::Tensor &src, at::Tensor &idx, at::Tensor &out) {
  auto n = out.numel();
  leaky<float><<<16, 1024>>>(src.data_ptr<float>(), out.data_ptr<float>(), n, 1.0f);
  use(idx.data_ptr<int64_t>());
}
void wide(at::Tensor &input, at::Tensor &output, double alpha) {
  auto n = input.numel();
  leaky<double><<<16, 1024>>>(input.data_ptr<double>(), output.data_ptr<double>(), n, alpha);
}
"""


def test_a_host_function_that_uses_tensors_as_n_elements_is_found_through_its_dispatch():
    assert elementwise_tensors(LABEL, "leaky_forward", ["input", "output"]) == {
        "input": "float32",
        "output": "float32",
    }
    assert elementwise_tensors(LABEL, "wide", ["input", "output"]) == {
        "input": "float64",
        "output": "float64",
    }
    assert elementwise_tensors(LABEL, "per_row", ["input", "noise"]) is None  # a size read
    assert elementwise_tensors(LABEL, "gather", ["src", "idx", "out"]) is None  # indices
    assert elementwise_tensors(LABEL, "missing", ["input"]) is None


def test_its_calls_are_the_rules_sizes_with_a_value_per_scalar():
    params = [("at::Tensor &", "input"), ("at::Tensor &", "output"), ("double", "alpha")]
    calls = elementwise_calls(params, LABEL, "leaky_forward")
    assert [c.args[0].numel() for c in calls] == list(RULE_SIZES)
    assert all(c.args[1].shape == c.args[0].shape and c.args[2] == 1.25 for c in calls)
    assert calls[0].origin == ELEMENTWISE_ORIGIN and calls[0].args[0].dtype == torch.float32
    wide = elementwise_calls(params, LABEL, "wide")
    assert wide[0].args[0].dtype == torch.float64
    counted = [("at::Tensor &", "input"), ("at::Tensor &", "noise"), ("int", "n")]
    assert elementwise_calls(counted, LABEL, "per_row") == []  # an int may be a size
