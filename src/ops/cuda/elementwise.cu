#include "ops/cuda/elementwise.h"

#include "core/dummy_random.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_values.cuh"
#include "ops/cuda/launch.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

bool is_float(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

void check_cuda(const TensorView& t, const char* op, const char* what) {
  TETRA_CHECK(t.empty() || t.device == Device::Cuda, op, ": ", what, " is not on the CUDA device");
}

// A token id outside the table gives a row of zeros (the runtime refuses such ids at submission).
__global__ void embedding_kernel(const void* table, DType tdt, const int32_t* ids, int64_t n_tokens,
                                 int64_t vocab, int64_t hidden, void* out, DType odt) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = n_tokens * hidden;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden, c = i % hidden;
    const int32_t id = ids[t];
    const float v = id >= 0 && id < vocab ? load_float(table, int64_t(id) * hidden + c, tdt) : 0.0f;
    store_float(out, i, odt, v);
  }
}

__global__ void silu_mul_kernel(const void* gate, const void* up, void* out, int64_t n, DType dt) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load_float(gate, i, dt), u = load_float(up, i, dt);
    store_float(out, i, dt, g / (1.0f + expf(-g)) * u);
  }
}

__global__ void add_kernel(const void* a, const void* b, void* out, int64_t n, DType dt) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_float(out, i, dt, load_float(a, i, dt) + load_float(b, i, dt));
}

__global__ void add_bias_kernel(void* out, DType odt, const void* bias, DType bdt, int64_t rows, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    store_float(out, i, odt, load_float(out, i, odt) + load_float(bias, i % n, bdt));
}

// Rows of `row_bytes` bytes copied in 4-byte words when both sides allow it, else bytes.
__global__ void gather_rows_kernel(const char* x, int64_t n_src_rows, const int32_t* rows, int64_t n_rows,
                                   int64_t row_bytes, char* out) {
  pdl_wait();
  pdl_launch_dependents();
  const bool words = row_bytes % 4 == 0;
  const int64_t unit = words ? 4 : 1, per_row = row_bytes / unit, total = n_rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = i % per_row;
    const int32_t src = rows[r];
    if (src < 0 || src >= n_src_rows) continue;
    if (words)
      reinterpret_cast<uint32_t*>(out + r * row_bytes)[c] =
          reinterpret_cast<const uint32_t*>(x + int64_t(src) * row_bytes)[c];
    else
      out[r * row_bytes + c] = x[int64_t(src) * row_bytes + c];
  }
}

__global__ void copy_columns_kernel(const char* src, int64_t src_row_bytes, char* dst, int64_t dst_row_bytes,
                                    int64_t rows, int64_t n_bytes) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t total = rows * n_bytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n_bytes, c = i % n_bytes;
    dst[r * dst_row_bytes + c] = src[r * src_row_bytes + c];
  }
}

__global__ void fill_normal_kernel(void* out, DType dt, int64_t n, uint64_t seed, float offset, float scale) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_float(out, i, dt, offset + scale * dummy_normal(seed, uint64_t(i)));
}

__global__ void fill_bytes_kernel(uint8_t* out, int64_t n, uint64_t seed, int lo, int span) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = dummy_byte(seed, uint64_t(i), lo, span);
}

}  // namespace

void embedding(const KernelLaunch& launch, TensorView table, TensorView ids, TensorView out) {
  check_cuda(table, "embedding", "the table");
  check_cuda(ids, "embedding", "the ids");
  check_cuda(out, "embedding", "the output");
  TETRA_CHECK(is_float(table.dtype) && is_float(out.dtype) && ids.dtype == DType::I32 && table.shape.rank == 2,
              "embedding: table must be a float [V, H] tensor, ids I32");
  const int64_t n = ids.numel(), hidden = table.dim(1);
  TETRA_CHECK(out.numel() == n * hidden, "embedding: the output holds ", out.numel(), " values, not ", n * hidden);
  if (n == 0) return;
  launch_kernel(launch, embedding_kernel, blocks_for(n * hidden), kThreads, 0, table.data, table.dtype,
                ids.as<const int32_t>(), n, table.dim(0), hidden, out.data, out.dtype);
  TETRA_CUDA_CHECK_LAUNCH("embedding");
}

void silu_mul(const KernelLaunch& launch, TensorView gate, TensorView up, TensorView out) {
  TETRA_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel() && gate.dtype == up.dtype &&
                  gate.dtype == out.dtype && is_float(gate.dtype),
              "silu_mul: gate, up and out must have one float dtype and one size");
  if (gate.numel() == 0) return;
  launch_kernel(launch, silu_mul_kernel, blocks_for(gate.numel()), kThreads, 0, gate.data, up.data, out.data,
                gate.numel(), gate.dtype);
  TETRA_CUDA_CHECK_LAUNCH("silu_mul");
}

void add(const KernelLaunch& launch, TensorView a, TensorView b, TensorView out) {
  TETRA_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: shapes ", a.shape.str(), " and ",
              b.shape.str(), " differ");
  TETRA_CHECK(a.dtype == b.dtype && a.dtype == out.dtype && is_float(a.dtype), "add: one float dtype expected");
  if (a.numel() == 0) return;
  launch_kernel(launch, add_kernel, blocks_for(a.numel()), kThreads, 0, a.data, b.data, out.data, a.numel(), a.dtype);
  TETRA_CUDA_CHECK_LAUNCH("add");
}

void add_bias(const KernelLaunch& launch, TensorView out, TensorView bias) {
  const int64_t n = bias.numel();
  TETRA_CHECK(n > 0 && out.numel() % n == 0 && is_float(bias.dtype) && is_float(out.dtype),
              "bias: ", bias.shape.str(), " does not fit an output of ", out.shape.str());
  if (out.numel() == 0) return;
  launch_kernel(launch, add_bias_kernel, blocks_for(out.numel()), kThreads, 0, out.data, out.dtype, bias.data,
                bias.dtype, out.numel() / n, n);
  TETRA_CUDA_CHECK_LAUNCH("add_bias");
}

void gather_rows(const KernelLaunch& launch, TensorView x, TensorView rows, TensorView out) {
  TETRA_CHECK(rows.dtype == DType::I32 && x.shape.rank >= 1 && x.dtype == out.dtype,
              "gather_rows: rows must be I32 and x and out of one dtype");
  const int64_t n_rows = rows.numel();
  if (n_rows == 0 || x.dim(0) == 0) return;
  const int64_t row_bytes = x.nbytes() / x.dim(0);
  TETRA_CHECK(out.nbytes() == n_rows * row_bytes, "gather_rows: the output does not hold ", n_rows, " rows");
  launch_kernel(launch, gather_rows_kernel, blocks_for(n_rows * row_bytes / 4 + 1), kThreads, 0,
                static_cast<const char*>(x.data), x.dim(0), rows.as<const int32_t>(), n_rows, row_bytes,
                static_cast<char*>(out.data));
  TETRA_CUDA_CHECK_LAUNCH("gather_rows");
}

void copy_columns(const KernelLaunch& launch, TensorView src, int64_t src_col0, TensorView dst, int64_t dst_col0,
                  int64_t n) {
  const int64_t rows = src.dim(0), sw = src.numel() / rows, dw = dst.numel() / dst.dim(0);
  TETRA_CHECK(dst.dim(0) == rows && src.dtype == dst.dtype && src_col0 + n <= sw && dst_col0 + n <= dw,
              "copy_columns: columns out of range");
  const int64_t es = dtype_bits(src.dtype) / 8;
  if (rows == 0 || n == 0) return;
  launch_kernel(launch, copy_columns_kernel, blocks_for(rows * n * es), kThreads, 0,
                static_cast<const char*>(src.data) + src_col0 * es, sw * es,
                static_cast<char*>(dst.data) + dst_col0 * es, dw * es, rows, n * es);
  TETRA_CUDA_CHECK_LAUNCH("copy_columns");
}

void fill_random(const KernelLaunch& launch, TensorView t, const RandomFill& fill, uint64_t seed) {
  const int64_t n = t.numel();
  if (n == 0) return;
  if (fill.kind == RandomFill::Bytes) {
    TETRA_CHECK(dtype_bits(t.dtype) == 8, "random bytes need a byte tensor, not ", dtype_name(t.dtype));
    TETRA_CHECK(fill.span >= 1 && fill.lo >= 0 && fill.lo + fill.span <= 256, "random bytes out of range");
    launch_kernel(launch, fill_bytes_kernel, blocks_for(n), kThreads, 0, t.as<uint8_t>(), n, seed, fill.lo, fill.span);
  } else {
    TETRA_CHECK(is_float(t.dtype) || t.dtype == DType::F8_E4M3, "random values need an F32, BF16, F16 or F8_E4M3 ",
                "tensor, not ", dtype_name(t.dtype));
    launch_kernel(launch, fill_normal_kernel, blocks_for(n), kThreads, 0, t.data, t.dtype, n, seed,
                  fill.kind == RandomFill::NearOne ? 1.0f : 0.0f, fill.scale);
  }
  TETRA_CUDA_CHECK_LAUNCH("fill_random");
}

}  // namespace tetra::ops::cuda
