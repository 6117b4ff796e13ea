#include "formats/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <vector>

#include "core/thread_pool.h"

namespace tetra::nvfp4 {
namespace {

// ModelOpt's e2m1_bounds: the midpoints between neighbouring E2M1 magnitudes.
constexpr float kE2m1Bounds[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};

bool is_float_dtype(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

// fn(r0, r1) over [0, n_rows), on the pool when there is one.
void for_rows(ThreadPool* pool, int64_t n_rows, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool && n_rows > 1)
    pool->parallel_for(n_rows, 16, fn);
  else
    fn(0, n_rows);
}

void check_row_width(int64_t n_in) {
  TETRA_CHECK(n_in > 0 && n_in % kBlockSize == 0, "an NVFP4 row needs a positive multiple of ",
              kBlockSize, " elements, not ", n_in);
}

}  // namespace

uint8_t e2m1_code(float x) {
  const uint8_t sign = x < 0.0f ? 8 : 0;  // -0.0 < 0 is false: negative zero keeps code 0
  const float a = std::fabs(x);
  uint8_t ord = 0;
  while (ord < 7 && kE2m1Bounds[ord] < a) ++ord;  // torch.searchsorted(bounds, a), side left
  // At 0.75, 1.75 and 3.5 the left search lands on the odd (lower) neighbour; ModelOpt moves
  // those ties up to the even mantissa, which makes every tie round half to even.
  if (a == 0.75f || a == 1.75f || a == 3.5f) ++ord;
  return uint8_t(sign | ord);
}

void dequantize_block(const uint8_t* packed, uint8_t block_scale_e4m3, float global_scale,
                      float out[kBlockSize]) {
  const float m = block_multiplier(block_scale_e4m3, global_scale);
  for (int i = 0; i < kBlockBytes; ++i) {
    out[2 * i] = e2m1_to_f32(unpack_even(packed[i])) * m;
    out[2 * i + 1] = e2m1_to_f32(unpack_odd(packed[i])) * m;
  }
}

void dequantize_row(const uint8_t* packed, const uint8_t* block_scales, float global_scale,
                    int64_t n_in, float* out) {
  check_row_width(n_in);
  for (int64_t b = 0; b < n_in / kBlockSize; ++b)
    dequantize_block(packed + b * kBlockBytes, block_scales[b], global_scale,
                     out + b * kBlockSize);
}

float dot_row(const float* x, const uint8_t* packed, const uint8_t* block_scales,
              float global_scale, int64_t n_in) {
  check_row_width(n_in);
  float sum = 0.0f;
  float w[kBlockSize];
  for (int64_t b = 0; b < n_in / kBlockSize; ++b) {
    dequantize_block(packed + b * kBlockBytes, block_scales[b], global_scale, w);
    const float* xb = x + b * kBlockSize;
    float s = 0.0f;
    for (int j = 0; j < kBlockSize; ++j) s += xb[j] * w[j];
    sum += s;
  }
  return sum;
}

void row_to_f32(TensorView t, int64_t row, float* out) {
  const int64_t n = t.dim(-1);
  const int64_t off = row * n;
  switch (t.dtype) {
    case DType::BF16: {
      const uint16_t* p = t.as<const uint16_t>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* p = t.as<const uint16_t>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    case DType::F32: {
      const float* p = t.as<const float>() + off;
      std::copy(p, p + n, out);
      return;
    }
    default:
      fail("NVFP4 quantization reads BF16, F16 or F32 weights, not ", dtype_name(t.dtype));
  }
}

float tensor_amax(TensorView t, std::string_view what, ThreadPool* pool) {
  TETRA_CHECK(t.shape.rank >= 1, "tensor ", what, " has no dimensions to quantize");
  TETRA_CHECK(is_float_dtype(t.dtype), "tensor ", what, " is ", dtype_name(t.dtype),
              "; NVFP4 quantization reads BF16, F16 or F32");
  const int64_t n = t.dim(-1);
  const int64_t rows = n ? t.numel() / n : 0;
  std::mutex mu;
  float amax = 0.0f;
  int64_t bad_row = -1, bad_col = -1;  // the first non-finite element found, if any
  // Workers must not throw, so a NaN or Inf is recorded and reported after the loop.
  for_rows(pool, rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>(std::max<int64_t>(n, 1)));
    float local = 0.0f;
    int64_t br = -1, bc = -1;
    for (int64_t r = r0; r < r1 && br < 0; ++r) {
      row_to_f32(t, r, buf.data());
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(buf[size_t(i)])) {
          br = r, bc = i;
          break;
        }
        local = std::max(local, std::fabs(buf[size_t(i)]));
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    amax = std::max(amax, local);
    if (br >= 0 && (bad_row < 0 || br < bad_row)) bad_row = br, bad_col = bc;
  });
  TETRA_CHECK(bad_row < 0, "tensor ", what, " holds NaN or Inf (row ", bad_row, ", column ",
              bad_col, "), which NVFP4 cannot represent");
  return amax;
}

uint8_t block_scale_code(float block_amax, float global_scale) {
  if (global_scale == 0.0f) return f32_to_e4m3(1.0f);  // all-zero tensor: 0/0 in ModelOpt
  // f32(6 * global_scale) first, then the division, as the torch expression does.
  const float denom = kE2m1Max * global_scale;
  float s = block_amax / denom;
  if (s == 0.0f) s = 1.0f;
  s = std::clamp(s, kE4m3MinSubnormal, kE4m3Max);
  return f32_to_e4m3(s);
}

void quantize_row(const float* w, int64_t n_in, float global_scale, uint8_t* packed,
                  uint8_t* block_scales) {
  check_row_width(n_in);
  for (int64_t b = 0; b < n_in / kBlockSize; ++b) {
    const float* wb = w + b * kBlockSize;
    float bamax = 0.0f;
    for (int j = 0; j < kBlockSize; ++j) bamax = std::max(bamax, std::fabs(wb[j]));
    const uint8_t sc = block_scale_code(bamax, global_scale);
    block_scales[b] = sc;
    // f32(f32(block scale) * global_scale), then w / that, each rounded to f32.
    const float denom = e4m3_to_f32(sc) * global_scale;
    uint8_t* pb = packed + b * kBlockBytes;
    for (int j = 0; j < kBlockSize; j += 2) {
      const uint8_t lo = denom == 0.0f ? 0 : e2m1_code(wb[j] / denom);
      const uint8_t hi = denom == 0.0f ? 0 : e2m1_code(wb[j + 1] / denom);
      pb[j / 2] = pack_pair(lo, hi);
    }
  }
}

void quantize_tensor(TensorView weight, float global_scale, std::span<uint8_t> packed,
                     std::span<uint8_t> block_scales, ThreadPool* pool) {
  TETRA_CHECK(weight.shape.rank == 2, "NVFP4 quantizes 2-D weights, not shape ",
              weight.shape.str());
  const int64_t n_out = weight.dim(0), n_in = weight.dim(1);
  check_row_width(n_in);
  TETRA_CHECK(int64_t(packed.size()) == n_out * n_in / 2 &&
                  int64_t(block_scales.size()) == n_out * n_in / kBlockSize,
              "NVFP4 output buffers do not match a weight of shape ", weight.shape.str());
  TETRA_CHECK(is_float_dtype(weight.dtype), "NVFP4 quantization reads BF16, F16 or F32 weights, not ",
              dtype_name(weight.dtype));
  for_rows(pool, n_out, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t r = r0; r < r1; ++r) {
      row_to_f32(weight, r, row.data());
      quantize_row(row.data(), n_in, global_scale, packed.data() + r * n_in / 2,
                   block_scales.data() + r * n_in / kBlockSize);
    }
  });
}

}  // namespace tetra::nvfp4
