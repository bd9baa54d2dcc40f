// kminer compile-only shim (see cublas_v2.h)
#pragma once
typedef enum {
  CUSOLVER_STATUS_SUCCESS = 0,
  CUSOLVER_STATUS_NOT_INITIALIZED = 1,
  CUSOLVER_STATUS_INVALID_VALUE = 3
} cusolverStatus_t;
