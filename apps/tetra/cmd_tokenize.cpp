// tetra tokenize: the ids Hugging Face's tokenizer.encode(text) gives (BOS and the like by
// the tokenizer's own rule, as `tetra generate --prompt` and /v1/completions encode; none with
// --no-add-special-tokens), for one text, a file of JSON strings (one per line), or a chat
// rendered with the model's template (which writes its own BOS).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/json_string.h"
#include "tokenizer/tokenizer.h"

namespace tetra::cli {

namespace {

std::string ids_line(const std::vector<tok::TokenId>& ids, bool json) {
  std::string out = json ? "{\"ids\": [" : "";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += json ? ", " : ",";
    out += std::to_string(ids[i]);
  }
  if (json) out += "]}";
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TETRA_CHECK(in, "cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{"Print the token ids of a text, of each line of a JSONL file, or of a chat"};
  app.option_defaults()->always_capture_default();
  std::string model, text, jsonl, chat;
  bool json = false, add_special = true;
  app.add_option("--model", model, "model folder with tokenizer.json (or tiktoken.model)")->required();
  auto* text_opt = app.add_option("--text", text, "text to tokenize");
  auto* jsonl_opt = app.add_option("--jsonl", jsonl, "file with one JSON string per line");
  auto* chat_opt = app.add_option("--chat", chat, "JSON file with an array of chat messages");
  text_opt->excludes(jsonl_opt)->excludes(chat_opt);
  jsonl_opt->excludes(chat_opt);
  app.add_flag("--json", json, "print JSON objects");
  app.add_flag("!--no-add-special-tokens", add_special,
               "--text and --jsonl: no BOS or other tokens the tokenizer adds (HF's add_special_tokens=False)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!*text_opt && !*jsonl_opt && !*chat_opt) {
    std::fprintf(stderr, "tetra tokenize: give one of --text, --jsonl or --chat\n");
    return 2;
  }

  tok::Tokenizer tokenizer = tok::Tokenizer::load(model);
  if (*text_opt) {
    std::puts(ids_line(tokenizer.encode(text, {.add_special_tokens = add_special}), json).c_str());
  } else if (*jsonl_opt) {
    std::ifstream in(jsonl, std::ios::binary);
    TETRA_CHECK(in, "cannot open ", jsonl);
    std::string line, out;
    size_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      std::string value;
      TETRA_CHECK(tok::parse_json_string(line, value), jsonl, " line ", line_no,
                  " is not one JSON string");
      out = ids_line(tokenizer.encode(value, {.add_special_tokens = add_special}), json);
      out += '\n';
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
  } else {
    nlohmann::ordered_json messages;
    try {
      messages = nlohmann::ordered_json::parse(read_file(chat));
    } catch (const nlohmann::ordered_json::exception& e) {
      fail(chat, " is not valid JSON (", e.what(), ")");
    }
    TETRA_CHECK(messages.is_array(), chat, " does not hold a JSON array of messages");
    tok::ChatRequest request;
    request.messages = messages;
    request.add_generation_prompt = true;
    std::string rendered = tok::render_chat(tokenizer, request);
    std::vector<tok::TokenId> ids = tokenizer.encode(rendered);
    if (json) {
      nlohmann::json out = {{"text", rendered}, {"ids", ids}};
      std::puts(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::puts(rendered.c_str());
      std::puts(ids_line(ids, false).c_str());
    }
  }
  return 0;
}

}  // namespace tetra::cli
