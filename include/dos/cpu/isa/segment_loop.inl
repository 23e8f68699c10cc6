// The CPU loop over one segment. No include guard: included once per instruction
// set, inside that set's namespace and target region, after adam_step.inl.
//
// The includer provides the lane type `Lane` of width `kWidth`, `broadcast(float)`,
// and lane loads/stores that convert from and to float, bf16 and fp16. The tail of a
// range runs the same adam_step on plain floats, which gives bit-identical results
// because every operation in it is a single correctly rounded IEEE operation.

DOS_STEP_FN ::dos::AdamCoefficients<Lane> broadcast_coefficients(const ::dos::AdamCoefficients<float>& k) {
  return {broadcast(k.grad_sign), broadcast(k.l2),
          broadcast(k.decay),     broadcast(k.beta1),
          broadcast(k.one_minus_beta1), broadcast(k.beta2),
          broadcast(k.one_minus_beta2), broadcast(k.inv_sqrt_bias_correction2),
          broadcast(k.eps),       broadcast(k.neg_step_size)};
}

// Updates the U vectors from element i on: all their loads, then their steps, then
// their stores, so U independent Adam chains (a square root and a division each)
// overlap. Each element still takes the one adam_step.
//
// Stream: write the 16-bit copy with non-temporal stores. Nothing reads it during the
// update, so streaming saves the read-for-ownership of every line: 2 B per element,
// which puts a bf16 update at the same 28 B per element as an fp32 one.
//
// HasMaster: p is read from and written to the fp32 master, and the value array only
// receives a copy. Always the case for 16-bit values; for fp32 values only when the
// value is a mirror of a parameter that lives on a device.
template <std::size_t U, class P, class G, bool Amsgrad, bool Stream, bool HasMaster>
DOS_STEP_FN void adam_vectors(const ::dos::cpu::SegmentArgs& a, std::size_t i,
                              const ::dos::AdamCoefficients<Lane>& c) {
  auto* const param = static_cast<P*>(a.param);
  const auto* const grad = static_cast<const G*>(a.grad);
  // Ask for what the loop reads `prefetch_elements` ahead, once per 64-byte line of
  // fp32 state (cpu/kernel.hpp says why). The 16-bit copy is only written: not asked for.
  constexpr std::size_t ahead = ::dos::cpu::prefetch_elements, line = 64 / sizeof(float);
  for (std::size_t j = i; j < i + U * kWidth; j += kWidth)
    if (j % line < kWidth) {
      ::dos::cpu::prefetch_ahead(HasMaster ? static_cast<const void*>(a.master + j) : static_cast<const void*>(param + j),
                                 ahead * (HasMaster ? sizeof(float) : sizeof(P)));
      ::dos::cpu::prefetch_ahead(grad + j, ahead * sizeof(G));
      ::dos::cpu::prefetch_ahead(a.exp_avg + j, ahead * sizeof(float));
      ::dos::cpu::prefetch_ahead(a.exp_avg_sq + j, ahead * sizeof(float));
      if constexpr (Amsgrad) ::dos::cpu::prefetch_ahead(a.max_exp_avg_sq + j, ahead * sizeof(float));
    }
  Lane p[U], g[U], m[U], v[U], vmax[U];
  for (std::size_t u = 0; u < U; ++u) {
    const std::size_t j = i + u * kWidth;
    if constexpr (HasMaster) {
      p[u] = load(a.master + j);
    } else {
      p[u] = load(param + j);
    }
    g[u] = load(grad + j);
    m[u] = load(a.exp_avg + j);
    v[u] = load(a.exp_avg_sq + j);
    vmax[u] = Amsgrad ? load(a.max_exp_avg_sq + j) : v[u];
  }
  for (std::size_t u = 0; u < U; ++u) adam_step<Amsgrad>(p[u], g[u], m[u], v[u], vmax[u], c);
  for (std::size_t u = 0; u < U; ++u) {
    const std::size_t j = i + u * kWidth;
    if constexpr (HasMaster) store(a.master + j, p[u]);
    if constexpr (Stream) {
      store_stream(param + j, p[u]);
    } else {
      store(param + j, p[u]);
    }
    store(a.exp_avg + j, m[u]);
    store(a.exp_avg_sq + j, v[u]);
    if constexpr (Amsgrad) store(a.max_exp_avg_sq + j, vmax[u]);
  }
}

// `unroll_vectors` vectors per iteration (cpu/kernel.hpp), then one vector at a time,
// then the scalar tail.
template <class P, class G, bool Amsgrad, bool Stream, bool HasMaster>
DOS_LOOP_FN void adam_range_impl(const ::dos::cpu::SegmentArgs& a, std::size_t begin, std::size_t end,
                                 const ::dos::AdamCoefficients<float>& k) {
  constexpr std::size_t U = ::dos::cpu::unroll_vectors;
  const ::dos::AdamCoefficients<Lane> c = broadcast_coefficients(k);
  std::size_t i = begin;
  for (; i + U * kWidth <= end; i += U * kWidth) adam_vectors<U, P, G, Amsgrad, Stream, HasMaster>(a, i, c);
  for (; i + kWidth <= end; i += kWidth) adam_vectors<1, P, G, Amsgrad, Stream, HasMaster>(a, i, c);
  auto* const param = static_cast<P*>(a.param);
  const auto* const grad = static_cast<const G*>(a.grad);
  float* const m_ = a.exp_avg;
  float* const v_ = a.exp_avg_sq;
  float* const vmax_ = a.max_exp_avg_sq;
  for (; i < end; ++i) {
    float p = HasMaster ? a.master[i] : static_cast<float>(param[i]);
    float vmax = Amsgrad ? vmax_[i] : 0.0f;
    adam_step<Amsgrad>(p, static_cast<float>(grad[i]), m_[i], v_[i], vmax, k);
    if constexpr (HasMaster) a.master[i] = p;
    param[i] = P(p);
    if constexpr (Amsgrad) vmax_[i] = vmax;
  }
}

template <class P, class G, bool Amsgrad>
DOS_LOOP_FN void adam_range(const ::dos::cpu::SegmentArgs& a, std::size_t begin, std::size_t end,
                            const ::dos::AdamCoefficients<float>& k) {
  if constexpr (!std::is_same_v<P, float>) {
    if (reinterpret_cast<std::uintptr_t>(static_cast<P*>(a.param) + begin) % kStreamAlignment == 0) {
      adam_range_impl<P, G, Amsgrad, true, true>(a, begin, end, k);
      stream_fence();
      return;
    }
    adam_range_impl<P, G, Amsgrad, false, true>(a, begin, end, k);
  } else if (a.master != nullptr) {
    adam_range_impl<P, G, Amsgrad, false, true>(a, begin, end, k);
  } else {
    adam_range_impl<P, G, Amsgrad, false, false>(a, begin, end, k);
  }
}
