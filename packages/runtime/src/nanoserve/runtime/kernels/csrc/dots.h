// The exact integer dot products of packed levels against int8 inputs, per ISA, over simd.h.
//
// Included after simd.h, in the same ISA namespace. Two accumulators, each exact in int32
// whatever the ISA sums in between (so every path gives the same integers):
//   - Dots: a group's dot products of levels of at most 6 bits, 8 inputs a call;
//   - Narrow: the same for levels of at most 5 bits, summed narrower where the ISA can (AVX2's
//     int16 lanes), widened once at the end.
// AVX-512's dpbusd sums 4 products into int32 lanes; AVX2's maddubs sums 2 into int16 lanes
// (saturating), which one madd widens.
//
// Tried and dropped: q6_k's scales applied on AVX2 by the widening madd itself (one int32
// accumulator a row, no multiply of its own): 3-5% slower than Dots, then a multiply per half.

// -- AVX2: int16 sums, widened -----------------------------------------------------------
#if defined(NS_AVX2)

// Dots: int32 lanes, one accumulator per row (two registers). A chunk's low and high halves meet
// in int16 (two maddubs pairs of levels <= 63 and |x| <= 127: at most 32,004, no saturation)
// and are widened at once: two more operations per chunk than keeping int16 sums across
// chunks, but half the registers, so 4 rows' accumulators no longer spill to the stack.
struct Dots { I16 v; };
inline Dots d_zero() { return {i_zero()}; }
inline __m256i chunk8(__m256i acc, __m256i lo, __m256i hi, __m256i x_lo, __m256i x_hi) {
  const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_lo), _mm256_maddubs_epi16(hi, x_hi));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline Dots d_add(Dots a, B64 lo, B64 hi, int32_t x_lo, int32_t x_hi) {
  const __m256i xl = _mm256_set1_epi32(x_lo), xh = _mm256_set1_epi32(x_hi);
  Dots r = {{chunk8(a.v.lo, lo.lo, hi.lo, xl, xh), chunk8(a.v.hi, lo.hi, hi.hi, xl, xh)}};
  asm("" : "+x"(r.v.lo), "+x"(r.v.hi));  // no reassociation (see Narrow)
  return r;
}
inline I16 d_sum(Dots a) { return a.v; }
// Narrow: int16 lanes, widened once into init at the end (one madd for several chunks, where
// Dots widens every chunk). A maddubs pair of levels <= 15 and |x| <= 127 is at most 3,810, so a
// chunk adds at most 7,620: 4 chunks of 4-bit levels stay within int16 (30,480), and 2 of 5-bit
// ones (2 * 15,748 = 31,496).
struct Narrow { __m256i lo, hi; };
inline Narrow n_start(I16) { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Narrow n_start(int32_t) { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Narrow n_add(Narrow a, B64 lo, B64 hi, int32_t x_lo, int32_t x_hi) {
  const __m256i xl = _mm256_set1_epi32(x_lo), xh = _mm256_set1_epi32(x_hi);
  Narrow r = {_mm256_add_epi16(a.lo, _mm256_add_epi16(_mm256_maddubs_epi16(lo.lo, xl), _mm256_maddubs_epi16(hi.lo, xh))),
              _mm256_add_epi16(a.hi, _mm256_add_epi16(_mm256_maddubs_epi16(lo.hi, xl), _mm256_maddubs_epi16(hi.hi, xh)))};
  // Opaque to the optimizer: otherwise GCC reassociates a group's sums into one tree at its
  // end and keeps every product live until then (AVX2 has 16 registers: they spill).
  asm("" : "+x"(r.lo), "+x"(r.hi));
  return r;
}
inline I16 n_end(Narrow a, I16 init) {
  const __m256i ones = _mm256_set1_epi16(1);
  return {_mm256_add_epi32(init.lo, _mm256_madd_epi16(a.lo, ones)), _mm256_add_epi32(init.hi, _mm256_madd_epi16(a.hi, ones))};
}
inline I16 n_end(Narrow a, int32_t init) { return n_end(a, I16{_mm256_set1_epi32(init), _mm256_set1_epi32(init)}); }

// -- AVX-512 and plain C++: i_dot sums into int32 lanes ----------------------------------
#else

// Dots: one group's dot products of small unsigned levels (at most 6 bits) against int8 inputs,
// 8 inputs a call (a chunk's low and high halves). int32 lanes here: one accumulator, exact.
struct Dots { I16 v; };
inline Dots d_zero() { return {i_zero()}; }
inline Dots d_add(Dots a, B64 lo, B64 hi, int32_t x_lo, int32_t x_hi) {
  return {i_dot(i_dot(a.v, lo, x_lo), hi, x_hi)};
}
inline I16 d_sum(Dots a) { return a.v; }
// Narrow: dot products of levels of at most 5 bits, summed as narrow as they stay exact before
// they are added to `init` (AVX2's int16 lanes: 4 chunks of 4-bit levels, 2 of 5-bit ones).
// i_dot (dpbusd, or one lane at a time) sums in int32 already: the accumulator starts from init.
struct Narrow { I16 v; };
inline Narrow n_start(I16 init) { return {init}; }
inline Narrow n_start(int32_t init) { return {i_set1(init)}; }
inline Narrow n_add(Narrow a, B64 lo, B64 hi, int32_t x_lo, int32_t x_hi) {
  return {i_dot(i_dot(a.v, lo, x_lo), hi, x_hi)};
}
inline I16 n_end(Narrow a, I16) { return a.v; }
inline I16 n_end(Narrow a, int32_t) { return a.v; }

#endif
