#include "core/tensor.h"

namespace tetra {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

TensorView TensorView::rows(int64_t begin, int64_t end) const {
  TETRA_CHECK(shape.rank >= 1 && 0 <= begin && begin <= end && end <= shape[0],
              "row range [", begin, ", ", end, ") is outside a tensor of shape ", shape.str());
  TensorView v = *this;
  const int64_t row_bytes = shape[0] ? nbytes() / shape[0] : 0;
  v.data = static_cast<char*>(data) + begin * row_bytes;
  v.shape[0] = end - begin;
  return v;
}

TensorView TensorView::reshaped(Shape s) const {
  TETRA_CHECK(s.numel() == numel(), "cannot view a tensor of shape ", shape.str(), " as ",
              s.str());
  TensorView v = *this;
  v.shape = s;
  return v;
}

}  // namespace tetra
