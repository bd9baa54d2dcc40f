// kminer compile-only shim (see cublas_v2.h)
#pragma once
#include <cuda_runtime_api.h>
typedef struct cusparseContext* cusparseHandle_t;
typedef enum { CUSPARSE_STATUS_SUCCESS = 0 } cusparseStatus_t;
const char* cusparseGetErrorString(cusparseStatus_t status);
