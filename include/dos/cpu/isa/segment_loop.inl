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

// Stream: write the 16-bit copy with non-temporal stores. Nothing reads it during the
// update, so streaming saves the read-for-ownership of every line: 2 B per element,
// which puts a bf16 update at the same 28 B per element as an fp32 one.
//
// HasMaster: p is read from and written to the fp32 master, and the value array only
// receives a copy. Always the case for 16-bit values; for fp32 values only when the
// value is a mirror of a parameter that lives on a device.
template <class P, class G, bool Amsgrad, bool Stream, bool HasMaster>
DOS_LOOP_FN void adam_range_impl(const ::dos::cpu::SegmentArgs& a, std::size_t begin, std::size_t end,
                                 const ::dos::AdamCoefficients<float>& k) {
  constexpr bool has_master = HasMaster;
  auto* const param = static_cast<P*>(a.param);
  const auto* const grad = static_cast<const G*>(a.grad);
  float* const m_ = a.exp_avg;
  float* const v_ = a.exp_avg_sq;
  float* const vmax_ = a.max_exp_avg_sq;

  const ::dos::AdamCoefficients<Lane> c = broadcast_coefficients(k);
  // Ask for what the loop reads `prefetch_elements` ahead, once per 64-byte line of
  // fp32 state (cpu/kernel.hpp says why). The 16-bit copy is only written: not asked for.
  constexpr std::size_t ahead = ::dos::cpu::prefetch_elements, line = 64 / sizeof(float);
  std::size_t i = begin;
  for (; i + kWidth <= end; i += kWidth) {
    if (i % line < kWidth) {
      ::dos::cpu::prefetch_ahead(has_master ? static_cast<const void*>(a.master + i) : static_cast<const void*>(param + i),
                                 ahead * (has_master ? sizeof(float) : sizeof(P)));
      ::dos::cpu::prefetch_ahead(grad + i, ahead * sizeof(G));
      ::dos::cpu::prefetch_ahead(m_ + i, ahead * sizeof(float));
      ::dos::cpu::prefetch_ahead(v_ + i, ahead * sizeof(float));
      if constexpr (Amsgrad) ::dos::cpu::prefetch_ahead(vmax_ + i, ahead * sizeof(float));
    }
    Lane p;
    if constexpr (has_master) {
      p = load(a.master + i);
    } else {
      p = load(param + i);
    }
    Lane m = load(m_ + i);
    Lane v = load(v_ + i);
    Lane vmax = Amsgrad ? load(vmax_ + i) : v;
    adam_step<Amsgrad>(p, load(grad + i), m, v, vmax, c);
    if constexpr (has_master) store(a.master + i, p);
    if constexpr (Stream) {
      store_stream(param + i, p);
    } else {
      store(param + i, p);
    }
    store(m_ + i, m);
    store(v_ + i, v);
    if constexpr (Amsgrad) store(vmax_ + i, vmax);
  }
  for (; i < end; ++i) {
    float p = has_master ? a.master[i] : static_cast<float>(param[i]);
    float vmax = Amsgrad ? vmax_[i] : 0.0f;
    adam_step<Amsgrad>(p, static_cast<float>(grad[i]), m_[i], v_[i], vmax, k);
    if constexpr (has_master) a.master[i] = p;
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
