// kminer compile-only shim (see cublas_v2.h)
#pragma once
#include "cusolver_common.h"
typedef struct cusolverDnContext* cusolverDnHandle_t;
