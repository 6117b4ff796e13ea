#include "model/weights.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "formats/linear_tensors.h"

namespace tetra::model {
namespace {

// Each dummy tensor's values depend on its name alone, so loading order and backend do not
// change a dummy model (FNV-1a of the name).
uint64_t seed_of(const std::string& name) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

ops::WeightFormat format_of_algo(QuantAlgo algo) {
  switch (algo) {
    case QuantAlgo::Nvfp4:
    case QuantAlgo::W4a16Nvfp4: return ops::WeightFormat::Nvfp4;
    case QuantAlgo::Fp8: return ops::WeightFormat::Fp8;
    default: return ops::WeightFormat::Dense;
  }
}

}  // namespace

int64_t tensor_layer(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (!name.starts_with(prefix)) return -1;
  int64_t index = 0;
  size_t i = prefix.size();
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    index = std::min<int64_t>(index * 10 + (name[i] - '0'), int64_t{1} << 40);  // no overflow
  return i > prefix.size() && i < name.size() && name[i] == '.' ? index : -1;
}

int64_t expert_bytes(ops::WeightFormat format, int64_t hidden, int64_t inter) {
  const int64_t weights = 3 * hidden * inter;
  return format == ops::WeightFormat::Nvfp4 ? weights * 9 / 16 : weights * 2;
}

WeightLoader::WeightLoader(const Checkpoint* checkpoint, const std::filesystem::path& dir,
                           ops::Backend& backend, const LoadOptions& options)
    : checkpoint_(checkpoint), dir_(dir), quant_(load_quant_config(dir, options.hf_overrides)), backend_(backend),
      options_(options) {}

void WeightLoader::count(const TensorView& t) {
  stats_.tensors += 1;
  stats_.bytes += t.nbytes();
  if (options_.on_progress) options_.on_progress(stats_);
}

TensorView WeightLoader::take(const std::string& name, DType dtype, Shape shape) {
  TensorView t = checkpoint_->get(name, dtype, shape);
  count(t);
  return backend_.upload(t);
}

TensorView WeightLoader::random(const std::string& name, DType dtype, Shape shape,
                                const ops::RandomFill& fill) {
  storage_.push_back(backend_.random_tensor(dtype, shape, fill, seed_of(name)));
  const TensorView t = storage_.back()->view();
  count(t);
  return t;
}

ops::WeightFormat WeightLoader::format_of(const std::string& module) const {
  return format_of_algo(quant_ ? quant_->module_quant(module).algo : QuantAlgo::None);
}

float WeightLoader::scalar_or(const std::vector<std::string>& names, float fallback) {
  for (const std::string& name : names) {
    if (!has(name)) continue;
    const TensorView t = checkpoint_->get(name);
    TETRA_CHECK(t.dtype == DType::F32 && t.numel() == 1, "tensor ", name, " must be one F32 value, not ",
                dtype_name(t.dtype), " ", t.shape.str());
    const float v = t.as<const float>()[0];
    TETRA_CHECK(std::isfinite(v) && v > 0, "tensor ", name, " is ", v, "; a KV cache scale must be positive");
    return v;
  }
  return fallback;
}

TensorView WeightLoader::floats(const std::string& name, Shape shape) {
  if (dummy()) {
    const bool norm = name.find("norm") != std::string::npos;
    return random(name, DType::BF16, shape,
                  {.kind = norm ? ops::RandomFill::NearOne : ops::RandomFill::Normal});
  }
  const TensorInfo* info = checkpoint_->find(name);
  if (!info) checkpoint_->get(name);  // throws: names the folder and the tensor
  const DType dt = info->dtype;
  if (dt != DType::BF16 && dt != DType::F16 && dt != DType::F32)
    fail(checkpoint_->file_of(name).string(), ": tensor ", name, " is ", dtype_name(dt),
         ", expected BF16, F16 or F32");
  return take(name, dt, shape);
}

TensorView WeightLoader::floats_f32(const std::string& name, Shape shape) {
  if (dummy()) return random(name, DType::F32, shape, {});
  const TensorView stored = checkpoint_->find(name) ? checkpoint_->get(name) : TensorView{};
  if (stored.empty() || stored.dtype == DType::F32) return floats(name, shape);
  const TensorView host = checkpoint_->get(name, stored.dtype, shape);  // checks the shape
  TETRA_CHECK(host.dtype == DType::BF16 || host.dtype == DType::F16,
              checkpoint_->file_of(name).string(), ": tensor ", name, " is ", dtype_name(host.dtype),
              ", expected BF16, F16 or F32");
  auto f32 = backend_.alloc_host(host.numel() * 4);
  float* dst = f32->view().as<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    const uint16_t v = host.as<const uint16_t>()[i];
    dst[i] = host.dtype == DType::BF16 ? bf16_to_f32(v) : f16_to_f32(v);
  }
  count(host);
  const TensorView view = backend_.upload(TensorView{dst, DType::F32, shape, Device::Cpu});
  storage_.push_back(std::move(f32));  // the upload may still be reading it
  return view;
}

ops::LinearWeight WeightLoader::host_linear(const std::string& module, int64_t n_out, int64_t n_in,
                                            bool with_bias, const LinearSlice& slice) {
  const LinearTensors t = load_linear(*checkpoint_, quant_ ? &*quant_ : nullptr, module, n_out, n_in);
  if (with_bias && t.bias.empty())
    fail(checkpoint_->file_of(module + ".weight").string(), ": ", module,
         " needs a bias (the config says attention_bias) but ", module, ".bias is missing");
  ops::LinearWeight w;
  w.n_out = n_out;
  w.n_in = n_in;
  w.format = format_of_algo(t.algo);
  w.weight = t.weight;
  w.block_scale = t.block_scale;
  w.global_scale = t.global_scale;
  w.input_scale = t.input_scale;
  if (with_bias) w.bias = t.bias;
  w = slice_host(module, w, slice);
  count(w.weight);
  if (!w.block_scale.empty()) count(w.block_scale);
  if (!w.bias.empty()) count(w.bias);
  return w;
}

ops::LinearWeight WeightLoader::slice_host(const std::string& module, const ops::LinearWeight& w,
                                           const LinearSlice& slice) {
  const int64_t b = slice.range.begin, e = slice.range.end;
  ops::LinearWeight out = w;
  if (slice.kind == LinearSlice::Whole) return out;
  if (slice.kind == LinearSlice::Rows) {
    // Every format stores one row per output: a block of rows is a view of the mapping.
    out.n_out = e - b;
    out.weight = w.weight.rows(b, e);
    if (!w.block_scale.empty()) out.block_scale = w.block_scale.rows(b, e);
    if (!w.bias.empty()) out.bias = w.bias.rows(b, e);
    return out;
  }
  const bool nvfp4 = w.format == ops::WeightFormat::Nvfp4;
  TETRA_CHECK(!nvfp4 || (b % 16 == 0 && e % 16 == 0), module, ": an NVFP4 weight splits between ranks only at ",
              "multiples of 16 input columns (its scales cover 16 each), not at [", b, ", ", e, ")");
  // Input columns are strided in the rows: copied, one row at a time.
  auto columns = [&](const TensorView& t, int64_t bits, int64_t c0, int64_t c1) {
    const int64_t rows = t.dim(0), row_bytes = t.nbytes() / std::max<int64_t>(rows, 1);
    const int64_t b0 = c0 * bits / 8, n = (c1 - c0) * bits / 8;
    storage_.push_back(backend_.alloc_host(std::max<int64_t>(1, rows * n)));
    char* dst = static_cast<char*>(storage_.back()->view().data);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * n, static_cast<const char*>(t.data) + r * row_bytes + b0, size_t(n));
    TensorView v = t;
    v.data = dst;
    v.shape[1] = n * 8 / dtype_bits(t.dtype);
    return v;
  };
  out.n_in = e - b;
  out.weight = columns(w.weight, nvfp4 ? 4 : dtype_bits(w.weight.dtype), b, e);
  if (nvfp4) out.block_scale = columns(w.block_scale, 8, b / 16, e / 16);
  if (!slice.keep_bias) out.bias = {};
  return out;
}

ops::LinearWeight WeightLoader::linear(const std::string& module, int64_t n_out, int64_t n_in,
                                       bool with_bias, const LinearSlice& slice) {
  if (!dummy()) return backend_.upload(host_linear(module, n_out, n_in, with_bias, slice));
  // A slice of a dummy layer is drawn in its own shape, from a seed of its own.
  std::string name = module;
  if (slice.kind == LinearSlice::Rows) {
    n_out = slice.range.size();
    name += str_cat("@rows", slice.range.begin);
  } else if (slice.kind == LinearSlice::Columns) {
    n_in = slice.range.size();
    name += str_cat("@columns", slice.range.begin);
    with_bias = with_bias && slice.keep_bias;
  }
  ops::LinearWeight w;
  w.n_out = n_out;
  w.n_in = n_in;
  w.format = format_of(module);
  switch (w.format) {
    case ops::WeightFormat::Dense:
      w.weight = random(name + ".weight", DType::BF16, {n_out, n_in}, {});
      break;
    case ops::WeightFormat::Nvfp4:
      TETRA_CHECK(n_in % 16 == 0, module, ": an NVFP4 weight needs a width that is a multiple of 16, not ", n_in);
      w.weight = random(name + ".weight", DType::U8, {n_out, n_in / 2}, {.kind = ops::RandomFill::Bytes});
      w.block_scale = random(name + ".weight_scale", DType::F8_E4M3, {n_out, n_in / 16},
                             {.kind = ops::RandomFill::Bytes, .lo = ops::kDummyNvfp4ScaleLo,
                              .span = ops::kDummyNvfp4ScaleSpan});
      w.global_scale = ops::kDummyNvfp4GlobalScale;
      break;
    case ops::WeightFormat::Fp8:
      fail(module, ": --load-format dummy does not draw FP8 weights");
  }
  if (with_bias) w.bias = random(name + ".bias", DType::BF16, {n_out}, {});
  return w;
}

parallel::Range WeightLoader::width_range(const std::string& down_module, int64_t inter,
                                          parallel::Part part) const {
  if (part.whole()) return {0, inter};
  const bool nvfp4 = format_of(down_module) == ops::WeightFormat::Nvfp4;
  return parallel::split(inter, part.parts, part.index, nvfp4 ? 16 : 1);
}

ops::MlpWeights WeightLoader::host_mlp(const std::string& prefix, const char* gate, const char* up,
                                       const char* down, int64_t hidden, int64_t inter,
                                       parallel::Range width) {
  const bool whole = width.begin == 0 && width.end == inter;
  const LinearSlice rows = whole ? LinearSlice{} : LinearSlice::rows(width);
  const LinearSlice columns = whole ? LinearSlice{} : LinearSlice::columns(width, false);
  return {host_linear(prefix + gate, inter, hidden, false, rows), host_linear(prefix + up, inter, hidden, false, rows),
          host_linear(prefix + down, hidden, inter, false, columns)};
}

ops::MlpWeights WeightLoader::mlp(const std::string& prefix, const char* gate, const char* up,
                                  const char* down, int64_t hidden, int64_t inter, parallel::Part part) {
  const parallel::Range width = width_range(prefix + down, inter, part);
  const LinearSlice rows = part.whole() ? LinearSlice{} : LinearSlice::rows(width);
  const LinearSlice columns = part.whole() ? LinearSlice{} : LinearSlice::columns(width, false);
  ops::MlpWeights m;
  m.gate = linear(prefix + gate, inter, hidden, false, rows);
  m.up = linear(prefix + up, inter, hidden, false, rows);
  m.down = linear(prefix + down, hidden, inter, false, columns);
  return m;
}

std::unique_ptr<ops::MoeExperts> WeightLoader::experts(const std::string& prefix, int64_t n_experts,
                                                       const char* gate, const char* up,
                                                       const char* down, int64_t hidden, int64_t inter,
                                                       const std::string* shared_prefix,
                                                       int64_t shared_inter, const ExpertsShard& shard) {
  TETRA_CHECK(n_experts % shard.ids.parts == 0, "--ep ", shard.ids.parts, " must divide the model's ", n_experts,
              " routed experts");
  const parallel::Range ids = parallel::split(n_experts, shard.ids.parts, shard.ids.index);
  const parallel::Range width = width_range(prefix + "0." + down, inter, shard.width);
  const parallel::Range shared_width =
      shared_prefix ? width_range(*shared_prefix + down, shared_inter, shard.shared) : parallel::Range{};
  const bool sharded = !shard.ids.whole() || !shard.width.whole() || !shard.shared.whole();
  if (dummy()) {
    const ops::WeightFormat format = format_of(prefix + "0." + gate);
    TETRA_CHECK(format != ops::WeightFormat::Fp8, prefix, ": --load-format dummy does not draw FP8 experts");
    // As linear() checks: NVFP4 scales cover 16 values of a row, and an expert's rows are
    // `hidden` (gate, up) and `inter` (down) wide.
    TETRA_CHECK(format != ops::WeightFormat::Nvfp4 || (hidden % 16 == 0 && inter % 16 == 0), prefix,
                ": NVFP4 experts need widths that are multiples of 16, not hidden ", hidden, " and intermediate ", inter);
    TETRA_CHECK(format_of(prefix + "0." + down) == format, prefix, ": --load-format dummy draws experts whose ",
                "matrices share one format; the quantization config gives their down projections another");
    // The backend draws a shared expert only of the routed experts' width. Where the ranks'
    // shares of the two differ (the shared expert splits over every rank, a routed one over
    // its expert group), the first group holds the shared expert, split as the routed ones.
    bool with_shared = shared_prefix != nullptr;
    int64_t shared_part = shared_width.size();
    if (with_shared && shared_part != width.size() && shared_inter == inter) {
      with_shared = shard.ids.index == 0;
      shared_part = width.size();
    }
    const bool fused_shared = with_shared && shared_part == width.size();
    TETRA_CHECK(!with_shared || fused_shared, prefix, ": --load-format dummy draws a shared expert only ",
                "of the routed experts' width (", width.size(), "), not ", shared_part);
    const ops::ExpertsSpec spec{.hidden = hidden, .intermediate = width.size(), .n_experts = int(ids.size()),
                                .format = format, .shared_expert = fused_shared};
    // A rank's dummy experts are drawn from a seed of their own.
    auto ex = backend_.random_experts(
        spec, seed_of(sharded ? str_cat(prefix, "@", ids.begin, ",", width.begin) : prefix));
    ex->set_first_expert(ids.begin);
    const int64_t n = ids.size() + (fused_shared ? 1 : 0);
    stats_.tensors += n * 3;
    stats_.bytes += n * expert_bytes(format, hidden, width.size());
    stats_.routed_expert_bytes += ids.size() * expert_bytes(format, hidden, width.size());
    if (options_.on_progress) options_.on_progress(stats_);
    return ex;
  }
  std::vector<ops::MlpWeights> host;
  host.reserve(size_t(ids.size()));
  const int64_t before = stats_.bytes;
  for (int64_t e = ids.begin; e < ids.end; ++e)
    host.push_back(host_mlp(prefix + std::to_string(e) + ".", gate, up, down, hidden, inter, width));
  stats_.routed_expert_bytes += stats_.bytes - before;
  std::optional<ops::MlpWeights> shared;
  if (shared_prefix) shared = host_mlp(*shared_prefix, gate, up, down, hidden, shared_inter, shared_width);
  auto ex = backend_.prepare_experts(host, shared ? &*shared : nullptr);
  ex->set_first_expert(ids.begin);
  return ex;
}

}  // namespace tetra::model
