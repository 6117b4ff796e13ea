#include "formats/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "formats/safetensors_internal.h"

namespace tetra {
namespace {

using OrderedJson = nlohmann::ordered_json;

}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     const std::vector<TensorDecl>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path) {
  const std::string file = path.string();
  // Everything is checked before the file is created, so a bad declaration leaves nothing.
  std::set<std::string_view> names;
  layout_.reserve(tensors.size());
  for (const auto& decl : tensors) {
    const std::string name = quote_name(decl.name);
    if (decl.name == "__metadata__")
      fail(file, ": a tensor cannot be named __metadata__, the header's metadata key");
    if (!names.insert(decl.name).second) fail(file, ": tensor ", name, " is declared twice");
    for (int i = 0; i < decl.shape.rank; ++i)
      if (decl.shape[i] < 0)
        fail(file, ": tensor ", name, " has a negative dimension in shape ", decl.shape.str());
    const TensorBytes size = safetensors_tensor_bytes(decl.dtype, decl.shape);
    if (size.overflow)
      fail(file, ": tensor ", name, " has a shape ", decl.shape.str(),
           " whose size overflows 64 bits");
    if (size.misaligned)
      fail(file, ": tensor ", name, " of ", dtype_name(decl.dtype), " shape ", decl.shape.str(),
           " does not end on a byte boundary");
    TensorInfo info{decl.name, decl.dtype, decl.shape, data_bytes_, 0};
    if (__builtin_add_overflow(data_bytes_, size.bytes, &info.end))
      fail(file, ": the declared tensors add up to more than 2^64 bytes");
    data_bytes_ = info.end;
    layout_.push_back(std::move(info));
  }

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const auto& t : layout_) {
    OrderedJson shape = OrderedJson::array();
    for (int i = 0; i < t.shape.rank; ++i) shape.push_back(t.shape[i]);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", std::move(shape)},
                      {"data_offsets", {t.begin, t.end}}};
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception&) {
    fail(file, ": tensor names and metadata must be valid UTF-8");
  }
  // Spaces up to a multiple of 8 so the data buffer (at 8 + N) starts 8-byte aligned, as the
  // reference writer does; readers tolerate trailing whitespace in the header.
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kSafetensorsMaxHeaderBytes)
    fail(file, ": the header would be ", json.size(), " bytes, more than readers accept (",
         kSafetensorsMaxHeaderBytes, ")");
  data_offset_ = 8 + json.size();

  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create ", file, ": ", std::strerror(errno));
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = uint8_t(uint64_t(json.size()) >> (8 * i));
  write_all(length, 8);
  write_all(json.data(), json.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
}

std::string_view SafetensorsWriter::next() const {
  return cursor_ < layout_.size() ? std::string_view(layout_[cursor_].name) : std::string_view();
}

void SafetensorsWriter::write_all(const void* data, uint64_t n_bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n_bytes > 0) {
    // One write() moves at most ~2 GB on Linux; loop until the whole piece is out.
    const ssize_t n = ::write(fd_, p, n_bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      fail("cannot write ", path_.string(), ": ", n < 0 ? std::strerror(errno) : "no progress");
    }
    p += n;
    n_bytes -= uint64_t(n);
  }
}

void SafetensorsWriter::write(std::string_view name, const void* data, uint64_t n_bytes) {
  const std::string file = path_.string();
  if (fd_ < 0) fail(file, ": tensor ", quote_name(name), " written after the file was finished");
  if (broken_) fail(file, ": an earlier write failed, so the file cannot be continued");
  if (cursor_ == layout_.size())
    fail(file, ": tensor ", quote_name(name), " written after every declared tensor is complete");
  const TensorInfo& t = layout_[cursor_];
  if (name != t.name)
    fail(file, ": got bytes for tensor ", quote_name(name), " while ", quote_name(t.name),
         " is next (tensors are written whole, in declared order)");
  const uint64_t size = t.end - t.begin;
  if (n_bytes > size - cursor_bytes_)
    fail(file, ": tensor ", quote_name(name), " is ", size, " bytes but ", cursor_bytes_ + n_bytes,
         " were written for it");
  if (n_bytes > 0) write_all(data, n_bytes);
  cursor_bytes_ += n_bytes;
  if (cursor_bytes_ == size) {
    ++cursor_;
    cursor_bytes_ = 0;
  }
}

void SafetensorsWriter::write(std::string_view name, const TensorView& tensor) {
  if (cursor_ < layout_.size() && name == layout_[cursor_].name) {
    const TensorInfo& t = layout_[cursor_];
    if (tensor.dtype != t.dtype || !(tensor.shape == t.shape))
      fail(path_.string(), ": tensor ", quote_name(name), " was declared ", dtype_name(t.dtype),
           " ", t.shape.str(), " but is written as ", dtype_name(tensor.dtype), " ",
           tensor.shape.str());
  }
  write(name, tensor.data, safetensors_tensor_bytes(tensor.dtype, tensor.shape).bytes);
}

void SafetensorsWriter::finish() {
  const std::string file = path_.string();
  if (fd_ < 0) fail(file, " is already finished");
  if (broken_) fail(file, ": an earlier write failed, so the file cannot be finished");
  if (cursor_ < layout_.size())
    fail(file, ": tensor ", quote_name(layout_[cursor_].name), " and ",
         layout_.size() - cursor_ - 1, " after it were not written in full");
  // The caller renames the finished folder into place; syncing first means a crash can never
  // leave a complete-looking name with missing data behind it.
  if (::fsync(fd_) != 0) fail("cannot flush ", file, ": ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    fail("cannot close ", file, ": ", std::strerror(errno));
  }
}

std::string safetensors_shard_name(int index, int count) {
  TETRA_CHECK(1 <= index && index <= count && count <= 99999, "shard ", index, " of ", count,
              " is not a valid shard number");
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", index, count);
  return name;
}

void write_safetensors_index(const std::filesystem::path& path,
                             const std::map<std::string, std::string>& weight_map,
                             uint64_t total_size) {
  const std::string file = path.string();
  for (const auto& [name, shard] : weight_map)
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find_first_of(std::string_view("/\0", 2)) != std::string::npos)
      fail(file, ": tensor ", quote_name(name), " maps to ", quote_name(shard),
           ", which is not a plain file name in the model folder");
  nlohmann::json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::string text;
  try {
    text = index.dump(2) + "\n";
  } catch (const nlohmann::json::exception&) {
    fail(file, ": tensor and shard names must be valid UTF-8");
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), std::streamsize(text.size()));
  out.close();
  if (!out) fail("cannot write ", file);
}

}  // namespace tetra
