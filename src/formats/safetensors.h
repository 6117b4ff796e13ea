// safetensors files (FORMATS.md §4), memory-mapped and validated by the reference reader's
// rules before any tensor is handed out; sharded checkpoints through
// model.safetensors.index.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace tetra {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer (after the header)
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
};

// The reference reader's MAX_HEADER_SIZE: a larger header length is refused before the
// header is looked at.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// A parsed header may take as much memory as its file's size, and at least this much.
inline constexpr uint64_t kSafetensorsParseFloorBytes = 1u << 20;

// The byte size of a tensor as the reference reader computes it: product(shape), then times
// the dtype's bits, each step checked for u64 overflow; the bits must end on a byte boundary.
struct TensorBytes {
  uint64_t bytes = 0;
  bool overflow = false;    // the element or bit count does not fit in u64
  bool misaligned = false;  // the bit count is not a multiple of 8 (an odd number of F4s)
  bool ok() const { return !overflow && !misaligned; }
};
TensorBytes safetensors_tensor_bytes(DType dtype, const Shape& shape);

// Parses and validates a header's JSON against a data buffer of `buffer_bytes` bytes.
// Throws tetra::Error naming `source` (a file name, for messages) and the problem.
SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t buffer_bytes,
                                           const std::string& source);

// Validates a whole file image (8-byte length, header, buffer) held in memory.
SafetensorsHeader parse_safetensors_bytes(std::string_view bytes, const std::string& source);

// Parses model.safetensors.index.json text: the `weight_map` (tensor name -> shard file name,
// as written, not yet checked to stay inside the folder). Other top-level keys (`metadata`)
// are skipped. Duplicate keys are refused; errors name `source`.
std::map<std::string, std::string> parse_safetensors_index(std::string_view json,
                                                           const std::string& source);

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // File offset of the data buffer (8 + header length).
  uint64_t data_offset() const { return data_offset_; }
  const TensorInfo* find(std::string_view name) const;
  // A view of the tensor's bytes in the mapping (throws if absent).
  TensorView view(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;
  const uint8_t* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  uint64_t data_offset_ = 0;
};

// A model folder's tensors: model.safetensors if present (as transformers prefers it), else
// the shards model.safetensors.index.json lists. The index is authoritative: a tensor it names
// must be in its shard, and tensors a shard holds that the index does not name are ignored.
// Shard paths that leave the folder (absolute, `..`, or a symlink resolving outside) are
// refused; the one exception is a Hugging Face hub cache snapshot, whose files are symlinks
// into the same repository's `blobs/` folder.
class Checkpoint {
 public:
  static std::unique_ptr<Checkpoint> open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  bool has(std::string_view name) const;
  const TensorInfo* find(std::string_view name) const;
  std::vector<std::string> names() const;
  // The tensor, or an Error naming the folder and the missing tensor.
  TensorView get(std::string_view name) const;
  // The tensor, checked to have this dtype and shape; an Error names the file and mismatch.
  TensorView get(std::string_view name, DType dtype, Shape shape) const;
  // The file that holds a tensor (for messages).
  std::filesystem::path file_of(std::string_view name) const;
  uint64_t total_bytes() const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*, std::less<>> where_;
};

}  // namespace tetra
