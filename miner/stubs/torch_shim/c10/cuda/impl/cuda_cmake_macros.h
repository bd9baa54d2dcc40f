// kminer shim: generated only in CUDA builds of torch; the CPU wheel's headers need it.
#pragma once
#define C10_CUDA_BUILD_SHARED_LIBS
