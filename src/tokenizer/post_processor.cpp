#include "tokenizer/post_processor.h"

#include <string>

#include "core/error.h"

namespace tetra::tok {
namespace {

using nlohmann::json;

// {"SpecialToken": {"id": "<s>"}} -> that token's ids from the `special_tokens` map.
void append_template_token(const json& item, const json& specials, const std::string& source,
                           std::vector<TokenId>& out) {
  const std::string name = item.at("SpecialToken").at("id").get<std::string>();
  const auto it = specials.find(name);
  TETRA_CHECK(it != specials.end(), source, ": post_processor template names special token '", name,
              "' that its special_tokens do not define");
  for (const json& id : it->at("ids")) out.push_back(id.get<TokenId>());
}

void parse_into(const json& j, const std::string& source, SpecialTokenWrap& w) {
  if (j.is_null()) return;
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) parse_into(p, source, w);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& specials = j.value("special_tokens", json::object());
    bool after = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      append_template_token(item, specials, source, after ? w.suffix : w.prefix);
    }
    TETRA_CHECK(after, source, ": post_processor's single template has no Sequence");
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // "cls": ["<s>", 0], "sep": ["</s>", 2]
    w.prefix.push_back(j.at("cls").at(1).get<TokenId>());
    w.suffix.push_back(j.at("sep").at(1).get<TokenId>());
    return;
  }
  fail(source, ": post_processor type '", type, "' is not supported");
}

}  // namespace

SpecialTokenWrap parse_post_processor(const json& j, const std::string& source) {
  SpecialTokenWrap w;
  try {
    parse_into(j, source, w);
  } catch (const json::exception& e) {
    fail(source, ": post_processor has an unexpected structure (", e.what(), ")");
  }
  return w;
}

}  // namespace tetra::tok
