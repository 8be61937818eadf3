// torch.ops.nanoserve's weight ops: a linear over packed GGUF blocks (its parts each of its own
// type), packing a GGUF tensor's rows for the kernels, and dequantizing rows (embeddings, and
// float fallbacks) exactly as the file defines them. Registered in library.cpp.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_table.h"
#include "op_checks.h"

namespace nanoserve {
namespace {

const WeightType& weight_type(int64_t ggml, bool linear) {
  const WeightType* t = find_weight_type(ggml);
  TORCH_CHECK(t != nullptr, "GGML type ", ggml, " has no entry in nanoserve's weight types");
  TORCH_CHECK(!linear || t->linear, t->name, " has no dot kernel (it is dequantized, not packed)");
  return *t;
}

int64_t feature_blocks(int64_t n) { return (n + kFeatureBlock - 1) / kFeatureBlock; }

// x @ [w_0; w_1; ...].T (+ bias): the parts of one linear (q, k and v; gate and up), each in its
// own type, stacked along the output features. x is quantized once for all of them.
void check_gguf_rows(const at::Tensor& rows, const WeightType& type, int64_t k) {
  TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kByte && rows.dim() == 2 &&
                  rows.stride(1) == 1,
              "GGUF rows must be a 2-D uint8 CPU tensor with unit inner stride, got ", rows.sizes());
  TORCH_CHECK(k > 0 && k % type.inputs == 0 && rows.size(1) == k / type.inputs * type.file_bytes,
              type.name, " rows of ", k, " values are ", k / type.inputs * type.file_bytes,
              " bytes, got ", rows.size(1));
}

// A zeroed byte tensor from an anonymous map, its pages first touched by the packers that
// fill it (in parallel; no memset pass). Deliberately in 4 KiB pages (MADV_NOHUGEPAGE, for
// hosts whose transparent huge pages are "always"): a huge page is 2 MiB of physical memory at
// once, and where a VM hands free huge blocks back to its host (free page reporting), each one
// faults in from the host at ~0.5 GB/s. Measured on a 1.5B Q4_K_M (1.1 GB packed): the build
// took 2.9-3.2 s in huge pages, 2.2-2.3 s without, and a decode step was no slower (1 row
// 36-38 ms, 32 rows 233-236 ms, either way).
at::Tensor zeroed_bytes(int64_t bytes) {
  const size_t size = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "cannot map ", size, " bytes for packed weights");
  madvise(p, size, MADV_NOHUGEPAGE);  // a hint: refused quietly where huge pages are off
  return at::from_blob(p, {bytes}, [size](void* q) { munmap(q, size); }, at::TensorOptions().dtype(at::kByte));
}

}  // namespace

at::Tensor linear(const at::Tensor& x, at::TensorList weights, at::IntArrayRef types,
                  at::IntArrayRef features, const std::optional<at::Tensor>& bias) {
  check_rows(x, "x", kGroup);
  const int64_t parts = static_cast<int64_t>(weights.size());
  TORCH_CHECK(parts > 0 && static_cast<int64_t>(types.size()) == parts &&
                  static_cast<int64_t>(features.size()) == parts,
              "linear takes one type and one feature count per weight, got ", parts, " weights, ",
              types.size(), " types, ", features.size(), " counts");
  const int64_t rows = x.size(0), k = x.size(1), groups = k / kGroup;
  const KernelTable* t = active_table();
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

}  // namespace nanoserve
