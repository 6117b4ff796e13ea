// Tensor views: a pointer, an element type, a row-major shape, and where the bytes live.
// Views never own memory; owners (mmap'd files, backend buffers) outlive the views they hand out.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace tetra {

enum class Device : uint8_t { Cpu, Cuda };

inline constexpr int kMaxDims = 6;

// A row-major shape of up to kMaxDims dimensions.
struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    TETRA_CHECK(d.size() <= kMaxDims, "a tensor shape has at most ", kMaxDims, " dimensions");
    for (int64_t v : d) dims[rank++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t& operator[](int i) { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::Cpu;

  int64_t numel() const { return shape.numel(); }
  int64_t nbytes() const { return numel() * dtype_bits(dtype) / 8; }
  int64_t dim(int i) const { return shape[i < 0 ? shape.rank + i : i]; }
  bool empty() const { return data == nullptr; }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  // The rows [begin, end) of the first dimension.
  TensorView rows(int64_t begin, int64_t end) const;
  // The same bytes seen with another shape of the same element count.
  TensorView reshaped(Shape s) const;
};

}  // namespace tetra
