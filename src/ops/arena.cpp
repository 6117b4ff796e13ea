// The step arena (ops.h): bump allocation over backend buffers.
#include <algorithm>

#include "ops/ops.h"

namespace tetra::ops {
namespace {

// 256 bytes: what cuBLASLt and 16-byte vector loads want, and a whole number of cache lines.
constexpr int64_t kAlign = 256;

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int64_t Arena::capacity_bytes() const {
  int64_t total = 0;
  for (const auto& c : chunks_) total += c->view().nbytes();
  return total;
}

TensorView Arena::alloc(DType dtype, Shape shape) {
  TensorView v;
  v.dtype = dtype;
  v.shape = shape;
  const int64_t bytes = align_up(std::max<int64_t>(v.nbytes(), 1));
  const int64_t room = chunks_.empty() ? 0 : chunks_.back()->view().nbytes() - offset_;
  if (bytes > room) {
    TETRA_CHECK(!frozen_, "the step arena (", capacity_bytes(), " bytes, sized by the measuring "
                "pass) has no room for ", bytes, " more bytes: this step is larger than the one "
                "it was measured with");
    const int64_t last = chunks_.empty() ? 0 : chunks_.back()->view().nbytes();
    const int64_t size = std::max({bytes, 2 * last, int64_t(1) << 20});
    chunks_.push_back(backend_.alloc(DType::U8, {size}));
    offset_ = 0;
  }
  const TensorView chunk = chunks_.back()->view();
  v.data = static_cast<char*>(chunk.data) + offset_;
  v.device = chunk.device;
  offset_ += bytes;
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return v;
}

void Arena::rewind(int64_t mark) {
  TETRA_CHECK(mark >= 0 && mark <= used_, "arena: rewind to ", mark, " bytes, but ", used_, " are in use");
  used_ = mark;
  // One chunk: the offset is the bytes in use. While the arena grows over several chunks the
  // later allocations take fresh bytes; the peak counts the reuse, so the one chunk that
  // replaces them at the next reset is sized for it.
  if (chunks_.size() == 1) offset_ = mark;
}

void Arena::reset() {
  // Several chunks mean the last step outgrew the arena: one chunk of the peak replaces them,
  // so later steps of that size take one buffer and stop allocating.
  if (chunks_.size() > 1) {
    chunks_.clear();
    chunks_.push_back(backend_.alloc(DType::U8, {align_up(peak_)}));
  }
  offset_ = 0;
  used_ = 0;
}

void Arena::freeze() {
  reset();
  if (chunks_.empty()) chunks_.push_back(backend_.alloc(DType::U8, {align_up(std::max<int64_t>(peak_, 1))}));
  frozen_ = true;
}

}  // namespace tetra::ops
