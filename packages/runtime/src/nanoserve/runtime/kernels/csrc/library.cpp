// torch.ops.nanoserve.*: the CPU kernels as torch operators.
//
// This file checks arguments, allocates outputs, splits the work between torch's threads and
// calls the kernel table of one ISA, chosen at load from what the CPU supports (AVX-512 with
// VNNI, else AVX2 with FMA and F16C, else plain C++), as llama.cpp does. The tables compute the
// same bits, so the choice changes speed only; `force_isa` lets tests compare them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <atomic>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_table.h"

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

// Work below this many multiply-adds runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelWork = 1 << 16;

int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kParallelWork / std::max<int64_t>(1, work_per_item));
}

void check_rows(const at::Tensor& x, const char* name, int64_t multiple) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              name, " must be a 2-D float32 CPU tensor, got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(x.size(1) % multiple == 0, name, " width ", x.size(1), " is not a multiple of ",
              multiple);
}

void check_index(const at::Tensor& t, const char* name, int64_t length) {
  TORCH_CHECK(t.scalar_type() == at::kLong && t.dim() == 1 && t.is_contiguous() &&
                  t.size(0) == length,
              name, " must be a contiguous int64 vector of ", length, ", got ", t.sizes(), " ",
              t.scalar_type());
}

// [2, slots + 1, kv_heads, head_dim] float32, bfloat16 or float16.
void check_pool(const at::Tensor& kv) {
  const auto type = kv.scalar_type();
  TORCH_CHECK(kv.dim() == 4 && kv.size(0) == 2 && kv.is_contiguous() &&
                  (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf),
              "the K/V pool must be a contiguous [2, slots + 1, kv_heads, head_dim] float32, "
              "bfloat16 or float16 tensor, got ", kv.sizes(), " ", kv.scalar_type());
  TORCH_CHECK(kv.size(3) % 16 == 0, "head_dim ", kv.size(3), " is not a multiple of 16");
}

KvType kv_type(const at::Tensor& kv) {
  if (kv.scalar_type() == at::kBFloat16) return KvType::kBF16;
  return kv.scalar_type() == at::kHalf ? KvType::kF16 : KvType::kF32;
}

// -- linears -------------------------------------------------------------------------------

const WeightType& weight_type(int64_t ggml, bool linear) {
  const WeightType* t = find_weight_type(ggml);
  TORCH_CHECK(t != nullptr, "GGML type ", ggml, " has no entry in nanoserve's weight types");
  TORCH_CHECK(!linear || t->linear, t->name, " has no dot kernel (it is dequantized, not packed)");
  return *t;
}

int64_t feature_blocks(int64_t n) { return (n + kFeatureBlock - 1) / kFeatureBlock; }

// x @ [w_0; w_1; ...].T (+ bias): the parts of one linear (q, k and v; gate and up), each in its
// own type, stacked along the output features. x is quantized once for all of them.
at::Tensor linear(const at::Tensor& x, at::TensorList weights, at::IntArrayRef types,
                  at::IntArrayRef features, const std::optional<at::Tensor>& bias) {
  check_rows(x, "x", kGroup);
  const int64_t parts = static_cast<int64_t>(weights.size());
  TORCH_CHECK(parts > 0 && static_cast<int64_t>(types.size()) == parts &&
                  static_cast<int64_t>(features.size()) == parts,
              "linear takes one type and one feature count per weight, got ", parts, " weights, ",
              types.size(), " types, ", features.size(), " counts");
  const int64_t rows = x.size(0), k = x.size(1), groups = k / kGroup;
  const KernelTable* t = table();
  std::vector<LinearKernel> kernels(parts);
  std::vector<int64_t> first_block(parts + 1, 0), first_column(parts + 1, 0);
  for (int64_t p = 0; p < parts; ++p) {
    const WeightType& type = weight_type(types[p], true);
    const int64_t n = features[p];
    TORCH_CHECK(n > 0 && k % type.inputs == 0, type.name, " weight of ", n, " x ", k,
                ": its inputs must fill ", type.inputs, "-input blocks");
    const int64_t bytes = feature_blocks(n) * (k / type.inputs) * type.packed_bytes;
    const at::Tensor& w = weights[p];
    TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 1 && w.is_contiguous() && w.numel() == bytes,
                "packed ", type.name, " weights for ", n, " x ", k, " must be ", bytes,
                " contiguous bytes, got ", w.sizes(), " ", w.scalar_type());
    kernels[p] = t->linear(type.ggml);
    TORCH_CHECK(kernels[p] != nullptr, type.name, " has no kernel on ", t->name);
    first_block[p + 1] = first_block[p] + feature_blocks(n);
    first_column[p + 1] = first_column[p] + n;
  }
  const int64_t n_total = first_column[parts];
  if (bias) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->dim() == 1 && bias->size(0) == n_total &&
                    bias->is_contiguous(),
                "bias must be a contiguous float32 vector of ", n_total);
  }
  at::Tensor out = at::empty({rows, n_total}, x.options());
  if (rows == 0) return out;
  // The quantized activations live only for this call: one buffer per calling thread, kept,
  // instead of tensors allocated per linear (a decode step calls ~120 linears).
  thread_local std::vector<int32_t> scratch;
  const int64_t words = rows * (k / 4 + 5 * groups);
  if (static_cast<int64_t>(scratch.size()) < words) scratch.resize(words);
  int32_t* base = scratch.data();
  const QuantizedRows xq{reinterpret_cast<const int8_t*>(base),
                         reinterpret_cast<const float*>(base + rows * k / 4),
                         reinterpret_cast<const float*>(base + rows * (k / 4 + groups)),
                         base + rows * (k / 4 + 2 * groups), base + rows * (k / 4 + 3 * groups),
                         rows, k, groups};
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, rows, grain_for(k), [&](int64_t r0, int64_t r1) { t->quantize(xp, xq, r0, r1); });
  std::vector<LinearArgs> args;
  for (int64_t p = 0; p < parts; ++p) {
    args.push_back({xq, weights[p].data_ptr<uint8_t>(),
                    bias ? bias->data_ptr<float>() + first_column[p] : nullptr,
                    out.data_ptr<float>() + first_column[p], features[p], n_total});
  }
  // One range over every part's feature blocks, so the threads split the whole linear evenly.
  at::parallel_for(0, first_block[parts], grain_for(rows * k * kFeatureBlock), [&](int64_t b0, int64_t b1) {
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t lo = std::max(b0, first_block[p]), hi = std::min(b1, first_block[p + 1]);
      if (lo < hi) kernels[p](args[p], lo - first_block[p], hi - first_block[p]);
    }
  });
  return out;
}

void check_gguf_rows(const at::Tensor& rows, const WeightType& type, int64_t k) {
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kByte && rows.dim() == 2 &&
                  rows.stride(1) == 1,
              "GGUF rows must be a 2-D uint8 CPU tensor with unit inner stride, got ", rows.sizes());
  TORCH_CHECK(k > 0 && k % type.inputs == 0 && rows.size(1) == k / type.inputs * type.file_bytes,
              type.name, " rows of ", k, " values are ", k / type.inputs * type.file_bytes,
              " bytes, got ", rows.size(1));
}

// A zeroed byte tensor from an anonymous map in 2 MiB pages where the OS gives them: a model's
// packed weights are hundreds of MiB, and first touching them in 4 KiB pages cost more than
// the packing (torch.zeros of 400 MiB: 0.2-1.2 s here).
at::Tensor zeroed_bytes(int64_t bytes) {
  const size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "cannot map ", size, " bytes for packed weights");
  madvise(p, size, MADV_HUGEPAGE);  // a hint: refused quietly where huge pages are off
  return at::from_blob(p, {bytes}, [size](void* q) { munmap(q, size); }, at::TensorOptions().dtype(at::kByte));
}

// GGUF rows (one per output feature) into the kernels' layout; row f of the weight is
// rows[order[f]] when an order is given (llama.cpp's Q/K row permutation, undone for free).
at::Tensor pack_weight(const at::Tensor& rows, int64_t ggml, int64_t k, const std::optional<at::Tensor>& order) {
  const WeightType& type = weight_type(ggml, true);
  check_gguf_rows(rows, type, k);
  const int64_t n = rows.size(0);
  const int64_t* index = nullptr;
  if (order) {
    check_index(*order, "order", n);
    index = order->data_ptr<int64_t>();
    for (int64_t f = 0; f < n; ++f)
      TORCH_CHECK(index[f] >= 0 && index[f] < n, "order names row ", index[f], " of ", n);
  }
  const int64_t block_bytes = (k / type.inputs) * type.packed_bytes;
  at::Tensor packed = zeroed_bytes(feature_blocks(n) * block_bytes);
  const uint8_t* src = rows.data_ptr<uint8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  at::parallel_for(0, feature_blocks(n), 1, [&](int64_t b0, int64_t b1) {
    pack_features(type, src, rows.stride(0), index, n, k, dst, b0 * kFeatureBlock, b1 * kFeatureBlock);
  });
  return packed;
}

// The values of GGUF rows (all, or those named by ids: an embedding lookup), exactly as the file
// defines them, in float32.
at::Tensor dequantize_rows(const at::Tensor& rows, int64_t ggml, int64_t k, const std::optional<at::Tensor>& ids) {
  const WeightType& type = weight_type(ggml, false);
  check_gguf_rows(rows, type, k);
  const int64_t count = ids ? ids->numel() : rows.size(0);
  const int64_t* index = nullptr;
  if (ids) {
    TORCH_CHECK(ids->scalar_type() == at::kLong && ids->dim() == 1 && ids->is_contiguous(),
                "ids must be a contiguous int64 vector");
    index = ids->data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i)
      TORCH_CHECK(index[i] >= 0 && index[i] < rows.size(0), "id ", index[i], " is outside the ",
                  rows.size(0), " rows");
  }
  at::Tensor out = at::empty({count, k}, rows.options().dtype(at::kFloat));
  const uint8_t* src = rows.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, count, grain_for(k * 4), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      dequantize_row(type, src + (index ? index[r] : r) * rows.stride(0), k, dst + r * k);
  });
  return out;
}

// What the table says of a type: (name, inputs per block, file bytes, packed bytes, linear).
std::tuple<std::string, int64_t, int64_t, int64_t, bool> weight_type_info(int64_t ggml) {
  const WeightType& t = weight_type(ggml, false);
  return {t.name, t.inputs, t.file_bytes, t.packed_bytes, t.linear};
}

// -- attention -----------------------------------------------------------------------------

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& rect,
                           const std::optional<at::Tensor>& rect_rows,
                           const at::Tensor& context_lens, double scale, int64_t heads) {
  check_pool(kv);
  const int64_t kv_heads = kv.size(2), dim = kv.size(3), tokens = q.size(0);
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
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t* rows = rect_rows ? rect_rows->data_ptr<int64_t>() : nullptr;
  for (int64_t t = 0; t < tokens; ++t) {  // the host side of the addressing, checked once
    TORCH_CHECK(lens[t] >= 0 && lens[t] <= rect.size(1), "token ", t, " sees ", lens[t],
                " slots of a rectangle ", rect.size(1), " wide");
    TORCH_CHECK(!rows || (rows[t] >= 0 && rows[t] < rect.size(0)), "token ", t,
                " names rectangle row ", rows ? rows[t] : 0, " of ", rect.size(0));
  }
  at::Tensor out = at::empty({tokens, heads * dim}, q.options());
  const int64_t element = kv.element_size();
  const char* base = static_cast<const char*>(kv.data_ptr());
  const AttentionArgs args{q.data_ptr<float>(), q.stride(0), base,
                           base + kv.size(1) * kv_heads * dim * element, rect.data_ptr<int64_t>(),
                           rect.stride(0), rows, lens, out.data_ptr<float>(), kv.size(1), heads,
                           kv_heads, dim, static_cast<float>(scale), kv_type(kv)};
  const int64_t group = heads / kv_heads, width = rect.size(1);
  std::atomic<bool> ok{true};
  const KernelTable* t = table();
  at::parallel_for(0, tokens * kv_heads, grain_for(group * width * dim), [&](int64_t t0, int64_t t1) {
    // Kept per thread across calls, as the linears' activations are: no allocation per step.
    thread_local std::vector<float> scratch;
    const size_t floats = group * (width + 16) + 16 * dim;
    if (scratch.size() < floats) scratch.resize(floats);
    if (!t->attention(args, t0, t1, scratch.data())) ok = false;
  });
  TORCH_CHECK(ok.load(), "a slot in the rectangle is outside the K/V pool of ", kv.size(1), " slots");
  return out;
}

// -- rotary and the K/V write --------------------------------------------------------------

void rope_write_kv(const at::Tensor& qkv, const at::Tensor& positions, const at::Tensor& cos,
                   const at::Tensor& sin, const at::Tensor& kv, const at::Tensor& slots,
                   int64_t heads) {
  check_pool(kv);
  const int64_t kv_heads = kv.size(2), dim = kv.size(3), tokens = qkv.size(0);
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1 &&
                  qkv.size(1) == (heads + 2 * kv_heads) * dim,
              "qkv must be float32 [tokens, ", (heads + 2 * kv_heads) * dim, "], got ", qkv.sizes());
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.dim() == 2 &&
                  cos.size(1) == dim && cos.sizes() == sin.sizes() && sin.is_contiguous() &&
                  sin.scalar_type() == at::kFloat,
              "cos and sin must be contiguous float32 [positions, ", dim, "]");
  check_index(positions, "positions", tokens);
  check_index(slots, "slots", tokens);
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "position ", pos[t], " is outside the ",
                cos.size(0), "-position rotary table");
  const RopeArgs args{qkv.data_ptr<float>(), qkv.stride(0), pos, cos.data_ptr<float>(),
                      sin.data_ptr<float>(), kv.data_ptr(), slots.data_ptr<int64_t>(),
                      kv.size(1), heads, kv_heads, dim, kv_type(kv)};
  std::atomic<bool> ok{true};
  const KernelTable* t = table();
  at::parallel_for(0, tokens, grain_for(qkv.size(1) * 4), [&](int64_t t0, int64_t t1) {
    if (!t->rope_write_kv(args, t0, t1)) ok = false;
  });
  TORCH_CHECK(ok.load(), "a write slot is outside the K/V pool of ", kv.size(1), " slots");
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
        "float scale, int heads) -> Tensor");
  m.def("rope_write_kv(Tensor(a!) qkv, Tensor positions, Tensor cos, Tensor sin, Tensor(b!) kv, "
        "Tensor slots, int heads) -> ()");
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) x, Tensor delta, Tensor w, float eps) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("argmax(Tensor x) -> Tensor");
  m.def("apply_token_bitmask(Tensor(a!) logits, Tensor bitmask, Tensor rows) -> ()");
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
  m.impl("argmax", nanoserve::argmax);
  m.impl("apply_token_bitmask", nanoserve::apply_token_bitmask);
}
