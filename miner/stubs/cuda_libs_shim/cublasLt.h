// kminer compile-only shim (see cublas_v2.h)
#pragma once
#include "cublas_v2.h"
typedef struct cublasLtContext* cublasLtHandle_t;
