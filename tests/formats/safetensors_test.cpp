// The safetensors reader against hand-built files: every rule of the reference reader
// (FORMATS.md §4, RELIABILITY.md §2.2, case 27) has a file that breaks exactly that rule.
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>

#include "safetensors_test_util.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::expect_error;
using test::image;
using test::TempDir;
using test::write_file;

const std::string kSrc = "bad.safetensors";

// Parses a header JSON with a buffer of `buffer` bytes and returns the error message.
std::string header_error(const std::string& json, uint64_t buffer) {
  return error_of([&] { parse_safetensors_bytes(image(json, std::string(buffer, '\0')), kSrc); });
}

TEST(SafetensorsParse, ReadsTensorsSortedByOffsetAndMetadata) {
  const std::string json = R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                           R"("__metadata__":{"format":"pt","k":"v"},)"
                           R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]}})";
  auto h = parse_safetensors_bytes(image(json, std::string(12, 'x')), kSrc);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[0].dtype, DType::BF16);
  EXPECT_EQ(h.tensors[0].shape, (Shape{1, 2}));
  EXPECT_EQ(h.tensors[0].begin, 0u);
  EXPECT_EQ(h.tensors[0].end, 4u);
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].begin, 4u);
  EXPECT_EQ(h.tensors[1].end, 12u);
  EXPECT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(SafetensorsParse, AcceptsWhitespaceAroundTheHeader) {
  const std::string body = R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})";
  for (const std::string& json : {body + "       ", "  \n\t" + body, " " + body + "\r\n "}) {
    auto h = parse_safetensors_bytes(image(json, "abc"), kSrc);
    ASSERT_EQ(h.tensors.size(), 1u) << json;
    EXPECT_EQ(h.tensors[0].shape, (Shape{3}));
  }
}

TEST(SafetensorsParse, AcceptsEmptyTensorsScalarsAndEmptyHeader) {
  const std::string json = R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                           R"("e":{"dtype":"F32","shape":[4,0,3],"data_offsets":[8,8]},)"
                           R"("z":{"dtype":"F4","shape":[0],"data_offsets":[8,8]}})";
  auto h = parse_safetensors_bytes(image(json, std::string(8, '\0')), kSrc);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "s");
  EXPECT_EQ(h.tensors[0].shape.rank, 0);
  EXPECT_EQ(h.tensors[1].shape, (Shape{4, 0, 3}));
  EXPECT_TRUE(parse_safetensors_bytes(image("{}", ""), kSrc).tensors.empty());
}

TEST(SafetensorsParse, AcceptsEveryDtypeName) {
  // name, bits; an 8-element tensor keeps the sub-byte types on a byte boundary.
  const std::pair<const char*, int> kTypes[] = {
      {"BOOL", 8},        {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},
      {"I8", 8},          {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
      {"F8_E5M2FNUZ", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16},    {"BF16", 16},
      {"I32", 32},        {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},
      {"I64", 64},        {"U64", 64}};
  for (auto [name, bits] : kTypes) {
    const int bytes = 8 * bits / 8;
    const std::string json = std::string(R"({"t":{"dtype":")") + name +
                             R"(","shape":[2,4],"data_offsets":[0,)" + std::to_string(bytes) +
                             "]}}";
    auto h = parse_safetensors_bytes(image(json, std::string(bytes, '\0')), kSrc);
    ASSERT_EQ(h.tensors.size(), 1u) << name;
    EXPECT_EQ(dtype_name(h.tensors[0].dtype), name);
  }
}

TEST(SafetensorsParse, RejectsShortFilesAndBadHeaderLengths) {
  expect_error([] { parse_safetensors_bytes("1234567", kSrc); }, {kSrc, "too short"});
  expect_error([] { parse_safetensors_bytes("", kSrc); }, {kSrc, "too short"});
  // N just above MAX_HEADER_SIZE, and the largest u64 (which must not wrap 8 + N).
  for (uint64_t n : {kSafetensorsMaxHeaderBytes + 1, ~uint64_t(0)}) {
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    bytes += "{}";
    expect_error([&] { parse_safetensors_bytes(bytes, kSrc); }, {kSrc, "exceeds the limit"});
  }
  std::string past_end = image("{}", "");
  past_end[0] = 3;  // N = 3 but only 2 header bytes follow
  expect_error([&] { parse_safetensors_bytes(past_end, kSrc); }, {kSrc, "runs past the end"});
}

TEST(SafetensorsParse, RejectsInvalidUtf8) {
  for (const std::string& bad : {std::string("\xff"), std::string("\xc0\x80"),  // overlong NUL
                                 std::string("\xed\xa0\x80"),                   // surrogate
                                 std::string("\xf4\x90\x80\x80"),               // past U+10FFFF
                                 std::string("\xe2\x82")}) {                    // truncated
    const std::string json =
        "{\"" + bad + "\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}";
    EXPECT_NE(header_error(json, 1).find("not valid UTF-8"), std::string::npos);
  }
  // Multi-byte names that are valid are kept byte for byte.
  const std::string name = "\xe6\x9d\x83\xe9\x87\x8d.\xf0\x9f\x98\x80";
  auto h = parse_safetensors_bytes(
      image("{\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", "x"),
      kSrc);
  EXPECT_EQ(h.tensors.at(0).name, name);
}

TEST(SafetensorsParse, RejectsHeadersThatAreNotAJsonObject) {
  for (const char* json : {"[]", "42", "\"x\"", "null", "true"})
    EXPECT_NE(header_error(json, 0).find("not a JSON object"), std::string::npos) << json;
  for (const char* json : {"{", "", "{\"a\":}", "{} x", "{}{}", "{'a':1}"})
    EXPECT_NE(header_error(json, 0).find("not valid JSON"), std::string::npos) << json;
  // nlohmann alone would stop at a raw NUL and accept whatever follows it.
  EXPECT_NE(header_error(std::string("{}\0", 3), 0).find("NUL byte at byte 2"), std::string::npos);
  EXPECT_NE(header_error(std::string("{}\0garbage", 10), 0).find("not valid JSON"),
            std::string::npos);
}

TEST(SafetensorsParse, RejectsDuplicateKeys) {
  const std::string t = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  const std::string u = R"({"dtype":"U8","shape":[1],"data_offsets":[1,2]})";
  EXPECT_NE(header_error("{\"w\":" + t + ",\"w\":" + u + "}", 2).find("two entries for tensor 'w'"),
            std::string::npos);
  EXPECT_NE(header_error(R"({"__metadata__":{},"__metadata__":{}})", 0).find("two __metadata__"),
            std::string::npos);
  EXPECT_NE(header_error(R"({"__metadata__":{"k":"1","k":"2"}})", 0).find("repeats the key 'k'"),
            std::string::npos);
  EXPECT_NE(header_error(R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1)
                .find("repeats the field 'dtype'"),
            std::string::npos);
}

TEST(SafetensorsParse, RejectsMetadataThatIsNotAStringMap) {
  EXPECT_NE(header_error(R"({"__metadata__":{"total":5}})", 0).find("instead of a string"),
            std::string::npos);
  EXPECT_NE(header_error(R"({"__metadata__":{"k":{"x":"y"}}})", 0).find("instead of a string"),
            std::string::npos);
  EXPECT_NE(header_error(R"({"__metadata__":{"k":["v"]}})", 0).find("instead of a string"),
            std::string::npos);
  for (const char* json :
       {R"({"__metadata__":["a"]})", R"({"__metadata__":null})", R"({"__metadata__":"pt"})"})
    EXPECT_NE(header_error(json, 0).find("__metadata__ is not an object of strings"),
              std::string::npos)
        << json;
}

TEST(SafetensorsParse, RejectsBadEntries) {
  auto entry_error = [](const std::string& body, uint64_t buffer) {
    return header_error("{\"w\":" + body + "}", buffer);
  };
  auto has = [](const std::string& msg, const char* part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_NE(msg.find(kSrc + ": tensor 'w'"), std::string::npos) << msg;
  };
  has(entry_error(R"({"dtype":"F128","shape":[1],"data_offsets":[0,16]})", 16),
      "unknown dtype 'F128'");
  has(entry_error(R"({"dtype":"bf16","shape":[1],"data_offsets":[0,2]})", 2), "unknown dtype");
  has(entry_error(R"({"dtype":16,"shape":[1],"data_offsets":[0,2]})", 2),
      "dtype that is not a string");
  has(entry_error(R"({"shape":[1],"data_offsets":[0,1]})", 1), "has no dtype");
  has(entry_error(R"({"dtype":"U8","data_offsets":[0,1]})", 1), "has no shape");
  has(entry_error(R"({"dtype":"U8","shape":[1]})", 1), "has no data_offsets");
  has(entry_error(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1})", 1),
      "unknown field 'x'");
  has(entry_error(R"({"dtype":"U8","shape":[-1],"data_offsets":[0,1]})", 1), "negative dimension");
  has(entry_error(R"({"dtype":"U8","shape":[1.0],"data_offsets":[0,1]})", 1), "not an integer");
  has(entry_error(R"({"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]})", 1),
      "not an integer below 2^64");
  has(entry_error(R"({"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]})", 0),
      "larger than 2^63-1");
  has(entry_error(R"({"dtype":"U8","shape":["1"],"data_offsets":[0,1]})", 1), "shape entry");
  has(entry_error(R"({"dtype":"U8","shape":[[1]],"data_offsets":[0,1]})", 1), "shape entry");
  has(entry_error(R"({"dtype":"U8","shape":1,"data_offsets":[0,1]})", 1),
      "shape that is not an array");
  has(entry_error(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})", 1), "1 data_offsets");
  has(entry_error(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,1]})", 1), "more than two");
  has(entry_error(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})", 1),
      "negative data offset");
  has(entry_error(R"({"dtype":"U8","shape":[1],"data_offsets":{"a":0}})", 1), "not an array");
  has(entry_error(R"([1])", 1), "instead of an object");
  has(entry_error(R"(7)", 1), "instead of an object");
}

TEST(SafetensorsParse, RejectsRankAboveTheLimit) {
  const std::string msg =
      header_error(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1);
  EXPECT_NE(msg.find("more than 6 dimensions"), std::string::npos) << msg;
  auto h = parse_safetensors_bytes(
      image(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1,2],"data_offsets":[0,2]}})", "ab"), kSrc);
  EXPECT_EQ(h.tensors[0].shape.rank, 6);
}

TEST(SafetensorsParse, RejectsGapsOverlapsAndReversedOffsets) {
  const std::string a = R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  auto two = [&](const char* b_offsets, uint64_t buffer) {
    return header_error(
        "{" + a + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":)" + b_offsets + "}}", buffer);
  };
  std::string msg = two("[5,9]", 9);
  EXPECT_NE(
      msg.find("tensor 'b' begins at byte 5 of the data but the previous one ends at 4 (a gap)"),
      std::string::npos)
      << msg;
  msg = two("[3,7]", 7);
  EXPECT_NE(msg.find("(an overlap)"), std::string::npos) << msg;
  msg = two("[4,3]", 4);
  EXPECT_NE(msg.find("tensor 'b' ends (3) before it begins (4)"), std::string::npos) << msg;
  msg = header_error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6);
  EXPECT_NE(msg.find("first tensor must begin at 0"), std::string::npos) << msg;
}

TEST(SafetensorsParse, RejectsSizeOverflowMisalignmentAndMismatch) {
  std::string msg = header_error(
      R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}})", 0);
  EXPECT_NE(msg.find("overflows 64 bits"), std::string::npos) << msg;
  // The element count fits but the bit count (2^62 * 32) does not.
  msg = header_error(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})",
                     0);
  EXPECT_NE(msg.find("overflows 64 bits"), std::string::npos) << msg;
  msg = header_error(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2);
  EXPECT_NE(msg.find("does not end on a byte boundary"), std::string::npos) << msg;
  msg = header_error(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,11]}})", 11);
  EXPECT_NE(msg.find("needs 12 bytes but its data_offsets span 11"), std::string::npos) << msg;
}

TEST(SafetensorsParse, RejectsTrailingAndMissingBytes) {
  const std::string json = R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  std::string msg = header_error(json, 5);
  EXPECT_NE(msg.find("cover 4 bytes but the data buffer holds 5 (trailing bytes)"),
            std::string::npos)
      << msg;
  msg = header_error(json, 3);
  EXPECT_NE(msg.find("(truncated file)"), std::string::npos) << msg;
  msg = header_error("{}", 1);
  EXPECT_NE(msg.find("trailing bytes"), std::string::npos) << msg;
}

TEST(SafetensorsParse, ErrorMessagesStayShortForHugeNames) {
  const std::string name(100000, 'n');
  const std::string msg =
      header_error("{\"" + name + R"(":{"dtype":"X","shape":[],"data_offsets":[0,0]}})", 0);
  EXPECT_LT(msg.size(), 400u) << msg.substr(0, 400);
  EXPECT_NE(msg.find("unknown dtype"), std::string::npos);
}

// Empty tensors are valid, so a header can list very many for a few bytes each; parsed, each
// costs several times its text. Such a header is refused once it would take more memory than
// the file's size (case 27), and the same entries parse when the file is large enough.
TEST(SafetensorsParse, RefusesHeadersThatWouldTakeMoreMemoryThanTheFile) {
  std::string json = "{";
  const int n = 40000;  // about 2 MB of entries, past the 1 MiB floor
  for (int i = 0; i < n; ++i)
    json += str_cat(i ? "," : "", "\"t", i, R"(":{"dtype":"U8","shape":[0],"data_offsets":[0,0]})");
  json += "}";
  const std::string msg = header_error(json, 0);
  EXPECT_NE(msg.find("more than the file holds"), std::string::npos) << msg.substr(0, 400);
  EXPECT_LT(msg.size(), 400u);

  // With a 32 MiB file the same header is ordinary: its data is one real tensor.
  const uint64_t data = 32u << 20;
  std::string big = json.substr(0, json.size() - 1) +
                    str_cat(R"(,"w":{"dtype":"U8","shape":[)", data, R"(],"data_offsets":[0,)", data, "]}}");
  const SafetensorsHeader h = parse_safetensors_bytes(image(big, std::string(data, '\0')), kSrc);
  EXPECT_EQ(h.tensors.size(), size_t(n + 1));

  // Small files always parse, however their entries compare with their size.
  EXPECT_EQ(parse_safetensors_bytes(image(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                                          std::string(4, '\0')), kSrc).tensors.size(), 1u);
}

// ---- mapped files ----

TEST(SafetensorsFile, MapsTensorsInPlace) {
  TempDir dir;
  const std::string json = R"({"x":{"dtype":"I16","shape":[2],"data_offsets":[0,4]},)"
                           R"("y":{"dtype":"U8","shape":[3],"data_offsets":[4,7]}})";
  const std::string buffer = std::string("\x01\x00\xff\xff", 4) + "abc";
  write_file(dir.path() / "m.safetensors", image(json, buffer));
  auto f = SafetensorsFile::open(dir.path() / "m.safetensors");
  EXPECT_EQ(f->data_offset(), 8 + json.size());
  TensorView x = f->view("x");
  EXPECT_EQ(x.dtype, DType::I16);
  EXPECT_EQ(x.shape, (Shape{2}));
  EXPECT_EQ(x.as<int16_t>()[0], 1);
  EXPECT_EQ(x.as<int16_t>()[1], -1);
  EXPECT_EQ(std::string(f->view("y").as<char>(), 3), "abc");
  EXPECT_EQ(f->find("z"), nullptr);
  expect_error([&] { f->view("z"); }, {"m.safetensors has no tensor 'z'"});
}

TEST(SafetensorsFile, OpenErrorsNameTheFile) {
  TempDir dir;
  expect_error([&] { SafetensorsFile::open(dir.path() / "none.safetensors"); },
               {"cannot open", "none.safetensors"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, {"is not a regular file"});
  write_file(dir.path() / "empty.safetensors", "");
  expect_error([&] { SafetensorsFile::open(dir.path() / "empty.safetensors"); },
               {"empty.safetensors: file of 0 bytes is too short"});
  write_file(dir.path() / "t.safetensors",
             image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "ab"));
  expect_error([&] { SafetensorsFile::open(dir.path() / "t.safetensors"); },
               {"t.safetensors: the tensors cover 1 bytes"});
}

}  // namespace
}  // namespace tetra
