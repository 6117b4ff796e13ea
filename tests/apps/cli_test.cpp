// The CLI as users run it: the contract's output, and one clear sentence for every bad input
// (PRODUCT.md), never a crash, an abort or a huge allocation.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"

namespace fs = std::filesystem;

namespace tetra {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

RunResult run_cli(const std::string& args) {
  const fs::path err_file = fs::temp_directory_path() / ("tetra_cli_err_" + std::to_string(::getpid()));
  const std::string cmd = std::string(TETRA_CLI) + " " + args + " 2>" + err_file.string();
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream e(err_file);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  fs::remove(err_file);
  return r;
}

const fs::path kFixture = fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/qwen3_moe-tiny";

// A scratch copy of the fixture that a test may break.
class BrokenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kFixture / "model.safetensors")) << kFixture << " is missing";
    dir_ = fs::temp_directory_path() / ("tetra_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(kFixture / "config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Rewrites the fixture's tensors into dir_, letting `edit` drop (return false) or change one.
  template <typename Edit>
  void write_tensors(Edit edit) {
    auto src = Checkpoint::open(kFixture);
    std::vector<TensorDecl> decls;
    std::vector<std::pair<std::string, TensorView>> data;
    for (const auto& name : src->names()) {
      TensorView v = src->get(name);
      TensorDecl d{name, v.dtype, v.shape};
      if (!edit(d)) continue;
      decls.push_back(d);
      data.emplace_back(name, v);
    }
    SafetensorsWriter w(dir_ / "model.safetensors", decls);
    std::vector<char> zeros;
    for (size_t i = 0; i < decls.size(); ++i) {
      const int64_t bytes = decls[i].shape.numel() * dtype_bits(decls[i].dtype) / 8;
      if (bytes == data[i].second.nbytes()) {
        w.write(decls[i].name, data[i].second.data, uint64_t(bytes));
      } else {
        zeros.assign(size_t(bytes), 0);
        w.write(decls[i].name, zeros.data(), uint64_t(bytes));
      }
    }
    w.finish();
  }

  RunResult generate() { return run_cli("generate --model " + dir_.string() + " --prompt-ids 1,2,3 --max-new-tokens 2"); }

  fs::path dir_;
};

// One line on stderr, naming what it must name, exit code 1.
void expect_clear_error(const RunResult& r, const std::string& must_contain) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << r.err;
  const auto lines = std::count(r.err.begin(), r.err.end(), '\n');
  EXPECT_LE(lines, 1) << "expected one sentence, got:\n" << r.err;
}

TEST(Cli, GenerateJsonMatchesTransformers) {
  std::ifstream in(kFixture / "expected.json");
  ASSERT_TRUE(in) << kFixture << "/expected.json is missing";
  const auto expected = nlohmann::json::parse(in)["cases"][0];
  std::string ids;
  for (int id : expected["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  const auto r = run_cli("generate --model " + kFixture.string() + " --prompt-ids " + ids +
                         " --max-new-tokens " + std::to_string(expected["max_new_tokens"].get<int>()) +
                         " --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["token_ids"], expected["token_ids"]);
  ASSERT_EQ(out["logprobs"].size(), expected["logprobs"].size());
  for (size_t i = 0; i < out["logprobs"].size(); ++i)
    EXPECT_NEAR(out["logprobs"][i].get<double>(), expected["logprobs"][i].get<double>(), 1e-4);
  EXPECT_TRUE(out.contains("text"));
}

TEST(Cli, GenerateOnRanksGivesWhatOneRankGives) {
  const std::string base = "generate --model " + kFixture.string() +
                           " --device cpu --prompt-ids 3,14,15,92,65 --max-new-tokens 12 --ignore-eos --json";
  const auto one = run_cli(base);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const auto want = nlohmann::json::parse(one.out);
  for (const char* flags : {" --tp 2", " --ep 2", " --tp 2 --ep 2", " --tp 4 --ep 2"}) {
    const auto r = run_cli(base + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    EXPECT_NE(r.err.find(" ranks (--tp"), std::string::npos) << r.err;
    const auto got = nlohmann::json::parse(r.out);
    EXPECT_EQ(got["token_ids"], want["token_ids"]) << flags;
    ASSERT_EQ(got["logprobs"].size(), want["logprobs"].size()) << flags;
    for (size_t i = 0; i < got["logprobs"].size(); ++i)
      EXPECT_NEAR(got["logprobs"][i].get<double>(), want["logprobs"][i].get<double>(), 1e-4) << flags;
  }
}

TEST(Cli, DummyWeightsRunOnRanks) {
  // A shared expert (glm4_moe) whose share per rank differs from a routed expert's.
  const fs::path config = fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/glm4_moe-small-config";
  for (const char* flags : {" --tp 2", " --ep 2", " --tp 2 --ep 2"}) {
    const auto r = run_cli("generate --model " + config.string() + " --load-format dummy --device cpu" +
                           " --prompt-ids 1,2,3 --max-new-tokens 2 --json" + flags);
    ASSERT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].size(), 2u) << flags;
  }
}

TEST(Cli, RankFlagsTetraCannotRunAreOneSentence) {
  const std::string base = "generate --model " + kFixture.string() + " --device cpu --prompt-ids 1";
  expect_clear_error(run_cli(base + " --tp 2 --ep 4"), "--ep 4 must divide --tp 2");
  expect_clear_error(run_cli(base + " --tp 8"), "--tp 8 must divide the model's 4 attention heads");
  expect_clear_error(run_cli(base + " --ep 3"), "--ep 3 must divide the model's 8 routed experts");
}

TEST(Cli, InspectReadsConfigAlone) {
  const fs::path dir = fs::temp_directory_path() / ("tetra_cli_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kFixture / "config.json", dir / "config.json", fs::copy_options::overwrite_existing);
  const auto r = run_cli("inspect --model " + dir.string() + " --json");
  fs::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["model_type"], "qwen3_moe");
  EXPECT_GT(out["params_total"].get<int64_t>(), out["params_active"].get<int64_t>());
  EXPECT_FALSE(out.contains("weights"));
}

TEST(Cli, MissingFolder) {
  expect_clear_error(run_cli("generate --model /nonexistent/model --prompt-ids 1"), "/nonexistent/model");
}

TEST(Cli, BadFlags) {
  const auto r = run_cli("generate --model " + kFixture.string() + " --prompt-ids 1 --max-new-tokens -5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("max-new-tokens"), std::string::npos) << r.err;
  const auto ids = run_cli("generate --model " + kFixture.string() + " --prompt-ids 1,x,3");
  expect_clear_error(ids, "--prompt-ids");
  EXPECT_EQ(run_cli("frobnicate").exit_code, 2);
}

TEST(Cli, KernelBenchesNameABadTokenList) {
  // Checked before the build's CUDA or the machine's GPU is asked for.
  for (const char* args : {"bench moe --tokens 8,x", "bench linear --tokens 8,x"})
    expect_clear_error(run_cli(args), "--tokens");
}

TEST(Cli, PromptIdOutsideVocabulary) {
  expect_clear_error(run_cli("generate --model " + kFixture.string() + " --prompt-ids 1,99999999"),
                     "99999999");
}

TEST_F(BrokenModel, NoWeightsFile) {
  expect_clear_error(generate(), dir_.string());
}

TEST_F(BrokenModel, MalformedHeader) {
  std::ofstream f(dir_ / "model.safetensors", std::ios::binary);
  const uint64_t n = 1ull << 40;  // a header length far past the end of the file
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << "{\"a\": 1}";
  f.close();
  expect_clear_error(generate(), "model.safetensors");
}

TEST_F(BrokenModel, TruncatedFile) {
  fs::copy_file(kFixture / "model.safetensors", dir_ / "model.safetensors");
  fs::resize_file(dir_ / "model.safetensors", fs::file_size(dir_ / "model.safetensors") - 100);
  expect_clear_error(generate(), "model.safetensors");
}

TEST_F(BrokenModel, MissingTensor) {
  write_tensors([](TensorDecl& d) { return d.name != "model.layers.1.self_attn.k_proj.weight"; });
  expect_clear_error(generate(), "model.layers.1.self_attn.k_proj.weight");
}

TEST_F(BrokenModel, WrongShape) {
  write_tensors([](TensorDecl& d) {
    if (d.name == "model.norm.weight") d.shape = Shape{d.shape[0] + 1};
    return true;
  });
  expect_clear_error(generate(), "model.norm.weight");
}

TEST_F(BrokenModel, WrongDtype) {
  write_tensors([](TensorDecl& d) {
    if (d.name == "model.norm.weight") d.dtype = DType::I16;
    return true;
  });
  expect_clear_error(generate(), "model.norm.weight");
}

TEST_F(BrokenModel, AbsurdConfigSizes) {
  fs::copy_file(kFixture / "model.safetensors", dir_ / "model.safetensors");
  for (auto [field, value] : {std::pair{"hidden_size", 1e12}, {"num_hidden_layers", 1e9},
                              {"vocab_size", -3.0}, {"num_attention_heads", 0.0}}) {
    std::ifstream in(kFixture / "config.json");
    auto cfg = nlohmann::json::parse(in);
    cfg[field] = int64_t(value);
    std::ofstream(dir_ / "config.json") << cfg.dump();
    SCOPED_TRACE(field);
    expect_clear_error(generate(), field);
  }
}

TEST(Cli, InspectPrintsSmallCountsInPlainUnits) {
  const auto r = run_cli("inspect --model " + kFixture.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("0.000 B"), std::string::npos) << r.out;
  const size_t at = r.out.find("parameters: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  // The tiny model has some hundred thousand parameters: "123.45 K total".
  EXPECT_NE(line.find(" K total"), std::string::npos) << line;
}

// Every --help gives each option's default.
TEST(Cli, HelpShowsDefaults) {
  auto option_line = [](const std::string& help, const std::string& flag) {
    const size_t at = help.find(flag);
    return at == std::string::npos ? std::string() : help.substr(at, help.find('\n', at) - at);
  };
  const auto serve = run_cli("serve --help");
  ASSERT_EQ(serve.exit_code, 0) << serve.err;
  EXPECT_NE(option_line(serve.out, "--port").find("30000"), std::string::npos) << serve.out;
  EXPECT_NE(option_line(serve.out, "--generation-config").find("auto"), std::string::npos) << serve.out;
  EXPECT_NE(serve.out.find("--max-model-len"), std::string::npos) << serve.out;
  const auto generate = run_cli("generate --help");
  EXPECT_NE(option_line(generate.out, "--max-new-tokens").find("16"), std::string::npos) << generate.out;
  const auto eval = run_cli("eval --help");
  EXPECT_NE(option_line(eval.out, "--window").find("512"), std::string::npos) << eval.out;
}

// The commands that build an engine (serve, generate, eval, bench decode) all list `flag`.
void expect_in_every_engine_help(const std::string& flag) {
  for (const char* cmd : {"serve", "generate", "eval", "bench decode"}) {
    const auto help = run_cli(std::string(cmd) + " --help");
    ASSERT_EQ(help.exit_code, 0) << cmd << ": " << help.err;
    EXPECT_NE(help.out.find(flag), std::string::npos) << cmd << ":\n" << help.out;
  }
}

// Three greedy tokens of the fixture on the CPU, as JSON (with the run's fingerprint).
const std::string kGenerateJson = "generate --model " + kFixture.string() +
                                  " --device cpu --prompt-ids 1,2,3 --max-new-tokens 3 --ignore-eos --json";

// --disable-pdl on every command that builds an engine (serve, generate, eval, bench decode);
// on the CPU backend it changes nothing.
TEST(Cli, DisablePdlOnEveryEngineCommand) {
  expect_in_every_engine_help("--disable-pdl");
  const std::string& args = kGenerateJson;
  const auto plain = run_cli(args), no_pdl = run_cli(args + " --disable-pdl");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(no_pdl.exit_code, 0) << no_pdl.err;
  EXPECT_EQ(nlohmann::json::parse(no_pdl.out)["fingerprint"], nlohmann::json::parse(plain.out)["fingerprint"]);
}

// --kv-cache-dtype on every command that builds an engine: fp8_e4m3 runs on the CPU (a
// different fingerprint, the FP8 cache's rounding), a bad value is one sentence naming the flag.
TEST(Cli, KvCacheDtypeOnEveryEngineCommand) {
  expect_in_every_engine_help("--kv-cache-dtype");
  const std::string& args = kGenerateJson;
  const auto plain = run_cli(args), fp8 = run_cli(args + " --kv-cache-dtype fp8_e4m3"),
             auto_ = run_cli(args + " --kv-cache-dtype auto");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  ASSERT_EQ(auto_.exit_code, 0) << auto_.err;
  EXPECT_EQ(nlohmann::json::parse(auto_.out)["fingerprint"], nlohmann::json::parse(plain.out)["fingerprint"]);
  EXPECT_NE(nlohmann::json::parse(fp8.out)["fingerprint"], nlohmann::json::parse(plain.out)["fingerprint"]);
  expect_clear_error(run_cli(args + " --kv-cache-dtype fp4"), "--kv-cache-dtype must be auto or fp8_e4m3, not 'fp4'");
}

class EvalIds : public ::testing::Test {
 protected:
  void SetUp() override {
    ids_ = fs::temp_directory_path() / ("tetra_cli_ids_" + std::to_string(::getpid()) + ".json");
    std::ofstream(ids_) << "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]";
  }
  void TearDown() override { fs::remove(ids_); }
  RunResult eval(const std::string& flags) {
    return run_cli("eval --model " + kFixture.string() + " --ids " + ids_.string() + " --threads 1 " + flags);
  }
  fs::path ids_;
};

TEST_F(EvalIds, WindowIsCheckedAgainstTheContext) {
  expect_clear_error(eval("--window 5000"), "--window 5000 is more than the context of 4096 tokens");
}

TEST_F(EvalIds, ProgressCountsTokens) {
  const auto r = eval("--window 6");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.err.find("evaluating: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
  EXPECT_NE(line.find(" tokens"), std::string::npos) << line;
  EXPECT_EQ(line.find("tensors"), std::string::npos) << line;
}

TEST_F(EvalIds, RanksScoreWhatOneRankScores) {
  const std::string flags = "--device cpu --window 6 --json --ref " + kFixture.string();
  const auto one = eval(flags);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const auto want = nlohmann::json::parse(one.out);
  for (const char* ranks : {" --tp 2", " --tp 2 --ep 2", " --ep 2"}) {
    const auto r = eval(flags + ranks);
    ASSERT_EQ(r.exit_code, 0) << ranks << ": " << r.err;
    const auto got = nlohmann::json::parse(r.out);
    EXPECT_EQ(got["scored"], want["scored"]) << ranks;
    // Perplexity is exp(mean NLL): log-probs within 1e-4 keep it within that relative error.
    EXPECT_NEAR(got["perplexity"].get<double>() / want["perplexity"].get<double>(), 1.0, 1e-4) << ranks;
    EXPECT_NEAR(got["mean_kl"].get<double>(), 0.0, 1e-9) << ranks;  // against itself, split alike
  }
}

// eval --kv-cache-dtype fp8_e4m3 --ref the same folder: the reference keeps the F32 cache
// (--ref-kv-cache-dtype auto), so the KL is the FP8 cache's cost, small but not zero.
TEST_F(EvalIds, Fp8KvCacheAgainstTheModelsOwnCache) {
  const auto r = eval("--device cpu --window 6 --json --kv-cache-dtype fp8_e4m3 --ref " + kFixture.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = nlohmann::json::parse(r.out);
  EXPECT_GT(got["mean_kl"].get<double>(), 0.0);
  EXPECT_LT(got["mean_kl"].get<double>(), 1e-2);
  const auto same = eval("--device cpu --window 6 --json --kv-cache-dtype fp8_e4m3 --ref-kv-cache-dtype fp8_e4m3 --ref " +
                         kFixture.string());
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_NEAR(nlohmann::json::parse(same.out)["mean_kl"].get<double>(), 0.0, 1e-9);
  expect_clear_error(eval("--kv-cache-dtype bf17"), "--kv-cache-dtype must be auto or fp8_e4m3, not 'bf17'");
  expect_clear_error(eval("--ref-kv-cache-dtype e5m2 --ref " + kFixture.string()),
                     "--ref-kv-cache-dtype must be auto or fp8_e4m3, not 'e5m2'");
}

// eval --moe-activation-dtype fp8_e4m3 --ref the same NVFP4 folder: the reference keeps W4A16
// (--ref-moe-activation-dtype auto), so the KL is W4A8's cost, small but not zero. BF16 experts
// have nothing to run as W4A8: one sentence, not a silent no-op.
TEST_F(EvalIds, W4a8ExpertsAgainstTheModelsW4a16) {
  const std::string nvfp4 = kFixture.string() + "-nvfp4";
  auto eval_nvfp4 = [&](const std::string& flags) {
    return run_cli("eval --model " + nvfp4 + " --ids " + ids_.string() + " --threads 1 --device cpu --window 6 --json " +
                   flags);
  };
  expect_in_every_engine_help("--moe-activation-dtype");
  const auto r = eval_nvfp4("--moe-activation-dtype fp8_e4m3 --ref " + nvfp4);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = nlohmann::json::parse(r.out);
  EXPECT_GT(got["mean_kl"].get<double>(), 0.0);
  EXPECT_LT(got["mean_kl"].get<double>(), 1e-1);
  const auto same = eval_nvfp4("--moe-activation-dtype fp8_e4m3 --ref-moe-activation-dtype fp8 --ref " + nvfp4);
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_NEAR(nlohmann::json::parse(same.out)["mean_kl"].get<double>(), 0.0, 1e-9);
  expect_clear_error(eval("--device cpu --moe-activation-dtype fp8_e4m3"),
                     "--moe-activation-dtype fp8_e4m3 (W4A8) takes NVFP4 experts");
  expect_clear_error(eval("--moe-activation-dtype int8"), "--moe-activation-dtype must be auto or fp8_e4m3, not 'int8'");
}

// The README's main model (models/demo, tools/demo_model/) writes English: on its held-out text
// (none of it seen in training) the BF16 model's perplexity is far below a random model's 4,096,
// and its NVFP4 twin stays close to it. On the first 20,000 bytes, measured 2026-12-02:
// perplexity 22.38, NVFP4 22.39, mean KL 0.0067 nats, top-1 agreement 95.0%.
TEST(Cli, TheDemoModelPredictsHeldOutEnglish) {
  const fs::path root(TETRA_SOURCE_DIR);
  std::ifstream in(root / "tools/demo_model/data/kjv-heldout.txt", std::ios::binary);
  std::string text(20000, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  ASSERT_EQ(in.gcount(), std::streamsize(text.size()));
  const fs::path file = fs::temp_directory_path() / ("tetra_demo_heldout_" + std::to_string(::getpid()));
  std::ofstream(file, std::ios::binary) << text;
  const auto r = run_cli("eval --device cpu --window 512 --json --model " + (root / "models/demo-nvfp4").string() +
                         " --ref " + (root / "models/demo").string() + " --text " + file.string());
  fs::remove(file);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_LT(j["ref_perplexity"].get<double>(), 30.0);
  EXPECT_LT(j["perplexity"].get<double>(), 1.01 * j["ref_perplexity"].get<double>());
  EXPECT_LT(j["mean_kl"].get<double>(), 0.02);
  EXPECT_GT(j["top1_agreement"].get<double>(), 0.9);
}

// A checkpoint with its multi-token-prediction layer (model.layers.{num_hidden_layers}.*) loads,
// generates as without it, and inspect counts the MTP tensors.
TEST(Cli, MtpLayerIsLoadedAndSkipped) {
  const fs::path src_dir = fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/deepseek_v3-tiny";
  const fs::path dir = fs::temp_directory_path() / ("tetra_cli_mtp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(src_dir / "config.json", dir / "config.json");
  std::ifstream cfg_in(src_dir / "config.json");
  const auto cfg = nlohmann::json::parse(cfg_in);
  ASSERT_EQ(cfg["num_nextn_predict_layers"], 1);
  const std::string mtp = "model.layers." + std::to_string(cfg["num_hidden_layers"].get<int>()) + ".";
  auto src = Checkpoint::open(src_dir);
  std::vector<TensorDecl> decls;
  for (const auto& name : src->names()) {
    TensorView v = src->get(name);
    decls.push_back({name, v.dtype, v.shape});
  }
  const int64_t hidden = cfg["hidden_size"];
  for (const char* t : {"eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
    decls.push_back({mtp + t, DType::BF16, std::string(t) == "eh_proj.weight" ? Shape{hidden, 2 * hidden} : Shape{hidden}});
  {
    SafetensorsWriter w(dir / "model.safetensors", decls);
    for (const auto& d : decls) {
      if (src->has(d.name)) {
        TensorView v = src->get(d.name);
        w.write(d.name, v.data, uint64_t(v.nbytes()));
      } else {
        std::vector<uint16_t> ones(size_t(d.shape.numel()), f32_to_bf16(1.0f));
        w.write(d.name, ones.data(), ones.size() * 2);
      }
    }
    w.finish();
  }
  const std::string args = " --model " + dir.string() + " --prompt-ids 3,1,4,1,5 --max-new-tokens 4 --json";
  const auto with_mtp = run_cli("generate" + args);
  const auto without = run_cli("generate --model " + src_dir.string() + " --prompt-ids 3,1,4,1,5 --max-new-tokens 4 --json");
  const auto inspect = run_cli("inspect --json --model " + dir.string());
  const auto inspect_cut = run_cli("inspect --json --model " + dir.string() + R"( --hf-overrides '{"num_hidden_layers": 2}')");
  fs::remove_all(dir);
  ASSERT_EQ(with_mtp.exit_code, 0) << with_mtp.err;
  EXPECT_EQ(nlohmann::json::parse(with_mtp.out)["token_ids"], nlohmann::json::parse(without.out)["token_ids"]);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  const auto info = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(info["mtp_layers"], 1);
  EXPECT_EQ(info["weights"]["mtp_tensors"], 4);
  EXPECT_EQ(info["weights"]["unloaded_tensors"], 4);
  // Cut to 2 layers: the MTP layer is still the file's layer 3, and layer 2 is not loaded either.
  ASSERT_EQ(inspect_cut.exit_code, 0) << inspect_cut.err;
  const auto cut = nlohmann::json::parse(inspect_cut.out)["weights"];
  EXPECT_EQ(cut["mtp_tensors"], 4);
  int64_t layer2 = 0;
  for (const auto& name : src->names()) layer2 += name.starts_with("model.layers.2.");
  EXPECT_EQ(cut["unloaded_tensors"], 4 + layer2);
}

// --hf-overrides: GLM-5's published config read with 4 layers; dummy weights drawn for the
// layers left; a real checkpoint loading only the layers left, generating exactly what a
// checkpoint cut to those layers generates; and a bad value refused like any bad flag.
TEST(Cli, HfOverridesShortenGlm5) {
  const std::string glm5 = (fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/glm5-config").string();
  const auto full = run_cli("inspect --json --model " + glm5);
  const auto four = run_cli("inspect --json --model " + glm5 + R"( --hf-overrides '{"num_hidden_layers": 4}')");
  ASSERT_EQ(four.exit_code, 0) << four.err;
  const auto info = nlohmann::json::parse(four.out);
  EXPECT_EQ(nlohmann::json::parse(full.out)["layers"], 78);
  EXPECT_EQ(info["layers"], 4);
  EXPECT_EQ(info["dense_layers"], 3);
  EXPECT_EQ(info["hf_overrides"], (nlohmann::json{{"num_hidden_layers", 4}}));
  // The text form describes the model as run, overrides included; SGLang's name works too.
  const auto text = run_cli("inspect --model " + glm5 + R"( --json-model-override-args '{"num_hidden_layers": 4}')");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("glm_moe_dsa: 4 layers (3 dense)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(R"(--hf-overrides {"num_hidden_layers":4})"), std::string::npos) << text.out;
}

TEST(Cli, HfOverridesWithDummyWeights) {
  const std::string dsa = (fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/glm_moe_dsa-tiny").string();
  const auto r = run_cli("generate --model " + dsa + " --load-format dummy --prompt-ids 1,2,3 --max-new-tokens 3 " +
                         R"(--json --hf-overrides '{"num_hidden_layers": 2}')");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].size(), 3u);
  EXPECT_NE(r.err.find("glm_moe_dsa: 2 layers (1 dense)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(R"(--hf-overrides {"num_hidden_layers":2})"), std::string::npos) << r.err;
}

// bench decode reports its prompts' prefill; with --skip-prefill the cache is random and the
// steps still run (the DSA fixture: its indexer reads the random index keys too).
TEST(Cli, BenchDecodeReportsPrefillOrSkipsIt) {
  const std::string dsa = (fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/glm_moe_dsa-tiny").string();
  const fs::path json = fs::temp_directory_path() / ("tetra_bench_decode_" + std::to_string(::getpid()) + ".json");
  for (const bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "--skip-prefill" : "prefill");
    const auto r = run_cli("bench decode --model " + dsa + " --batch 1,3 --context 40 --steps 3 --profile-steps 0 " +
                           (skip ? "--skip-prefill " : "") + "--json " + json.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(skip ? "prefill (the prompts to their first tokens, 4096 tokens a step at most): skipped"
                              : "batch 3 "),
              std::string::npos)
        << r.out;
    std::ifstream in(json);
    const auto rows = nlohmann::json::parse(in);
    ASSERT_EQ(rows.size(), 2u);
    for (const auto& row : rows) {
      EXPECT_GT(row["step_ms_median"].get<double>(), 0);
      // Each step's host time is its wall time less a wait inside it, so the medians keep order.
      EXPECT_GE(row["host_ms_median"].get<double>(), 0);
      EXPECT_LE(row["host_ms_median"].get<double>(), row["step_ms_median"].get<double>());
      EXPECT_EQ(row.contains("prefill_tokens_per_s"), !skip);
    }
  }
  fs::remove(json);
}

TEST(Cli, BenchDecodeBreaksThePrefillDown) {
  const fs::path json = fs::temp_directory_path() / ("tetra_bench_prefill_" + std::to_string(::getpid()) + ".json");
  const auto r = run_cli("bench decode --model " + kFixture.string() + " --batch 2 --context 48 --steps 3 --profile-steps 1 "
                         "--verbose --json " + json.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill breakdown, batch 2 (eager "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("moe_experts"), std::string::npos) << r.out;
  std::ifstream in(json);
  const auto rows = nlohmann::json::parse(in);
  ASSERT_EQ(rows.size(), 1u);
  const auto& br = rows[0]["prefill_breakdown_ms"];
  // The two prompts' forward: attention, experts and projections all ran, within the eager prefill.
  double ops = 0;
  for (const char* c : {"attention", "moe", "dense GEMMs", "norms/rope", "elementwise", "sampling"}) ops += br[c].get<double>();
  EXPECT_GT(br["attention"].get<double>(), 0);
  EXPECT_GT(br["moe"].get<double>(), 0);
  EXPECT_GT(br["dense GEMMs"].get<double>(), 0);
  EXPECT_LE(ops, rows[0]["prefill_eager_ms"].get<double>());
  fs::remove(json);
}

// bench decode runs a split model as serve does; its floor is rank 0's share: the same for
// every rank count at one token would mean the split was not counted.
TEST(Cli, BenchDecodeRunsASplitModelAndCountsRankZerosBytes) {
  const std::string model = (fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/qwen3_moe-tiny-nvfp4").string();
  const fs::path json = fs::temp_directory_path() / ("tetra_bench_decode_tp_" + std::to_string(::getpid()) + ".json");
  std::map<std::string, double> floor_ms;
  for (const char* split : {"", "--tp 2", "--ep 2", "--tp 2 --ep 2"}) {
    SCOPED_TRACE(split);
    const auto r = run_cli("bench decode --device cpu --model " + model + " --batch 2 --context 16 --steps 3 " +
                           "--profile-steps 0 " + split + " --json " + json.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(json);
    const auto rows = nlohmann::json::parse(in);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_GT(rows[0]["step_ms_median"].get<double>(), 0);
    floor_ms[split] = rows[0]["floor_ms"].get<double>();
  }
  EXPECT_LT(floor_ms["--tp 2"], floor_ms[""]);
  EXPECT_LT(floor_ms["--ep 2"], floor_ms[""]);
  EXPECT_LT(floor_ms["--tp 2 --ep 2"], floor_ms[""]);
  fs::remove(json);
}

TEST(Cli, HfOverridesLoadOnlyTheLayersLeft) {
  for (const char* fixture : {"deepseek_v3-tiny", "deepseek_v3-tiny-nvfp4"}) {
    SCOPED_TRACE(fixture);
    const fs::path src_dir = fs::path(TETRA_SOURCE_DIR) / "tests/fixtures" / fixture;
    // The same checkpoint cut to its first 2 layers by hand: config and tensors.
    const fs::path cut = fs::temp_directory_path() / ("tetra_cli_cut_" + std::to_string(::getpid()));
    fs::remove_all(cut);
    fs::create_directories(cut);
    for (const auto& e : fs::directory_iterator(src_dir))
      if (e.path().filename() != "model.safetensors") fs::copy_file(e.path(), cut / e.path().filename());
    {
      std::ifstream in(src_dir / "config.json");
      auto cfg = nlohmann::json::parse(in);
      ASSERT_EQ(cfg["num_hidden_layers"], 3);
      cfg["num_hidden_layers"] = 2;
      std::ofstream(cut / "config.json") << cfg.dump();
    }
    auto src = Checkpoint::open(src_dir);
    std::vector<TensorDecl> decls;
    for (const auto& name : src->names()) {
      if (name.starts_with("model.layers.2.")) continue;
      TensorView v = src->get(name);
      decls.push_back({name, v.dtype, v.shape});
    }
    ASSERT_LT(decls.size(), src->names().size());
    {
      SafetensorsWriter w(cut / "model.safetensors", decls);
      for (const auto& d : decls) {
        TensorView v = src->get(d.name);
        w.write(d.name, v.data, uint64_t(v.nbytes()));
      }
      w.finish();
    }
    const std::string args = " --prompt-ids 3,1,4,1,5,9,2,6 --max-new-tokens 6 --ignore-eos --json";
    const auto overridden =
        run_cli("generate --model " + src_dir.string() + args + R"( --hf-overrides '{"num_hidden_layers": 2}')");
    const auto by_hand = run_cli("generate --model " + cut.string() + args);
    const auto whole = run_cli("generate --model " + src_dir.string() + args);
    fs::remove_all(cut);
    ASSERT_EQ(overridden.exit_code, 0) << overridden.err;
    ASSERT_EQ(by_hand.exit_code, 0) << by_hand.err;
    const auto got = nlohmann::json::parse(overridden.out), want = nlohmann::json::parse(by_hand.out);
    EXPECT_EQ(got["token_ids"], want["token_ids"]);
    EXPECT_EQ(got["logprobs"], want["logprobs"]);
    EXPECT_EQ(got["fingerprint"], want["fingerprint"]);  // every logit the same
    EXPECT_NE(got["fingerprint"], nlohmann::json::parse(whole.out)["fingerprint"]);  // the third layer counted
  }
}

TEST(Cli, HfOverridesRefusesBadValues) {
  const std::string gen = "generate --model " + kFixture.string() + " --prompt-ids 1,2 --max-new-tokens 1 ";
  expect_clear_error(run_cli(gen + "--hf-overrides '{num_hidden_layers: 2}'"), "--hf-overrides is not valid JSON");
  expect_clear_error(run_cli(gen + "--hf-overrides '[2]'"), "--hf-overrides is an array");
  expect_clear_error(run_cli(gen + R"(--hf-overrides '{"num_hidden_layers": 0}')"),
                     "config.json with --hf-overrides: \"num_hidden_layers\" is 0");
  expect_clear_error(run_cli("inspect --model " + kFixture.string() + R"( --hf-overrides '"six"')"),
                     "--hf-overrides is a string");
  // More layers than the checkpoint holds: the missing tensor is named.
  expect_clear_error(run_cli(gen + R"(--hf-overrides '{"num_hidden_layers": 4}')"), "model.layers.3.");
  // serve checks it before it listens.
  expect_clear_error(run_cli("serve --port 0 --model " + kFixture.string() + R"( --hf-overrides '{"vocab_size": 0}')"),
                     "config.json with --hf-overrides: \"vocab_size\" is 0");
}

// --hf-overrides reaches the quantization config too: the BF16 fixture given the NVFP4
// fixture's quantization_config draws exactly the NVFP4 fixture's dummy model (dummy values
// depend on the tensor's name and format alone).
TEST(Cli, HfOverridesQuantizationConfigWithDummyWeights) {
  const fs::path fixtures = fs::path(TETRA_SOURCE_DIR) / "tests/fixtures";
  std::ifstream in(fixtures / "deepseek_v3-tiny-nvfp4/config.json");
  const nlohmann::json quant = {{"quantization_config", nlohmann::json::parse(in)["quantization_config"]}};
  const std::string args = " --load-format dummy --prompt-ids 3,1,4,1,5 --max-new-tokens 4 --ignore-eos --json";
  const auto overridden = run_cli("generate --model " + (fixtures / "deepseek_v3-tiny").string() + args +
                                  " --hf-overrides '" + quant.dump() + "'");
  const auto nvfp4 = run_cli("generate --model " + (fixtures / "deepseek_v3-tiny-nvfp4").string() + args);
  const auto bf16 = run_cli("generate --model " + (fixtures / "deepseek_v3-tiny").string() + args);
  ASSERT_EQ(overridden.exit_code, 0) << overridden.err;
  ASSERT_EQ(nvfp4.exit_code, 0) << nvfp4.err;
  EXPECT_EQ(nlohmann::json::parse(overridden.out)["fingerprint"], nlohmann::json::parse(nvfp4.out)["fingerprint"]);
  EXPECT_NE(nlohmann::json::parse(overridden.out)["fingerprint"], nlohmann::json::parse(bf16.out)["fingerprint"]);
  // Experts too narrow for NVFP4's 16-value scales are one sentence, not a crash.
  const nlohmann::json narrow = {
      {"quantization_config", {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"ignore", {"lm_head", "*self_attn*", "*mlp.gate"}}}},
      {"moe_intermediate_size", 24}};
  expect_clear_error(run_cli("generate --model " + (fixtures / "deepseek_v3-tiny").string() + args +
                             " --hf-overrides '" + narrow.dump() + "'"),
                     "NVFP4 experts need widths that are multiples of 16");
}

}  // namespace
}  // namespace tetra
