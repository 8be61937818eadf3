// The CPU kernels, written once over simd.h's 16-lane types and included per ISA.
//
// Each output number is computed in one fixed order that depends on neither the number of
// rows, the thread split, the padding of a batch nor the ISA:
//   - linears: a group's integer dot product is exact (a computed offset, q4_0's and q5_0's
//     8 or 16 times the inputs' sum, comes off it in integers); per output feature the groups
//     are then accumulated in order, acc = fma(dot, d_w * d_x, acc), and then, for the types
//     that store a minimum (q4_1, q5_1, q4_k, q5_k, q2_k), acc = fma(m_w, s_x, acc);
//   - attention: per token and head, scores in position order, one max, exp, a 16-lane sum
//     reduced by the fixed tree, and the weighted values accumulated in position order;
//   - norms, rotary and SiLU: per row, 16 lanes and the fixed tree.
// So a row's result is the same alone or batched, eager or replayed, on AVX-512 or AVX2.
//
// Needs: NS_ROW_TILE (rows per weight pass), the types and functions of simd.h, and the
// recurrent layers' steps of recurrent.h.

inline int32_t load_x4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// -- activations to int8 groups ----------------------------------------------------------

void quantize(const float* x, const QuantizedRows& out, int64_t r0, int64_t r1) {
  const int64_t k = out.k, groups = out.groups;
  int8_t* q = const_cast<int8_t*>(out.q);
  float* d = const_cast<float*>(out.d);
  float* s = const_cast<float*>(out.s);
  int32_t* qsum = const_cast<int32_t*>(out.qsum);
  int32_t* qsum16 = const_cast<int32_t*>(out.qsum16);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = x + r * k + g * kGroup;
      const F16 a = f_load(src), b = f_load(src + 16);
      const float amax = f_hmax(f_max(f_abs(a), f_abs(b)));
      const float scale = amax / 127.f;
      const F16 inv = f_set1(scale != 0.f ? 1.f / scale : 0.f);
      const I16 qa = f_to_i(f_round(f_mul(a, inv))), qb = f_to_i(f_round(f_mul(b, inv)));
      i_store_i8(q + r * k + g * kGroup, qa);
      i_store_i8(q + r * k + g * kGroup + 16, qb);
      const int32_t first = i_hsum(qa), second = i_hsum(qb);
      const int64_t at = r * groups + g;
      d[at] = scale;
      qsum[at] = first + second;
      qsum16[2 * at] = first, qsum16[2 * at + 1] = second;
      s[at] = scale * static_cast<float>(first + second);
    }
  }
}

// -- quantized linears -------------------------------------------------------------------

inline void store_block(const LinearArgs& a, int64_t row, int64_t block, F16 acc) {
  const int64_t n0 = block * kFeatureBlock;
  float* dst = a.out + row * a.out_stride + n0;
  if (n0 + kFeatureBlock <= a.n) {
    if (a.bias) acc = f_add(acc, f_load(a.bias + n0));
    f_store(dst, acc);
  } else {  // the last block of a width that is not a multiple of 16: its padding is dropped
    float lanes[16];
    f_store(lanes, acc);
    for (int64_t i = 0; i < a.n - n0; ++i) dst[i] = a.bias ? lanes[i] + a.bias[n0 + i] : lanes[i];
  }
}

// Weight bytes ahead of the ones being read that a kernel asks the cache for: a thread's blocks
// are one contiguous stream, and one row's arithmetic is too little to hide memory's latency.
constexpr int64_t kPrefetchBytes = 4096;

inline void prefetch_bytes(const uint8_t* w, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(w + kPrefetchBytes + line, 0, 3);
}

#include "dots.h"

#define NS_DOTS 1
#include "quant_q.h"
#include "quant_k.h"
#include "quant_mx.h"
#undef NS_DOTS

// R rows against one feature block: each superblock's weights are unpacked once for all R
// rows, and each output number is accumulated group by group in input order.
// `ahead`: the bytes from a superblock to the same one of the next block, which the first tile
// asks for into L2 as it goes (0: none).
template <class Format, int R>
void format_rows(const LinearArgs& a, int64_t r0, int64_t block, int64_t ahead) {
  const QuantizedRows& x = a.x;
  const int64_t supers = x.k / Format::kInputs;
  const uint8_t* w = a.w + block * supers * Format::kBytes;
  F16 acc[R];
  const int8_t* xq[R];
  for (int r = 0; r < R; ++r) acc[r] = f_zero(), xq[r] = x.q + (r0 + r) * x.k;
  for (int64_t s = 0; s < supers; ++s, w += Format::kBytes) {
    // The first row tile streams the block from memory; the next ones find it in cache.
    if (r0 == 0) {
      prefetch_bytes(w, Format::kBytes);
      if (ahead)
        for (int64_t line = 0; line < Format::kBytes; line += 64) __builtin_prefetch(w + ahead + line, 0, 2);
    }
    Format::template block<R>(w, x, r0, s, xq, acc);
  }
  for (int r = 0; r < R; ++r) store_block(a, r0 + r, block, acc[r]);
}

template <class Format>
void format_linear(const LinearArgs& a, int64_t b0, int64_t b1) {
  constexpr int T = NS_ROW_TILE;
  const int64_t block_bytes = a.x.k / Format::kInputs * Format::kBytes;
  for (int64_t block = b0; block < b1; ++block) {
    // With several row tiles a block is read once from memory and then from cache, so the
    // stream would stall only on its first tile: that tile asks for the next block, into L2,
    // a superblock at a time (not all at once: a burst of misses fills the miss buffers and
    // stalls), and memory streams while all of this block's tiles compute.
    const int64_t ahead = a.x.rows > T && block + 1 < b1 ? block_bytes : 0;
    int64_t r0 = 0;
    for (; r0 + T <= a.x.rows; r0 += T) format_rows<Format, T>(a, r0, block, ahead);
    switch (a.x.rows - r0) {  // the last rows, fewer than a tile
      case 0: break;
#define NS_TAIL(n) case n: if constexpr (n < T) format_rows<Format, n>(a, r0, block, ahead); break;
      NS_TAIL(1) NS_TAIL(2) NS_TAIL(3) NS_TAIL(4) NS_TAIL(5) NS_TAIL(6) NS_TAIL(7)
#undef NS_TAIL
      default: break;
    }
  }
}

LinearKernel linear_kernel(int64_t ggml) {
  switch (ggml) {
    case kQ4_0: return format_linear<QFormat<kQ4_0>>;
    case kQ4_1: return format_linear<QFormat<kQ4_1>>;
    case kQ5_0: return format_linear<QFormat<kQ5_0>>;
    case kQ5_1: return format_linear<QFormat<kQ5_1>>;
    case kQ8_0: return format_linear<QFormat<kQ8_0>>;
    case kQ2_K: return format_linear<KFormat<kQ2_K>>;
    case kQ3_K: return format_linear<KFormat<kQ3_K>>;
    case kQ4_K: return format_linear<KFormat<kQ4_K>>;
    case kQ5_K: return format_linear<KFormat<kQ5_K>>;
    case kQ6_K: return format_linear<KFormat<kQ6_K>>;
    case kMXFP4: return format_linear<MxFormat>;
    default: return nullptr;
  }
}

// -- paged attention ---------------------------------------------------------------------

#include "kv_blocks.h"

// One (token, kv head): its query heads over the token's visible slots, read in place.
// C is head_dim / 16 when known at compile time (the accumulators then live in registers),
// else 0. K is converted once per block of 16 positions into `kbuf`, and the block's 16 scores
// of a head are reduced together (f_hsum16: the same tree as f_hsum); each V row is read once
// for up to 4 query heads. Scratch: group * (n + 16) scores, then 16 * head_dim for kbuf.
template <int C, KvType KT, KvType VT>
bool attend(const AttentionArgs& a, int64_t token, int64_t kv_head, float* scratch) {
  const int64_t group = a.heads / a.kv_heads, dim = a.head_dim;
  const int64_t chunks = C ? C : dim / 16;
  const int64_t n = a.context_lens[token];
  // A sliding layer's token sees positions [lo, n): its last `window`, itself included.
  const int64_t lo = a.window > 0 && n > a.window ? n - a.window : 0;
  const int64_t first = lo / 16 * 16;  // blocks of 16 start here; positions below lo weigh 0
  const int64_t* slots = a.rect + (a.rect_rows ? a.rect_rows[token] : token) * a.rect_stride;

  float* out = a.out + token * a.heads * dim + kv_head * group * dim;
  if (n <= 0) {  // a padded row: nothing visible, zeros out
    for (int64_t i = 0; i < group * dim; ++i) out[i] = 0.f;
    return true;
  }
  for (int64_t p = lo; p < n; ++p)  // a slot outside the pool is refused, never read
    if (static_cast<uint64_t>(slots[p]) >= static_cast<uint64_t>(a.num_slots)) return false;
  const int64_t padded = (n + 15) / 16 * 16;
  float* kbuf = scratch + group * padded;  // [16, dim]
  const float* q0 = a.q + token * a.q_stride + kv_head * group * dim;
  if (const int64_t width = kv_rotation_width(KT, dim, false)) {  // K kept turned: so is q
    float* turned = kbuf + 16 * dim;  // [group, dim]
    std::memcpy(turned, q0, group * dim * sizeof(float));
    for (int64_t h = 0; h < group; ++h) hadamard(turned + h * dim, dim, width);
    q0 = turned;
  }

  // Scores, 16 positions at a time (positions outside [lo, n) read a visible slot and are dropped).
  for (int64_t p0 = first; p0 < padded; p0 += 16) {
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t slot = slots[p0 + i < n && p0 + i >= lo ? p0 + i : lo];
      const uint8_t* row = a.k + (slot * a.kv_heads + kv_head) * a.row_bytes;
      for (int64_t c = 0; c < chunks; ++c) f_store(kbuf + i * dim + 16 * c, load_kv<KT>(row, c));
    }
    for (int64_t h = 0; h < group; ++h) {
      const float* q = q0 + h * dim;
      F16 qv[C ? C : 16], dots[16];
      for (int64_t c = 0; c < chunks; ++c) qv[c] = f_load(q + 16 * c);
      for (int64_t i = 0; i < 16; ++i) {
        dots[i] = f_mul(qv[0], f_load(kbuf + i * dim));
        for (int64_t c = 1; c < chunks; ++c) dots[i] = f_fma(qv[c], f_load(kbuf + i * dim + 16 * c), dots[i]);
      }
      float* s = scratch + h * padded + p0;
      f_hsum16(dots, s);
      f_store(s, f_mul(f_load(s), f_set1(a.scale)));
      for (int64_t i = n - p0; i < 16; ++i) s[i] = -INFINITY;  // past n: no weight, no max
      for (int64_t i = 0; i < lo - p0; ++i) s[i] = -INFINITY;  // before the window: the same
    }
  }
  // Per head: exp(s - max) with positions past n weighing exactly 0, and 1 / their sum (with a
  // sink, its logit joins the max and its exp the sum: it weighs, and takes no value).
  float inv[8 * 16];  // group <= 128
  for (int64_t h = 0; h < group; ++h) {
    float* s = scratch + h * padded;
    F16 tops = f_load(s + first);
    for (int64_t p = first + 16; p < padded; p += 16) tops = f_max(tops, f_load(s + p));
    const float sink = a.sinks ? a.sinks[kv_head * group + h] : -INFINITY;
    const float top = std::max(f_hmax(tops), sink);
    F16 total = f_zero();
    for (int64_t p = first; p < padded; p += 16) {
      F16 e = f_exp(f_sub(f_load(s + p), f_set1(top)));
      if (p + 16 > n || p < lo) {
        float lanes[16];
        f_store(lanes, e);
        for (int64_t i = n - p; i < 16; ++i) lanes[i] = 0.f;
        for (int64_t i = 0; i < lo - p; ++i) lanes[i] = 0.f;
        e = f_load(lanes);
      }
      f_store(s + p, e);
      total = f_add(total, e);
    }
    inv[h] = 1.f / (a.sinks ? f_hsum(total) + std::exp(sink - top) : f_hsum(total));
  }
  // The weighted values in position order, each V row read once for up to 4 heads.
  for (int64_t h0 = 0; h0 < group; h0 += 4) {
    const int64_t heads = group - h0 < 4 ? group - h0 : 4;
    F16 acc[4][C ? C : 16];
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < chunks; ++c) acc[h][c] = f_zero();
    for (int64_t p = lo; p < n; ++p) {
      const uint8_t* row = a.v + (slots[p] * a.kv_heads + kv_head) * a.row_bytes;
      F16 v[C ? C : 16];
      for (int64_t c = 0; c < chunks; ++c) v[c] = load_kv<VT>(row, c);
      for (int64_t h = 0; h < heads; ++h) {
        const F16 weight = f_set1(scratch[(h0 + h) * padded + p]);
        for (int64_t c = 0; c < chunks; ++c) acc[h][c] = f_fma(weight, v[c], acc[h][c]);
      }
    }
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t c = 0; c < chunks; ++c)
        f_store(out + (h0 + h) * dim + 16 * c, f_mul(acc[h][c], f_set1(inv[h0 + h])));
  }
  if (const int64_t width = kv_rotation_width(VT, dim, true))  // V kept turned: turn it back
    for (int64_t h = 0; h < group; ++h) hadamard(out + h * dim, dim, width);
  return true;
}

template <int C, KvType KT, KvType VT>
bool attend_tasks(const AttentionArgs& a, int64_t t0, int64_t t1, float* scratch) {
  for (int64_t task = t0; task < t1; ++task)
    if (!attend<C, KT, VT>(a, task / a.kv_heads, task % a.kv_heads, scratch)) return false;
  return true;
}

template <KvType KT, KvType VT>
bool attention_of(const AttentionArgs& a, int64_t t0, int64_t t1, float* scratch) {
  const int64_t chunks = a.head_dim / 16;
  if (chunks == 4) return attend_tasks<4, KT, VT>(a, t0, t1, scratch);
  if (chunks == 8) return attend_tasks<8, KT, VT>(a, t0, t1, scratch);
  return attend_tasks<0, KT, VT>(a, t0, t1, scratch);
}

// The pairs a pool holds: one float form for both, or blocks for each (library.cpp checks).
bool attention(const AttentionArgs& a, int64_t t0, int64_t t1, float* scratch) {
  using enum KvType;
  const auto pair = [&](KvType k, KvType v) { return a.k_type == k && a.v_type == v; };
  if (pair(kQ8_0, kQ8_0)) return attention_of<kQ8_0, kQ8_0>(a, t0, t1, scratch);
  if (pair(kQ8_0, kQ4_0)) return attention_of<kQ8_0, kQ4_0>(a, t0, t1, scratch);
  if (pair(kQ4_0, kQ8_0)) return attention_of<kQ4_0, kQ8_0>(a, t0, t1, scratch);
  if (pair(kQ4_0, kQ4_0)) return attention_of<kQ4_0, kQ4_0>(a, t0, t1, scratch);
  switch (a.k_type) {
    case kBF16: return attention_of<kBF16, kBF16>(a, t0, t1, scratch);
    case kF16: return attention_of<kF16, kF16>(a, t0, t1, scratch);
    default: return attention_of<kF32, kF32>(a, t0, t1, scratch);
  }
}

// -- rotary, and the new K/V into the pool ------------------------------------------------

// Hugging Face's rotary: the two halves of a head, x1 * cos - x2 * sin and x2 * cos + x1 * sin
// (multiplies and adds rounded separately, as torch's eager rotary is).
inline void rotate(float* x, const float* cos, const float* sin, int64_t dim) {
  const int64_t half = dim / 2;
  int64_t c = 0;
  for (; c + 16 <= half; c += 16) {
    const F16 x1 = f_load(x + c), x2 = f_load(x + half + c);
    f_store(x + c, f_sub(f_mul(x1, f_load(cos + c)), f_mul(x2, f_load(sin + c))));
    f_store(x + half + c, f_add(f_mul(x2, f_load(cos + half + c)), f_mul(x1, f_load(sin + half + c))));
  }
  for (; c < half; ++c) {  // a half narrower than 16 (head_dim 16): the same operations
    const float x1 = x[c], x2 = x[half + c];
    x[c] = x1 * cos[c] - x2 * sin[c];
    x[half + c] = x2 * cos[half + c] + x1 * sin[half + c];
  }
}

bool rope_write_kv(const RopeArgs& a, int64_t t0, int64_t t1) {
  const int64_t dim = a.head_dim;
  const int64_t k_width = kv_rotation_width(a.k_type, dim, false), v_width = kv_rotation_width(a.v_type, dim, true);
  thread_local std::vector<float> turned;  // a head turned before its blocks are rounded
  if (static_cast<int64_t>(turned.size()) < dim) turned.resize(dim);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t slot = a.slots[t];
    if (slot < 0 || slot >= a.num_slots) return false;
    float* row = a.qkv + t * a.qkv_stride;
    // A partial rotary (Phi-4-mini) turns the first rot_dim of each head, its own two halves.
    const float* cos = a.cos + a.positions[t] * a.rot_dim;
    const float* sin = a.sin + a.positions[t] * a.rot_dim;
    for (int64_t h = 0; h < a.heads + a.kv_heads; ++h) rotate(row + h * dim, cos, sin, a.rot_dim);
    const float* k = row + a.heads * dim;
    for (int64_t h = 0; h < a.kv_heads; ++h) {
      const int64_t at = (slot * a.kv_heads + h) * a.row_bytes;
      store_kv(a.k + at, k + h * dim, dim, a.k_type, k_width, turned.data());
      store_kv(a.v + at, k + (a.kv_heads + h) * dim, dim, a.v_type, v_width, turned.data());
    }
  }
  return true;
}

// -- RMSNorm (with the residual add) and SiLU-and-multiply ---------------------------------

void rms_norm(float* x, const float* delta, const float* w, float* out, int64_t k, float eps,
              int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    float* row = x + r * k;
    if (delta) {
      for (int64_t c = 0; c < k; c += 16) f_store(row + c, f_add(f_load(row + c), f_load(delta + r * k + c)));
    }
    F16 squares = f_zero();
    for (int64_t c = 0; c < k; c += 16) {
      const F16 v = f_load(row + c);
      squares = f_fma(v, v, squares);
    }
    const F16 inv = f_set1(1.f / std::sqrt(f_hsum(squares) / static_cast<float>(k) + eps));
    for (int64_t c = 0; c < k; c += 16) f_store(out + r * k + c, f_mul(f_load(w + c), f_mul(f_load(row + c), inv)));
  }
}

void silu_mul(const float* gate_up, float* out, int64_t half, int64_t r0, int64_t r1) {
  const F16 one = f_set1(1.f), zero = f_zero();
  for (int64_t r = r0; r < r1; ++r) {
    const float* gate = gate_up + r * 2 * half;
    for (int64_t c = 0; c < half; c += 16) {
      const F16 g = f_load(gate + c);
      const F16 silu = f_div(g, f_add(one, f_exp(f_sub(zero, g))));
      f_store(out + r * half + c, f_mul(silu, f_load(gate + half + c)));
    }
  }
}

// GELU's tanh form as a sigmoid: 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)), u = sqrt(2 / pi) (g +
// 0.044715 g^3); no tanh of its own, and no cancellation near 0.
void gelu_mul(const float* gate_up, float* out, int64_t half, int64_t r0, int64_t r1) {
  const F16 one = f_set1(1.f), minus_two_beta = f_set1(-2.f * 0.7978845608028654f);
  const F16 kappa = f_set1(0.044715f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* gate = gate_up + r * 2 * half;
    for (int64_t c = 0; c < half; c += 16) {
      const F16 g = f_load(gate + c);
      const F16 u = f_add(g, f_mul(kappa, f_mul(f_mul(g, g), g)));
      const F16 gelu = f_div(g, f_add(one, f_exp(f_mul(minus_two_beta, u))));
      f_store(out + r * half + c, f_mul(gelu, f_load(gate + half + c)));
    }
  }
}

// -- greedy picking ------------------------------------------------------------------------

// Per row, the index of the first maximum, and torch's rule for NaN (the first NaN wins): a
// vector max, then the first position equal to it. min(FLT_MAX, |v|) keeps a NaN (both ISAs
// and the portable path return the second operand when unordered) and turns an infinity into
// FLT_MAX, so c - c is NaN only for a NaN: the scan for one runs only on rows that hold one,
// not on every row a grammar masked with -inf.
inline F16 nan_marker(F16 v) {
  const F16 c = f_min(f_set1(std::numeric_limits<float>::max()), f_abs(v));
  return f_sub(c, c);
}

void argmax_rows(const float* x, int64_t k, int64_t* out, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = x + r * k;
    float top = row[0];
    int64_t c = 0;
    bool suspect = false;
    if (k >= 16) {
      F16 tops = f_load(row), odd = f_zero();
      for (c = 16; c + 16 <= k; c += 16) {
        const F16 v = f_load(row + c);
        tops = f_max(tops, v);
        odd = f_add(odd, nan_marker(v));
      }
      top = f_hmax(tops);
      const float first_sum = f_hsum(f_add(odd, nan_marker(f_load(row))));
      suspect = first_sum != first_sum;
    }
    for (; c < k; ++c) {
      top = row[c] > top ? row[c] : top;
      suspect = suspect || row[c] != row[c];
    }
    int64_t at = 0;
    if (suspect || top != top) {
      while (at < k && row[at] == row[at]) ++at;  // the first NaN, if any
      if (at < k) {
        out[r] = at;
        continue;
      }
      at = 0;
    }
    while (at < k && row[at] != top) ++at;
    out[r] = at < k ? at : 0;
  }
}

const KernelTable table = {
    NS_ISA_NAME, quantize, linear_kernel, attention, rope_write_kv, rms_norm, silu_mul,
    gelu_mul, argmax_rows, delta_step, conv_step, ssm_step, NS_ROW_TILE,
};
