#!/usr/bin/env python3
"""What transformers makes of config.json files, to check formats/model_config against.

Run on the GPU machine (transformers 5.17):
    python3 tools/model_config_ref.py CONFIG [CONFIG...] > ref.json
CONFIG is a config.json, a model folder, or a JSON object mapping names to configs. For each
config it builds the model on the meta device (no memory) and prints the parameter count
(plus e_score_correction_bias buffers, which tetra counts as router weights), the MoE
layers, the DSA indexer layers and the resolved RoPE: the figures model_sizes_test.cpp and
model_config_test.cpp hold.
"""
import json
import os
import sys
import traceback

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def configs_from(path):
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        data = json.load(f)
    if "model_type" in data:
        return {path: data}
    return data


def describe(cfg):
    cfg = dict(cfg)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    bias = sum(b.numel() for n, b in model.named_buffers() if "e_score_correction_bias" in n)
    layers = model.model.layers
    rotary = getattr(model.model, "rotary_emb", None)
    return {
        "params_total": params + bias,
        "moe_layers": [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts")],
        "indexer_layers": [i for i, layer in enumerate(layers)
                           if getattr(layer.self_attn, "indexer", None) is not None],
        "rope_parameters": getattr(config, "rope_parameters", None),
        "rotary_dim": 2 * rotary.inv_freq.numel() if rotary is not None else None,
        "attention_scaling": float(getattr(rotary, "attention_scaling", 1.0)) if rotary is not None else None,
        "head_dim": getattr(config, "head_dim", None),
        "num_key_value_heads": getattr(config, "num_key_value_heads", None),
        "eos_token_id": config.eos_token_id,
        "bos_token_id": config.bos_token_id,
    }


def main():
    out = {"transformers": transformers.__version__}
    for path in sys.argv[1:]:
        for name, cfg in configs_from(path).items():
            try:
                out[name] = describe(cfg)
            except Exception:  # report and go on: one bad config should not hide the others
                out[name] = {"error": traceback.format_exc(limit=3)}
    json.dump(out, sys.stdout, indent=1, default=str)
    print()


if __name__ == "__main__":
    main()
