// libFuzzer target for the safetensors reader (RELIABILITY.md §2.2, case 27). Every input is
// read three ways: as a whole file image, as a header alone against a fixed-size buffer (so
// mutations of the JSON are not all lost to a length prefix that no longer matches), and as
// model.safetensors.index.json text. Only tetra::Error may escape; anything else (a crash, a
// sanitizer report, another exception type, an accepted header that breaks the layout rules)
// is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/safetensors.h"

namespace {

using namespace tetra;

// Header-only inputs are validated against this buffer size; seeds are built to match it.
constexpr uint64_t kHeaderModeBufferBytes = 64;

// What an accepted header promises its users; a violation traps so libFuzzer records it.
void check_accepted(const SafetensorsHeader& h, uint64_t buffer_bytes) {
  uint64_t at = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != at || t.end < t.begin) __builtin_trap();
    if (t.shape.rank < 0 || t.shape.rank > kMaxDims) __builtin_trap();
    for (int i = 0; i < t.shape.rank; ++i)
      if (t.shape[i] < 0) __builtin_trap();
    const TensorBytes size = safetensors_tensor_bytes(t.dtype, t.shape);
    if (!size.ok() || size.bytes != t.end - t.begin) __builtin_trap();
    at = t.end;
  }
  if (at != buffer_bytes) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz.safetensors";
  try {
    const SafetensorsHeader h = parse_safetensors_bytes(bytes, source);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
    if (n > size - 8) __builtin_trap();  // accepted a header length past the end
    check_accepted(h, size - 8 - n);
  } catch (const Error&) {
  }
  try {
    check_accepted(parse_safetensors_header(bytes, kHeaderModeBufferBytes, source),
                   kHeaderModeBufferBytes);
  } catch (const Error&) {
  }
  try {
    for (const auto& [name, shard] : parse_safetensors_index(bytes, "fuzz.index.json"))
      if (shard.empty()) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
