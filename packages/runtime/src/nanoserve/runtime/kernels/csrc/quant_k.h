// The K-quant family: q2_k, q3_k, q4_k, q5_k, q6_k, in blocks of 256 inputs.
//
// A GGUF K block is 8 groups of 32 (q4_k, q5_k: a 6-bit scale and minimum per group) or 16
// sub-blocks of 16 (q2_k: 4-bit scale and minimum; q3_k: 6-bit signed scale; q6_k: 8-bit
// signed scale), under fp16 superblock scales d (and dmin). Levels are unsigned as packed:
//   q4_k  w = d sc q - dmin m           levels 0..15   per group   L4, sc, m
//   q5_k  the same                      levels 0..31               L4, H1 (bit 4), sc, m
//   q6_k  w = d sc (q - 32)             levels 0..63   per 16      L4, L2 (bits 4-5), sc
//   q3_k  w = d (sc - 32) (q - 4)       levels 0..7    per 16      L2, H1 (bit 2), sc - 32
//   q2_k  w = d sc q - dmin m           levels 0..3    per 16      L2, sc | m << 4
// Packed superblock: the fp16 d (and dmin) of its 16 features, then its 8 groups, each its
// per-feature scale bytes and its planes (weight_types.h).
//
// Per group the integer work is exact: a sub-block's dot product, its offset (32 or 4 times
// the sum of its inputs) and its integer scale combine in int32 (|sum| < 2^24, so exact in
// float too); one float scale, d * d_x, then multiplies. For q4_k and q5_k the group's scale
// d * sc is a float (exact: 11 bits times 6), as q4_1's d is.

// Packed bytes: the superblock's header, then 8 groups of scale bytes and planes.
template <int64_t Type>
struct KLayout {
  static constexpr bool kDmin = Type == kQ4_K || Type == kQ5_K || Type == kQ2_K;
  static constexpr int64_t kHeader = kDmin ? 64 : 32;
  static constexpr int64_t kScales = 32;  // two rows of 16 per-feature bytes
  static constexpr int64_t kPlanes = Type == kQ4_K   ? 256
                                     : Type == kQ5_K ? 320
                                     : Type == kQ6_K ? 384
                                     : Type == kQ3_K ? 192
                                                     : 128;
  static constexpr int64_t kGroupBytes = kScales + kPlanes;
  static constexpr int64_t kBytes = kHeader + 8 * kGroupBytes;
};

#if defined(NS_LAYOUT)

struct KDecoded {
  uint8_t level[256];  // unsigned, as packed
  uint16_t d, dmin;    // fp16 bits
  uint8_t sc[16], m[16];  // per group (q4_k, q5_k: 8) or per 16 inputs (16); q3_k/q6_k signed
};

inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63, m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

template <int64_t Type>
inline void k_decode(const uint8_t* b, KDecoded& out) {
  using planes::u16_at;
  out.dmin = 0;
  if constexpr (Type == kQ4_K || Type == kQ5_K) {
    out.d = u16_at(b), out.dmin = u16_at(b + 2);
    for (int j = 0; j < 8; ++j) scale_min_k4(j, b + 4, out.sc[j], out.m[j]);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (Type == kQ5_K ? 48 : 16);
    for (int i = 0; i < 4; ++i) {  // groups 2i (low nibbles) and 2i + 1 (high) share 32 bytes
      for (int l = 0; l < 32; ++l) {
        out.level[64 * i + l] = qs[32 * i + l] & 15;
        out.level[64 * i + 32 + l] = qs[32 * i + l] >> 4;
      }
    }
    if constexpr (Type == kQ5_K) {
      for (int e = 0; e < 256; ++e) out.level[e] |= static_cast<uint8_t>(((qh[e % 32] >> (e / 32)) & 1) << 4);
    }
  } else if constexpr (Type == kQ6_K) {
    const uint8_t *ql = b, *qh = b + 128;
    out.d = u16_at(b + 208);
    for (int s = 0; s < 16; ++s) out.sc[s] = b[192 + s];
    for (int n = 0; n < 2; ++n) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t h = qh[32 * n + l];
        uint8_t* lv = out.level + 128 * n + l;
        lv[0] = static_cast<uint8_t>((ql[64 * n + l] & 15) | ((h & 3) << 4));
        lv[32] = static_cast<uint8_t>((ql[64 * n + l + 32] & 15) | (((h >> 2) & 3) << 4));
        lv[64] = static_cast<uint8_t>((ql[64 * n + l] >> 4) | (((h >> 4) & 3) << 4));
        lv[96] = static_cast<uint8_t>((ql[64 * n + l + 32] >> 4) | (((h >> 6) & 3) << 4));
      }
    }
  } else if constexpr (Type == kQ3_K) {
    const uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
    out.d = u16_at(b + 108);
    for (int i = 0; i < 16; ++i) {
      const int low = i < 8 ? scales[i] & 15 : scales[i - 8] >> 4;
      const int high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
      out.sc[i] = static_cast<uint8_t>(static_cast<int8_t>((low | (high << 4)) - 32));
    }
    for (int e = 0; e < 256; ++e) {
      const int n = e / 128, s = (e % 128) / 32, l = e % 32;
      const int low2 = (qs[32 * n + l] >> (2 * s)) & 3, hbit = (hmask[l] >> (e / 32)) & 1;
      out.level[e] = static_cast<uint8_t>(low2 | (hbit << 2));
    }
  } else {  // q2_k
    const uint8_t *scales = b, *qs = b + 16;
    out.d = u16_at(b + 80), out.dmin = u16_at(b + 82);
    for (int i = 0; i < 16; ++i) out.sc[i] = scales[i] & 15, out.m[i] = scales[i] >> 4;
    for (int e = 0; e < 256; ++e) {
      const int n = e / 128, s = (e % 128) / 32, l = e % 32;
      out.level[e] = static_cast<uint8_t>((qs[32 * n + l] >> (2 * s)) & 3);
    }
  }
}

template <int64_t Type>
inline void k_dequantize(const uint8_t* b, float* out) {
  KDecoded q;
  k_decode<Type>(b, q);
  const float d = planes::half_to_float(q.d), dmin = planes::half_to_float(q.dmin);
  for (int e = 0; e < 256; ++e) {
    const float level = static_cast<float>(q.level[e]);
    if constexpr (Type == kQ4_K || Type == kQ5_K) {
      out[e] = d * static_cast<float>(q.sc[e / 32]) * level - dmin * static_cast<float>(q.m[e / 32]);
    } else if constexpr (Type == kQ6_K) {
      out[e] = d * static_cast<float>(static_cast<int8_t>(q.sc[e / 16])) * (level - 32.f);
    } else if constexpr (Type == kQ3_K) {
      out[e] = d * static_cast<float>(static_cast<int8_t>(q.sc[e / 16])) * (level - 4.f);
    } else {
      out[e] = d * static_cast<float>(q.sc[e / 16]) * level - dmin * static_cast<float>(q.m[e / 16]);
    }
  }
}


template <int64_t Type>
inline void k_pack(const uint8_t* b, uint8_t* dst, int f) {
  using L = KLayout<Type>;
  KDecoded q;
  k_decode<Type>(b, q);
  planes::put_u16(dst, f, q.d);
  if constexpr (L::kDmin) planes::put_u16(dst + 32, f, q.dmin);
  for (int g = 0; g < 8; ++g) {
    uint8_t* grp = dst + L::kHeader + g * L::kGroupBytes;
    const uint8_t* lv = q.level + 32 * g;
    uint8_t* planes_at = grp + L::kScales;
    if constexpr (Type == kQ4_K || Type == kQ5_K) {
      planes::put_u8(grp, f, q.sc[g]);
      planes::put_u8(grp + 16, f, q.m[g]);
      planes::put_l4(planes_at, f, lv);
      if constexpr (Type == kQ5_K) planes::put_h1(planes_at + 256, f, lv, 4);
    } else if constexpr (Type == kQ6_K || Type == kQ3_K) {
      planes::put_u8(grp, f, q.sc[2 * g]);
      planes::put_u8(grp + 16, f, q.sc[2 * g + 1]);
      if constexpr (Type == kQ6_K) {
        planes::put_l4(planes_at, f, lv);
        planes::put_l2(planes_at + 256, f, lv, 4);
      } else {
        planes::put_l2(planes_at, f, lv, 0);
        planes::put_h1(planes_at + 128, f, lv, 2);
      }
    } else {  // q2_k: scale and minimum of each 16-input half in one byte
      planes::put_u8(grp, f, static_cast<uint8_t>(q.sc[2 * g] | (q.m[2 * g] << 4)));
      planes::put_u8(grp + 16, f, static_cast<uint8_t>(q.sc[2 * g + 1] | (q.m[2 * g + 1] << 4)));
      planes::put_l2(planes_at, f, lv, 0);
    }
  }
}

#endif  // NS_LAYOUT

#if defined(NS_DOTS)

// The scaled integer sum of a group of the per-16 types: sum over its two halves h of
// scale_h * (dot_h - offset * sum(x_h)), each half's dot products folded in as soon as they
// are done (fewer live registers); Levels(c) gives chunk c's (low, high) levels.
template <int R, int Offset, class Levels>
inline void scaled_halves(const int8_t* const* xq, int64_t at, const int32_t* xs16, int64_t xs_stride,
                          const uint8_t* scales, Levels levels, I16* isum) {
  for (int r = 0; r < R; ++r) isum[r] = i_zero();
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    Dots dots[R];
    for (int r = 0; r < R; ++r) dots[r] = d_zero();
#pragma GCC unroll 2
    for (int c = 2 * h; c < 2 * h + 2; ++c) {
      B64 wlo, whi;
      levels(c, wlo, whi);
      chunk_dots<R>(dots, wlo, whi, xq, at + 8 * c);
    }
    const I16 scale = i_from_i8(scales + 16 * h);
    for (int r = 0; r < R; ++r) {
      const I16 t = i_sub(d_sum(dots[r]), i_set1(Offset * xs16[r * xs_stride + h]));
      isum[r] = i_add(isum[r], i_mul(scale, t));
    }
  }
}

template <int64_t Type>
struct KFormat {
  using L = KLayout<Type>;
  static constexpr int64_t kInputs = 256;
  static constexpr int64_t kBytes = L::kBytes;

  template <int R>
  static void block(const uint8_t* w, const QuantizedRows& x, int64_t r0, int64_t s,
                    const int8_t* const* xq, F16* acc) {
    const F16 d = f_load_f16(reinterpret_cast<const uint16_t*>(w));
    F16 neg_dmin = f_zero();
    if constexpr (L::kDmin) neg_dmin = f_sub(f_zero(), f_load_f16(reinterpret_cast<const uint16_t*>(w + 32)));
    for (int64_t j = 0; j < 8; ++j) {
      const uint8_t* grp = w + L::kHeader + j * L::kGroupBytes;
      const uint8_t* pl = grp + L::kScales;
      const int64_t g = 8 * s + j, at = g * kGroup;
      const int32_t* xs16 = x.qsum16 + 2 * (r0 * x.groups + g);
      const int64_t xs_stride = 2 * x.groups;
      I16 isum[R];
      if constexpr (Type == kQ4_K || Type == kQ5_K) {
        constexpr int32_t zeros[R] = {};
        q45_group_dots<R, Type == kQ5_K>(pl, xq, at, zeros, isum);
        const F16 dw = f_mul(d, f_from_u8(grp));
        const F16 mw = f_mul(neg_dmin, f_from_u8(grp + 16));
        accumulate<R>(acc, isum, dw, &mw, x, r0, g);
        continue;
      } else if constexpr (Type == kQ6_K) {
        const B64 a2 = b_load(pl + 256), b2 = b_load(pl + 320);
        scaled_halves<R, 32>(xq, at, xs16, xs_stride, grp, [&](int c, B64& lo, B64& hi) {
          const B64 packed = b_load(pl + 64 * c);
          lo = b_or(b_low_nibbles(packed), b_field(a2, 2 * c, 3, 4));
          hi = b_or(b_high_nibbles(packed), b_field(b2, 2 * c, 3, 4));
        }, isum);
      } else if constexpr (Type == kQ3_K) {
        const B64 a2 = b_load(pl), b2 = b_load(pl + 64), h1 = b_load(pl + 128);
        scaled_halves<R, 4>(xq, at, xs16, xs_stride, grp, [&](int c, B64& lo, B64& hi) {
          lo = b_or(b_field(a2, 2 * c, 3, 0), b_field(h1, c, 1, 2));
          hi = b_or(b_field(b2, 2 * c, 3, 0), b_field(h1, c + 4, 1, 2));
        }, isum);
      } else {  // q2_k: the scale and minimum of each half share a byte, sc | m << 4
        const B64 a2 = b_load(pl), b2 = b_load(pl + 64);
        I16 imin[R];
        for (int r = 0; r < R; ++r) isum[r] = i_zero(), imin[r] = i_zero();
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          Dots dots[R];
          for (int r = 0; r < R; ++r) dots[r] = d_zero();
#pragma GCC unroll 2
          for (int c = 2 * h; c < 2 * h + 2; ++c)
            chunk_dots<R>(dots, b_field(a2, 2 * c, 3, 0), b_field(b2, 2 * c, 3, 0), xq, at + 8 * c);
          const I16 scm = i_from_u8(grp + 16 * h);
          const I16 scale = i_and(scm, i_set1(15)), minimum = i_shr(scm, 4);
          for (int r = 0; r < R; ++r) {
            isum[r] = i_add(isum[r], i_mul(scale, d_sum(dots[r])));
            imin[r] = i_add(imin[r], i_mul(minimum, i_set1(xs16[r * xs_stride + h])));
          }
        }
        for (int r = 0; r < R; ++r) {
          const F16 dx = f_set1(x.d[(r0 + r) * x.groups + g]);
          acc[r] = f_fma(i_to_f(isum[r]), f_mul(d, dx), acc[r]);
          acc[r] = f_fma(i_to_f(imin[r]), f_mul(neg_dmin, dx), acc[r]);
        }
        continue;
      }
      for (int r = 0; r < R; ++r)
        acc[r] = f_fma(i_to_f(isum[r]), f_mul(d, f_set1(x.d[(r0 + r) * x.groups + g])), acc[r]);
    }
  }
};

#endif  // NS_DOTS
