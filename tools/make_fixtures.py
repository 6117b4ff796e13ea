#!/usr/bin/env python3
"""Make tetra's reference fixtures: tiny random MoE checkpoints plus transformers' greedy output.

Runs on the GPU machine (Python 3.12, torch 2.11, transformers 5.17, tokenizers 0.23); all
numerics run on its CPU in float32. For each fixture it writes, under OUT/<name>/:

  config.json, generation_config.json, model.safetensors   as save_pretrained writes them (BF16
                                                            weights; what transformers keeps in
                                                            fp32, e.g. e_score_correction_bias,
                                                            stays F32)
  expected.json      greedy cases computed from the RELOADED checkpoint (dtype float32, eager
                     attention, no KV cache: every step recomputes the whole sequence)
  debug.safetensors  case 0's prompt: hidden_states [L+1,T,H], logits [T,V] and per-layer
                     intermediates, to find the first layer where an engine diverges

qwen3_moe-tiny also gets a trained byte-level BPE tokenizer (tokenizer.json,
tokenizer_config.json) and tokenizer_expected.json.

Usage (on the GPU machine, from the repository root):
  PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --out /tmp/fx [--only NAME,...]
See tests/fixtures/README.md for the exact device command.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import random
import shutil
import sys
import time
import traceback
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

MARGIN_MIN = 0.05  # nats between the top-1 and top-2 log-prob at every greedy step
TOPK_GAP_MIN = 1e-4  # gap at every top-k boundary inside the model (routers, DSA indexer)
MASKED = -1e30  # values at or below this inside a top-k input count as masked out
NEW_TOKENS = [8, 10, 12]  # max_new_tokens of cases 0, 1, 2
MIN_DISTINCT = 4  # distinct generated tokens wanted per case (random models like to repeat)
DEADLINE = {"at": None, "cases_left": 0}  # spreads the prompt-search time over what is left

# Qwen3's pre-tokenizer regex (docs FORMATS.md section 5.1).
QWEN3_SPLIT_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's simple ChatML template; '\n' inside the Jinja string literals is a backslash and an n.
CHAT_TEMPLATE = (
    r"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    r"{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    r"{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    r"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------------
# Fixture definitions
# ----------------------------------------------------------------------------------------------
# kw: config kwargs. layer_kinds: expected 'dense'/'moe' per layer (checked on the built model).
# shapes: state_dict key -> expected shape (checked). prompt_len: (lo, hi) for cases 1-2;
# case 0 uses prompt_len0.

def fixture_specs():
    specs = []
    specs.append(dict(
        name="qwen3_moe-tiny",
        model_type="qwen3_moe",
        tokenizer=True,
        exercises="GQA 4q/2kv, head_dim 24 != hidden/heads, qk-norm, softmax top-2 of 8 with "
                  "norm_topk_prob, mlp_only_layers=[1] (one dense MLP layer), trained BPE tokenizer "
                  "(the README demo model)",
        kw=dict(
            vocab_size=512, hidden_size=64, intermediate_size=72, moe_intermediate_size=24,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[1], attention_bias=False, rms_norm_eps=1e-6,
            max_position_embeddings=4096, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=509, eos_token_id=511,
        ),
        variants=[{"mlp_layer_types": ["sparse", "dense", "sparse"]}],
        layer_kinds=["moe", "dense", "moe"],
        shapes={
            "model.layers.0.self_attn.q_proj.weight": (96, 64),
            "model.layers.0.self_attn.k_proj.weight": (48, 64),
            "model.layers.0.self_attn.o_proj.weight": (64, 96),
            "model.layers.0.self_attn.q_norm.weight": (24,),
            "model.layers.1.mlp.gate_proj.weight": (72, 64),
            "model.layers.0.mlp.gate.weight": (8, 64),
        },
    ))
    specs.append(dict(
        name="qwen3_moe-nonorm",
        model_type="qwen3_moe",
        exercises="norm_topk_prob false (raw softmax weights), q/k/v/o bias, decoder_sparse_step 2 "
                  "(layers 0,2 dense, 1,3 MoE), tied embeddings, odd vocab 300, head_dim 20 with "
                  "hidden 72 / 4 heads, top-3 of 6",
        kw=dict(
            vocab_size=300, hidden_size=72, intermediate_size=56, moe_intermediate_size=32,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=20,
            num_experts=6, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2,
            mlp_only_layers=[], attention_bias=True, rms_norm_eps=1e-6,
            max_position_embeddings=4096, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=0, eos_token_id=1,
        ),
        variants=[{"mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}],
        layer_kinds=["dense", "moe", "dense", "moe"],
        shapes={
            "model.layers.0.self_attn.q_proj.weight": (80, 72),
            "model.layers.0.self_attn.q_proj.bias": (80,),
            "model.layers.0.self_attn.k_proj.bias": (40,),
            "model.layers.0.self_attn.o_proj.bias": (72,),
            "model.layers.0.mlp.gate_proj.weight": (56, 72),
        },
    ))
    specs.append(dict(
        name="glm4_moe-tiny",
        model_type="glm4_moe",
        exercises="GQA with qkv bias (o_proj without), qk-norm, partial RoPE 0.5 of head_dim 32 "
                  "(16 rotary dims, half-split), first_k_dense_replace 1, sigmoid+bias router with "
                  "n_group 2 / topk_group 1, top-3 of 8, 1 shared expert, routed_scaling 2.5",
        kw=dict(
            vocab_size=256, hidden_size=64, intermediate_size=80, moe_intermediate_size=24,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            partial_rotary_factor=0.5, use_qk_norm=True, attention_bias=True,
            first_k_dense_replace=1, n_shared_experts=1, n_routed_experts=8,
            num_experts_per_tok=3, n_group=2, topk_group=1, routed_scaling_factor=2.5,
            norm_topk_prob=True, rms_norm_eps=1e-5, max_position_embeddings=4096,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=0, eos_token_id=1,
        ),
        variants=[{"rope_parameters": {"partial_rotary_factor": 0.5}},
                  {"-partial_rotary_factor": None,
                   "rope_parameters": {"partial_rotary_factor": 0.5}}],
        layer_kinds=["dense", "moe", "moe"],
        shapes={
            "model.layers.0.self_attn.q_proj.weight": (128, 64),
            "model.layers.0.self_attn.q_proj.bias": (128,),
            "model.layers.0.self_attn.k_proj.weight": (64, 64),
            "model.layers.0.self_attn.q_norm.weight": (32,),
            "model.layers.1.mlp.gate.weight": (8, 64),
            "model.layers.1.mlp.gate.e_score_correction_bias": (8,),
            "model.layers.1.mlp.shared_experts.gate_proj.weight": (24, 64),
        },
        rotary_dims=16,
    ))
    specs.append(dict(
        name="mixtral-tiny",
        model_type="mixtral",
        exercises="GQA 4q/2kv with head_dim derived from hidden/heads, softmax top-2 of 8 "
                  "renormalized, no sliding window, w1/w2/w3 expert names",
        kw=dict(
            vocab_size=256, hidden_size=64, intermediate_size=24, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
            num_experts_per_tok=2, sliding_window=None, rms_norm_eps=1e-5,
            max_position_embeddings=4096, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=0, eos_token_id=1,
        ),
        layer_kinds=["moe", "moe", "moe"],
        shapes={
            "model.layers.0.self_attn.q_proj.weight": (64, 64),
            "model.layers.0.self_attn.k_proj.weight": (32, 64),
        },
    ))
    specs.append(dict(
        name="deepseek_v3-tiny",
        model_type="deepseek_v3",
        exercises="MLA with q_lora (48), kv_lora 32, qk 16 nope + 8 rope, v 16, 4 heads, "
                  "interleaved RoPE with YaRN (factor 4, orig 64, beta 32/1, mscale 1/1), "
                  "first_k_dense_replace 1, sigmoid+bias router with n_group 4 / topk_group 2, "
                  "top-4 of 16, 1 shared expert, routed_scaling 2.5",
        kw=dict(
            vocab_size=256, hidden_size=64, intermediate_size=80, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4,
            n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
            first_k_dense_replace=1, rope_interleave=True, attention_bias=False,
            rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                "mscale": 1.0, "mscale_all_dim": 1.0,
            },
            bos_token_id=0, eos_token_id=1,
        ),
        variants=[{"mlp_layer_types": ["dense", "sparse", "sparse"]}],
        layer_kinds=["dense", "moe", "moe"],
        shapes={
            "model.layers.0.self_attn.q_a_proj.weight": (48, 64),
            "model.layers.0.self_attn.q_a_layernorm.weight": (48,),
            "model.layers.0.self_attn.q_b_proj.weight": (96, 48),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (40, 64),
            "model.layers.0.self_attn.kv_a_layernorm.weight": (32,),
            "model.layers.0.self_attn.kv_b_proj.weight": (128, 32),
            "model.layers.0.self_attn.o_proj.weight": (64, 64),
            "model.layers.1.mlp.gate.weight": (16, 64),
            "model.layers.1.mlp.gate.e_score_correction_bias": (16,),
            "model.layers.1.mlp.shared_experts.gate_proj.weight": (16, 64),
        },
    ))
    specs.append(dict(
        name="deepseek_v3-noqlora",
        model_type="deepseek_v3",
        exercises="MLA without q_lora (direct q_proj), hidden 80, qk 12 nope + 8 rope, v 20 "
                  "(v != nope), interleaved RoPE without YaRN, n_group 1, top-2 of 8, 2 shared "
                  "experts (shared width 2 x moe_intermediate)",
        kw=dict(
            vocab_size=256, hidden_size=80, intermediate_size=64, moe_intermediate_size=24,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=None, kv_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8,
            v_head_dim=20, n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2,
            n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            first_k_dense_replace=1, rope_interleave=True, attention_bias=False,
            rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=0, eos_token_id=1,
        ),
        variants=[{"mlp_layer_types": ["dense", "sparse", "sparse"]}],
        layer_kinds=["dense", "moe", "moe"],
        shapes={
            "model.layers.0.self_attn.q_proj.weight": (80, 80),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (32, 80),
            "model.layers.0.self_attn.kv_b_proj.weight": (128, 24),
            "model.layers.0.self_attn.o_proj.weight": (80, 80),
            "model.layers.1.mlp.shared_experts.gate_proj.weight": (48, 80),
        },
    ))
    specs.append(dict(
        name="glm4_moe_lite-tiny",
        model_type="glm4_moe_lite",
        exercises="GLM-4.7-Flash shaped MLA (q_lora 48, kv_lora 32, qk 24 nope + 8 rope, v 32 > "
                  "nope), interleaved RoPE theta 1e6, first layer dense, sigmoid+bias router "
                  "n_group 1, top-4 of 8, 1 shared expert, routed_scaling 1.8",
        kw=dict(
            vocab_size=256, hidden_size=64, intermediate_size=80, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=24, qk_rope_head_dim=8,
            v_head_dim=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=4,
            n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True,
            first_k_dense_replace=1, mlp_layer_types=["dense", "sparse", "sparse"],
            rope_interleave=True, attention_bias=False, rms_norm_eps=1e-5,
            max_position_embeddings=4096, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=0, eos_token_id=1,
        ),
        variants=[{"-first_k_dense_replace": None}],
        layer_kinds=["dense", "moe", "moe"],
        shapes={
            "model.layers.0.self_attn.q_a_proj.weight": (48, 64),
            "model.layers.0.self_attn.q_b_proj.weight": (128, 48),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": (40, 64),
            "model.layers.0.self_attn.kv_b_proj.weight": (224, 32),
            "model.layers.0.self_attn.o_proj.weight": (64, 128),
            "model.layers.1.mlp.gate.e_score_correction_bias": (8,),
        },
    ))
    specs.append(dict(
        name="glm_moe_dsa-tiny",
        model_type="glm_moe_dsa",
        exercises="GLM-5 shaped MLA (q_lora 48, kv_lora 32, qk 24 nope + 8 rope, v 32) with the "
                  "DSA indexer (8 heads x 32, rope part 8, k_norm LayerNorm, top-4 keys: fewer "
                  "than the 10-20 token prompts, so it selects), first layer dense, "
                  "sigmoid+bias router n_group 1, top-3 of 8, 1 shared expert, routed_scaling 2.5",
        kw=dict(
            vocab_size=256, hidden_size=64, intermediate_size=80, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=24, qk_rope_head_dim=8,
            v_head_dim=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3,
            n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            first_k_dense_replace=1, index_n_heads=8, index_head_dim=32, index_topk=4,
            num_nextn_predict_layers=0, rope_interleave=True, attention_bias=False,
            rms_norm_eps=1e-5, max_position_embeddings=4096, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=0, eos_token_id=1,
        ),
        variants=[{"mlp_layer_types": ["dense", "sparse", "sparse"]},
                  {"-num_nextn_predict_layers": None}],
        layer_kinds=["dense", "moe", "moe"],
        shapes={
            "model.layers.0.self_attn.q_a_proj.weight": (48, 64),
            "model.layers.0.self_attn.q_b_proj.weight": (128, 48),
            "model.layers.0.self_attn.kv_b_proj.weight": (224, 32),
            "model.layers.0.self_attn.indexer.wq_b.weight": (256, 48),
            "model.layers.0.self_attn.indexer.wk.weight": (32, 64),
            "model.layers.0.self_attn.indexer.k_norm.weight": (32,),
            "model.layers.0.self_attn.indexer.k_norm.bias": (32,),
            "model.layers.0.self_attn.indexer.weights_proj.weight": (8, 64),
        },
        prompt_len=(10, 20),
        prompt_len0=(14, 20),
    ))
    return specs


# ----------------------------------------------------------------------------------------------
# Tokenizer (qwen3_moe-tiny)
# ----------------------------------------------------------------------------------------------

def training_texts(limit_chars=3_000_000):
    import sysconfig
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "*.py")))
    texts, n = [], 0
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except Exception:
            continue
        texts.append(t)
        n += len(t)
        if n >= limit_chars:
            break
    # a little non-ASCII text so that multi-byte characters appear in training
    texts.append("café naïve résumé Zürich 東京 日本語 Привет мир ½ ¾ € — “quotes” 🙂\n" * 20)
    return texts, root, len(files)


def build_tokenizer(out_dir, vocab_total=512):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    # Qwen's tokenizer.json has add_prefix_space/trim_offsets/use_regex false on all three
    # ByteLevel parts; older tokenizers releases refuse some of these keywords
    def bytelevel(mod, **kw):
        for drop in ([], ["trim_offsets"], ["use_regex", "trim_offsets"],
                     ["add_prefix_space", "use_regex", "trim_offsets"]):
            try:
                return mod.ByteLevel(**{k: v for k, v in kw.items() if k not in drop})
            except TypeError:
                continue
        return mod.ByteLevel()
    flags = dict(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_SPLIT_RE), behavior="isolated", invert=False),
        bytelevel(pre_tokenizers, **flags),
    ])
    tok.decoder = bytelevel(decoders, **flags)
    tok.post_processor = bytelevel(processors, **flags)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_total - len(SPECIALS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    texts, root, nfiles = training_texts()
    tok.train_from_iterator(texts, trainer=trainer)
    n_bpe = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    total = tok.get_vocab_size()
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    log(f"  tokenizer: trained on {sum(map(len, texts))} chars from {root} ({nfiles} .py files "
        f"listed); BPE vocab {n_bpe}, total {total}, specials {ids}")
    if total != vocab_total:
        raise RuntimeError(f"tokenizer size {total} != {vocab_total}")
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    added_decoder = {}
    for s in SPECIALS:
        added_decoder[str(ids[s])] = {
            "content": s, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
    tcfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(tcfg, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    return tok, ids


TOKENIZER_TEXTS = [
    "Hello, world!",
    "def add(a, b):\n    return a + b\n",
    "import os\nprint(os.path.join('a', 'b'))",
    "  leading spaces and trailing   \n\n\tTabs\r\nCRLF",
    "I'm sure you've seen THEY'LL and DON'T.",
    "Numbers: 12345 and 3.14159, 1e-9.",
    "caf\u00e9 vs cafe\u0301 (NFC), na\u00efve, Z\u00fcrich",
    "\u6771\u4eac\u3068\u65e5\u672c\u8a9e, \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
    "emoji \U0001F642\U0001F680 and symbols \u20ac \u00bd \u2014",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <|im_end|>",
    "",
]
CHAT_CASES = [
    {"messages": [{"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Say hi."},
                  {"role": "assistant", "content": "Hi."},
                  {"role": "user", "content": "Again, in caf\u00e9 style \U0001F642"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "def f(x):\n    return x * 2"}],
     "add_generation_prompt": False},
]


def tokenizer_expected(out_dir, tok):
    """Encodings and chat renderings from tokenizers and transformers, for tetra's tokenizer tests."""
    import transformers
    res = {"tokenizers_version": None, "transformers_version": transformers.__version__,
           "encode": [], "chat": [], "notes": []}
    try:
        import tokenizers
        res["tokenizers_version"] = tokenizers.__version__
    except Exception:
        pass
    hf = None
    try:
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(out_dir)
        res["notes"].append(f"AutoTokenizer class: {type(hf).__name__}")
    except Exception as e:  # noqa: BLE001
        res["notes"].append(f"AutoTokenizer failed: {e!r}")
    for text in TOKENIZER_TEXTS:
        enc = tok.encode(text, add_special_tokens=False)
        item = {"text": text, "ids": enc.ids, "tokens": enc.tokens,
                "decoded": tok.decode(enc.ids, skip_special_tokens=False)}
        if hf is not None:
            try:
                hids = hf.encode(text, add_special_tokens=False)
                if hids != enc.ids:
                    item["transformers_ids"] = hids
                    res["notes"].append(f"transformers ids differ for {text!r}")
            except Exception as e:  # noqa: BLE001
                res["notes"].append(f"transformers encode failed for {text!r}: {e!r}")
        res["encode"].append(item)
    for case in CHAT_CASES:
        rendered, how = None, None
        if hf is not None:
            try:
                rendered = hf.apply_chat_template(case["messages"], tokenize=False,
                                                  add_generation_prompt=case["add_generation_prompt"])
                how = "transformers.apply_chat_template"
            except Exception as e:  # noqa: BLE001
                res["notes"].append(f"apply_chat_template failed: {e!r}")
        if rendered is None:
            import jinja2.sandbox
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            rendered = env.from_string(CHAT_TEMPLATE).render(
                messages=case["messages"], add_generation_prompt=case["add_generation_prompt"])
            how = "jinja2 (trim_blocks, lstrip_blocks)"
        ids = tok.encode(rendered, add_special_tokens=False).ids
        res["chat"].append(dict(case, text=rendered, ids=ids, rendered_by=how))
    with open(os.path.join(out_dir, "tokenizer_expected.json"), "w", encoding="utf-8") as fh:
        json.dump(res, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    return res


# ----------------------------------------------------------------------------------------------
# Model building
# ----------------------------------------------------------------------------------------------

def make_config(model_type, kw):
    """AutoConfig.for_model, dropping keyword arguments this transformers version refuses."""
    from transformers import AutoConfig
    kw = dict(kw)
    dropped = []
    for _ in range(len(kw) + 1):
        try:
            return AutoConfig.for_model(model_type, **kw), dropped
        except TypeError as e:
            msg = str(e)
            if "unexpected keyword" not in msg:
                raise
            bad = [k for k in kw if f"'{k}'" in msg or f"`{k}`" in msg]
            if not bad:
                raise
            for k in bad:
                kw.pop(k)
                dropped.append(k)
            log(f"  config refused {bad}: {msg.splitlines()[0][:200]}; retrying without")
    raise RuntimeError("could not build config")


def config_mismatches(cfg, kw):
    """Keys whose value in the built config differs from what was asked (logged, not fatal)."""
    out = []
    for k, want in kw.items():
        have = getattr(cfg, k, "<absent>")
        if isinstance(want, dict) and isinstance(have, dict):
            diff = {kk: (vv, have.get(kk, "<absent>")) for kk, vv in want.items()
                    if have.get(kk, "<absent>") != vv}
            if diff:
                out.append(f"{k}: {diff}")
        elif have != want and not (isinstance(want, list) and list(have or []) == want):
            out.append(f"{k}: asked {want!r}, config has {have!r}")
    return out


def decoder_layers(model):
    base = getattr(model, "model", model)
    return list(base.layers)


def mlp_of(layer):
    for n in ("mlp", "block_sparse_moe", "feed_forward"):
        m = getattr(layer, n, None)
        if m is not None:
            return m
    return None


def layer_kind(layer):
    m = mlp_of(layer)
    if m is None:
        return "none"
    for n, _ in m.named_modules():
        if "expert" in n:
            return "moe"
    return "moe" if hasattr(m, "experts") else "dense"


def find_rotary(model):
    """The model's rotary embedding module (top level, or the first one inside a layer)."""
    rot = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rot is not None and hasattr(rot, "inv_freq"):
        return rot
    for n, m in model.named_modules():
        if n.endswith("rotary_emb") and hasattr(m, "inv_freq"):
            return m
    return None


def tied(model):
    try:
        return model.get_output_embeddings().weight is model.get_input_embeddings().weight
    except Exception:
        return False


def randomize(model, seed, tied_embed):
    """Overwrite every floating tensor of the state dict with seeded random values."""
    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    seen = set()
    mods = dict(model.named_modules())
    summary = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if not torch.is_floating_point(t) or id(t) in seen:
            continue
        seen.add(id(t))
        modname, _, leaf = name.rpartition(".")
        cls = type(mods.get(modname, None)).__name__.lower()
        shape = tuple(t.shape)
        z = torch.randn(shape, generator=g, dtype=torch.float32)
        if "e_score_correction_bias" in name:
            v, kind = 0.1 * z, "bias0.1"
        elif "norm" in cls:
            v, kind = (1.0 + 0.1 * z, "norm") if leaf == "weight" else (0.1 * z, "bias0.1")
        elif leaf.endswith("bias") or t.dim() == 1:
            v, kind = 0.1 * z, "bias0.1"
        elif "embed_tokens" in name:
            std = 0.15 if tied_embed else 1.0
            v, kind = std * z, f"embed{std}"
        elif name.startswith("lm_head"):
            std = 2.0 / math.sqrt(hidden)
            v, kind = std * z, "lm_head"
        elif name.endswith(".gate.weight") and t.dim() == 2:
            v, kind = 0.1 * z, "router0.1"
        else:
            std = min(0.2, max(0.05, 1.0 / math.sqrt(shape[-1])))
            v, kind = std * z, "linear"
        with torch.no_grad():
            t.data.copy_(v.to(t.dtype))
        summary[kind] = summary.get(kind, 0) + t.numel()
    return summary


def check_model(spec, model):
    kinds = [layer_kind(l) for l in decoder_layers(model)]
    if kinds != spec["layer_kinds"]:
        raise RuntimeError(f"layer kinds {kinds} != expected {spec['layer_kinds']}")
    sd = model.state_dict()
    for k, shp in spec.get("shapes", {}).items():
        if k not in sd:
            log(f"  WARNING: shape check key {k} not in the state dict")
        elif tuple(sd[k].shape) != tuple(shp):
            raise RuntimeError(f"{k}: shape {tuple(sd[k].shape)} != expected {tuple(shp)}")
    if spec.get("rotary_dims"):
        rot = find_rotary(model)
        n = rot.inv_freq.numel() * 2 if rot is not None else None
        if n != spec["rotary_dims"]:
            raise RuntimeError(f"rotary dims {n} != expected {spec['rotary_dims']}")
    want_tie = bool(spec["kw"].get("tie_word_embeddings"))
    if want_tie != tied(model):
        raise RuntimeError(f"tie_word_embeddings={want_tie} but tied(model)={tied(model)}")
    return kinds


def patched(kw, patch):
    kw = json.loads(json.dumps(kw))
    for k, v in patch.items():
        if v is None and k.startswith("-"):
            kw.pop(k[1:], None)
        elif isinstance(v, dict) and isinstance(kw.get(k), dict):
            kw[k].update(v)
        else:
            kw[k] = v
    return kw


def build_model(spec, out_dir, seed):
    """Build the model from the spec's kwargs (or the first variant that passes the checks),
    randomize it and save it."""
    import transformers
    from transformers import AutoModelForCausalLM
    attempts = [{}] + list(spec.get("variants", []))
    errors = []
    for patch in attempts:
        kw = patched(spec["kw"], patch)
        try:
            cfg, dropped = make_config(spec["model_type"], kw)
            try:
                model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            except TypeError:
                model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
            model.eval()
            kinds = check_model(spec, model)
            mism = config_mismatches(cfg, {k: v for k, v in kw.items() if k not in dropped})
            for m in mism:
                log(f"  config differs from the request: {m}")
            break
        except Exception as e:  # noqa: BLE001
            errors.append(f"{patch or 'base'}: {type(e).__name__}: {e}")
            log(f"  build attempt {patch or 'base'} failed: {type(e).__name__}: {str(e)[:400]}")
    else:
        raise RuntimeError("no config variant built the expected model: " + " | ".join(errors))
    if patch:
        log(f"  using config variant {patch}")
    tie = tied(model)
    # what transformers keeps in fp32 stays fp32; make sure the router bias is F32 before it
    # gets its random values (from_config in bf16 leaves it bf16 for some families)
    for mname, mod in model.named_modules():
        b = getattr(mod, "e_score_correction_bias", None)
        if torch.is_tensor(b) and b.dtype != torch.float32:
            log(f"  NOTE: {mname}.e_score_correction_bias was {b.dtype}; storing F32")
            if isinstance(b, torch.nn.Parameter):
                mod.e_score_correction_bias = torch.nn.Parameter(b.data.float(), requires_grad=False)
            else:
                mod.e_score_correction_bias = b.data.float()
    rsum = randomize(model, seed, tie)
    non_bf16 = sorted({f"{k}:{str(v.dtype).replace('torch.', '')}"
                       for k, v in model.state_dict().items() if v.dtype != torch.bfloat16})
    os.makedirs(out_dir, exist_ok=True)
    try:
        model.save_pretrained(out_dir, safe_serialization=True)
    except TypeError:
        model.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    return model, cfg, dict(dropped_kwargs=dropped, config_mismatches=mism,
                            layer_kinds=kinds, params=params,
                            tied=tie, init=rsum, non_bf16=non_bf16, variant=patch,
                            build_errors=errors, transformers=transformers.__version__)


def reload_fp32(out_dir, built):
    from transformers import AutoModelForCausalLM
    base = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model = info = None
    for extra in ({"experts_implementation": "eager"}, {}):
        try:
            res = AutoModelForCausalLM.from_pretrained(out_dir, **base, **extra)
            model, info = res if isinstance(res, tuple) else (res, {})
            break
        except Exception as e:  # noqa: BLE001
            log(f"  from_pretrained({extra}) failed: {type(e).__name__}: {str(e)[:300]}")
    if model is None:
        raise RuntimeError("from_pretrained failed")
    model.eval()
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        vals = list((info or {}).get(key, []) or [])
        if key == "missing_keys" and tied(model):
            vals = [v for v in vals if not str(v).startswith("lm_head")]
        if vals:
            problems.append(f"{key}: {vals[:8]}")
    if problems:
        raise RuntimeError("reload problems: " + "; ".join(problems))
    a, b = model.state_dict(), built.state_dict()
    if set(a) != set(b):
        raise RuntimeError(f"state dict keys differ after reload: {sorted(set(a) ^ set(b))[:8]}")
    for k in a:
        if not torch.equal(a[k].float(), b[k].float()):
            raise RuntimeError(f"reloaded tensor {k} differs from the saved one")
        if torch.is_floating_point(a[k]) and a[k].dtype != torch.float32:
            raise RuntimeError(f"reloaded tensor {k} is {a[k].dtype}, not float32")
    impl = {"attn": getattr(model.config, "_attn_implementation", None),
            "experts": getattr(model.config, "_experts_implementation", None)}
    return model, impl


# ----------------------------------------------------------------------------------------------
# Reference computation
# ----------------------------------------------------------------------------------------------

class TopkRecorder:
    """Records every torch.topk / Tensor.topk input during a forward, to check boundary gaps."""

    def __enter__(self):
        self.calls = []
        self._fn, self._m = torch.topk, torch.Tensor.topk
        rec = self

        def parse(args, kwargs):
            x = args[0] if args else kwargs.get("input")
            k = args[1] if len(args) > 1 else kwargs.get("k")
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            largest = args[3] if len(args) > 3 else kwargs.get("largest", True)
            rec.calls.append((x.detach().float().clone(), int(k),
                              -1 if dim is None else int(dim), bool(largest)))

        def fn(*args, **kwargs):
            try:
                parse(args, kwargs)
            except Exception:  # noqa: BLE001
                pass
            return rec._fn(*args, **kwargs)

        def meth(self_, *args, **kwargs):
            try:
                parse((self_,) + args, kwargs)
            except Exception:  # noqa: BLE001
                pass
            return rec._m(self_, *args, **kwargs)

        torch.topk = fn
        torch.Tensor.topk = meth
        return self

    def __exit__(self, *exc):
        torch.topk = self._fn
        torch.Tensor.topk = self._m
        return False

    def min_gap(self):
        """Smallest gap between the k-th and (k+1)-th unmasked value over all rows of all calls."""
        best = float("inf")
        for x, k, dim, largest in self.calls:
            if x.dim() == 0:
                continue
            x = x.movedim(dim, -1)
            n = x.shape[-1]
            if k >= n:
                continue
            x = x.reshape(-1, n)
            if not largest:
                x = -x
            valid = torch.isfinite(x) & (x > MASKED)
            nvalid = valid.sum(-1)
            rows = nvalid > k
            if not rows.any():
                continue
            s = torch.where(valid, x, torch.full_like(x, -float("inf"))).sort(-1, descending=True).values
            gap = (s[:, k - 1] - s[:, k])[rows]
            best = min(best, float(gap.min()))
        return best


def greedy(model, prompt, n_new, eos_ids, abort=True, check_topk=True):
    """Plain greedy loop without a KV cache. Returns a dict; 'ok' is False on a near-tie or EOS."""
    ids = list(prompt)
    out = {"token_ids": [], "logprobs": [], "margins": [], "ok": True, "why": "",
           "min_topk_gap": None}
    for step in range(n_new):
        last = step == n_new - 1
        rec = TopkRecorder() if (check_topk and last) else contextlib.nullcontext()
        with torch.no_grad(), rec:
            logits = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits
        lp = torch.log_softmax(logits[0, -1].float(), dim=-1)
        v, i = torch.topk(lp, 2)
        tok, margin = int(i[0]), float(v[0] - v[1])
        out["token_ids"].append(tok)
        out["logprobs"].append(float(lp[tok]))
        out["margins"].append(margin)
        ids.append(tok)
        if margin < MARGIN_MIN:
            out["ok"], out["why"] = False, f"margin {margin:.4f} at step {step}"
        elif tok in eos_ids:
            out["ok"], out["why"] = False, f"EOS at step {step}"
        if check_topk and last:
            gap = rec.min_gap()
            out["min_topk_gap"] = gap if math.isfinite(gap) else None
            out["topk_calls"] = len(rec.calls)
            if math.isfinite(gap) and gap < TOPK_GAP_MIN and out["ok"]:
                out["ok"], out["why"] = False, f"top-k boundary gap {gap:.2e}"
        if not out["ok"] and abort:
            return out
    out["min_margin"] = min(out["margins"])
    distinct = len(set(out["token_ids"]))
    if out["ok"] and distinct < min(MIN_DISTINCT, n_new):
        out["ok"], out["why"] = False, f"only {distinct} distinct tokens"
    return out


def pick_cases(model, spec, vocab, eos_ids, banned, rng, max_tries, time_budget):
    allowed = [t for t in range(vocab) if t not in banned and t not in eos_ids]
    lo, hi = spec.get("prompt_len", (5, 20))
    lo0, hi0 = spec.get("prompt_len0", (12, 20))
    cases, notes, used = [], [], set()
    for ci, n_new in enumerate(NEW_TOKENS):
        a, b = (lo0, hi0) if ci == 0 else ((lo, 10) if ci == 1 and lo < 10 else (lo, hi))
        best, best_prompt, tries = None, None, 0
        chosen = None
        t_start = time.time()
        budget = time_budget
        if DEADLINE["at"] is not None:
            left_cases = max(1, DEADLINE["cases_left"])
            budget = min(time_budget, max(3.0, (DEADLINE["at"] - t_start) / left_cases))
        DEADLINE["cases_left"] -= 1
        while tries < max_tries and (tries < 3 or time.time() - t_start < budget):
            tries += 1
            prompt = [rng.choice(allowed) for _ in range(rng.randint(a, b))]
            if tuple(prompt) in used:
                continue
            r = greedy(model, prompt, n_new, eos_ids)
            if r["ok"]:
                chosen = (prompt, r)
                break
            score = (len(r["token_ids"]), "top-k" not in r["why"],
                     min(MIN_DISTINCT, len(set(r["token_ids"]))), min(r["margins"]))
            if best is None or score > best:
                best, best_prompt = score, prompt
        if chosen is None:
            if best_prompt is None:
                raise RuntimeError(f"case {ci}: no prompt tried")
            r = greedy(model, best_prompt, n_new, eos_ids, abort=False)
            chosen = (best_prompt, r)
            notes.append(f"case {ci}: no prompt met the criteria in {tries} tries; kept the best "
                         f"({r['why'] or 'ok'})")
        prompt, r = chosen
        used.add(tuple(prompt))
        if "min_margin" not in r:
            r["min_margin"] = min(r["margins"])
        cases.append({
            "prompt_ids": prompt,
            "max_new_tokens": n_new,
            "token_ids": r["token_ids"],
            "logprobs": r["logprobs"],
            "min_margin": r["min_margin"],
            "min_topk_gap": r["min_topk_gap"],
            "tries": tries,
        })
        log(f"  case {ci}: prompt len {len(prompt)}, {tries} tries, min_margin "
            f"{r['min_margin']:.4f}, min_topk_gap {r['min_topk_gap']}, "
            f"topk calls {r.get('topk_calls')} {'' if r['ok'] else 'WEAK: ' + r['why']}")
    return cases, notes


def first_tensor(o):
    if torch.is_tensor(o):
        return o
    if isinstance(o, (tuple, list)) and o and torch.is_tensor(o[0]):
        return o[0]
    return None


def debug_tensors(model, prompt):
    """Forward case 0's prompt once with hooks; returns tensors for debug.safetensors."""
    layers = decoder_layers(model)
    L = len(layers)
    got = {"attn": [None] * L, "mlp": [None] * L, "layer": [None] * L}
    extra = {}
    handles = []

    def hook(kind, i):
        def f(_m, _inp, out):
            t = first_tensor(out)
            if t is not None:
                got[kind][i] = t.detach().float()[0].clone()
        return f

    def hook_extra(key):
        def f(_m, _inp, out):
            t = first_tensor(out)
            if t is not None:
                extra[key] = t.detach().clone()
        return f

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(hook("layer", i)))
        attn = getattr(layer, "self_attn", None)
        if attn is not None:
            handles.append(attn.register_forward_hook(hook("attn", i)))
            idx = getattr(attn, "indexer", None)
            if idx is not None:
                handles.append(idx.register_forward_hook(hook_extra(f"indexer_topk.{i}")))
        mlp = mlp_of(layer)
        if mlp is not None:
            handles.append(mlp.register_forward_hook(hook("mlp", i)))
            gate = getattr(mlp, "gate", None)
            if gate is not None and layer_kind(layer) == "moe":
                handles.append(gate.register_forward_hook(hook_extra(f"router_logits.{i}")))
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        handles.append(norm.register_forward_hook(hook_extra("final_norm")))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=False,
                        output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    T = len(prompt)
    res = {"input_ids": torch.tensor(prompt, dtype=torch.int64),
           "logits": out.logits[0].float().contiguous()}
    hs = getattr(out, "hidden_states", None)
    if hs is not None:
        res["hidden_states"] = torch.stack([h[0].float() for h in hs]).contiguous()
    for kind, key in (("attn", "attn_out"), ("mlp", "mlp_out"), ("layer", "layer_out")):
        if all(t is not None for t in got[kind]):
            res[key] = torch.stack(got[kind]).contiguous()
    for k, t in extra.items():
        if k == "final_norm":
            res[k] = t.float()[0].contiguous()
        elif k.startswith("indexer_topk"):
            res[k] = t.to(torch.int64).reshape(T, -1).contiguous()
        elif torch.is_floating_point(t) and t.numel() % T == 0:
            res[k] = t.float().reshape(T, -1).contiguous()
    return res


def module_facts(model):
    """Numbers read off the loaded modules (eps, attention scaling, RoPE) and a few facts from
    the modeling source, so that the engine's choices can be checked against transformers'."""
    import inspect
    facts = {}
    layers = decoder_layers(model)
    attn = getattr(layers[0], "self_attn", None)
    if attn is not None:
        for a in ("scaling", "head_dim", "qk_head_dim", "num_key_value_groups", "softmax_scale"):
            v = getattr(attn, a, None)
            if isinstance(v, (int, float)):
                facts[f"layer0.self_attn.{a}"] = v
        idx = getattr(attn, "indexer", None)
        if idx is not None:
            for a in ("softmax_scale", "n_heads", "head_dim", "index_topk", "qk_rope_head_dim"):
                v = getattr(idx, a, None)
                if isinstance(v, (int, float)):
                    facts[f"layer0.self_attn.indexer.{a}"] = v
    for n, m in model.named_modules():
        if n.startswith("model.layers.") and not n.startswith("model.layers.0.") and \
                not n.startswith("model.layers.1."):
            continue
        for a in ("variance_epsilon", "eps"):
            v = getattr(m, a, None)
            if isinstance(v, float) and "norm" in type(m).__name__.lower():
                facts[f"{n}.{a}"] = v
    rot = find_rotary(model)
    if rot is not None:
        facts["rotary_emb.attention_scaling"] = float(getattr(rot, "attention_scaling", 1.0))
        facts["rotary_emb.inv_freq"] = [float(x) for x in rot.inv_freq.float()]
    try:
        src = inspect.getsource(sys.modules[type(model).__module__])
        facts["source.mentions_rope_interleave"] = "rope_interleave" in src
        facts["source.defines_apply_rotary_pos_emb_interleave"] = \
            "def apply_rotary_pos_emb_interleave" in src
        fill = None
        if 'masked_fill(~score_mask.bool(), float("-inf"))' in src:
            fill = "-inf"
        elif "masked_fill(~score_mask.bool(), 0.0)" in src:
            fill = "0.0"
        facts["source.group_mask_fill"] = fill
    except Exception as e:  # noqa: BLE001
        facts["source.error"] = repr(e)
    return facts


def eos_list(cfg):
    e = getattr(cfg, "eos_token_id", None)
    if e is None:
        return set()
    return set(e) if isinstance(e, (list, tuple)) else {int(e)}


def make_fixture(spec, out_root, args):
    import transformers
    from safetensors.torch import save_file
    name = spec["name"]
    out_dir = os.path.join(out_root, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    seed = zlib.crc32(name.encode()) ^ args.seed
    banned = set()
    tokinfo = None
    early_notes = []
    if spec.get("tokenizer"):
        vocab = spec["kw"]["vocab_size"]
        try:
            tok, ids = build_tokenizer(out_dir, vocab_total=vocab)
            tokinfo = (tok, ids)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            early_notes.append(f"tokenizer training failed: {type(e).__name__}: {e}")
            ids = {s_: vocab - len(SPECIALS) + i for i, s_ in enumerate(SPECIALS)}
        banned = set(ids.values())
        spec["kw"]["bos_token_id"] = ids["<|endoftext|>"]
        spec["kw"]["eos_token_id"] = ids["<|im_end|>"]
    torch.manual_seed(seed)
    built, cfg, info = build_model(spec, out_dir, seed)
    log(f"  built: {info['params']} params, layers {info['layer_kinds']}, tied={info['tied']}, "
        f"non-bf16 tensors {info['non_bf16']}, dropped kwargs {info['dropped_kwargs']}")
    model, impl = reload_fp32(out_dir, built)
    del built
    log(f"  reloaded fp32: implementations {impl}")
    eos = eos_list(model.config)
    facts = module_facts(model)
    log(f"  facts: { {k: v for k, v in facts.items() if k != 'rotary_emb.inv_freq'} }")
    rng = random.Random(seed)
    cases, notes = pick_cases(model, spec, model.config.vocab_size, eos, banned, rng,
                              args.max_tries, args.time_budget)
    dbg = debug_tensors(model, cases[0]["prompt_ids"])
    save_file(dbg, os.path.join(out_dir, "debug.safetensors"))
    # consistency: the debug logits' last row must give case 0's first token
    notes = early_notes + notes
    if int(dbg["logits"][-1].argmax()) != cases[0]["token_ids"][0]:
        notes.append("CHECK: debug logits' last row disagrees with case 0's first token")
    if tokinfo is not None:
        te = tokenizer_expected(out_dir, tokinfo[0])
        notes += [f"tokenizer: {n}" for n in te["notes"]]
    expected = {
        "fixture": name,
        "model_type": spec["model_type"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "compute_dtype": "float32",
        "device": "cpu",
        "attn_implementation": impl["attn"],
        "experts_implementation": impl["experts"],
        "seed": seed,
        "exercises": spec["exercises"],
        "params": info["params"],
        "layer_kinds": info["layer_kinds"],
        "config_variant": info["variant"],
        "config_kwargs_dropped": info["dropped_kwargs"],
        "config_differs_from_request": info["config_mismatches"],
        "module_facts": facts,
        "f32_tensors": info["non_bf16"],
        "eos_token_ids": sorted(eos),
        "method": "greedy; each step runs the whole sequence with use_cache=False and takes "
                  "log_softmax of the last position's fp32 logits; prompts retried until every "
                  f"step's top1-top2 gap >= {MARGIN_MIN} nats, no EOS is generated, and every "
                  f"top-k inside the model (routers, DSA indexer) has a boundary gap >= "
                  f"{TOPK_GAP_MIN} on the last step's forward",
        "notes": notes,
        "cases": cases,
        "debug": {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in dbg.items()},
    }
    with open(os.path.join(out_dir, "expected.json"), "w", encoding="utf-8") as fh:
        json.dump(expected, fh, indent=1)
        fh.write("\n")
    # list what was saved, for the log
    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        dt = {}
        for k in keys:
            d = str(f.get_slice(k).get_dtype())
            dt[d] = dt.get(d, 0) + 1
        f32 = [k for k in keys if str(f.get_slice(k).get_dtype()) != "BF16"]
    l1 = sorted(k for k in keys if ".layers.1." in k and ".experts." not in k)
    ex = sorted(k for k in keys if ".layers.1." in k and ".experts." in k)
    log(f"  saved {len(keys)} tensors {dt}; non-BF16: {f32}")
    log(f"  layer 1 tensors: {l1}")
    log(f"  layer 1 expert tensors: {len(ex)}, e.g. {ex[:3]}")
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(out_dir, "*")))
    status = "ok"
    if any("no prompt met" in n for n in notes):
        status = "weak"
    if any(n.startswith("CHECK") or n.startswith("tokenizer training failed") for n in notes):
        status = "check"
    return dict(fixture=name, params=info["params"], cases=len(cases),
                min_margin=min(c["min_margin"] for c in cases),
                min_topk_gap=min((c["min_topk_gap"] for c in cases if c["min_topk_gap"] is not None),
                                 default=None),
                bytes=size, status=status)


def dump_sources(dst, model_types):
    """Copy the transformers sources used, for reading (not for committing)."""
    import transformers
    root = os.path.dirname(transformers.__file__)
    os.makedirs(dst, exist_ok=True)
    pats = [f"models/{m}/*.py" for m in model_types] + [
        "modeling_rope_utils.py", "masking_utils.py", "integrations/moe.py", "integrations/sdpa_attention.py",
        "conversion_mapping.py", "core_model_loading.py",
    ]
    for p in pats:
        for f in glob.glob(os.path.join(root, p)):
            rel = os.path.relpath(f, root)
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy(f, os.path.join(dst, rel))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory to write the fixture folders into")
    ap.add_argument("--only", default="", help="comma-separated fixture names")
    ap.add_argument("--seed", type=int, default=0, help="xor-ed into each fixture's seed")
    ap.add_argument("--max-tries", type=int, default=400, help="random prompts tried per case")
    ap.add_argument("--time-budget", type=float, default=20.0, help="seconds of prompt search per case")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=300.0,
                    help="seconds from start by which all prompt searches should end")
    ap.add_argument("--dump-src", default="", help="copy transformers' sources used to this dir")
    args = ap.parse_args()

    import transformers
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        import tokenizers
        tv = tokenizers.__version__
    except Exception:  # noqa: BLE001
        tv = "?"
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, tokenizers {tv}")
    specs = fixture_specs()
    if args.only:
        want = set(args.only.split(","))
        specs = [s for s in specs if s["name"] in want]
    os.makedirs(args.out, exist_ok=True)
    DEADLINE["at"] = time.time() + args.deadline
    DEADLINE["cases_left"] = len(specs) * len(NEW_TOKENS)
    if args.dump_src:
        try:
            dump_sources(args.dump_src, sorted({s["model_type"] for s in fixture_specs()}))
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    rows = []
    for spec in specs:
        log(f"== {spec['name']} ({spec['model_type']})")
        t0 = time.time()
        try:
            row = make_fixture(spec, args.out, args)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            DEADLINE["cases_left"] = len(specs) * len(NEW_TOKENS) - \
                len(NEW_TOKENS) * (len(rows) + 1)
            row = dict(fixture=spec["name"], params=None, cases=0, min_margin=None,
                       min_topk_gap=None, bytes=None, status=f"FAILED: {type(e).__name__}: {e}"[:300])
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        log(f"  -> {row['status']} in {row['seconds']} s")
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
        fh.write("\n")
    log("")
    log(f"{'fixture':22} {'params':>8} {'cases':>5} {'min_margin':>10} {'topk_gap':>9} "
        f"{'bytes':>8} {'sec':>5}  status")
    for r in rows:
        mm = f"{r['min_margin']:.4f}" if r["min_margin"] is not None else "-"
        tg = f"{r['min_topk_gap']:.2e}" if r.get("min_topk_gap") is not None else "-"
        log(f"{r['fixture']:22} {str(r['params']):>8} {r['cases']:>5} {mm:>10} {tg:>9} "
            f"{str(r['bytes']):>8} {r['seconds']:>5}  {r['status']}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
