// kminer compile-only shim: this machine has no cuBLAS headers; torch's CUDAContext.h only
// needs the handle and status types to parse. Never used on a machine with real CUDA libraries.
#pragma once
#include <cuda_runtime_api.h>
typedef struct cublasContext* cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1 } cublasStatus_t;
