// The operations of adam_step.inl on plain floats. No include guard: included in each
// CPU instruction-set namespace, where they serve the scalar kernel and the scalar
// tails of the vector kernels. The includer defines DOS_STEP_FN.

DOS_STEP_FN float mul(float a, float b) { return a * b; }
DOS_STEP_FN float fma(float a, float b, float c) { return std::fma(a, b, c); }
DOS_STEP_FN float div(float a, float b) { return ::dos::cpu::isa::exact_div(a, b); }
DOS_STEP_FN float sqrt(float a) { return ::dos::cpu::isa::exact_sqrt(a); }
// Unsigned comparison of the bit patterns: the order of non-negative floats, with
// NaN above infinity, so NaN propagates like torch.maximum under any -ffast-math.
DOS_STEP_FN float max_nonneg(float a, float b) {
  return ::dos::detail::float_bits(a) >= ::dos::detail::float_bits(b) ? a : b;
}
