"""Launchers that take, or are methods of, a class the repository binds with py::class_."""

from __future__ import annotations

import pytest
from conftest import kernel, label_of, needs_nvcc

from wrappers.batching import batch_source
from wrappers.bound_class import bound_classes, method_signature
from wrappers.mined import LauncherIndex, mine_wrapper

TABLE = """\
#include <torch/extension.h>
#define EMPTY 0
__inline__ __device__ int8_t atomicCAS(int8_t *address, int8_t compare, int8_t val) {
  int32_t *base = (int32_t *)((char *)address - ((size_t)address & 3));
  int32_t shift = ((size_t)address & 3) * 8;
  return (int8_t)(atomicCAS(base, (int32_t)compare << shift, (int32_t)val << shift) >> shift);
}
template <typename K = int64_t, typename V = int>
__global__ void put_kernel(K *keys, V *vals, const K *in, int n, int capacity) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int slot = (unsigned long long)in[i] % capacity;
  while (true) {
    K prev = atomicCAS((unsigned long long *)&keys[slot], (unsigned long long)EMPTY,
                       (unsigned long long)in[i]);
    if (prev == EMPTY || prev == in[i]) { vals[slot] = i + 1; return; }
    slot = (slot + 1) % capacity;
  }
}
template <typename K, typename V>
class Table {
 private:
  const int _capacity;
  K *keys;
  V *vals;
 public:
  Table(const int capacity) : _capacity(capacity) {}
  Table(torch::Tensor table_keys, torch::Tensor table_vals)
      : _capacity(table_keys.size(0)), keys(table_keys.data_ptr<K>()),
        vals(table_vals.data_ptr<V>()) {}
  void put_many(const K *in, const int n);
  void put(torch::Tensor in);
  int capacity() { return _capacity; }
  V *values() { return vals; }
};
using table64 = Table<int64_t, int>;
template <typename K, typename V>
void Table<K, V>::put_many(const K *in, const int n) {
  put_kernel<K, V><<<(n + 255) / 256, 256>>>(keys, vals, in, n, _capacity);
}
template <typename K, typename V>
void Table<K, V>::put(torch::Tensor in) {
  put_many(in.data_ptr<K>(), in.size(0));
}
__global__ void used_kernel(const int *vals, int capacity, int *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < capacity && vals[i] != 0) atomicAdd(out, 1);
}
std::vector<at::Tensor> count_used(table64 &table, at::Tensor out) {
  used_kernel<<<(table.capacity() + 255) / 256, 256>>>(table.values(), table.capacity(),
                                                       out.data_ptr<int>());
  return {out};
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<table64>(m, "Table")
      .def(py::init<const int>())
      .def(py::init<torch::Tensor, torch::Tensor>())
      .def("put", &table64::put);
  m.def("count_used", &count_used);
}
"""


@pytest.fixture
def table(tmp_path):
    from miner.discover import discover
    from miner.extract import Extractor

    (tmp_path / "table.cu").write_text(TABLE)
    disc = discover(tmp_path)
    return disc, Extractor(disc), LauncherIndex(disc)


def test_bound_classes_prefer_the_constructor_from_tensors():
    """The binding's own `py::init`s say how Python makes the object; the one taking tensors
    wins (the object's state then lives where the test sees it), with its definition's names."""
    found = bound_classes(TABLE, {"table64": "Table<int64_t, int>"})
    cls = found["table64"]
    assert found["Table<int64_t, int>"] is cls
    assert cls.concrete == "Table<int64_t, int>" and cls.template == "Table"
    assert cls.ctor == [("torch::Tensor", "table_keys"), ("torch::Tensor", "table_vals")]
    assert bound_classes(TABLE.replace("py::class_", "class_"), {}) == {}


def test_a_method_defined_outside_its_class_reads_as_a_plain_signature():
    code = "template <typename K, typename V>\nvoid Table<K, V>::put(torch::Tensor in) {\n}"
    sig = method_signature(code, "put", "Table")
    assert sig is not None and sig.params == [("torch::Tensor", "in")] and not sig.template
    assert method_signature(code, "put", "Other") is None


def test_a_kernel_launched_by_a_method_is_bound_through_the_method_pybind_can_call(table):
    """put_kernel is launched by `put_many(const K *, int)`, called by `put(torch::Tensor)`:
    the adapter makes the table from its bound constructor's tensors and calls `put`."""
    disc, extractor, index = table
    w = mine_wrapper(kernel(disc, "put_kernel"), extractor, index)
    assert w is not None and w.chain == ["put_many", "put"]
    assert [f.name for f in w.functions()] == ["kminer_table64_put"]
    assert (
        "void kminer_table64_put(torch::Tensor self_table_keys, torch::Tensor self_table_vals, "
        "torch::Tensor in) {\n  Table<int64_t, int> self(self_table_keys, self_table_vals);\n"
        "  self.put(in);\n}" in w.code
    )
    assert "class Table" in w.code and "__global__ void put_kernel" in w.code


def test_an_object_argument_is_made_from_its_bound_constructor(table):
    """`count_used(table64 &table, at::Tensor out)`: pybind cannot pass the table, so the
    adapter takes its constructor's tensors and hands back the tensors the launcher returns."""
    disc, extractor, index = table
    w = mine_wrapper(kernel(disc, "used_kernel"), extractor, index)
    assert w is not None and w.chain == ["count_used"]
    assert (
        "std::vector<at::Tensor> kminer_count_used(torch::Tensor table_table_keys, "
        "torch::Tensor table_table_vals, at::Tensor out) {\n"
        "  Table<int64_t, int> table(table_table_keys, table_table_vals);\n"
        "  return count_used(table, out);\n}" in w.code
    )


@needs_nvcc
@pytest.mark.slow
def test_both_adapted_labels_build_in_one_batch(table):
    """Each label in its own namespace: the repository's int8_t atomicCAS must not hide CUDA's
    (a using-declaration brings them back), and the adapters compile against the class."""
    from wrappers.build import build_batch

    texts = [label_of(*table, name)[1].text for name in ("put_kernel", "used_kernel")]
    source, _ = batch_source([("put", texts[0]), ("used", texts[1])], "m")
    assert "using ::atomicCAS;" in source
    results = build_batch([("put", texts[0]), ("used", texts[1])])
    assert all(r.ok for r in results.values()), [r.detail for r in results.values()]
