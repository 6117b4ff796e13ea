#!/usr/bin/env python3
"""Asks Hugging Face tokenizers how its regex engine classifies the code points listed in
src/tokenizer/unicode_delta.inc (new since Unicode 14), through the DeepSeek-V3 and Qwen3
pre-tokenizers. Prints JSON {"cp": class} with class L, M, N, PS or none.
usage: hf_unicode_probe.py DATA_DIR DELTA_INC
"""
import json
import os
import re
import sys

from tokenizers import Tokenizer


def main():
    data, inc = sys.argv[1], sys.argv[2]
    ds = Tokenizer.from_file(os.path.join(data, "deepseek_v3", "tokenizer.json")).pre_tokenizer
    qw = Tokenizer.from_file(os.path.join(data, "qwen3", "tokenizer.json")).pre_tokenizer
    out = {}
    for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)", open(inc).read()):
        for cp in range(int(a, 16), int(b, 16) + 1):
            x = chr(cp)
            q = [p for p, _ in qw.pre_tokenize_str("a" + x)]
            d_sp = [p for p, _ in ds.pre_tokenize_str("a" + x)]
            d_ps = [p for p, _ in ds.pre_tokenize_str("!" + x)]
            if len(q) == 1:
                cls = "L"
            elif len(d_sp) == 1:
                cls = "M"
            elif len(d_ps) == 1:
                cls = "PS"
            else:
                qn = [p for p, _ in qw.pre_tokenize_str(x + "1")]
                cls = "N" if len(qn) == 2 and len([p for p, _ in qw.pre_tokenize_str("!" + x)]) == 2 else "none"
            out[cp] = cls
    print(json.dumps(out))


if __name__ == "__main__":
    main()
