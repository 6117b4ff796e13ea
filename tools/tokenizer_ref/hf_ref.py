#!/usr/bin/env python3
"""Ids from Hugging Face `tokenizers` itself (run where transformers is installed, e.g. the GPU
machine), to check where the node reference and HF disagree.
usage: hf_ref.py DATA_DIR OUT_DIR   (DATA_DIR as written by scripts/fetch-test-data)
"""
import json
import os
import sys

from tokenizers import Tokenizer


def main():
    data, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(data, "corpus.jsonl"), encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f if line.strip()]
    for model in ["deepseek_v3", "qwen3"]:
        tok = Tokenizer.from_file(os.path.join(data, model, "tokenizer.json"))
        with open(os.path.join(out, f"hf_{model}.jsonl"), "w", encoding="utf-8") as f:
            for text in corpus:
                ids = tok.encode(text, add_special_tokens=False).ids
                f.write(json.dumps({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)}) + "\n")
    import tokenizers
    print("tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
