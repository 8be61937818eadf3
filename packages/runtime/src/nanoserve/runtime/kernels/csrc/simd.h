// Sixteen-lane vectors with the same arithmetic on every ISA.
//
// Included once per ISA, inside that ISA's namespace, with one of NS_AVX512, NS_AVX2 or
// NS_PORTABLE defined (see isa_*.cpp). F16 is 16 floats, I16 16 int32 lanes, B64 64 bytes.
// Every operation is exact IEEE per lane (add, mul, div, sqrt, fma with one rounding, round
// to nearest even), and the only cross-lane operations, hsum and hmax, reduce in one fixed
// tree. So a kernel written on these types gives the same bits on AVX-512, AVX2 and plain
// C++: the ISA changes the speed, never the result.
//
// The tree: lanes i and i+8, then i and i+4, then i and i+2, then 0 and 1.

// The including file has already included <immintrin.h>, <cmath>, <cstdint> and <cstring>.

#if defined(NS_AVX512) + defined(NS_AVX2) + defined(NS_PORTABLE) != 1
#error "define exactly one of NS_AVX512, NS_AVX2, NS_PORTABLE"
#endif

// -- AVX-512 (F, BW, VL, DQ, VNNI) --------------------------------------------------------
#if defined(NS_AVX512)

struct F16 { __m512 v; };
struct I16 { __m512i v; };
struct B64 { __m512i v; };

inline F16 f_zero() { return {_mm512_setzero_ps()}; }
inline F16 f_set1(float x) { return {_mm512_set1_ps(x)}; }
inline F16 f_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void f_store(float* p, F16 a) { _mm512_storeu_ps(p, a.v); }
inline F16 f_load_bf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}
inline F16 f_load_f16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// IEEE half, round to nearest even (F16C's mode 0; the portable path rounds the same).
inline void f_store_f16(uint16_t* p, F16 a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// Round to nearest even, as torch's float -> bfloat16 does (NaN aside).
inline void f_store_bf16(uint16_t* p, F16 a) {
  __m512i bits = _mm512_castps_si512(a.v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  bits = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
}
inline F16 f_add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 f_sub(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F16 f_mul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 f_div(F16 a, F16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline F16 f_fma(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline F16 f_max(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline F16 f_min(F16 a, F16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline F16 f_abs(F16 a) { return {_mm512_abs_ps(a.v)}; }
inline F16 f_round(F16 a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline I16 f_to_i(F16 a) { return {_mm512_cvtps_epi32(a.v)}; }  // of an integral value: exact
inline F16 i_to_f(I16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline F16 i_as_f(I16 a) { return {_mm512_castsi512_ps(a.v)}; }
inline float f_hsum(F16 a) {
  const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(a.v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline float f_hmax(F16 a) {  // the tree, as f_hsum: a max of signed zeros depends on order
  const __m256 s = _mm256_max_ps(_mm512_castps512_ps256(a.v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// The 16 tree sums of v[0..16) at once, out[p] = f_hsum(v[p]) bit for bit: each step adds the
// same lane pairs as f_hsum, for several vectors per instruction.
inline void f_hsum16(const F16* v, float* out) {
  __m512 r[8], c[4], d[2];
  for (int k = 0; k < 8; ++k) {  // lanes i + i+8: [v_2k | v_2k+1], 8 lanes each
    const __m512 x = v[2 * k].v, y = v[2 * k + 1].v;
    r[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
  }
  for (int k = 0; k < 4; ++k)  // i + i+4: quarter j holds vector 4k + j
    c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], 0x88),
                         _mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], 0xDD));
  for (int k = 0; k < 2; ++k)  // i + i+2, within each quarter
    d[k] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * k], c[2 * k + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * k], c[2 * k + 1], 0xEE));
  // 0 + 1: lane 4j + t now holds vector 4t + j; put vector p at lane p.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, sums));
}

inline I16 i_zero() { return {_mm512_setzero_si512()}; }
inline I16 i_set1(int32_t x) { return {_mm512_set1_epi32(x)}; }
inline I16 i_add(I16 a, I16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline I16 i_sub(I16 a, I16 b) { return {_mm512_sub_epi32(a.v, b.v)}; }
inline I16 i_shl(I16 a, int n) { return {_mm512_slli_epi32(a.v, n)}; }
inline I16 i_shr(I16 a, int n) { return {_mm512_srli_epi32(a.v, n)}; }
inline I16 i_and(I16 a, I16 b) { return {_mm512_and_si512(a.v, b.v)}; }
inline I16 i_mul(I16 a, I16 b) { return {_mm512_mullo_epi32(a.v, b.v)}; }  // of products < 2^31
inline int32_t i_hsum(I16 a) { return _mm512_reduce_add_epi32(a.v); }  // exact in any order
inline void i_store_i8(int8_t* p, I16 a) {  // of values in [-127, 127]
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(a.v));
}

inline B64 b_load(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
inline B64 b_low_nibbles(B64 a) { return {_mm512_and_si512(a.v, _mm512_set1_epi8(0x0F))}; }
inline B64 b_high_nibbles(B64 a) {
  return {_mm512_and_si512(_mm512_srli_epi16(a.v, 4), _mm512_set1_epi8(0x0F))};
}
inline B64 b_or(B64 a, B64 b) { return {_mm512_or_si512(a.v, b.v)}; }
// Per byte: table[a] (a < 16), one shuffle of the table in every 128-bit lane.
inline B64 b_lookup(B64 a, const uint8_t* table) {
  const __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return {_mm512_shuffle_epi8(t, a.v)};
}
// Per byte: ((a >> from) & mask) << to. One 16-bit shift and a mask: the bits a shift carries
// across a byte boundary land outside `mask << to` (the field lies within its byte).
inline B64 b_field(B64 a, int from, int mask, int to) {
  const __m512i v = from > to ? _mm512_srli_epi16(a.v, from - to) : _mm512_slli_epi16(a.v, to - from);
  return {_mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(mask << to)))};
}
// 16 bytes, one per lane, widened.
inline I16 i_from_u8(const uint8_t* p) {
  return {_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline I16 i_from_i8(const uint8_t* p) {
  return {_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline F16 f_from_u8(const uint8_t* p) { return {_mm512_cvtepi32_ps(i_from_u8(p).v)}; }
// acc[lane] + sum over b < 4 of w[4 lane + b] (unsigned) * x[b] (signed): exact in int32.
inline I16 i_dot(I16 acc, B64 w, int32_t x4) {
  return {_mm512_dpbusd_epi32(acc.v, w.v, _mm512_set1_epi32(x4))};
}
// q8 weights are stored as u = w + 128. i_dot_q8 adds sum u * x (dpbusd does not saturate);
// the caller starts the sum from -128 * sum(x) (kQ8DotHasOffset).
constexpr bool kQ8DotHasOffset = true;
inline I16 i_dot_q8(I16 acc, B64 u, int32_t x4) { return i_dot(acc, u, x4); }
// One IEEE half <-> float (F16C): exact one way, to nearest even the other.
inline float h_to_f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f_to_h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

// -- AVX2 (with FMA and F16C): each 16-lane vector is two 8-lane halves -------------------
#elif defined(NS_AVX2)

struct F16 { __m256 lo, hi; };
struct I16 { __m256i lo, hi; };
struct B64 { __m256i lo, hi; };

inline F16 f_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F16 f_set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 f_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void f_store(float* p, F16 a) { _mm256_storeu_ps(p, a.lo), _mm256_storeu_ps(p + 8, a.hi); }
inline __m256 bf16x8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline F16 f_load_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline F16 f_load_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline void f_store_f16(uint16_t* p, F16 a) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(a.lo, mode));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(a.hi, mode));
}
inline void bf16x8_store(uint16_t* p, __m256 a) {
  __m256i bits = _mm256_castps_si256(a);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  bits = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  // 8 int32 holding 16-bit values -> 8 uint16 (packus keeps them: they are below 2^16).
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline void f_store_bf16(uint16_t* p, F16 a) { bf16x8_store(p, a.lo), bf16x8_store(p + 8, a.hi); }
inline F16 f_add(F16 a, F16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F16 f_sub(F16 a, F16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F16 f_mul(F16 a, F16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F16 f_div(F16 a, F16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline F16 f_fma(F16 a, F16 b, F16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline F16 f_max(F16 a, F16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F16 f_min(F16 a, F16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline F16 f_abs(F16 a) {
  const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, mask), _mm256_and_ps(a.hi, mask)};
}
inline F16 f_round(F16 a) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}
inline I16 f_to_i(F16 a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
inline F16 i_to_f(I16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline F16 i_as_f(I16 a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
inline float f_hsum(F16 a) {
  const __m256 s = _mm256_add_ps(a.lo, a.hi);
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
inline float f_hmax(F16 a) {
  const __m256 s = _mm256_max_ps(a.lo, a.hi);
  __m128 t = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  t = _mm_max_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

inline I16 i_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I16 i_set1(int32_t x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
inline I16 i_add(I16 a, I16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline I16 i_sub(I16 a, I16 b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
inline I16 i_shl(I16 a, int n) { return {_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)}; }
inline I16 i_shr(I16 a, int n) { return {_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)}; }
inline I16 i_and(I16 a, I16 b) { return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
inline I16 i_mul(I16 a, I16 b) { return {_mm256_mullo_epi32(a.lo, b.lo), _mm256_mullo_epi32(a.hi, b.hi)}; }
inline int32_t i_hsum(I16 a) {
  const __m256i s = _mm256_add_epi32(a.lo, a.hi);
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}
inline void i_store_i8(int8_t* p, I16 a) {  // of values in [-127, 127]
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), 0xD8);
  const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bytes);
}

inline B64 b_load(const uint8_t* p) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))};
}
inline B64 b_low_nibbles(B64 a) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(a.lo, m), _mm256_and_si256(a.hi, m)};
}
inline B64 b_high_nibbles(B64 a) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(_mm256_srli_epi16(a.lo, 4), m), _mm256_and_si256(_mm256_srli_epi16(a.hi, 4), m)};
}
inline B64 b_or(B64 a, B64 b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
inline B64 b_lookup(B64 a, const uint8_t* table) {
  const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return {_mm256_shuffle_epi8(t, a.lo), _mm256_shuffle_epi8(t, a.hi)};
}
inline __m256i field8(__m256i a, int from, int mask, int to) {
  const __m256i v = from > to ? _mm256_srli_epi16(a, from - to) : _mm256_slli_epi16(a, to - from);
  return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(mask << to)));
}
inline B64 b_field(B64 a, int from, int mask, int to) {
  return {field8(a.lo, from, mask, to), field8(a.hi, from, mask, to)};
}
inline __m128i load8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
inline I16 i_from_u8(const uint8_t* p) { return {_mm256_cvtepu8_epi32(load8(p)), _mm256_cvtepu8_epi32(load8(p + 8))}; }
inline I16 i_from_i8(const uint8_t* p) { return {_mm256_cvtepi8_epi32(load8(p)), _mm256_cvtepi8_epi32(load8(p + 8))}; }
inline F16 f_from_u8(const uint8_t* p) { return i_to_f(i_from_u8(p)); }
// maddubs multiplies unsigned by signed bytes and adds pairs into int16 with saturation; for
// w <= 15 and |x| <= 127 a pair is at most 3,810, so nothing saturates and the sum is exact.
inline __m256i dot8(__m256i acc, __m256i w, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
inline I16 i_dot(I16 acc, B64 w, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {dot8(acc.lo, w.lo, x), dot8(acc.hi, w.hi, x)};
}
// u = w + 128 would saturate maddubs; |w| (<= 128) times sign(x, w) (|x| <= 127) does not:
// a pair is at most 32,512. So i_dot_q8 adds sum w * x itself, and no offset is taken out.
constexpr bool kQ8DotHasOffset = false;
inline __m256i q8_dot8(__m256i acc, __m256i u, __m256i x) {
  const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));  // u - 128
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
inline I16 i_dot_q8(I16 acc, B64 u, int32_t x4) {
  const __m256i x = _mm256_set1_epi32(x4);
  return {q8_dot8(acc.lo, u.lo, x), q8_dot8(acc.hi, u.hi, x)};
}
inline float h_to_f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f_to_h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

// -- plain C++: the same operations one lane at a time -----------------------------------
#else

struct F16 { float v[16]; };
struct I16 { int32_t v[16]; };
struct B64 { uint8_t v[64]; };

#define NS_LANES(expr) \
  for (int i = 0; i < 16; ++i) r.v[i] = (expr);

inline F16 f_zero() { F16 r; NS_LANES(0.f) return r; }
inline F16 f_set1(float x) { F16 r; NS_LANES(x) return r; }
inline F16 f_load(const float* p) { F16 r; NS_LANES(p[i]) return r; }
inline void f_store(float* p, F16 a) { for (int i = 0; i < 16; ++i) p[i] = a.v[i]; }
inline float bits_to_float(uint32_t bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }
inline F16 f_load_bf16(const uint16_t* p) { F16 r; NS_LANES(bits_to_float(uint32_t(p[i]) << 16)) return r; }
inline float half_to_float(uint16_t h) {
  // IEEE half -> float, exactly (F16C's vcvtph2ps does the same).
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return bits_to_float(sign | 0x7F800000 | (man << 13));
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
  const float value = std::ldexp(static_cast<float>(man), -24);  // subnormal: exact
  return sign ? -value : value;
}
inline F16 f_load_f16(const uint16_t* p) { F16 r; NS_LANES(half_to_float(p[i])) return r; }
// float -> IEEE half, round to nearest even, as F16C's vcvtps2ph does (NaNs quieted).
inline uint16_t float_to_half(float f) {
  const uint32_t x = float_to_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // 65520 and up: inf
  if (a >= 0x38800000u) {  // a normal half: drop 13 bits, to nearest even
    return static_cast<uint16_t>(sign | ((a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the least subnormal
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - (a >> 23);  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}
inline void f_store_f16(uint16_t* p, F16 a) { for (int i = 0; i < 16; ++i) p[i] = float_to_half(a.v[i]); }
inline float h_to_f(uint16_t h) { return half_to_float(h); }
inline uint16_t f_to_h(float f) { return float_to_half(f); }
inline void f_store_bf16(uint16_t* p, F16 a) {
  for (int i = 0; i < 16; ++i) {
    const uint32_t bits = float_to_bits(a.v[i]);
    p[i] = static_cast<uint16_t>((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16);
  }
}
inline F16 f_add(F16 a, F16 b) { F16 r; NS_LANES(a.v[i] + b.v[i]) return r; }
inline F16 f_sub(F16 a, F16 b) { F16 r; NS_LANES(a.v[i] - b.v[i]) return r; }
inline F16 f_mul(F16 a, F16 b) { F16 r; NS_LANES(a.v[i] * b.v[i]) return r; }
inline F16 f_div(F16 a, F16 b) { F16 r; NS_LANES(a.v[i] / b.v[i]) return r; }
inline F16 f_fma(F16 a, F16 b, F16 c) { F16 r; NS_LANES(std::fma(a.v[i], b.v[i], c.v[i])) return r; }
// As the SIMD max/min: the second operand when the comparison is false (NaN aside, equal).
inline F16 f_max(F16 a, F16 b) { F16 r; NS_LANES(a.v[i] > b.v[i] ? a.v[i] : b.v[i]) return r; }
inline F16 f_min(F16 a, F16 b) { F16 r; NS_LANES(a.v[i] < b.v[i] ? a.v[i] : b.v[i]) return r; }
inline F16 f_abs(F16 a) { F16 r; NS_LANES(std::fabs(a.v[i])) return r; }
inline F16 f_round(F16 a) { F16 r; NS_LANES(std::nearbyint(a.v[i])) return r; }
inline I16 f_to_i(F16 a) { I16 r; NS_LANES(static_cast<int32_t>(a.v[i])) return r; }
inline F16 i_to_f(I16 a) { F16 r; NS_LANES(static_cast<float>(a.v[i])) return r; }
inline F16 i_as_f(I16 a) { F16 r; NS_LANES(bits_to_float(static_cast<uint32_t>(a.v[i]))) return r; }
inline float f_hsum(F16 a) {
  float s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i) s[i] = a.v[i] + a.v[i + 8];
  for (int i = 0; i < 4; ++i) t[i] = s[i] + s[i + 4];
  for (int i = 0; i < 2; ++i) u[i] = t[i] + t[i + 2];
  return u[0] + u[1];
}
inline float f_hmax(F16 a) {
  float m = a.v[0];
  for (int i = 1; i < 16; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}

inline I16 i_zero() { I16 r; NS_LANES(0) return r; }
inline I16 i_set1(int32_t x) { I16 r; NS_LANES(x) return r; }
inline I16 i_add(I16 a, I16 b) { I16 r; NS_LANES(a.v[i] + b.v[i]) return r; }
inline I16 i_sub(I16 a, I16 b) { I16 r; NS_LANES(a.v[i] - b.v[i]) return r; }
inline I16 i_shl(I16 a, int n) { I16 r; NS_LANES(static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) << n)) return r; }
inline I16 i_shr(I16 a, int n) { I16 r; NS_LANES(static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) >> n)) return r; }
inline I16 i_and(I16 a, I16 b) { I16 r; NS_LANES(a.v[i] & b.v[i]) return r; }
inline I16 i_mul(I16 a, I16 b) { I16 r; NS_LANES(a.v[i] * b.v[i]) return r; }
inline int32_t i_hsum(I16 a) { int32_t s = 0; for (int i = 0; i < 16; ++i) s += a.v[i]; return s; }
inline void i_store_i8(int8_t* p, I16 a) { for (int i = 0; i < 16; ++i) p[i] = static_cast<int8_t>(a.v[i]); }

inline B64 b_load(const uint8_t* p) { B64 r; std::memcpy(r.v, p, 64); return r; }
inline B64 b_low_nibbles(B64 a) { B64 r; for (int i = 0; i < 64; ++i) r.v[i] = a.v[i] & 0x0F; return r; }
inline B64 b_high_nibbles(B64 a) { B64 r; for (int i = 0; i < 64; ++i) r.v[i] = a.v[i] >> 4; return r; }
inline B64 b_or(B64 a, B64 b) { B64 r; for (int i = 0; i < 64; ++i) r.v[i] = a.v[i] | b.v[i]; return r; }
inline B64 b_lookup(B64 a, const uint8_t* table) { B64 r; for (int i = 0; i < 64; ++i) r.v[i] = table[a.v[i]]; return r; }
inline B64 b_field(B64 a, int from, int mask, int to) {
  B64 r;
  for (int i = 0; i < 64; ++i) r.v[i] = static_cast<uint8_t>(((a.v[i] >> from) & mask) << to);
  return r;
}
inline I16 i_from_u8(const uint8_t* p) { I16 r; NS_LANES(p[i]) return r; }
inline I16 i_from_i8(const uint8_t* p) { I16 r; NS_LANES(static_cast<int8_t>(p[i])) return r; }
inline F16 f_from_u8(const uint8_t* p) { F16 r; NS_LANES(static_cast<float>(p[i])) return r; }
inline I16 i_dot(I16 acc, B64 w, int32_t x4) {
  int8_t x[4];
  std::memcpy(x, &x4, 4);
  for (int i = 0; i < 16; ++i)
    for (int b = 0; b < 4; ++b) acc.v[i] += static_cast<int32_t>(w.v[4 * i + b]) * x[b];
  return acc;
}
constexpr bool kQ8DotHasOffset = true;
inline I16 i_dot_q8(I16 acc, B64 u, int32_t x4) { return i_dot(acc, u, x4); }

#undef NS_LANES
#endif

// -- built from the above, so the same everywhere ----------------------------------------

#if !defined(NS_AVX512)
// The 16 tree sums of v[0..16): AVX-512 has a shuffle network for it; here, one at a time.
inline void f_hsum16(const F16* v, float* out) {
  for (int p = 0; p < 16; ++p) out[p] = f_hsum(v[p]);
}
#endif

// exp(x) for x <= 88 (Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, times 2^n).
// Below -87.3 it returns ~1e-38 rather than 0: a softmax weight that small changes nothing.
inline F16 f_exp(F16 x) {
  x = f_min(f_max(x, f_set1(-87.33654f)), f_set1(88.0f));
  const F16 n = f_round(f_mul(x, f_set1(1.44269504088896341f)));
  F16 r = f_fma(n, f_set1(-0.693359375f), x);
  r = f_fma(n, f_set1(2.12194440e-4f), r);
  F16 y = f_set1(1.9875691500e-4f);
  y = f_fma(y, r, f_set1(1.3981999507e-3f));
  y = f_fma(y, r, f_set1(8.3334519073e-3f));
  y = f_fma(y, r, f_set1(4.1665795894e-2f));
  y = f_fma(y, r, f_set1(1.6666665459e-1f));
  y = f_fma(y, r, f_set1(5.0000001201e-1f));
  y = f_add(f_fma(y, f_mul(r, r), r), f_set1(1.0f));
  const F16 scale = i_as_f(i_shl(i_add(f_to_i(n), i_set1(127)), 23));  // 2^n, n in [-126, 127]
  return f_mul(y, scale);
}
