#!/usr/bin/env bash
# `tetra tokenize` end to end on the official DeepSeek-V3 and Qwen3 tokenizers:
#  --jsonl: every corpus line's ids equal the reference ids (add_special_tokens=False);
#  --text: one string, same check; without --no-add-special-tokens, DeepSeek-V3's BOS first;
#  --chat: the rendered text equals jinja2's and its ids equal the reference ids of that text.
# usage: cli_test.sh TETRA_BINARY SOURCE_DIR
set -euo pipefail
tetra="$1"
root="$2"
data="$root/tests/.cache/tokenizer"
if [[ ! -f "$data/chat_ids_qwen3.jsonl" ]]; then
  echo "missing reference data in $data: run scripts/fetch-test-data" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for model in deepseek_v3 qwen3; do
  "$tetra" tokenize --model "$data/$model" --jsonl "$data/corpus.jsonl" --no-add-special-tokens --json > "$work/ids.jsonl"
  python3 - "$work/ids.jsonl" "$data/ref_$model.jsonl" "$model" <<'PY'
import json, sys
got = [json.loads(l)["ids"] for l in open(sys.argv[1])]
ref = [json.loads(l)["ids"] for l in open(sys.argv[2])]
bad = [i for i, (a, b) in enumerate(zip(got, ref)) if a != b]
assert len(got) == len(ref), f"{len(got)} lines out, {len(ref)} expected"
assert not bad, f"{sys.argv[3]}: {len(bad)} of {len(ref)} lines differ, first at line {bad[0] + 1}"
print(f"{sys.argv[3]}: --jsonl ids match on {len(ref)} lines")
PY
  text=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[200]))' "$data/corpus.jsonl")
  want=$(python3 -c 'import json,sys; print(json.dumps({"ids": json.loads(open(sys.argv[1]).readlines()[200])["ids"]}))' "$data/ref_$model.jsonl")
  got=$("$tetra" tokenize --model "$data/$model" --text "$text" --no-add-special-tokens --json)
  [[ "$got" == "$want" ]] || { echo "$model: --text ids differ: $got vs $want" >&2; exit 1; }
  # By default the tokenizer's own special tokens: DeepSeek-V3's BOS (id 0), none for Qwen3.
  if [[ "$model" == deepseek_v3 ]]; then
    want=$(python3 -c 'import json, sys; print(json.dumps({"ids": [0] + json.loads(sys.argv[1])["ids"]}))' "$want")
  fi
  got=$("$tetra" tokenize --model "$data/$model" --text "$text" --json)
  [[ "$got" == "$want" ]] || { echo "$model: --text ids with special tokens differ: $got vs $want" >&2; exit 1; }
  TETRA_BIN="$tetra" python3 - "$data" "$model" "$root/tools/tokenizer_ref/chat_cases/cases.json" "$work" <<'PY'
import json, subprocess, sys, os
data, model, cases_path, work = sys.argv[1:5]
cases = {c["name"]: c for c in json.load(open(cases_path))}
texts = [json.loads(l) for l in open(os.path.join(data, f"chat_texts_{model}.jsonl"))]
ids = [json.loads(l)["ids"] for l in open(os.path.join(data, f"chat_ids_{model}.jsonl"))]
for row, want_ids in zip(texts, ids):
    path = os.path.join(work, "messages.json")
    json.dump(cases[row["case"]]["messages"], open(path, "w"), ensure_ascii=False)
    out = subprocess.run([os.environ["TETRA_BIN"], "tokenize", "--model",
                          os.path.join(data, model), "--chat", path, "--json"], check=True,
                         capture_output=True, text=True).stdout
    got = json.loads(out)
    assert got["text"] == row["text"], f"{model}/{row['case']}: rendered text differs"
    assert got["ids"] == want_ids, f"{model}/{row['case']}: chat ids differ"
print(f"{model}: --chat text and ids match on {len(texts)} chats")
PY
done
