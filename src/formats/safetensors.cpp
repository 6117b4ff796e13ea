// safetensors reading: the header is parsed by a SAX handler that accepts only the schema
// (object of tensor entries plus an optional string map), so a hostile header can neither nest
// deeply nor make us build a DOM several times its size; then the reference reader's layout
// rules (FORMATS.md §4, RELIABILITY.md §2.2) are checked before any tensor is handed out.
#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "formats/safetensors_internal.h"

namespace tetra {
namespace {

using Json = nlohmann::json;

// Builds SafetensorsHeader straight from parser events. Depth never exceeds 3 because any
// container where the schema has none is refused at its first event.
class HeaderSax {
 public:
  // `allowance`: the most memory the parsed header may take (see parse_safetensors_header).
  HeaderSax(const std::string& source, SafetensorsHeader& out, uint64_t allowance)
      : source_(source), out_(out), allowance_(allowance) {}

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(Json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));
    if (state_ == State::Shape) fail_entry("has a negative dimension in its shape");
    if (state_ == State::Offsets) fail_entry("has a negative data offset");
    return scalar("a number");
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (state_ == State::Shape) {
      if (tensor_.shape.rank == kMaxDims)
        fail_entry("has more than ", kMaxDims, " dimensions, the most tetra supports");
      if (v > uint64_t(std::numeric_limits<int64_t>::max()))
        fail_entry("has a dimension larger than 2^63-1");
      tensor_.shape.dims[tensor_.shape.rank++] = int64_t(v);
      return true;
    }
    if (state_ == State::Offsets) {
      if (n_offsets_ == 2) fail_entry("has more than two data_offsets");
      (n_offsets_ == 0 ? tensor_.begin : tensor_.end) = v;
      ++n_offsets_;
      return true;
    }
    return scalar("a number");
  }
  bool number_float(Json::number_float_t, const std::string&) {
    if (state_ == State::Shape)
      fail_entry("has a shape dimension that is not an integer below 2^64");
    if (state_ == State::Offsets) fail_entry("has a data offset that is not an integer below 2^64");
    return scalar("a number");
  }
  bool binary(Json::binary_t&) { return scalar("binary data"); }

  bool string(std::string& v) {
    if (state_ == State::Entry && field_ == Field::Dtype) {
      auto dtype = dtype_from_name(v);
      if (!dtype) fail_entry("has the unknown dtype ", quote_name(v));
      tensor_.dtype = *dtype;
      return true;
    }
    if (state_ == State::Metadata) {
      charge(kTreeNodeBytes + meta_key_.size() + v.size() + 2);
      out_.metadata.emplace(std::move(meta_key_), std::move(v));
      return true;
    }
    return scalar("a string");
  }

  bool start_object(std::size_t) {
    if (state_ == State::Start) {
      state_ = State::Top;
      return true;
    }
    if (state_ == State::Top && in_metadata_value_) {
      state_ = State::Metadata;
      return true;
    }
    if (state_ == State::Top) {
      state_ = State::Entry;
      seen_ = 0;
      return true;
    }
    return scalar("an object");
  }

  bool key(std::string& k) {
    if (state_ == State::Top) {
      in_metadata_value_ = k == "__metadata__";
      if (in_metadata_value_) {
        if (seen_metadata_) fail("the header has two __metadata__ entries");
        seen_metadata_ = true;
        return true;
      }
      tensor_ = TensorInfo{};
      tensor_.name = std::move(k);
      return true;
    }
    if (state_ == State::Metadata) {
      if (out_.metadata.count(k)) fail("__metadata__ repeats the key ", quote_name(k));
      meta_key_ = std::move(k);
      return true;
    }
    // State::Entry: exactly these three fields, once each.
    if (k == "dtype")
      field_ = Field::Dtype;
    else if (k == "shape")
      field_ = Field::Shape;
    else if (k == "data_offsets")
      field_ = Field::Offsets;
    else
      fail_entry("has the unknown field ", quote_name(k));
    const unsigned bit = 1u << unsigned(field_);
    if (seen_ & bit) fail_entry("repeats the field ", quote_name(k));
    seen_ |= bit;
    return true;
  }

  bool end_object() {
    if (state_ == State::Metadata) {
      state_ = State::Top;
      in_metadata_value_ = false;
      return true;
    }
    if (state_ == State::Entry) {
      if (!(seen_ & (1u << unsigned(Field::Dtype)))) fail_entry("has no dtype");
      if (!(seen_ & (1u << unsigned(Field::Shape)))) fail_entry("has no shape");
      if (!(seen_ & (1u << unsigned(Field::Offsets)))) fail_entry("has no data_offsets");
      // The entry, the vector's spare capacity (up to as much again), and a copy of the name
      // in each of the two name indexes built on it (the file's and the checkpoint's).
      charge(2 * sizeof(TensorInfo) + 3 * (tensor_.name.size() + 1) + 2 * kTreeNodeBytes);
      out_.tensors.push_back(std::move(tensor_));
      state_ = State::Top;
      return true;
    }
    state_ = State::Done;  // State::Top: the parser only ends the object it opened
    return true;
  }

  bool start_array(std::size_t) {
    if (state_ == State::Entry && field_ == Field::Shape) {
      state_ = State::Shape;
      return true;
    }
    if (state_ == State::Entry && field_ == Field::Offsets) {
      state_ = State::Offsets;
      n_offsets_ = 0;
      return true;
    }
    return scalar("an array");
  }

  bool end_array() {
    if (state_ == State::Offsets && n_offsets_ != 2)
      fail_entry("has ", n_offsets_, " data_offsets instead of two");
    state_ = State::Entry;  // only Shape and Offsets arrays are ever opened
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    fail(source_, ": the header is not valid JSON (syntax error at byte ", position,
         " of the header)");
  }

 private:
  enum class State { Start, Top, Entry, Metadata, Shape, Offsets, Done };
  enum class Field : unsigned { Dtype, Shape, Offsets };

  // A value of the wrong kind for where it appears.
  bool scalar(const char* what) {
    switch (state_) {
      case State::Start:
        fail(source_, ": the header is not a JSON object");
      case State::Top:
        if (in_metadata_value_) fail(source_, ": __metadata__ is not an object of strings");
        fail_entry("is ", what, " instead of an object");
      case State::Metadata:
        fail(source_, ": __metadata__ value for ", quote_name(meta_key_), " is ", what,
             " instead of a string");
      case State::Entry:
        if (field_ == Field::Dtype) fail_entry("has a dtype that is not a string");
        if (field_ == Field::Shape) fail_entry("has a shape that is not an array");
        fail_entry("has data_offsets that are not an array");
      case State::Shape:
        fail_entry("has a shape entry that is ", what, " instead of a non-negative integer");
      case State::Offsets:
        fail_entry("has a data offset that is ", what, " instead of a non-negative integer");
      case State::Done:
        break;
    }
    fail(source_, ": the header has content after its JSON object");
  }

  template <typename... Args>
  [[noreturn]] void fail_entry(const Args&... args) {
    fail(source_, ": tensor ", quote_name(tensor_.name), " ", args...);
  }

  // A std::map node around a std::string key: the tree links and the key's own size.
  static constexpr uint64_t kTreeNodeBytes = 32 + sizeof(std::string) + 8;

  void charge(uint64_t bytes) {
    used_ += bytes;
    if (used_ > allowance_)
      fail(source_, ": the header's entries (", out_.tensors.size() + 1, " tensors so far) would take over ",
           allowance_, " bytes of memory once parsed, more than the file holds (a real checkpoint's tensors "
           "are far larger than their entries)");
  }

  const std::string& source_;
  SafetensorsHeader& out_;
  const uint64_t allowance_;
  uint64_t used_ = 0;
  State state_ = State::Start;
  Field field_ = Field::Dtype;
  unsigned seen_ = 0;  // bit per Field seen in the current entry
  int n_offsets_ = 0;
  bool in_metadata_value_ = false, seen_metadata_ = false;
  TensorInfo tensor_;
  std::string meta_key_;
};

// Validates UTF-8 as the Unicode standard defines it (no overlongs, surrogates or code points
// past U+10FFFF), so the message can say what is wrong before JSON parsing starts.
bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n = 0;
    unsigned lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c >= 0xc2 && c <= 0xdf)
      n = 1;
    else if (c == 0xe0)
      n = 2, lo = 0xa0;
    else if (c >= 0xe1 && c <= 0xef)
      n = 2, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c == 0xf0)
      n = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3)
      n = 3;
    else if (c == 0xf4)
      n = 3, hi = 0x8f;
    else
      return false;
    if (end - p <= n) return false;
    if (p[1] < lo || p[1] > hi) return false;
    for (int i = 2; i <= n; ++i)
      if ((p[i] & 0xc0) != 0x80) return false;
    p += n + 1;
  }
  return true;
}

}  // namespace

TensorBytes safetensors_tensor_bytes(DType dtype, const Shape& shape) {
  TensorBytes r;
  uint64_t n = 1;
  for (int i = 0; i < shape.rank; ++i) {
    if (shape.dims[i] < 0 || __builtin_mul_overflow(n, uint64_t(shape.dims[i]), &n)) {
      r.overflow = true;
      return r;
    }
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(n, uint64_t(dtype_bits(dtype)), &bits)) {
    r.overflow = true;
    return r;
  }
  r.misaligned = bits % 8 != 0;
  r.bytes = bits / 8;
  return r;
}

SafetensorsHeader parse_safetensors_header(std::string_view json, uint64_t buffer_bytes,
                                           const std::string& source) {
  if (!is_valid_utf8(json)) fail(source, ": the header is not valid UTF-8");
  // nlohmann's lexer takes a raw NUL as the end of input, so "{...}\0<anything>" would pass
  // its strict mode; valid JSON never holds a raw NUL, so refuse it here.
  if (const size_t nul = json.find('\0'); nul != std::string_view::npos)
    fail(source, ": the header is not valid JSON (NUL byte at byte ", nul, " of the header)");
  // A header of many tiny entries (empty tensors are valid) costs several times its text once
  // parsed. RELIABILITY case 27: nothing is allocated beyond the file's size, with a floor so
  // that small valid files always parse.
  const uint64_t allowance = std::max<uint64_t>(8 + json.size() + buffer_bytes, kSafetensorsParseFloorBytes);
  SafetensorsHeader header;
  HeaderSax sax(source, header, allowance);
  Json::sax_parse(json.begin(), json.end(), &sax);

  auto& tensors = header.tensors;
  // Duplicate names: the JSON parser reports every key, so a repeat shows up here as two
  // entries (nlohmann's DOM would have silently kept the last one).
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  for (size_t i = 1; i < tensors.size(); ++i)
    if (tensors[i].name == tensors[i - 1].name)
      fail(source, ": the header has two entries for tensor ", quote_name(tensors[i].name));

  // File order; empty tensors sharing an offset stay in name order, so the result is stable.
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected_begin = 0;
  for (const auto& t : tensors) {
    const bool first = &t == &tensors.front();
    const std::string name = quote_name(t.name);
    if (t.end < t.begin)
      fail(source, ": tensor ", name, " ends (", t.end, ") before it begins (", t.begin, ")");
    if (t.begin != expected_begin)
      fail(
          source, ": tensor ", name, " begins at byte ", t.begin, " of the data but the ",
          first ? "first tensor must begin at 0" : str_cat("previous one ends at ", expected_begin),
          t.begin > expected_begin ? " (a gap)" : " (an overlap)");
    const TensorBytes size = safetensors_tensor_bytes(t.dtype, t.shape);
    if (size.overflow)
      fail(source, ": tensor ", name, " has a shape ", t.shape.str(),
           " whose size overflows 64 bits");
    if (size.misaligned)
      fail(source, ": tensor ", name, " of ", dtype_name(t.dtype), " shape ", t.shape.str(),
           " does not end on a byte boundary");
    if (t.end - t.begin != size.bytes)
      fail(source, ": tensor ", name, " of ", dtype_name(t.dtype), " shape ", t.shape.str(),
           " needs ", size.bytes, " bytes but its data_offsets span ", t.end - t.begin);
    expected_begin = t.end;
  }
  if (expected_begin != buffer_bytes)
    fail(source, ": the tensors cover ", expected_begin, " bytes but the data buffer holds ",
         buffer_bytes, expected_begin < buffer_bytes ? " (trailing bytes)" : " (truncated file)");
  return header;
}

SafetensorsHeader parse_safetensors_bytes(std::string_view bytes, const std::string& source) {
  if (bytes.size() < 8)
    fail(source, ": file of ", bytes.size(), " bytes is too short for a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);  // little-endian u64
  if (n > kSafetensorsMaxHeaderBytes)
    fail(source, ": header length ", n, " exceeds the limit of ", kSafetensorsMaxHeaderBytes,
         " bytes");
  if (n > bytes.size() - 8)
    fail(source, ": header length ", n, " runs past the end of the ", bytes.size(), "-byte file");
  return parse_safetensors_header(bytes.substr(8, n), bytes.size() - 8 - n, source);
}

// ---- SafetensorsFile ----

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string source = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", source, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(source, " is not a regular file");
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const uint64_t size = uint64_t(st.st_size);
  if (size > 0) {
    // MAP_PRIVATE + PROT_READ: weights are never written through the mapping, and a private
    // mapping keeps our view stable if the page cache is shared with other readers.
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail("cannot map ", source, ": ", std::strerror(err));
    }
    file->map_ = static_cast<const uint8_t*>(p);
    file->map_bytes_ = size;
  }
  ::close(fd);  // the mapping keeps its own reference to the file
  // From here the destructor unmaps if validation throws.
  file->header_ = parse_safetensors_bytes(
      std::string_view(reinterpret_cast<const char*>(file->map_), size), source);
  const auto& tensors = file->header_.tensors;
  // Validation made the last tensor end exactly at the end of the file.
  file->data_offset_ = size - (tensors.empty() ? 0 : tensors.back().end);
  for (size_t i = 0; i < tensors.size(); ++i) file->index_.emplace(tensors[i].name, i);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) fail(path_.string(), " has no tensor ", quote_name(name));
  TensorView v;
  // The mapping is read-only; TensorView's pointer is non-const only because views also
  // describe writable device buffers. Writing through it faults.
  v.data = const_cast<uint8_t*>(map_ + data_offset_ + t->begin);
  v.dtype = t->dtype;
  v.shape = t->shape;
  return v;
}

}  // namespace tetra
