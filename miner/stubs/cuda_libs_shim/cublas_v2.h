// kminer compile-only shim: this machine has no cuBLAS headers; torch's CUDAContext.h only
// needs the handle and status types to parse. Never used on a machine with real CUDA libraries.
#pragma once
#include <cuda_runtime_api.h>
typedef struct cublasContext* cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1 } cublasStatus_t;
// what old extensions' THCudaBlas_* calls reach through wrappers/legacy.py (cuBLAS v2 API)
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
#ifdef __cplusplus
extern "C" {
#endif
cublasStatus_t cublasSgemm_v2(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const float*, const float*, int, const float*, int, const float*,
                              float*, int);
cublasStatus_t cublasDgemm_v2(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const double*, const double*, int, const double*, int,
                              const double*, double*, int);
cublasStatus_t cublasSgemmBatched(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                  int, const float*, const float* const[], int,
                                  const float* const[], int, const float*, float* const[], int,
                                  int);
cublasStatus_t cublasDgemmBatched(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                  int, const double*, const double* const[], int,
                                  const double* const[], int, const double*, double* const[],
                                  int, int);
cublasStatus_t cublasSgemv_v2(cublasHandle_t, cublasOperation_t, int, int, const float*,
                              const float*, int, const float*, int, const float*, float*, int);
cublasStatus_t cublasDgemv_v2(cublasHandle_t, cublasOperation_t, int, int, const double*,
                              const double*, int, const double*, int, const double*, double*,
                              int);
#ifdef __cplusplus
}
#endif
#define cublasSgemv cublasSgemv_v2
#define cublasDgemv cublasDgemv_v2
#define cublasSgemm cublasSgemm_v2
#define cublasDgemm cublasDgemm_v2
