// Writes a seed corpus for safetensors_fuzz into a folder: valid file images made by the
// writer, header-only JSON that fits the target's 64-byte buffer, an index, and a few
// near-misses. Generated at run time so the corpus follows the format code as it changes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/safetensors_writer.h"

namespace {

using namespace tetra;
namespace fs = std::filesystem;

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  TETRA_CHECK(out.good(), "cannot write the seed ", path.string());
}

void write_image(const fs::path& path, const std::vector<TensorDecl>& decls,
                 const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path, decls, metadata);
  for (const auto& d : decls) {
    const std::string bytes(safetensors_tensor_bytes(d.dtype, d.shape).bytes, '\x3c');
    w.write(d.name, bytes.data(), bytes.size());
  }
  w.finish();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const fs::path dir = argv[1];
    fs::create_directories(dir);
    write_image(dir / "image_small", {{"a", DType::BF16, Shape{2, 3}}, {"b", DType::F4, Shape{8}}},
                {{"format", "pt"}});
    write_image(dir / "image_scalar_empty",
                {{"s", DType::F64, Shape{}}, {"e", DType::U8, Shape{0, 4}}}, {});
    write_image(
        dir / "image_nvfp4",
        {{"model.layers.0.mlp.experts.0.down_proj.weight", DType::U8, Shape{4, 8}},
         {"model.layers.0.mlp.experts.0.down_proj.weight_scale", DType::F8_E4M3, Shape{4, 1}},
         {"model.layers.0.mlp.experts.0.down_proj.weight_scale_2", DType::F32, Shape{}},
         {"x", DType::F6_E2M3, Shape{1, 2, 1, 2, 1, 4}}},
        {{"format", "pt"}, {"quant", "nvfp4"}});
    write_image(dir / "image_none", {}, {});
    write_text(dir / "header_f32", R"({"a":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}})");
    write_text(
        dir / "header_mixed",
        R"( {"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[4,4],)"
        R"("data_offsets":[0,32]},"s":{"dtype":"F4","shape":[64],"data_offsets":[32,64]}}   )");
    write_text(dir / "header_gap", R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"U8","shape":[8],"data_offsets":[9,17]}})");
    write_text(dir / "header_dup", R"({"a":{"dtype":"U8","shape":[64],"data_offsets":[0,64]},)"
                                   R"("a":{"dtype":"U8","shape":[0],"data_offsets":[64,64]}})");
    write_text(dir / "index", R"({"metadata":{"total_size":64},"weight_map":)"
                              R"({"a":"model-00001-of-00002.safetensors","b":"../x"}})");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
