// Parses one JSON string literal (the whole line, whitespace around allowed) into UTF-8.
// Unlike a strict parser it keeps going on what real clients send: a lone surrogate escape
// (\ud800) becomes U+FFFD, and raw bytes are passed through for the encoder to repair.
#pragma once

#include <string>
#include <string_view>

namespace tetra::tok {

bool parse_json_string(std::string_view text, std::string& out);

}  // namespace tetra::tok
