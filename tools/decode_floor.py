#!/usr/bin/env python3
"""The floor of one decode step of a GQA MoE model: the bytes it must read (every dense weight,
the distinct experts the batch touches under uniform routing, the KV cache of every sequence)
over the H200's 4.24 TB/s (docs/PERF.md). Runs anywhere; reads config.json only.

  tools/decode_floor.py tests/fixtures/qwen3-30b-a3b-config --batch 1,16,64,256 --context 192,1536
"""
import argparse
import json
import os

BANDWIDTH = 4.24e12  # bytes/s, device copy measured on the H200 (docs/PERF.md)


def floor(cfg, batch, context, nvfp4_experts=True):
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    k, inter = cfg["num_experts_per_tok"], cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    attn = h * heads * d * 2 + h * kv * d * 2  # q, o; k, v
    dense = layers * (attn + h * experts) + cfg["vocab_size"] * h  # + router, lm_head
    per_expert = 3 * h * inter * (9 / 16 if nvfp4_experts else 2)
    touched = experts * (1 - (1 - k / experts) ** batch)
    kv_bytes = batch * context * layers * kv * d * 2 * 2
    total = dense * 2 + layers * touched * per_expert + kv_bytes
    return total, total / BANDWIDTH


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a folder with config.json")
    ap.add_argument("--batch", default="1,16,64,256")
    ap.add_argument("--context", default="192,1536", help="mean context of the decoding sequences")
    ap.add_argument("--bf16-experts", action="store_true")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    print("%8s %8s %10s %10s %12s" % ("batch", "context", "GB/step", "floor ms", "floor tok/s"))
    for c in map(int, a.context.split(",")):
        for b in map(int, a.batch.split(",")):
            total, s = floor(cfg, b, c, not a.bf16_experts)
            print("%8d %8d %10.2f %10.3f %12.0f" % (b, c, total / 1e9, s * 1e3, b / s))


if __name__ == "__main__":
    main()
