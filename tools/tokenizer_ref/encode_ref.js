// Reference ids from @lenml/tokenizers (a port of transformers.js) for tetra's parity tests.
// usage: node encode_ref.js MODEL_DIR CORPUS.jsonl OUT.jsonl
//   Each corpus line is one JSON string; each output line is {"ids": [...], "text": decode(ids)}:
//   tokenizer.encode(text, add_special_tokens=False) and its decode.
// usage: node encode_ref.js --bench MODEL_DIR TEXT_FILE   prints MB/s of encoding the file.
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

function load(dir) {
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

const args = process.argv.slice(2);
if (args[0] === "--bench") {
  const tok = load(args[1]);
  const text = fs.readFileSync(args[2], "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  // Encode line by line, as a server encodes prompts, so the cache sees realistic reuse.
  const lines = text.split(/(?<=\n)/);
  tok.encode(lines.slice(0, 100).join(""), { add_special_tokens: false });  // warm-up
  // CPU time (user + system) of the process: on a shared machine wall time measures the
  // neighbours too. Node's helper threads add little during a synchronous loop.
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  let n = 0;
  for (const line of lines) n += tok.encode(line, { add_special_tokens: false }).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  const c = process.cpuUsage(c0);
  const cpu = (c.user + c.system) / 1e6;
  console.log(JSON.stringify({ bytes, tokens: n, cpu_seconds: cpu, mb_per_cpu_s: bytes / 1e6 / cpu, wall_mb_per_s: bytes / 1e6 / s }));
} else {
  const [dir, corpus, out] = args;
  const tok = load(dir);
  const lines = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.length > 0);
  const rows = lines.map((l) => {
    const text = JSON.parse(l);
    const ids = tok.encode(text, { add_special_tokens: false });
    return JSON.stringify({ ids, text: ids.length ? tok.decode(ids) : "" });
  });
  fs.writeFileSync(out, rows.join("\n") + "\n");
}
