// kminer: the least of CUDA that libclang needs to read a unit without CUDA's headers
// (the PyPI libclang wheel ships no clang resource dir). Force-included with -include.
#pragma once
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __managed__ __attribute__((managed))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
#define __CUDACC__ 1
#define __NVCC__ 1
#define CUDA_VERSION 13000
typedef __SIZE_TYPE__ size_t;
struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  __host__ __device__ dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  __host__ __device__ dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
extern const __device__ uint3 threadIdx;
extern const __device__ uint3 blockIdx;
extern const __device__ dim3 blockDim;
extern const __device__ dim3 gridDim;
extern const __device__ int warpSize;
typedef struct CUstream_st* cudaStream_t;
typedef int cudaError_t;
extern "C" unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim,
                                                size_t sharedMem = 0, cudaStream_t stream = 0);
struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
struct float2 { float x, y; }; struct float3 { float x, y, z; }; struct float4 { float x, y, z, w; };
struct int2 { int x, y; }; struct int3 { int x, y, z; }; struct int4 { int x, y, z, w; };
struct double2 { double x, y; };
__device__ void __syncthreads(void);
__device__ void __syncwarp(unsigned mask = 0xffffffff);
__device__ void __threadfence(void);
template <class T> __device__ T atomicAdd(T* address, T val);
template <class T> __device__ T atomicMax(T* address, T val);
template <class T> __device__ T atomicMin(T* address, T val);
template <class T> __device__ T atomicExch(T* address, T val);
template <class T> __device__ T atomicCAS(T* address, T compare, T val);
template <class T> __device__ T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32);
template <class T> __device__ T __shfl_xor_sync(unsigned mask, T var, int lane, int width = 32);
template <class T> __device__ T __shfl_sync(unsigned mask, T var, int lane, int width = 32);
template <class T> __device__ T __ldg(const T* ptr);
template <class T> __host__ __device__ T min(T a, T b);
template <class T> __host__ __device__ T max(T a, T b);
// math and limits the units use, so that calls with these arguments still resolve
#define FLT_MAX 3.402823466e+38F
#define FLT_MIN 1.175494351e-38F
#define DBL_MAX 1.7976931348623158e+308
#define INT_MAX 2147483647
#define M_PI 3.14159265358979323846
#define assert(x) ((void)0)
#define printf(...) ((void)0)
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
#define KMINER_F1(f) __host__ __device__ float f##f(float); __host__ __device__ double f(double);
KMINER_F1(sqrt) KMINER_F1(exp) KMINER_F1(log) KMINER_F1(fabs) KMINER_F1(floor) KMINER_F1(ceil)
KMINER_F1(sin) KMINER_F1(cos) KMINER_F1(tan) KMINER_F1(atan) KMINER_F1(asin) KMINER_F1(acos)
KMINER_F1(tanh) KMINER_F1(round) KMINER_F1(rsqrt) KMINER_F1(log2) KMINER_F1(exp2) KMINER_F1(erf)
KMINER_F1(log1p) KMINER_F1(expm1) KMINER_F1(trunc) KMINER_F1(cbrt) KMINER_F1(rint)
#define KMINER_F2(f) __host__ __device__ float f##f(float, float); __host__ __device__ double f(double, double);
KMINER_F2(pow) KMINER_F2(atan2) KMINER_F2(fmin) KMINER_F2(fmax) KMINER_F2(fmod) KMINER_F2(hypot)
KMINER_F2(copysign)
__host__ __device__ int abs(int);
