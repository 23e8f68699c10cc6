#pragma once
/// @file
/// @brief The GPU Adam: the one step of `optim/detail/adam_step.inl` on floats with
///        the correctly rounded CUDA intrinsics, so it gives the CPU's bits. nvcc only.
///
/// One thread updates four consecutive elements. Its fp32 arrays (master, m, v,
/// vmax, and fp32 values or gradients) are read and written with 16-byte vector
/// accesses when the four elements are 16-byte aligned, its 16-bit arrays with
/// 8-byte ones; otherwise element by element, each array on its own. A launch carries up to
/// `segments_per_launch` segment descriptors by value, and each block finds its
/// segment from the block offsets, so many small tensors cost one launch.
///
/// It defines the functions of kernels.hpp: include it in one translation unit only
/// (dos/cuda/kernels.cu does, for the `dos::cuda` target).

#if !defined(__CUDACC__)
#error "dos/cuda/adam_kernel.cuh is CUDA C++: compile it with nvcc"
#endif

#include "dos/core/float16.hpp"
#include "dos/cuda/error.hpp"
#include "dos/cuda/kernels.hpp"
#include "dos/optim/coefficients.hpp"

#include <cub/device/device_reduce.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace dos::cuda::device {

// The operations adam_step.inl needs, each one correctly rounded IEEE operation.
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float sqrt(float a) { return __fsqrt_rn(a); }
// Unsigned order of the bit patterns: NaN above infinity, as on the CPU.
__device__ __forceinline__ float max_nonneg(float a, float b) { return __float_as_uint(a) >= __float_as_uint(b) ? a : b; }

#define DOS_STEP_FN __device__ __forceinline__
#include "dos/optim/detail/adam_step.inl"
#undef DOS_STEP_FN

inline constexpr int threads_per_block = 256;
inline constexpr int per_thread = 4;
inline constexpr std::size_t per_block = threads_per_block * per_thread;

struct Batch {
  DeviceSegment segment[segments_per_launch];
  unsigned first_block[segments_per_launch + 1];
  int count;
};

template <class T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return static_cast<float>(x);
}
template <class T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return T(x);
}

// Four elements of an array of T at p: one vector access when aligned.
template <class T>
__device__ __forceinline__ void load4(const T* p, float (&out)[4], bool vector) {
  if constexpr (std::is_same_v<T, float>) {
    if (vector) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
      return;
    }
  } else {
    if (vector) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      out[0] = to_float(T::from_bits(static_cast<std::uint16_t>(v.x & 0xFFFFu)));
      out[1] = to_float(T::from_bits(static_cast<std::uint16_t>(v.x >> 16)));
      out[2] = to_float(T::from_bits(static_cast<std::uint16_t>(v.y & 0xFFFFu)));
      out[3] = to_float(T::from_bits(static_cast<std::uint16_t>(v.y >> 16)));
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = to_float(p[i]);
}
template <class T>
__device__ __forceinline__ void store4(T* p, const float (&in)[4], bool vector) {
  if constexpr (std::is_same_v<T, float>) {
    if (vector) {
      *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
      return;
    }
  } else {
    if (vector) {
      const auto b = [&](int i) { return static_cast<unsigned>(from_float<T>(in[i]).bits); };
      *reinterpret_cast<uint2*>(p) = make_uint2(b(0) | (b(1) << 16), b(2) | (b(3) << 16));
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = from_float<T>(in[i]);
}

template <class T>
__device__ __forceinline__ bool aligned(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// Elements [begin, end) of one segment; at most four.
template <class P, class G, bool Amsgrad, bool HasMaster>
__device__ __forceinline__ void update(const DeviceSegment& s, std::size_t begin, std::size_t end) {
  const cpu::SegmentArgs& a = s.args;
  auto* const param = static_cast<P*>(a.param) + begin;
  const auto* const grad = static_cast<const G*>(a.grad) + begin;
  float* const master = HasMaster ? a.master + begin : nullptr;
  float* const m_ = a.exp_avg + begin;
  float* const v_ = a.exp_avg_sq + begin;
  float* const vmax_ = Amsgrad ? a.max_exp_avg_sq + begin : nullptr;
  const AdamCoefficients<float>& k = s.coefficients;
  if (end - begin == 4) {
    // Each array decides for itself: one misaligned array (a gradient at an odd offset)
    // takes the element path alone, the others keep their vector accesses.
    float p[4], g[4], m[4], v[4], vmax[4] = {0, 0, 0, 0};
    if constexpr (HasMaster) load4(master, p, aligned(master));
    else load4(param, p, aligned(param));
    load4(grad, g, aligned(grad));
    load4(m_, m, aligned(m_));
    load4(v_, v, aligned(v_));
    if constexpr (Amsgrad) load4(vmax_, vmax, aligned(vmax_));
#pragma unroll
    for (int i = 0; i < 4; ++i) adam_step<Amsgrad>(p[i], g[i], m[i], v[i], vmax[i], k);
    if constexpr (HasMaster) store4(master, p, aligned(master));
    store4(param, p, aligned(param));
    store4(m_, m, aligned(m_));
    store4(v_, v, aligned(v_));
    if constexpr (Amsgrad) store4(vmax_, vmax, aligned(vmax_));
    return;
  }
  for (std::size_t i = 0; i < end - begin; ++i) {
    float p = HasMaster ? master[i] : to_float(param[i]);
    float vmax = Amsgrad ? vmax_[i] : 0.0f;
    adam_step<Amsgrad>(p, to_float(grad[i]), m_[i], v_[i], vmax, k);
    if constexpr (HasMaster) master[i] = p;
    param[i] = from_float<P>(p);
    if constexpr (Amsgrad) vmax_[i] = vmax;
  }
}

template <class P, class G>
__device__ __forceinline__ void dispatch_flags(const DeviceSegment& s, std::size_t b, std::size_t e) {
  const bool master = s.args.master != nullptr;
  if (s.amsgrad) {
    if (master) update<P, G, true, true>(s, b, e);
    else update<P, G, true, false>(s, b, e);
  } else {
    if (master) update<P, G, false, true>(s, b, e);
    else update<P, G, false, false>(s, b, e);
  }
}
template <class P>
__device__ __forceinline__ void dispatch_grad(const DeviceSegment& s, std::size_t b, std::size_t e) {
  visit_dtype(s.grad, [&](auto g) { dispatch_flags<P, typename decltype(g)::type>(s, b, e); });
}

__global__ void __launch_bounds__(threads_per_block) adam_kernel(const __grid_constant__ Batch batch) {
  int s = 0;
  while (s + 1 < batch.count && blockIdx.x >= batch.first_block[s + 1]) ++s;
  const DeviceSegment& seg = batch.segment[s];
  const std::size_t begin = (blockIdx.x - batch.first_block[s]) * per_block + threadIdx.x * per_thread;
  if (begin >= seg.count) return;
  const std::size_t end = begin + per_thread < seg.count ? begin + per_thread : seg.count;
  visit_dtype(seg.value, [&](auto p) { dispatch_grad<typename decltype(p)::type>(seg, begin, end); });
}

// One element's contribution to the gradient statistics: its square (inf and NaN stay
// in the sum, as on the CPU: an inf gradient has an inf norm) and whether it is finite.
struct SumSquares {
  double sum;
  int nonfinite;
};
template <class T>
struct ElementStats {
  __host__ __device__ SumSquares operator()(T h) const {
    const float x = static_cast<float>(h);
    bool nonfinite = false;
    if constexpr (sizeof(T) == 4) nonfinite = (detail::float_bits(x) & 0x7F800000u) == 0x7F800000u;
    else {
      constexpr std::uint16_t exponent = std::is_same_v<T, bf16> ? 0x7F80u : 0x7C00u;
      nonfinite = (h.bits & exponent) == exponent;
    }
    const double d = x;
    return {d * d, nonfinite ? 1 : 0};
  }
};
struct AddStats {
  __host__ __device__ SumSquares operator()(SumSquares a, SumSquares b) const {
    return {a.sum + b.sum, a.nonfinite + b.nonfinite};
  }
};

// CUB's reduction of @p count elements of type T; with null @p scratch it only sizes it.
template <class T>
cudaError_t reduce(void* scratch, std::size_t& bytes, const void* data, std::size_t count, SumSquares* out,
                   cudaStream_t stream) {
  return cub::DeviceReduce::TransformReduce(scratch, bytes, static_cast<const T*>(data), out, count, AddStats{},
                                            ElementStats<T>{}, SumSquares{0.0, 0}, stream);
}

}  // namespace dos::cuda::device

namespace dos::cuda {

void launch_adam(std::span<const DeviceSegment> segments, cudaStream_t stream) {
  using namespace device;
  for (std::size_t first = 0; first < segments.size(); first += segments_per_launch) {
    Batch batch{};
    unsigned blocks = 0;
    batch.count = 0;
    for (std::size_t i = first; i < segments.size() && i < first + segments_per_launch; ++i) {
      batch.segment[batch.count] = segments[i];
      batch.first_block[batch.count] = blocks;
      blocks += static_cast<unsigned>((segments[i].count + per_block - 1) / per_block);
      ++batch.count;
    }
    batch.first_block[batch.count] = blocks;
    if (blocks == 0) continue;
    // An earlier asynchronous failure would otherwise be reported as this launch's:
    // report it as what it is (and clear it) before launching.
    check(cudaGetLastError(), "an earlier CUDA operation (its error was pending before an Adam launch)");
    adam_kernel<<<blocks, threads_per_block, 0, stream>>>(batch);
    DOS_CUDA_CHECK(cudaGetLastError());
  }
}

// CUB's scratch for a reduction depends on its grid, which is capped, not on the count
// beyond that: sized here for the largest count a tensor can have, once.
GradReduction::GradReduction() {
  using namespace device;
  constexpr std::size_t largest = std::size_t{1} << 40;
  for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::size_t bytes = 0;
    visit_dtype(t, [&](auto type) {
      DOS_CUDA_CHECK(reduce<typename decltype(type)::type>(nullptr, bytes, nullptr, largest, nullptr, nullptr));
    });
    scratch_bytes_ = std::max(scratch_bytes_, bytes);
  }
  DOS_CUDA_CHECK(cudaMalloc(&scratch_, scratch_bytes_));
  DOS_CUDA_CHECK(cudaMalloc(&result_, sizeof(SumSquares)));
  DOS_CUDA_CHECK(cudaHostAlloc(&host_, sizeof(SumSquares), cudaHostAllocDefault));
}

GradReduction::~GradReduction() {
  cudaFreeHost(host_);
  cudaFree(result_);
  cudaFree(scratch_);
}

GradStats GradReduction::operator()(const void* data, DType dtype, std::size_t count, cudaStream_t stream) {
  using namespace device;
  auto* out = static_cast<SumSquares*>(result_);
  visit_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    std::size_t bytes = 0;
    DOS_CUDA_CHECK(reduce<T>(nullptr, bytes, data, count, out, stream));
    if (bytes > scratch_bytes_)
      throw cuda_error("dos: the gradient reduction needs " + std::to_string(bytes) + " bytes of scratch, " +
                       std::to_string(scratch_bytes_) + " were allocated");
    bytes = scratch_bytes_;
    DOS_CUDA_CHECK(reduce<T>(scratch_, bytes, data, count, out, stream));
  });
  DOS_CUDA_CHECK(cudaMemcpyAsync(host_, out, sizeof(SumSquares), cudaMemcpyDeviceToHost, stream));
  DOS_CUDA_CHECK(cudaStreamSynchronize(stream));
  const SumSquares r = *static_cast<const SumSquares*>(host_);
  return {r.sum, r.nonfinite != 0};
}

}  // namespace dos::cuda
