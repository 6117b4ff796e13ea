// Checkpoint folders: a single model.safetensors, sharded indexes, and index entries that try
// to leave the folder (`..`, absolute paths, symlinks) or point at missing shards and tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "safetensors_test_util.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::expect_error;
using test::TempDir;
using test::write_file;

// A U8 file whose tensor `name` holds `n` copies of the byte `fill`.
void write_u8_file(const fs::path& path, const std::vector<std::string>& names, int n = 4) {
  std::vector<TensorDecl> decls;
  for (const auto& name : names) decls.push_back({name, DType::U8, Shape{n}});
  SafetensorsWriter w(path, decls);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string bytes(n, char('a' + i));
    w.write(names[i], bytes.data(), bytes.size());
  }
  w.finish();
}

void write_index(const fs::path& dir, const std::string& weight_map_json) {
  write_file(dir / "model.safetensors.index.json",
             R"({"metadata":{"total_size":8},"weight_map":)" + weight_map_json + "}");
}

TEST(Checkpoint, OpensASingleFile) {
  TempDir dir;
  write_u8_file(dir.path() / "model.safetensors", {"w.weight", "w.bias"});
  auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"w.bias", "w.weight"}));
  EXPECT_TRUE(ckpt->has("w.bias"));
  EXPECT_FALSE(ckpt->has("w"));
  EXPECT_EQ(ckpt->total_bytes(), 8u);
  EXPECT_EQ(ckpt->file_of("w.bias"), dir.path() / "model.safetensors");
  TensorView v = ckpt->get("w.bias", DType::U8, Shape{4});
  EXPECT_EQ(std::string(v.as<char>(), 4), "bbbb");
  ASSERT_NE(ckpt->find("w.weight"), nullptr);
  EXPECT_EQ(ckpt->find("w.weight")->end, 4u);
  EXPECT_EQ(ckpt->find("nope"), nullptr);
}

TEST(Checkpoint, GetChecksDtypeShapeAndNamesTheFileOrFolder) {
  TempDir dir;
  write_u8_file(dir.path() / "model.safetensors", {"w"});
  auto ckpt = Checkpoint::open(dir.path());
  const std::string file = (dir.path() / "model.safetensors").string();
  expect_error([&] { ckpt->get("w", DType::BF16, Shape{2}); },
               {file + ": tensor 'w' is U8 [4] but BF16 [2] was expected"});
  expect_error([&] { ckpt->get("w", DType::U8, Shape{2, 2}); }, {"U8 [2, 2] was expected"});
  expect_error([&] { ckpt->get("missing"); },
               {"tensor 'missing' is not in the checkpoint at " + dir.path().string()});
  expect_error([&] { ckpt->file_of("missing"); }, {dir.path().string()});
}

TEST(Checkpoint, EmptyOrMissingFolder) {
  TempDir dir;
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"no model.safetensors or model.safetensors.index.json in " + dir.path().string()});
  expect_error([&] { Checkpoint::open(dir.path() / "absent"); }, {"does not exist"});
  write_file(dir.path() / "f", "x");
  expect_error([&] { Checkpoint::open(dir.path() / "f"); }, {"is not a folder"});
}

TEST(Checkpoint, OpensShardsThroughTheIndex) {
  TempDir dir;
  write_u8_file(dir.path() / safetensors_shard_name(1, 2), {"a", "b"});
  // Shard 2 holds a tensor the index does not name: the index decides what the model has.
  write_u8_file(dir.path() / safetensors_shard_name(2, 2), {"c", "extra"});
  write_index(dir.path(), R"({"a":"model-00001-of-00002.safetensors",)"
                          R"("b":"model-00001-of-00002.safetensors",)"
                          R"("c":"model-00002-of-00002.safetensors"})");
  auto ckpt = Checkpoint::open(dir.path());
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(ckpt->has("extra"));
  EXPECT_EQ(ckpt->total_bytes(), 12u);
  EXPECT_EQ(ckpt->file_of("c").filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(std::string(ckpt->get("b").as<char>(), 4), "bbbb");
  EXPECT_EQ(std::string(ckpt->get("c").as<char>(), 4), "aaaa");
}

TEST(Checkpoint, PrefersModelSafetensorsOverTheIndex) {
  TempDir dir;
  write_u8_file(dir.path() / "model.safetensors", {"single"});
  write_index(dir.path(), R"({"a":"missing.safetensors"})");  // not even looked at
  EXPECT_EQ(Checkpoint::open(dir.path())->names(), (std::vector<std::string>{"single"}));
}

TEST(Checkpoint, ShardsInASubfolderAreInside) {
  TempDir dir;
  fs::create_directories(dir.path() / "sub");
  write_u8_file(dir.path() / "sub" / "s.safetensors", {"a"});
  write_index(dir.path(), R"({"a":"./sub/s.safetensors"})");
  EXPECT_TRUE(Checkpoint::open(dir.path())->has("a"));
}

TEST(Checkpoint, RefusesShardsOutsideTheFolder) {
  TempDir root;
  const fs::path dir = root.path() / "model";
  fs::create_directories(dir);
  const fs::path outside = root.path() / "outside.safetensors";
  write_u8_file(outside, {"a"});  // a valid file, so only the path rule can refuse it

  write_index(dir, R"({"a":"../outside.safetensors"})");
  expect_error([&] { Checkpoint::open(dir); }, {"'..' leaves the model folder"});
  write_index(dir, R"({"a":"sub/../../outside.safetensors"})");
  expect_error([&] { Checkpoint::open(dir); }, {"'..' leaves the model folder"});

  write_index(dir, R"({"a":")" + outside.string() + R"("})");
  expect_error([&] { Checkpoint::open(dir); }, {"by an absolute path"});

  fs::create_symlink(outside, dir / "link.safetensors");
  write_index(dir, R"({"a":"link.safetensors"})");
  expect_error([&] { Checkpoint::open(dir); },
               {"model.safetensors.index.json names the shard 'link.safetensors', a link to",
                "outside the model folder"});
  // A symlinked folder on the way out is caught the same way.
  fs::create_directory_symlink(root.path(), dir / "up");
  write_index(dir, R"({"a":"up/outside.safetensors"})");
  expect_error([&] { Checkpoint::open(dir); }, {"outside the model folder"});
}

TEST(Checkpoint, AcceptsHubCacheSnapshotLinksIntoBlobs) {
  TempDir root;
  // <repo>/snapshots/<rev>/shard -> ../../blobs/<hash>, as huggingface_hub lays out its cache.
  const fs::path repo = root.path() / "models--org--m";
  const fs::path snap = repo / "snapshots" / "abc123";
  fs::create_directories(snap);
  fs::create_directories(repo / "blobs");
  write_u8_file(repo / "blobs" / "1f2e", {"a"});
  fs::create_symlink("../../blobs/1f2e", snap / "model-00001-of-00001.safetensors");
  write_index(snap, R"({"a":"model-00001-of-00001.safetensors"})");
  EXPECT_TRUE(Checkpoint::open(snap)->has("a"));

  // Anything else outside the snapshot is still refused.
  write_u8_file(repo / "other.safetensors", {"a"});
  fs::create_symlink("../../other.safetensors", snap / "x.safetensors");
  write_index(snap, R"({"a":"x.safetensors"})");
  expect_error([&] { Checkpoint::open(snap); }, {"outside the model folder"});
}

TEST(Checkpoint, MissingShardOrTensor) {
  TempDir dir;
  write_index(dir.path(), R"({"a":"model-00001-of-00002.safetensors"})");
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"names the shard 'model-00001-of-00002.safetensors', which is missing from " +
                dir.path().string()});
  write_u8_file(dir.path() / "model-00001-of-00002.safetensors", {"b"});
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"model-00001-of-00002.safetensors has no tensor 'a', though",
                "model.safetensors.index.json places it there"});
  // A dangling symlink is a missing shard.
  fs::create_symlink(dir.path() / "nowhere", dir.path() / "dangling.safetensors");
  write_index(dir.path(), R"({"a":"dangling.safetensors"})");
  expect_error([&] { Checkpoint::open(dir.path()); }, {"which is missing"});
}

TEST(Checkpoint, RefusesMalformedIndexes) {
  const std::string src = "model.safetensors.index.json";
  auto index_error = [&](const std::string& json) {
    return error_of([&] { parse_safetensors_index(json, src); });
  };
  auto has = [](const std::string& msg, const char* part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  };
  has(index_error("[]"), "is not a JSON object");
  has(index_error("{"), "is not valid JSON");
  has(index_error(std::string("{\"weight_map\":{}}\0x", 19)), "NUL byte");
  has(index_error(R"({"metadata":{}})"), "has no weight_map");
  has(index_error(R"({"weight_map":[]})"), "weight_map is not an object");
  has(index_error(R"({"weight_map":"x"})"), "weight_map is not an object");
  has(index_error(R"({"weight_map":{"a":1}})"), "gives tensor 'a' a number instead of a file name");
  has(index_error(R"({"weight_map":{"a":{"f":"x"}}})"), "gives tensor 'a' an object");
  has(index_error(R"({"weight_map":{"a":""}})"), "empty or NUL-bearing file name");
  has(index_error(R"({"weight_map":{"a":"x\u0000y"}})"), "empty or NUL-bearing file name");
  has(index_error(R"({"weight_map":{"a":"x","a":"y"}})"), "lists tensor 'a' twice");
  has(index_error(R"({"weight_map":{},"weight_map":{}})"), "repeats the top-level key");
  // Other keys are skipped whatever they hold, nested or not.
  auto map = parse_safetensors_index(
      R"({"metadata":{"total_size":1,"x":[[{"a":null}]],"y":{"y":1,"y":2}},)"
      R"("weight_map":{"a":"s"},"z":7})",
      src);
  EXPECT_EQ(map.size(), 1u);
  EXPECT_EQ(map.at("a"), "s");
}

}  // namespace
}  // namespace tetra
