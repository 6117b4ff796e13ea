#!/usr/bin/env python3
"""A projection, not a measurement: output tok/s of an MLA MoE model (GLM-5, DeepSeek-V3) on N
H200s under random IN/OUT serving at several concurrencies, built from one GPU's measured
efficiency (docs/PERF.md) and a modelled collective. It stands in for issue 15's 8-GPU figures
until machines with several GPUs are lent; docs/PERF.md says what it assumes.

  tools/project_multi_gpu.py tests/fixtures/glm5-nvfp4-config --gpus 8 --concurrency 64,256,1024,2048

Layout (SGLang's --tp N --ep N for these models): attention heads split over the N ranks (q_a,
kv_a and the indexer's key side replicated, as the latent cache is); the dense MLPs split N
ways; the routed experts split N ways by expert (EP), each rank running its experts for every
token, which every rank holds after the attention all-reduce; the shared expert replicated. So
a layer has two all-reduces of [tokens, hidden] BF16 and no all-to-all.

Per decode step of C sequences (each rank):
  bytes = the rank's weights the step touches + the latents and index keys its tokens read
  memory time = bytes / (4.24 TB/s x the measured fraction of the floor at that batch)
  compute time = FLOPs of the step's tokens / (N x the measured prefill rate)
  step = max(memory, compute) + the all-reduces (latency + bytes over NVLink)
Prefill rides on the decode steps (chunked): a step carries C decode tokens and C x IN / OUT
prompt tokens on average, since each request prefills IN tokens over its OUT decode steps.
"""
import argparse
import json
import os
from math import log2

HBM = 4.24e12  # bytes/s, the H200's measured copy rate (docs/PERF.md)
# Fraction of the byte floor one H200 reaches on the GLM-5 6-layer decode step at context
# 4,096, by batch: `tetra bench decode --skip-prefill` (docs/PERF.md, 2026-12-02: 58.5% at 1,
# 59.0% at 16, 57.3% at 64, 36.8% at 256). The earlier 74.2% at 64 and 96.0% at 256 came from
# prefilled dummy runs, whose step times spread 2x from min to max and sat below these.
MEASURED_FLOOR_FRACTION = {1: 0.585, 16: 0.590, 64: 0.573, 256: 0.368}
# Prefill rate: the NVFP4 MoE layer at T = 4,096 ran 276 TFLOP/s and attention prefill 174
# (docs/PERF.md); most prefill FLOPs are the MoE's.
PREFILL_FLOPS = 250e12
# All-reduce over NVLink: a fixed cost per call and the bus rate for its bytes. Modelled, not
# measured here (no machine with several GPUs has been lent): NCCL's published H100/H200 figures
# are about 10 us for small messages and about 450 GB/s of bus bandwidth for large ones.
ALLREDUCE_LATENCY = 10e-6
ALLREDUCE_BUS = 450e9


def floor_fraction(batch):
    points = sorted(MEASURED_FLOOR_FRACTION.items())
    if batch <= points[0][0]:
        return points[0][1]
    for (b0, f0), (b1, f1) in zip(points, points[1:]):
        if batch <= b1:  # linear in log2(batch) between the measured points
            return f0 + (f1 - f0) * (log2(batch) - log2(b0)) / (log2(b1) - log2(b0))
    return points[-1][1]


def layer_shapes(c):
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    q_lora, kv_lora = c.get("q_lora_rank") or 0, c["kv_lora_rank"]
    replicated = (h * q_lora if q_lora else 0) + h * (kv_lora + rope)  # q_a, kv_a
    split = (q_lora or h) * heads * (nope + rope) + kv_lora * heads * (nope + v) + heads * v * h  # q_b, kv_b, o
    if "index_n_heads" in c:  # DSA: wq_b splits with the heads, wk and the head weights do not
        replicated += h * c["index_head_dim"] + h * c["index_n_heads"]
        split += (q_lora or h) * c["index_n_heads"] * c["index_head_dim"]
    expert = 3 * h * c["moe_intermediate_size"] * 9 / 16  # NVFP4: 4 bits and an E4M3 per 16
    return {
        "attn_replicated": replicated * 2,
        "attn_split": split * 2,
        "dense_mlp": 3 * h * c["intermediate_size"] * 2,
        "expert": expert,
        "router": h * c["n_routed_experts"] * 2,
        "latent": (kv_lora + rope) * 2,  # a cached token's latent row, BF16
        "index_key": c.get("index_head_dim", 0) * 2,
    }


def step(c, s, gpus, batch, context, prompt_tokens):
    layers, dense = c["num_hidden_layers"], c.get("first_k_dense_replace", 0)
    moe_layers = layers - dense
    E, k = c["n_routed_experts"], c["num_experts_per_tok"]
    shared = c.get("n_shared_experts", 0)
    tokens = batch + prompt_tokens
    touched_per_rank = E / gpus * (1 - (1 - k / E) ** tokens)
    attended = min(context, c.get("index_topk", context))
    weights = (layers * (s["attn_replicated"] + s["attn_split"] / gpus) + dense * s["dense_mlp"] / gpus
               + moe_layers * ((touched_per_rank + shared) * s["expert"] + s["router"])
               + c["vocab_size"] * c["hidden_size"] * 2 / gpus)  # lm_head split over the vocabulary
    cache = layers * batch * (attended * s["latent"] + (context * s["index_key"] if "index_topk" in c else 0))
    memory = (weights + cache) / (HBM * floor_fraction(batch))
    active = (layers * (s["attn_replicated"] + s["attn_split"]) / 2 + dense * s["dense_mlp"] / 2
              + moe_layers * (k + shared) * 3 * c["hidden_size"] * c["moe_intermediate_size"])
    attn_flops = layers * c["num_attention_heads"] * attended * 2 * (c["kv_lora_rank"] * 2 + c["qk_rope_head_dim"])
    compute = tokens * (2 * active + attn_flops) / (gpus * PREFILL_FLOPS)
    ar_bytes = tokens * c["hidden_size"] * 2
    allreduce = 0.0 if gpus == 1 else 2 * layers * (ALLREDUCE_LATENCY + 2 * (gpus - 1) / gpus * ar_bytes / ALLREDUCE_BUS)
    return max(memory, compute) + allreduce, memory, compute, allreduce, (weights + cache) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a folder with config.json (an MLA MoE model)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--concurrency", default="64,256,1024,2048")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    a = ap.parse_args()
    c = json.load(open(os.path.join(a.model, "config.json")))
    s = layer_shapes(c)
    print("PROJECTION (not measured): %s on %d H200s, --tp %d --ep %d, random %d/%d" %
          (c["model_type"], a.gpus, a.gpus, a.gpus, a.input_len, a.output_len))
    print("%11s %9s %10s %10s %11s %11s %13s" % ("concurrency", "GB/rank", "memory ms", "compute ms",
                                               "allreduce", "step ms", "output tok/s"))
    for conc in map(int, a.concurrency.split(",")):
        context = a.input_len + a.output_len // 2  # mean context of a decoding sequence
        prompt = conc * a.input_len / a.output_len
        total, memory, compute, ar, gb = step(c, s, a.gpus, conc, context, prompt)
        print("%11d %9.1f %10.2f %10.2f %11.2f %11.2f %13.0f" % (conc, gb, memory * 1e3, compute * 1e3,
                                                                ar * 1e3, total * 1e3, conc / total))


if __name__ == "__main__":
    main()
