// Reference ids for tetra's tiktoken.model loader, from the `tiktoken` package (WASM build of
// OpenAI's Rust tiktoken, whose regex engine takes Kimi's pattern as written, class
// intersections included).
// usage: node tiktoken_ref.js --make-fixture OUT_DIR
//   Writes a Kimi-shaped tokenizer folder: tiktoken.model with o200k_base's ranks (Kimi K2's own
//   file is on no package registry) and a tokenizer_config.json naming Kimi's
//   TikTokenTokenizer and Kimi K2's special tokens at their offsets past the base ranks.
// usage: node tiktoken_ref.js MODEL_DIR CORPUS.jsonl OUT.jsonl
//   Each output line is {"ids": [...], "text": decode(ids)}, special tokens in the text
//   encoded as such (Kimi's TikTokenTokenizer.encode default: allowed_special="all").
"use strict";
const fs = require("fs");
const path = require("path");
const { Tiktoken } = require("tiktoken");

// tokenization_kimi.py's pat_str.
const KIMI_PATTERN = [
  String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`,
  String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`,
  String.raw`\s*[\r\n]+`,
  String.raw`\s+(?!\S)`,
  String.raw`\s+`,
].join("|");

// Kimi K2's special tokens, by offset past the base ranks (163584 in Kimi K2).
const KIMI_SPECIALS = {
  0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
  6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
  11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
  14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>", 254: "[UNK]", 255: "[PAD]",
};

function makeFixture(out) {
  const enc = require("tiktoken/encoders/o200k_base.json");
  // The package's compact form: "<ignored> <first rank> <base64> <base64> ..." per line.
  const lines = [];
  for (const l of enc.bpe_ranks.split("\n")) {
    if (!l) continue;
    const [, first, ...tokens] = l.split(" ");
    tokens.forEach((t, i) => lines.push(t + " " + (Number(first) + i)));
  }
  const nBase = lines.length;
  const decoder = {};
  for (const [off, content] of Object.entries(KIMI_SPECIALS))
    decoder[String(nBase + Number(off))] = { content, lstrip: false, normalized: false, rstrip: false,
                                             single_word: false, special: true };
  const config = {
    added_tokens_decoder: decoder,
    auto_map: { AutoTokenizer: ["tokenization_kimi.TikTokenTokenizer", null] },
    bos_token: "[BOS]", eos_token: "[EOS]", pad_token: "[PAD]", unk_token: "[UNK]",
    model_max_length: 1000000000000000019884624838656,
    tokenizer_class: "TikTokenTokenizer",
  };
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, "tiktoken.model"), lines.join("\n") + "\n");
  fs.writeFileSync(path.join(out, "tokenizer_config.json"), JSON.stringify(config, null, 2) + "\n");
}

function load(dir) {
  const bfe = fs.readFileSync(path.join(dir, "tiktoken.model"), "utf8");
  const nBase = bfe.split("\n").filter((l) => l.length > 0).length;
  const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const specials = {};
  for (let id = nBase; id < nBase + 256; ++id) specials[`<|reserved_token_${id}|>`] = id;
  for (const [id, t] of Object.entries(config.added_tokens_decoder || {})) {
    delete specials[`<|reserved_token_${id}|>`];
    specials[t.content] = Number(id);
  }
  return new Tiktoken(bfe, specials, KIMI_PATTERN);
}

const args = process.argv.slice(2);
if (args[0] === "--make-fixture") {
  makeFixture(args[1]);
} else {
  const [dir, corpus, out] = args;
  const tok = load(dir);
  const utf8 = new TextDecoder("utf-8");  // invalid bytes become U+FFFD, as HF's decode does
  const rows = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0).map((l) => {
    const ids = Array.from(tok.encode(JSON.parse(l), "all"));
    return JSON.stringify({ ids, text: utf8.decode(tok.decode(new Uint32Array(ids))) });
  });
  fs.writeFileSync(out, rows.join("\n") + "\n");
}
