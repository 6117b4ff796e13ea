// The streaming writer: what it writes must pass the reader byte for byte, and misuse (wrong
// order, wrong sizes, bad declarations) must fail without leaving a plausible file behind.
#include "formats/safetensors_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "safetensors_test_util.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::read_file;
using test::TempDir;

// Deterministic, position-dependent bytes so a misplaced tensor cannot compare equal.
std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  uint32_t x = 2463534242u + uint32_t(seed) * 2654435761u;
  for (auto& c : s) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    c = char(x);
  }
  return s;
}

const DType kAllDtypes[] = {DType::BOOL,    DType::U8,          DType::I8,          DType::U16,
                            DType::I16,     DType::U32,         DType::I32,         DType::U64,
                            DType::I64,     DType::F16,         DType::BF16,        DType::F32,
                            DType::F64,     DType::C64,         DType::F8_E4M3,     DType::F8_E5M2,
                            DType::F8_E8M0, DType::F8_E4M3FNUZ, DType::F8_E5M2FNUZ, DType::F4,
                            DType::F6_E2M3, DType::F6_E3M2};

TEST(SafetensorsWriter, RoundTripsEveryDtypeThroughTheReader) {
  TempDir dir;
  const fs::path path = dir.path() / "all.safetensors";
  std::vector<TensorDecl> decls;
  for (DType t : kAllDtypes) decls.push_back({"t." + std::string(dtype_name(t)), t, Shape{3, 8}});
  decls.push_back({"scalar", DType::F32, Shape{}});
  decls.push_back({"empty", DType::BF16, Shape{5, 0}});
  decls.push_back({"rank6", DType::U8, Shape{1, 2, 1, 2, 1, 3}});
  decls.push_back({"name with \"quotes\" and \xc3\xa9", DType::I8, Shape{7}});
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"by", "tetra"}};

  std::vector<std::string> data;
  {
    SafetensorsWriter w(path, decls, metadata);
    for (size_t i = 0; i < decls.size(); ++i) {
      EXPECT_EQ(w.next(), decls[i].name);
      data.push_back(pattern(safetensors_tensor_bytes(decls[i].dtype, decls[i].shape).bytes, i));
      w.write(decls[i].name, data.back().data(), data.back().size());
    }
    EXPECT_EQ(w.next(), "");
    w.finish();
    EXPECT_EQ(fs::file_size(path), w.file_bytes());
  }

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->data_offset() % 8, 0u);  // the header is padded so the buffer is 8-aligned
  EXPECT_EQ(f->header().metadata, metadata);
  ASSERT_EQ(f->header().tensors.size(), decls.size());
  for (size_t i = 0; i < decls.size(); ++i) {
    // Declared order is file order.
    EXPECT_EQ(f->header().tensors[i].name, decls[i].name);
    TensorView v = f->view(decls[i].name);
    EXPECT_EQ(v.dtype, decls[i].dtype);
    EXPECT_EQ(v.shape, decls[i].shape);
    EXPECT_EQ(std::string(v.as<char>(), data[i].size()), data[i]) << decls[i].name;
  }
  const std::string bytes = read_file(path);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes[f->data_offset() - 1] == ' ' || bytes[f->data_offset() - 1] == '}', true);
}

TEST(SafetensorsWriter, StreamsATensorInPieces) {
  TempDir dir;
  const fs::path path = dir.path() / "p.safetensors";
  const std::string big = pattern(3 << 20, 1), small = pattern(6, 2);
  {
    SafetensorsWriter w(path, {{"big", DType::F32, Shape{3 << 18}}, {"s", DType::I16, Shape{3}}});
    for (size_t at = 0; at < big.size(); at += 100000)
      w.write("big", big.data() + at, std::min<size_t>(100000, big.size() - at));
    TensorView v;
    v.data = const_cast<char*>(small.data());
    v.dtype = DType::I16;
    v.shape = Shape{3};
    w.write("s", v);
    w.finish();
  }
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(std::string(f->view("big").as<char>(), big.size()), big);
  EXPECT_EQ(std::string(f->view("s").as<char>(), 6), small);
}

TEST(SafetensorsWriter, RefusesOutOfOrderAndWrongSizes) {
  TempDir dir;
  const fs::path path = dir.path() / "o.safetensors";
  const std::string bytes(16, 'x');
  SafetensorsWriter w(
      path, {{"a", DType::U8, Shape{4}}, {"z", DType::U8, Shape{0}}, {"b", DType::U8, Shape{2}}});
  expect_error([&] { w.write("b", bytes.data(), 2); },
               {"o.safetensors: got bytes for tensor 'b' while 'a' is next"});
  expect_error([&] { w.write("a", bytes.data(), 5); },
               {"tensor 'a' is 4 bytes but 5 were written"});
  w.write("a", bytes.data(), 3);
  expect_error([&] { w.write("a", bytes.data(), 2); }, {"is 4 bytes but 5 were written"});
  expect_error([&] { w.finish(); }, {"tensor 'a' and 2 after it were not written in full"});
  w.write("a", bytes.data(), 1);
  expect_error([&] { w.write("a", bytes.data(), 1); }, {"while 'z' is next"});
  TensorView wrong;
  wrong.data = const_cast<char*>(bytes.data());
  wrong.dtype = DType::I8;
  wrong.shape = Shape{0};
  expect_error([&] { w.write("z", wrong); },
               {"tensor 'z' was declared U8 [0] but is written as I8 [0]"});
  w.write("z", nullptr, 0);
  w.write("b", bytes.data(), 2);
  expect_error([&] { w.write("b", bytes.data(), 0); }, {"after every declared tensor is complete"});
  w.finish();
  expect_error([&] { w.finish(); }, {"already finished"});
  expect_error([&] { w.write("b", bytes.data(), 1); }, {"after the file was finished"});
  EXPECT_EQ(SafetensorsFile::open(path)->header().tensors.size(), 3u);
}

TEST(SafetensorsWriter, UnfinishedFilesAreRemoved) {
  TempDir dir;
  const fs::path path = dir.path() / "u.safetensors";
  {
    SafetensorsWriter w(path, {{"a", DType::U8, Shape{4}}});
    w.write("a", "ab", 2);
    EXPECT_TRUE(fs::exists(path));
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(SafetensorsWriter, RefusesBadDeclarationsBeforeCreatingTheFile) {
  TempDir dir;
  const fs::path path = dir.path() / "d.safetensors";
  auto refuses = [&](std::vector<TensorDecl> decls, const std::string& part) {
    expect_error([&] { SafetensorsWriter w(path, decls); }, {"d.safetensors: ", part});
    EXPECT_FALSE(fs::exists(path)) << part;
  };
  refuses({{"a", DType::U8, Shape{1}}, {"a", DType::U8, Shape{1}}}, "tensor 'a' is declared twice");
  refuses({{"__metadata__", DType::U8, Shape{1}}}, "cannot be named __metadata__");
  refuses({{"a", DType::U8, Shape{2, -1}}}, "negative dimension in shape [2, -1]");
  refuses({{"a", DType::F4, Shape{3}}}, "does not end on a byte boundary");
  refuses({{"a", DType::F64, Shape{int64_t(1) << 62}}}, "overflows 64 bits");
  std::vector<TensorDecl> huge;  // 16 tensors of 2^60 bytes: each fits, the sum does not
  for (int i = 0; i < 16; ++i)
    huge.push_back({std::to_string(i), DType::U8, Shape{int64_t(1) << 60}});
  refuses(huge, "more than 2^64 bytes");
  refuses({{"bad\xff", DType::U8, Shape{1}}}, "must be valid UTF-8");
}

TEST(SafetensorsWriter, WritesAnIndexThatCheckpointOpens) {
  TempDir dir;
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  for (int shard = 1; shard <= 2; ++shard) {
    const std::string file = safetensors_shard_name(shard, 2);
    const std::string name = "layer." + std::to_string(shard) + ".weight";
    SafetensorsWriter w(dir.path() / file, {{name, DType::BF16, Shape{2, 2}}});
    const std::string bytes = pattern(8, shard);
    w.write(name, bytes.data(), bytes.size());
    w.finish();
    weight_map[name] = file;
    total += 8;
  }
  write_safetensors_index(dir.path() / "model.safetensors.index.json", weight_map, total);
  const auto json = nlohmann::json::parse(read_file(dir.path() / "model.safetensors.index.json"));
  EXPECT_EQ(json["metadata"]["total_size"], 16);
  auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt->total_bytes(), 16u);
  EXPECT_EQ(std::string(ckpt->get("layer.2.weight", DType::BF16, Shape{2, 2}).as<char>(), 8),
            pattern(8, 2));
  EXPECT_EQ(ckpt->file_of("layer.1.weight").filename(), "model-00001-of-00002.safetensors");

  for (const char* bad : {"../x.safetensors", "/abs.safetensors", "", "..", "sub/x"})
    expect_error(
        [&] {
          write_safetensors_index(dir.path() / "i.json", {{"a", bad}}, 0);
        },
        {"i.json: tensor 'a' maps to", "not a plain file name"});
}

TEST(SafetensorsWriter, ShardNames) {
  EXPECT_EQ(safetensors_shard_name(1, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(safetensors_shard_name(163, 163), "model-00163-of-00163.safetensors");
  expect_error([] { safetensors_shard_name(0, 3); }, {"not a valid shard number"});
  expect_error([] { safetensors_shard_name(4, 3); }, {"not a valid shard number"});
}

}  // namespace
}  // namespace tetra
