// kminer shim: THC was removed from torch; its atomics live in ATen now.
#pragma once
#include <ATen/cuda/Atomic.cuh>
