// The one Adam step of dos. No include guard on purpose: this file is included once
// per instruction set (scalar, AVX2, AVX-512, CUDA) inside that set's namespace, so
// every executor compiles the same expression in the same order from one source.
//
// The includer provides, in its namespace, for its lane type V:
//   mul(a, b)             a * b, one rounding
//   fma(a, b, c)          a * b + c, one rounding
//   div(a, b), sqrt(a)    correctly rounded
//   max_nonneg(a, b)      max of two non-negative floats, NaN wins (torch.maximum)
// and defines DOS_STEP_FN as the function qualifiers (inline, target, __device__).
//
// The expression has no plain additions and no chains of multiplications, so no
// compiler flag (-ffp-contract, -ffast-math) has anything left to fuse or reorder:
// results do not depend on how the consumer compiles.

template <bool Amsgrad, class V>
DOS_STEP_FN void adam_step(V& p, V g, V& m, V& v, V& vmax, const ::dos::AdamCoefficients<V>& c) {
  g = mul(g, c.grad_sign);                                // maximize: exact negation
  g = fma(c.l2, p, g);                                    // Adam: g + wd * p
  p = mul(p, c.decay);                                    // AdamW: p * (1 - lr * wd)
  m = fma(c.beta1, m, mul(c.one_minus_beta1, g));         // b1 m + (1 - b1) g
  v = fma(mul(c.one_minus_beta2, g), g, mul(c.beta2, v)); // b2 v + (1 - b2) g g
  V vhat = v;
  if constexpr (Amsgrad) {
    vmax = max_nonneg(vmax, v);                           // max of the raw v
    vhat = vmax;
  }
  const V denom = fma(sqrt(vhat), c.inv_sqrt_bias_correction2, c.eps);
  p = fma(c.neg_step_size, div(m, denom), p);             // p - lr / bc1 * m / denom
}
