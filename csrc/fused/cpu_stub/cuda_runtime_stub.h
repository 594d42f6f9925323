// The few CUDA runtime types the kernels' host API names (fused_kernels.h), for the CPU test
// build of the bindings (tests/unit/test_kernel_bindings.py), which has no CUDA toolkit.
#pragma once

enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef enum cudaError cudaError_t;
typedef struct CUstream_st* cudaStream_t;
