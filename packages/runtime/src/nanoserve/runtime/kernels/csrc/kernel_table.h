// What each ISA's kernels take, and the table of them one ISA offers.
//
// Plain pointers and sizes, no torch types: the ISA files (isa_*.cpp) compile without torch's
// headers, so nothing of torch is ever built with AVX-512 code that an AVX2 machine could
// reach. library.cpp and weight_ops.cpp check tensors, split work between threads and call one
// table.
#pragma once

#include <cstdint>

#include "weight_types.h"

namespace nanoserve {

// How the K/V pool stores a value: float32, bfloat16 (torch's rounding) or float16 (IEEE half,
// llama.cpp's default cache type: 11 significant bits against bf16's 8).
// How a pool row (one slot's K or V of one head) is stored: float values, or GGUF blocks of 32
// (kv_blocks.h). The numbers are the Python side's (core/kv_cache_dtype.py).
enum class KvType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2, kQ8_0 = 3, kQ4_0 = 4 };
// Bytes of one block of 32 values of a block form (0: a float form).
constexpr int64_t kv_block_bytes(KvType t) { return t == KvType::kQ8_0 ? 34 : t == KvType::kQ4_0 ? 18 : 0; }
// The width of the Hadamard turn a row of `dim` values kept as `t` is stored through, as
// llama.cpp's quantized caches are (its attn_rot_k / attn_rot_v): none (0) for a float form or
// a head_dim that is not a multiple of 64; V 64; K the largest power of two dividing head_dim.
constexpr int64_t kv_rotation_width(KvType t, int64_t dim, bool v) {
  if (kv_block_bytes(t) == 0 || dim % 64 != 0) return 0;
  int64_t n = 64;
  while (!v && dim % (2 * n) == 0) n *= 2;
  return n;
}

// Activations quantized per row in groups of 32, as the linears read them.
struct QuantizedRows {
  const int8_t* q;       // [rows, k]
  const float* d;        // [rows, groups]: the group's scale, amax / 127
  const float* s;        // [rows, groups]: d * (sum of the group's q)
  const int32_t* qsum;   // [rows, groups]: sum of the group's q
  const int32_t* qsum16; // [rows, groups, 2]: sums of its two halves of 16
  int64_t rows, k, groups;
};

// One weight (or one part of a linear whose parts differ in type) against the rows.
struct LinearArgs {
  QuantizedRows x;
  const uint8_t* w;     // [blocks, superblocks, packed bytes] (weight_types.h)
  const float* bias;    // [n] or null
  float* out;           // [rows, n] at row stride out_stride: this part's first column
  int64_t n, out_stride;
};

using LinearKernel = void (*)(const LinearArgs& a, int64_t b0, int64_t b1);

struct AttentionArgs {
  const float* q;               // [tokens, heads * head_dim], row stride q_stride
  int64_t q_stride;
  // The row of (slot, kv head) starts at k + (slot * kv_heads + head) * row_bytes, and so for v:
  // a float pool [2, slots + 1, kv_heads, head_dim] has V past all of K, a block pool
  // [slots + 1, kv_heads, K bytes + V bytes] each V right after its K.
  const uint8_t* k;
  const uint8_t* v;
  int64_t row_bytes;
  const int64_t* rect;          // [rect rows, width], row stride rect_stride
  int64_t rect_stride;
  const int64_t* rect_rows;     // [tokens]: the rectangle row of each token; null: token t -> t
  const int64_t* context_lens;  // [tokens]: slots visible to each token
  float* out;                   // [tokens, heads * head_dim]
  int64_t num_slots;            // slots + 1 entries exist (the last is the sink)
  int64_t heads, kv_heads, head_dim;
  float scale;
  KvType k_type, v_type;
  int64_t window;               // > 0: a token sees only its last `window` slots (sliding layers)
  const float* sinks;           // [heads]: a logit per head in the softmax's denominator; null: none
};

struct RopeArgs {
  float* qkv;                   // [tokens, (heads + 2 kv_heads) * head_dim], row stride qkv_stride
  int64_t qkv_stride;
  const int64_t* positions;     // [tokens]
  const float* cos;             // [positions, rot_dim]: the first rot_dim of a head turn
  const float* sin;
  uint8_t* k;                   // the pool's rows, addressed as AttentionArgs' are
  uint8_t* v;
  int64_t row_bytes;
  const int64_t* slots;         // [tokens]: where each token's K/V go
  int64_t num_slots;            // slots + 1
  int64_t heads, kv_heads, head_dim;
  KvType k_type, v_type;
  int64_t rot_dim;              // dimensions rotary turns (head_dim, or fewer: partial rotary)
};

// One token of gated DeltaNet per (row, value head): the state updated in place (recurrent.h).
struct DeltaStepArgs {
  float* state;               // [slots + 1, heads, k_dim, v_dim]: the layer's state pool
  const int64_t* slots;       // [rows]: each row's state slot (the last: the sink, padding)
  const int64_t* positions;   // [rows]: 0 starts a sequence (no state is read)
  const float* q;             // [rows, heads, k_dim]: normalised and scaled
  const float* k;             // [rows, heads, k_dim]: normalised
  const float* v;             // [rows, heads, v_dim]
  const float* decay;         // [rows, heads]: exp(g)
  const float* beta;          // [rows, heads]
  float* out;                 // [rows, heads, v_dim]
  int64_t num_slots;          // slots + 1
  int64_t heads, k_dim, v_dim;  // v_dim a multiple of 16
};

// One token of a causal depthwise convolution per row: the window updated in place.
struct ConvStepArgs {
  float* state;               // [slots + 1, channels, taps - 1]: each row's last inputs
  const int64_t* slots;       // [rows]
  const int64_t* positions;   // [rows]: 0 starts a sequence (an empty window)
  const float* x;             // [rows, channels], row stride x_stride
  int64_t x_stride;
  const float* kernel;        // [channels, taps]
  const float* bias;          // [channels] or null
  float* out;                 // [rows, channels]
  int64_t num_slots, channels, taps;  // taps >= 2
};

// One token of Mamba2's state space per (row, head): the state updated in place.
struct SsmStepArgs {
  float* state;               // [slots + 1, heads, head_dim, d_state]
  const int64_t* slots;       // [rows]
  const int64_t* positions;   // [rows]: 0 starts a sequence (no state is read)
  const float* u;             // [rows, heads, head_dim]: dt * x
  const float* b;             // [rows, heads, d_state]
  const float* c;             // [rows, heads, d_state]
  const float* decay;         // [rows, heads]: exp(dt * A)
  float* out;                 // [rows, heads, head_dim]
  int64_t num_slots, heads, head_dim, d_state;  // d_state a multiple of 16
};

struct KernelTable {
  const char* name;
  // rows [r0, r1) of x [rows, k] (k a multiple of 32) into q, d, s, qsum.
  void (*quantize)(const float* x, const QuantizedRows& out, int64_t r0, int64_t r1);
  // The dot kernel of a weight type (its GGML number), or null: output feature blocks
  // [b0, b1) of x @ w.T for every row.
  LinearKernel (*linear)(int64_t ggml);
  // tasks [t0, t1) of tokens x kv_heads; scratch holds heads / kv_heads * (width + 16 +
  // head_dim) + 16 * head_dim floats;
  // false on a slot outside the pool.
  bool (*attention)(const AttentionArgs& a, int64_t t0, int64_t t1, float* scratch);
  // tokens [t0, t1): rotary on q and k in place, K and V into the pool; false on a bad slot.
  bool (*rope_write_kv)(const RopeArgs& a, int64_t t0, int64_t t1);
  // rows [r0, r1) of [rows, k]: out = w * x / rms(x); with delta, x += delta first (in place).
  void (*rms_norm)(float* x, const float* delta, const float* w, float* out, int64_t k, float eps,
                   int64_t r0, int64_t r1);
  // rows [r0, r1): out[:, i] = silu(gate_up[:, i]) * gate_up[:, half + i].
  void (*silu_mul)(const float* gate_up, float* out, int64_t half, int64_t r0, int64_t r1);
  // the same with tanh-approximate GELU for SiLU (GeGLU).
  void (*gelu_mul)(const float* gate_up, float* out, int64_t half, int64_t r0, int64_t r1);
  // rows [r0, r1) of [rows, k]: the index of each row's first maximum.
  void (*argmax)(const float* x, int64_t k, int64_t* out, int64_t r0, int64_t r1);
  // tasks [t0, t1) of rows x heads; scratch holds v_dim floats; false on a slot outside the pool.
  bool (*delta_step)(const DeltaStepArgs& a, int64_t t0, int64_t t1, float* scratch);
  // rows [r0, r1); false on a slot outside the pool.
  bool (*conv_step)(const ConvStepArgs& a, int64_t r0, int64_t r1);
  // tasks [t0, t1) of rows x heads; false on a slot outside the pool.
  bool (*ssm_step)(const SsmStepArgs& a, int64_t t0, int64_t t1);
  int64_t row_tile;  // rows a linear reads one weight group for (register blocking)
};

extern const KernelTable kAvx512Table;
extern const KernelTable kAvx2Table;
extern const KernelTable kPortableTable;

}  // namespace nanoserve
