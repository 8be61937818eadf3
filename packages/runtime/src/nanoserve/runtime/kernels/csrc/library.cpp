// torch.ops.nanoserve.*: the CPU kernels as torch operators.
//
// This file checks arguments, allocates outputs, splits the work between torch's threads and
// calls the kernel table of one ISA, chosen at load from what the CPU supports (AVX-512 with
// VNNI, else AVX2 with FMA and F16C, else plain C++), as llama.cpp does. The tables compute the
// same bits, so the choice changes speed only; `force_isa` lets tests compare them. The
// weights' ops (the linears, packing, dequantizing) are in weight_ops.cpp, the recurrent
// layers' steps in recurrent_ops.cpp, the memory's read speed in memory_ops.cpp; all are
// registered here.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <atomic>
#include <string>
#include <vector>

#include "kernel_table.h"
#include "op_checks.h"

namespace nanoserve {
namespace {

const KernelTable* best_table() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return &kAvx512Table;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return &kAvx2Table;
  return &kPortableTable;
}

const KernelTable*& table() {
  static const KernelTable* chosen = best_table();
  return chosen;
}

}  // namespace

const KernelTable* active_table() { return table(); }

namespace {

// A layer's K/V pool as the kernels address it (kernel_table.h): where K's and V's rows start,
// the bytes from one (slot, head) row to the next, and how each is stored.
struct PoolView {
  uint8_t* k;
  uint8_t* v;
  int64_t row_bytes, num_slots, kv_heads, head_dim;
  KvType k_type, v_type;
};

// kv_types empty: a float pool, [2, slots + 1, kv_heads, head_dim] float32, bfloat16 or float16.
// [k, v] (q8_0 = 3, q4_0 = 4): a block pool, uint8 [slots + 1, kv_heads, K bytes + V bytes],
// each row's K blocks then its V blocks (kv_blocks.h).
PoolView pool_view(const at::Tensor& kv, at::IntArrayRef kv_types) {
  TORCH_CHECK(kv.is_contiguous(), "the K/V pool must be contiguous");
  uint8_t* base = static_cast<uint8_t*>(kv.data_ptr());
  if (kv_types.empty()) {
    const auto type = kv.scalar_type();
    TORCH_CHECK(kv.dim() == 4 && kv.size(0) == 2 &&
                    (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf),
                "a float K/V pool must be a contiguous [2, slots + 1, kv_heads, head_dim] float32, "
                "bfloat16 or float16 tensor, got ", kv.sizes(), " ", kv.scalar_type());
    const int64_t dim = kv.size(3), row = dim * kv.element_size();
    TORCH_CHECK(dim % 16 == 0, "head_dim ", dim, " is not a multiple of 16");
    const KvType form = type == at::kBFloat16 ? KvType::kBF16 : type == at::kHalf ? KvType::kF16 : KvType::kF32;
    return {base, base + kv.size(1) * kv.size(2) * row, row, kv.size(1), kv.size(2), dim, form, form};
  }
  TORCH_CHECK(kv_types.size() == 2, "kv_types names K's form and V's, got ", kv_types.size());
  for (const int64_t t : kv_types)
    TORCH_CHECK(t == int64_t(KvType::kQ8_0) || t == int64_t(KvType::kQ4_0),
                "a block K/V pool stores q8_0 (3) or q4_0 (4) blocks, got ", t);
  const KvType k_type = KvType(kv_types[0]), v_type = KvType(kv_types[1]);
  const int64_t pair = kv_block_bytes(k_type) + kv_block_bytes(v_type);
  TORCH_CHECK(kv.scalar_type() == at::kByte && kv.dim() == 3 && kv.size(2) % pair == 0,
              "a block K/V pool must be uint8 [slots + 1, kv_heads, K bytes + V bytes] of whole "
              "blocks (", pair, " bytes per 32 values), got ", kv.sizes(), " ", kv.scalar_type());
  const int64_t blocks = kv.size(2) / pair;
  return {base, base + blocks * kv_block_bytes(k_type), kv.size(2), kv.size(0), kv.size(1),
          32 * blocks, k_type, v_type};
}

// -- attention -----------------------------------------------------------------------------

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& rect,
                           const std::optional<at::Tensor>& rect_rows,
                           const at::Tensor& context_lens, double scale, int64_t heads,
                           int64_t window, at::IntArrayRef kv_types,
                           const std::optional<at::Tensor>& sinks) {
  const PoolView pool = pool_view(kv, kv_types);
  const int64_t kv_heads = pool.kv_heads, dim = pool.head_dim, tokens = q.size(0);
  TORCH_CHECK(heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= 128, heads,
              " query heads do not group over ", kv_heads, " K/V heads (at most 128 each)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 2 && q.stride(1) == 1 &&
                  q.size(1) == heads * dim,
              "q must be float32 [tokens, ", heads * dim, "] with unit inner stride, got ",
              q.sizes(), " ", q.scalar_type());
  TORCH_CHECK(rect.scalar_type() == at::kLong && rect.dim() == 2 && rect.stride(1) == 1,
              "the slot rectangle must be int64 [rows, width] with unit inner stride");
  check_index(context_lens, "context_lens", tokens);
  if (rect_rows) {
    check_index(*rect_rows, "rect_rows", tokens);
  } else {
    TORCH_CHECK(rect.size(0) == tokens, "without rect_rows the rectangle needs one row per token");
  }
  if (sinks) {
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->dim() == 1 &&
                    sinks->size(0) == heads && sinks->is_contiguous(),
                "sinks must be float32 [", heads, "], got ", sinks->sizes(), " ",
                sinks->scalar_type());
  }
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t* rows = rect_rows ? rect_rows->data_ptr<int64_t>() : nullptr;
  for (int64_t t = 0; t < tokens; ++t) {  // the host side of the addressing, checked once
    TORCH_CHECK(lens[t] >= 0 && lens[t] <= rect.size(1), "token ", t, " sees ", lens[t],
                " slots of a rectangle ", rect.size(1), " wide");
    TORCH_CHECK(!rows || (rows[t] >= 0 && rows[t] < rect.size(0)), "token ", t,
                " names rectangle row ", rows ? rows[t] : 0, " of ", rect.size(0));
  }
  at::Tensor out = at::empty({tokens, heads * dim}, q.options());
  const AttentionArgs args{q.data_ptr<float>(), q.stride(0), pool.k, pool.v, pool.row_bytes,
                           rect.data_ptr<int64_t>(), rect.stride(0), rows, lens,
                           out.data_ptr<float>(), pool.num_slots, heads, kv_heads, dim,
                           static_cast<float>(scale), pool.k_type, pool.v_type,
                           window > 0 ? window : 0,
                           sinks ? sinks->data_ptr<float>() : nullptr};
  const int64_t group = heads / kv_heads, width = rect.size(1);
  std::atomic<bool> ok{true};
  const KernelTable* t = table();
  at::parallel_for(0, tokens * kv_heads, grain_for(group * width * dim), [&](int64_t t0, int64_t t1) {
    // Kept per thread across calls, as the linears' activations are: no allocation per step.
    thread_local std::vector<float> scratch;
    const size_t floats = group * (width + 16 + dim) + 16 * dim;
    if (scratch.size() < floats) scratch.resize(floats);
    if (!t->attention(args, t0, t1, scratch.data())) ok = false;
  });
  TORCH_CHECK(ok.load(), "a slot in the rectangle is outside the K/V pool of ", pool.num_slots, " slots");
  return out;
}

// -- rotary and the K/V write --------------------------------------------------------------

void rope_write_kv(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
                   const at::Tensor& sin, const at::Tensor& kv, const at::Tensor& slots,
                   int64_t heads, at::IntArrayRef kv_types) {
  const PoolView pool = pool_view(kv, kv_types);
  const int64_t kv_heads = pool.kv_heads, dim = pool.head_dim, tokens = qkv.size(0);
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1 &&
                  qkv.size(1) == (heads + 2 * kv_heads) * dim,
              "qkv must be float32 [tokens, ", (heads + 2 * kv_heads) * dim, "], got ", qkv.sizes());
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.dim() == 2 &&
                  cos.size(1) > 0 && cos.size(1) <= dim && cos.size(1) % 2 == 0 &&
                  cos.sizes() == sin.sizes() && sin.is_contiguous() && sin.scalar_type() == at::kFloat,
              "cos and sin must be contiguous float32 [positions, rotary dims], an even number of"
              " at most ", dim, ", got ", cos.sizes());
  check_index(positions, "positions", tokens);
  check_index(slots, "slots", tokens);
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "position ", pos[t], " is outside the ",
                cos.size(0), "-position rotary table");
  const RopeArgs args{qkv.data_ptr<float>(), qkv.stride(0), pos, cos.data_ptr<float>(),
                      sin.data_ptr<float>(), pool.k, pool.v, pool.row_bytes,
                      slots.data_ptr<int64_t>(), pool.num_slots, heads, kv_heads, dim,
                      pool.k_type, pool.v_type, cos.size(1)};
  std::atomic<bool> ok{true};
  const KernelTable* t = table();
  at::parallel_for(0, tokens, grain_for(qkv.size(1) * 4), [&](int64_t t0, int64_t t1) {
    if (!t->rope_write_kv(args, t0, t1)) ok = false;
  });
  TORCH_CHECK(ok.load(), "a write slot is outside the K/V pool of ", pool.num_slots, " slots");
}

// -- RMSNorm and SiLU ------------------------------------------------------------------------

void check_norm_weight(const at::Tensor& w, int64_t k) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 1 && w.size(0) == k && w.is_contiguous(),
              "the norm weight must be a contiguous float32 vector of ", k);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, "x", 16);
  check_norm_weight(w, x.size(1));
  at::Tensor out = at::empty_like(x);
  const KernelTable* t = table();
  float* xp = x.data_ptr<float>();
  at::parallel_for(0, x.size(0), grain_for(x.size(1) * 4), [&](int64_t r0, int64_t r1) {
    t->rms_norm(xp, nullptr, w.data_ptr<float>(), out.data_ptr<float>(), x.size(1),
                static_cast<float>(eps), r0, r1);
  });
  return out;
}

// x += delta (in place), then RMSNorm of the new x.
at::Tensor add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& w, double eps) {
  check_rows(x, "x", 16);
  check_rows(delta, "delta", 16);
  TORCH_CHECK(delta.sizes() == x.sizes(), "delta ", delta.sizes(), " does not match x ", x.sizes());
  check_norm_weight(w, x.size(1));
  at::Tensor out = at::empty_like(x);
  const KernelTable* t = table();
  at::parallel_for(0, x.size(0), grain_for(x.size(1) * 4), [&](int64_t r0, int64_t r1) {
    t->rms_norm(x.data_ptr<float>(), delta.data_ptr<float>(), w.data_ptr<float>(),
                out.data_ptr<float>(), x.size(1), static_cast<float>(eps), r0, r1);
  });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up", 32);
  const int64_t half = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), half}, gate_up.options());
  const KernelTable* t = table();
  at::parallel_for(0, gate_up.size(0), grain_for(half * 8), [&](int64_t r0, int64_t r1) {
    t->silu_mul(gate_up.data_ptr<float>(), out.data_ptr<float>(), half, r0, r1);
  });
  return out;
}

at::Tensor gelu_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up", 32);
  const int64_t half = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), half}, gate_up.options());
  const KernelTable* t = table();
  at::parallel_for(0, gate_up.size(0), grain_for(half * 12), [&](int64_t r0, int64_t r1) {
    t->gelu_mul(gate_up.data_ptr<float>(), out.data_ptr<float>(), half, r0, r1);
  });
  return out;
}

// In place: each q head and each k head of qkv [tokens, (heads + 2 kv_heads) * head_dim] is
// RMS-normalised with its weight (Qwen3's and Gemma 3's q/k norms), as rms_norm computes a row.
void head_rms_norm(at::Tensor qkv, const at::Tensor& q_weight, const at::Tensor& k_weight,
                   int64_t heads, int64_t kv_heads, double eps) {
  const int64_t dim = q_weight.numel();
  check_norm_weight(q_weight, dim);
  check_norm_weight(k_weight, dim);
  TORCH_CHECK(dim % 16 == 0, "head_dim ", dim, " is not a multiple of 16");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1 &&
                  qkv.size(1) == (heads + 2 * kv_heads) * dim,
              "qkv must be float32 [tokens, ", (heads + 2 * kv_heads) * dim, "], got ", qkv.sizes());
  const KernelTable* t = table();
  float* base = qkv.data_ptr<float>();
  const int64_t stride = qkv.stride(0);
  at::parallel_for(0, qkv.size(0), grain_for(qkv.size(1) * 2), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = base + r * stride;
      t->rms_norm(row, nullptr, q_weight.data_ptr<float>(), row, dim, static_cast<float>(eps), 0, heads);
      float* k = row + heads * dim;
      t->rms_norm(k, nullptr, k_weight.data_ptr<float>(), k, dim, static_cast<float>(eps), 0, kv_heads);
    }
  });
}

at::Tensor argmax(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
                  x.is_contiguous() && x.size(1) > 0,
              "argmax takes a contiguous, non-empty 2-D float32 CPU tensor, got ", x.sizes());
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  const KernelTable* t = table();
  at::parallel_for(0, x.size(0), grain_for(x.size(1)), [&](int64_t r0, int64_t r1) {
    t->argmax(x.data_ptr<float>(), x.size(1), out.data_ptr<int64_t>(), r0, r1);
  });
  return out;
}

// In place: logits[rows[i], t] = -inf wherever bit t % 32 of word t / 32 of bitmask[i] is clear,
// and for every t past the mask. A word of all ones (most words, inside a JSON string) is one
// compare, one of all zeros (most words elsewhere) one fill; torch's unpack-and-fill reads and
// writes 40 bytes per token for the same result.
void apply_token_bitmask(at::Tensor logits, const at::Tensor& bitmask, const at::Tensor& rows) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
                  logits.is_contiguous(),
              "apply_token_bitmask takes contiguous 2-D float32 CPU logits, got ", logits.sizes());
  TORCH_CHECK(bitmask.device().is_cpu() && bitmask.scalar_type() == at::kInt && bitmask.dim() == 2 &&
                  bitmask.is_contiguous() && rows.device().is_cpu() && rows.is_contiguous() &&
                  rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.size(0) == bitmask.size(0),
              "apply_token_bitmask takes a contiguous int32 [k, words] bitmask and int64 [k] rows, on the CPU");
  const int64_t vocab = logits.size(1), words = bitmask.size(1), batch = logits.size(0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t* row = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.size(0); ++i) {
    TORCH_CHECK(row[i] >= 0 && row[i] < batch, "apply_token_bitmask: row ", row[i], " outside ", batch);
    float* out = logits.data_ptr<float>() + row[i] * vocab;
    const uint32_t* mask = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>()) + i * words;
    const int64_t covered = std::min(vocab, words * 32);
    for (int64_t w = 0; w * 32 < covered; ++w) {
      const uint32_t bits = mask[w];
      if (bits == 0xFFFFFFFFu) continue;
      const int64_t end = std::min<int64_t>(32, covered - w * 32);
      if (bits == 0) {  // outside a string most words forbid all 32: a vectorised fill
        std::fill_n(out + w * 32, end, neg_inf);
        continue;
      }
      for (int64_t b = 0; b < end; ++b)
        if (!((bits >> b) & 1u)) out[w * 32 + b] = neg_inf;
    }
    for (int64_t t = covered; t < vocab; ++t) out[t] = neg_inf;
  }
}

// -- the ISA ---------------------------------------------------------------------------------

std::string kernel_isa() { return table()->name; }
std::string best_isa() { return best_table()->name; }

// Tests pin a path ("auto": the best this CPU runs); a path the CPU lacks is refused.
std::string force_isa(const std::string& name) {
  const std::vector<const KernelTable*> order{&kPortableTable, &kAvx2Table, &kAvx512Table};
  const KernelTable* best = best_table();
  const auto rank = [&](const KernelTable* t) { return std::find(order.begin(), order.end(), t) - order.begin(); };
  const KernelTable* wanted = name == "auto" ? best : nullptr;
  for (const KernelTable* t : order)
    if (name == t->name) wanted = t;
  TORCH_CHECK(wanted != nullptr, "unknown kernel ISA '", name, "' (portable, avx2, avx512-vnni, auto)");
  TORCH_CHECK(rank(wanted) <= rank(best), "this CPU cannot run ", name, " (best: ", best->name, ")");
  table() = wanted;
  return wanted->name;
}

}  // namespace
}  // namespace nanoserve

TORCH_LIBRARY(nanoserve, m) {
  m.def("linear(Tensor x, Tensor[] weights, int[] types, int[] features, Tensor? bias=None) -> Tensor");
  m.def("pack_weight(Tensor rows, int type, int k, Tensor? order=None) -> Tensor");
  m.def("dequantize_rows(Tensor rows, int type, int k, Tensor? ids=None) -> Tensor");
  m.def("weight_type_info(int type) -> (str, int, int, int, bool)", nanoserve::weight_type_info);
  m.def("paged_attention(Tensor q, Tensor kv, Tensor rect, Tensor? rect_rows, Tensor context_lens, "
        "float scale, int heads, int window=0, int[] kv_types=[], Tensor? sinks=None) -> Tensor");
  m.def("rope_write_kv(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor sin, Tensor(b!) kv, "
        "Tensor slots, int heads, int[] kv_types=[]) -> ()");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) x, Tensor delta, Tensor w, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("gelu_mul(Tensor gate_up) -> Tensor");
  m.def("head_rms_norm(Tensor(a!) qkv, Tensor q_weight, Tensor k_weight, int heads, int kv_heads, "
        "float eps) -> ()");
  m.def("argmax(Tensor x) -> Tensor");
  m.def("delta_net_step(Tensor(a!) state, Tensor slots, Tensor positions, Tensor q, Tensor k, "
        "Tensor v, Tensor decay, Tensor beta) -> Tensor");
  m.def("conv_step(Tensor(a!) state, Tensor slots, Tensor positions, Tensor x, Tensor kernel, "
        "Tensor? bias=None) -> Tensor");
  m.def("ssm_step(Tensor(a!) state, Tensor slots, Tensor positions, Tensor u, Tensor b, "
        "Tensor c, Tensor decay) -> Tensor");
  m.def("apply_token_bitmask(Tensor(a!) logits, Tensor bitmask, Tensor rows) -> ()");
  m.def("read_bytes(Tensor bytes) -> int");
  m.def("kernel_isa() -> str", nanoserve::kernel_isa);
  m.def("best_isa() -> str", nanoserve::best_isa);
  m.def("force_isa(str name) -> str", nanoserve::force_isa);
}

TORCH_LIBRARY_IMPL(nanoserve, CPU, m) {
  m.impl("linear", nanoserve::linear);
  m.impl("pack_weight", nanoserve::pack_weight);
  m.impl("dequantize_rows", nanoserve::dequantize_rows);
  m.impl("paged_attention", nanoserve::paged_attention);
  m.impl("rope_write_kv", nanoserve::rope_write_kv);
  m.impl("rms_norm", nanoserve::rms_norm);
  m.impl("add_rms_norm", nanoserve::add_rms_norm);
  m.impl("silu_mul", nanoserve::silu_mul);
  m.impl("gelu_mul", nanoserve::gelu_mul);
  m.impl("head_rms_norm", nanoserve::head_rms_norm);
  m.impl("argmax", nanoserve::argmax);
  m.impl("delta_net_step", nanoserve::delta_net_step);
  m.impl("conv_step", nanoserve::conv_step);
  m.impl("ssm_step", nanoserve::ssm_step);
  m.impl("apply_token_bitmask", nanoserve::apply_token_bitmask);
  m.impl("read_bytes", nanoserve::read_bytes);
}
