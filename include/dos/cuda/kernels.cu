// The one translation unit of `dos::cuda`: the kernels of adam_kernel.cuh, compiled
// by nvcc for sm_80 and sm_90, behind the host declarations of kernels.hpp.
#include "dos/cuda/error.hpp"
#include "dos/cuda/adam_kernel.cuh"
