#!/usr/bin/env bash
# Tokenizer speed, tetra vs @lenml/tokenizers, one core, same text: English (the license texts
# in /usr/share/common-licenses, repeated to ~1 MB) and mixed text (the parity corpus: many
# scripts, code, emoji, whitespace runs). Needs scripts/fetch-test-data and a build dir.
# usage: bench/tokenizer_bench.sh BUILD_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
data="$root/tests/.cache/tokenizer"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for _ in 1 2 3 4; do cat /usr/share/common-licenses/*; done > "$work/english.txt"
python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
text = "\n".join(s for s in lines if len(s) < 2000)
open(sys.argv[2], "w", encoding="utf-8").write(text * 4)
' "$data/corpus.jsonl" "$work/mixed.txt"
for model in qwen3 deepseek_v3; do
  for kind in english mixed; do
    t=$(taskset -c 0 "$build/bench/tokenizer_bench" "$data/$model" "$work/$kind.txt")
    r=$(taskset -c 0 node "$root/tools/tokenizer_ref/encode_ref.js" --bench "$data/$model" "$work/$kind.txt" 2>/dev/null)
    echo "$model $kind tetra=$t reference=$r"
  done
done
