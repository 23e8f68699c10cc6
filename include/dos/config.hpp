#pragma once
/// @file
/// @brief Which tiers of dos are available in this translation unit, and the
///        portability macros every other header relies on.
///
/// dos has three tiers of headers:
///  - pure C++20 (maths, partitioner, CPU executor, optimizer front end);
///  - CUDA runtime API only, compiled by any host compiler against CUDA::cudart;
///  - nvcc-only kernels (`.cuh`).
/// This header never includes CUDA itself; it only reports what is present.

#if defined(__CUDACC__)
#define DOS_CUDA_COMPILATION 1
#else
#define DOS_CUDA_COMPILATION 0
#endif

#if defined(DOS_WITH_CUDA_TOOLKIT) || DOS_CUDA_COMPILATION
#define DOS_HAS_CUDA_TOOLKIT 1
#else
#define DOS_HAS_CUDA_TOOLKIT 0
#endif

/// Functions usable on the host and, under nvcc, on the device. Without nvcc this
/// is plain `inline`, so the shared maths is tested on machines with no GPU.
#if DOS_CUDA_COMPILATION
#define DOS_HOST_DEVICE __host__ __device__ inline
#else
#define DOS_HOST_DEVICE inline
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DOS_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define DOS_ALWAYS_INLINE inline
#endif

/// x86-64 with a GCC-compatible compiler: the CPU executor gets run-time
/// dispatched AVX2 and AVX-512 kernels, whatever `-march` the consumer uses.
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !DOS_CUDA_COMPILATION
#define DOS_X86_DISPATCH 1
#else
#define DOS_X86_DISPATCH 0
#endif
