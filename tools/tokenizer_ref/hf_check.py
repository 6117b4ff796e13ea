#!/usr/bin/env python3
"""Checks the reference data against Hugging Face itself (run where transformers is installed,
e.g. the GPU machine): corpus ids from `tokenizers` versus the node reference, and chat renders
from transformers' apply_chat_template versus render_chat.py's jinja2 setup.
usage: hf_check.py DATA_DIR CASES_DIR   (DATA_DIR as written by scripts/fetch-test-data)
"""
import json
import os
import sys

import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer


def main():
    data, cases_dir = sys.argv[1], sys.argv[2]
    corpus = [json.loads(l) for l in open(os.path.join(data, "corpus.jsonl"), encoding="utf-8")]
    for model in ["deepseek_v3", "qwen3"]:
        tok = Tokenizer.from_file(os.path.join(data, model, "tokenizer.json"))
        ref = [json.loads(l)["ids"] for l in open(os.path.join(data, f"ref_{model}.jsonl"))]
        bad = [i for i, t in enumerate(corpus) if tok.encode(t, add_special_tokens=False).ids != ref[i]]
        print(f"ids {model}: {len(corpus)} strings, {len(bad)} differ from HF tokenizers", bad[:5])
    cases = {c["name"]: c for c in json.load(open(os.path.join(cases_dir, "cases.json"), encoding="utf-8"))}
    sources = {name: open(os.path.join(cases_dir, name + ".jinja"), encoding="utf-8").read()
               for name in ["glm_style", "features", "glm46", "kimi_k2_thinking"]}
    own_tokens = {"glm_style", "features"}  # the published templates use neither bos nor eos
    toks = {m: AutoTokenizer.from_pretrained(os.path.join(data, m)) for m in ["deepseek_v3", "qwen3"]}
    n = bad = 0
    for line in open(os.path.join(data, "chat_ref.jsonl"), encoding="utf-8"):
        row = json.loads(line)
        if "text" not in row:
            continue
        c = cases[row["case"]]
        tname = row["template"]
        tok = toks.get(tname, toks["qwen3"])
        kwargs = {}
        if "enable_thinking" in c:
            kwargs["enable_thinking"] = c["enable_thinking"]
        if tname in sources:
            kwargs["chat_template"] = sources[tname]
            if tname in own_tokens:
                kwargs["bos_token"], kwargs["eos_token"] = "<s>", "</s>"
        kwargs.update(c.get("extra", {}))
        try:
            text = tok.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False,
                                           add_generation_prompt=c.get("add_generation_prompt", True), **kwargs)
        except Exception as e:
            text = f"<error {e}>"
        n += 1
        if text != row["text"]:
            bad += 1
            print("differs:", tname, row["case"], repr(text[:200]), repr(row["text"][:200]))
    print(f"chat: {n} renders, {bad} differ from transformers {transformers.__version__} apply_chat_template")


if __name__ == "__main__":
    main()
