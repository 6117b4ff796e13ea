// Sharded checkpoints: model.safetensors.index.json parsing and the Checkpoint that maps each
// tensor name to the mapped file holding it. Shard names come from a text file anyone can
// edit, so each is checked to stay inside the model folder before it is opened.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "formats/safetensors.h"
#include "formats/safetensors_internal.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Keeps only `weight_map`; every other top-level value is skipped without being stored.
class IndexSax {
 public:
  IndexSax(const std::string& source, std::map<std::string, std::string>& out)
      : source_(source), out_(out) {}

  bool null() { return value("null"); }
  bool boolean(bool) { return value("a boolean"); }
  bool number_integer(Json::number_integer_t) { return value("a number"); }
  bool number_unsigned(Json::number_unsigned_t) { return value("a number"); }
  bool number_float(Json::number_float_t, const std::string&) { return value("a number"); }
  bool binary(Json::binary_t&) { return value("binary data"); }
  bool string(std::string& v) {
    if (state_ == State::WeightMap) {
      if (v.empty() || v.find('\0') != std::string::npos)
        fail(source_, ": weight_map gives tensor ", quote_name(name_),
             " an empty or NUL-bearing file name");
      out_.emplace(std::move(name_), std::move(v));
      return true;
    }
    return value("a string");
  }

  bool start_object(std::size_t) {
    if (state_ == State::Start) {
      state_ = State::Top;
      return true;
    }
    if (state_ == State::Top && key_is_weight_map_) {
      state_ = State::WeightMap;
      return true;
    }
    return open_container("an object");
  }
  bool start_array(std::size_t) { return open_container("an array"); }
  bool end_object() { return close_container(); }
  bool end_array() { return close_container(); }

  bool key(std::string& k) {
    if (state_ == State::Top) {
      if (!top_keys_.insert(k).second) fail(source_, " repeats the top-level key ", quote_name(k));
      key_is_weight_map_ = k == "weight_map";
      seen_weight_map_ |= key_is_weight_map_;
    } else if (state_ == State::WeightMap) {
      if (out_.count(k)) fail(source_, ": weight_map lists tensor ", quote_name(k), " twice");
      name_ = std::move(k);
    }
    return true;  // keys inside skipped values are not looked at
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    fail(source_, " is not valid JSON (syntax error at byte ", position, ")");
  }

  bool seen_weight_map() const { return seen_weight_map_; }

 private:
  enum class State { Start, Top, WeightMap, Skip, Done };

  bool value(const char* what) {
    if (state_ == State::Start) fail(source_, " is not a JSON object");
    if (state_ == State::Top && key_is_weight_map_) fail(source_, ": weight_map is not an object");
    if (state_ == State::WeightMap)
      fail(source_, ": weight_map gives tensor ", quote_name(name_), " ", what,
           " instead of a file name");
    return true;  // another top-level value, or inside a skipped one
  }
  bool open_container(const char* what) {
    if (state_ == State::Skip) {
      ++skip_depth_;
      return true;
    }
    value(what);  // fails unless this is some other top-level key's value
    state_ = State::Skip;
    skip_depth_ = 1;
    return true;
  }
  bool close_container() {
    if (state_ == State::Skip && --skip_depth_ > 0) return true;
    state_ = state_ == State::Top ? State::Done : State::Top;
    return true;
  }

  const std::string& source_;
  std::map<std::string, std::string>& out_;
  State state_ = State::Start;
  uint64_t skip_depth_ = 0;
  bool key_is_weight_map_ = false, seen_weight_map_ = false;
  std::set<std::string> top_keys_;
  std::string name_;
};

// Component-wise prefix test on canonical paths ("/a/bc" is not inside "/a/b").
bool is_within(const fs::path& path, const fs::path& root) {
  auto [r, p] = std::mismatch(root.begin(), root.end(), path.begin(), path.end());
  return r == root.end();
}

std::string read_text_file(const fs::path& path, uint64_t max_bytes) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail("cannot read ", path.string(), ": ", ec.message());
  if (size > max_bytes)
    fail(path.string(), " is ", size, " bytes, more than the limit of ", max_bytes);
  std::ifstream in(path, std::ios::binary);
  std::string text(size, '\0');
  if (!in.read(text.data(), std::streamsize(size))) fail("cannot read ", path.string());
  return text;
}

}  // namespace

std::map<std::string, std::string> parse_safetensors_index(std::string_view json,
                                                           const std::string& source) {
  // A raw NUL would end nlohmann's input early (see parse_safetensors_header).
  if (const size_t nul = json.find('\0'); nul != std::string_view::npos)
    fail(source, " is not valid JSON (NUL byte at byte ", nul, ")");
  std::map<std::string, std::string> weight_map;
  IndexSax sax(source, weight_map);
  Json::sax_parse(json.begin(), json.end(), &sax);
  if (!sax.seen_weight_map()) fail(source, " has no weight_map");
  return weight_map;
}

std::unique_ptr<Checkpoint> Checkpoint::open(const fs::path& dir) {
  const std::string dir_name = dir.string();
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("model folder ", dir_name, " does not exist");
  if (!fs::is_directory(dir, ec)) fail(dir_name, " is not a folder");

  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    ckpt->files_.push_back(SafetensorsFile::open(single));
    for (const auto& t : ckpt->files_.back()->header().tensors)
      ckpt->where_.emplace(t.name, ckpt->files_.back().get());
    return ckpt;
  }
  if (!fs::exists(index, ec))
    fail("no model.safetensors or model.safetensors.index.json in ", dir_name);

  const std::string index_name = index.string();
  // An index lists one line per tensor; even a 744B-parameter model's is a few tens of MB.
  const auto weight_map =
      parse_safetensors_index(read_text_file(index, kSafetensorsMaxHeaderBytes), index_name);

  const fs::path root = fs::weakly_canonical(dir, ec);
  if (ec) fail("cannot resolve the model folder ", dir_name, ": ", ec.message());
  // A Hugging Face hub cache snapshot (<repo>/snapshots/<rev>/) holds symlinks into
  // <repo>/blobs/; that folder belongs to the same download, so it counts as inside.
  const bool hub_snapshot = root.parent_path().filename() == "snapshots";
  const fs::path hub_blobs = root.parent_path().parent_path() / "blobs";

  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [name, shard] : weight_map) {
    auto found = shards.find(shard);
    if (found == shards.end()) {
      const fs::path rel(shard);
      if (rel.has_root_path())
        fail(index_name, " names the shard ", quote_name(shard),
             " by an absolute path; shards must be inside the model folder");
      for (const auto& part : rel)
        if (part == "..")
          fail(index_name, " names the shard ", quote_name(shard),
               ", whose '..' leaves the model folder");
      const fs::path full = dir / rel;
      if (!fs::exists(full, ec))
        fail(index_name, " names the shard ", quote_name(shard), ", which is missing from ",
             dir_name);
      const fs::path target = fs::weakly_canonical(full, ec);
      if (ec) fail("cannot resolve the shard ", full.string(), ": ", ec.message());
      if (!is_within(target, root) && !(hub_snapshot && is_within(target, hub_blobs)))
        fail(index_name, " names the shard ", quote_name(shard), ", a link to ", target.string(),
             " outside the model folder");
      ckpt->files_.push_back(SafetensorsFile::open(full));
      found = shards.emplace(shard, ckpt->files_.back().get()).first;
    }
    if (!found->second->find(name))
      fail(found->second->path().string(), " has no tensor ", quote_name(name), ", though ",
           index_name, " places it there");
    ckpt->where_.emplace(name, found->second);
  }
  return ckpt;
}

bool Checkpoint::has(std::string_view name) const { return where_.find(name) != where_.end(); }

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second->find(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

std::filesystem::path Checkpoint::file_of(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    fail("tensor ", quote_name(name), " is not in the checkpoint at ", dir_.string());
  return it->second->path();
}

TensorView Checkpoint::get(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    fail("tensor ", quote_name(name), " is not in the checkpoint at ", dir_.string());
  return it->second->view(name);
}

TensorView Checkpoint::get(std::string_view name, DType dtype, Shape shape) const {
  TensorView v = get(name);
  if (v.dtype != dtype || !(v.shape == shape))
    fail(file_of(name).string(), ": tensor ", quote_name(name), " is ", dtype_name(v.dtype), " ",
         v.shape.str(), " but ", dtype_name(dtype), " ", shape.str(), " was expected");
  return v;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, file] : where_) {
    const TensorInfo* t = file->find(name);
    total += t->end - t->begin;
  }
  return total;
}

}  // namespace tetra
