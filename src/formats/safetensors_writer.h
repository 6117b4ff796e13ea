// Streaming safetensors writer: every tensor is declared up front (so the header, which comes
// first in the file, can be written at once), then each tensor's bytes are streamed from the
// caller's buffer, so memory stays near one tensor however large the file. Also the
// model.safetensors.index.json that ties shards together.
//
// Layout: tensors are packed back to back in the order they are declared, not re-sorted by
// dtype and name as the reference writer does; the reference reader accepts any order, and
// declared order lets a caller produce tensors as it computes them. Sort the declarations
// first if byte-identical output to the reference writer matters.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "formats/safetensors.h"

namespace tetra {

struct TensorDecl {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};

class SafetensorsWriter {
 public:
  // Validates the declarations (unique names, none called __metadata__, non-negative dims,
  // sizes that fit and end on a byte boundary), then creates or truncates `path` and writes
  // the header, padded with spaces so the data buffer starts 8-byte aligned.
  SafetensorsWriter(const std::filesystem::path& path, const std::vector<TensorDecl>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  // A file not finished is closed and removed: it would not pass the reader anyway.
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends `n_bytes` of tensor `name`. Tensors come in declared order; one may arrive in
  // several pieces, which must add up to exactly its size before the next begins. A
  // zero-size tensor still gets one call (with n_bytes = 0).
  void write(std::string_view name, const void* data, uint64_t n_bytes);
  // The whole tensor at once, after checking its dtype and shape against the declaration.
  void write(std::string_view name, const TensorView& tensor);
  // Checks every tensor was written in full, flushes the file to disk and closes it.
  void finish();

  const std::filesystem::path& path() const { return path_; }
  // Tensors in file order with their data offsets.
  const std::vector<TensorInfo>& tensors() const { return layout_; }
  // The name of the tensor the next write must be for ("" when all are written).
  std::string_view next() const;
  uint64_t file_bytes() const { return data_offset_ + data_bytes_; }

 private:
  void write_all(const void* data, uint64_t n_bytes);

  std::filesystem::path path_;
  std::vector<TensorInfo> layout_;
  uint64_t data_offset_ = 0, data_bytes_ = 0;
  size_t cursor_ = 0;          // index in layout_ of the tensor being written
  uint64_t cursor_bytes_ = 0;  // bytes of that tensor written so far
  int fd_ = -1;
  bool broken_ = false;  // a write failed, so the file position is unknown
};

// "model-00001-of-00003.safetensors" for shard 1 of 3 (1-based, as transformers names them).
std::string safetensors_shard_name(int index, int count);

// Writes model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {...}}.
// Shard names must be plain file names in the same folder (what Checkpoint::open accepts).
void write_safetensors_index(const std::filesystem::path& path,
                             const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size);

}  // namespace tetra
