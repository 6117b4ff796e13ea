#!/usr/bin/env python3
"""Train tetra's demo model: a small qwen3_moe (4 layers, hidden 256, 8 experts, top-2, about
8 million parameters) from scratch on the King James Bible, with its own byte-level BPE
tokenizer and a ChatML template, saved as a Hugging Face checkpoint (BF16 safetensors).

Runs on the GPU machine (Python 3, PyTorch with CUDA, the `tokenizers` library that comes with
transformers) in one command, from the repository root:

  PYTHONUNBUFFERED=1 python3 tools/demo_model/train.py --out /tmp/demo

and on a CPU with Debian's python3-torch as a smoke test of the whole script (a tiny config,
the fixture's tokenizer since Debian has no `tokenizers`, a 20-second cap):

  /usr/bin/python3 tools/demo_model/train.py --smoke --device cpu --out /tmp/demo-smoke \\
      --tokenizer tests/fixtures/qwen3_moe-tiny

What it does, in order:
  1. reads tools/demo_model/data/kjv-train.txt.gz and kjv-heldout.txt (prepare_text.sh);
  2. trains a BPE tokenizer on the training text (Qwen2's pre-tokenizer: NFC, its split regex,
     byte level; vocabulary 4096 with <|endoftext|>, <|im_start|>, <|im_end|>) unless
     --tokenizer names a folder with one;
  3. tokenizes the training text whole (as `tetra eval` tokenizes a file) and adds chat turns
     made from it (the user sends a verse, the assistant answers with the verses after it and
     <|im_end|>), so the chat template's replies are text that ends;
  4. trains with AdamW under bf16 autocast on random windows of --seq-len tokens, for at most
     --max-epochs passes over the tokens and at most --minutes of wall clock (whichever comes
     first; the cosine schedule is fitted to the first measured steps), evaluating the held-out
     text in tetra eval's windows and keeping the best weights;
  5. writes OUT/: config.json, generation_config.json, model.safetensors (BF16),
     tokenizer.json, tokenizer_config.json, and train_summary.json;
  6. where transformers can be imported, loads OUT with Qwen3MoeForCausalLM and checks that its
     held-out loss equals this script's own model on the saved weights (the architecture here
     is written out in PyTorch, so a mismatch would show as different numbers).
"""

from __future__ import annotations

import argparse
import json
import gzip
import math
import os
import random
import re
import shutil
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer split (tokenizer.json's Split regex).
QWEN_SPLIT_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The same split for ASCII text in Python's re, which has no \p{..}: the fallback encoder's.
ASCII_SPLIT_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# ChatML without a default system turn. '\n' inside the Jinja string literals is a backslash
# and an n, which Jinja (and tetra's template engine) reads as a newline.
CHAT_TEMPLATE = (
    r"{% for message in messages %}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    r"{% endfor %}"
    r"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def log(*a):
    print(*a, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (created; must not exist unless --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--data", default=os.path.join(HERE, "data"), help="folder of kjv-train.txt.gz, kjv-heldout.txt")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--tokenizer", help="folder with tokenizer.json (+ tokenizer_config.json) to use instead of training one")
    p.add_argument("--smoke", action="store_true", help="tiny config, 20 s, a slice of the text: tests the script")
    p.add_argument("--minutes", type=float, help="wall-clock cap of the training loop (5; --smoke: 1/3)")
    p.add_argument("--max-epochs", type=float, default=30.0, help="passes over the training tokens at most")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--moe-intermediate", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=512, help="training window; also the served context")
    p.add_argument("--batch", type=int, default=32, help="windows per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.1, help="on the attention and MoE outputs, training only")
    p.add_argument("--aux-loss", type=float, default=0.01, help="router load-balancing loss coefficient")
    p.add_argument("--chat-per-chapter", type=int, default=2, help="chat turns made from each chapter")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.minutes is None:
        a.minutes = 20 / 60 if a.smoke else 5.0
    if a.smoke:
        a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim = 64, 2, 4, 2, 16
        a.moe_intermediate, a.seq_len, a.batch = 64, 128, 8
    return a


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte -> printable character map that byte-level BPE tokens are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class PythonBpe:
    """Encodes ASCII text with a byte-level BPE tokenizer.json in plain Python (merges by rank,
    as the tokenizers library does), for machines without that library."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        model = j["model"]
        self.vocab = model["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.added = {t["content"]: t["id"] for t in j.get("added_tokens", [])}
        self.byte_map = bytes_to_unicode()
        self.split = re.compile(ASCII_SPLIT_RE)
        self.cache = {}

    def size(self):
        return max(list(self.vocab.values()) + list(self.added.values())) + 1

    def token_id(self, s):
        return self.added[s]

    def _word(self, w):
        parts = [self.byte_map[b] for b in w.encode("utf-8")]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: self.ranks.get((parts[i], parts[i + 1]), 1 << 60))
            if (parts[best], parts[best + 1]) not in self.ranks:
                break
            pair = (parts[best], parts[best + 1])
            merged, i = [], 0
            while i < len(parts):  # every occurrence of the pair, left to right
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [self.vocab[p] for p in parts]

    def encode(self, text):
        if not text.isascii():
            raise ValueError("the fallback encoder reads ASCII text only")
        ids = []
        for w in self.split.findall(text):
            if w not in self.cache:
                self.cache[w] = self._word(w)
            ids.extend(self.cache[w])
        return ids


class HfBpe:
    def __init__(self, tok):
        self.tok = tok

    def size(self):
        return self.tok.get_vocab_size()

    def token_id(self, s):
        return self.tok.token_to_id(s)

    def encode(self, text):
        return self.tok.encode(text).ids


def train_tokenizer(text, vocab_total, out_dir, context):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()

    # Qwen's tokenizer.json sets add_prefix_space, trim_offsets and use_regex false on its three
    # ByteLevel parts; some releases refuse some of these keywords (tokenizers 0.23's decoder
    # takes none), which then keep their defaults (tools/make_fixtures.py does the same).
    def bytelevel(mod, **kw):
        for drop in ([], ["trim_offsets"], ["use_regex", "trim_offsets"], ["add_prefix_space", "use_regex", "trim_offsets"]):
            try:
                return mod.ByteLevel(**{k: v for k, v in kw.items() if k not in drop})
            except TypeError:
                continue
        return mod.ByteLevel()

    flags = dict(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_RE), behavior="isolated", invert=False),
        bytelevel(pre_tokenizers, **flags),
    ])
    tok.decoder = bytelevel(decoders, **flags)
    tok.post_processor = bytelevel(processors, **flags)
    trainer = trainers.BpeTrainer(vocab_size=vocab_total - len(SPECIALS), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    tcfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                               "single_word": False, "special": True} for s in SPECIALS},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": context,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tcfg, f, indent=2, ensure_ascii=False)
    return HfBpe(tok)


def load_tokenizer(src_dir, out_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src_dir, name)):
            shutil.copy(os.path.join(src_dir, name), os.path.join(out_dir, name))
    try:
        from tokenizers import Tokenizer
        return HfBpe(Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json")))
    except ImportError:
        log("tokenizer: no `tokenizers` library here; encoding with the plain-Python BPE")
        return PythonBpe(os.path.join(out_dir, "tokenizer.json"))


def chat_samples(tok, text, per_chapter, rng):
    """ChatML turns from the text: the user sends a verse, the assistant answers with the next
    one to three verses. Segments are encoded apart, as a rendered template is (special tokens
    split the text)."""
    start, end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    newline = tok.encode("\n")
    ids = []
    for chapter in text.split("\n\n"):
        verses = [v for v in chapter.split("\n") if v]
        if len(verses) < 2:
            continue
        for _ in range(per_chapter):
            i = rng.randrange(len(verses) - 1)
            reply = "\n".join(verses[i + 1:i + 1 + rng.randint(1, 3)])
            ids += [start] + tok.encode("user\n" + verses[i]) + [end] + newline
            ids += [start] + tok.encode("assistant\n" + reply) + [end] + newline
    return ids


# ----------------------------------------------------------------------------------------------
# The model: transformers' Qwen3MoeForCausalLM written out (same parameter names and math)
# ----------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_tables(seq_len, head_dim, theta, device):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.arange(seq_len, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.head_dim, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos[:t].to(q.dtype), sin[:t].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.n_heads // self.n_kv  # kv head j serves query heads j*group .. j*group + group - 1
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1).to(q.dtype)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            scores = (q @ k.transpose(-1, -2)).float() * self.head_dim ** -0.5
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            o = scores.masked_fill(mask, float("-inf")).softmax(-1).to(v.dtype) @ v
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class Experts(nn.Module):
    """The routed experts as stacked weights (saved as experts.{e}.{gate,up,down}_proj.weight)."""

    def __init__(self, c):
        super().__init__()
        e, h, i = c["num_local_experts"], c["hidden_size"], c["moe_intermediate_size"]
        self.gate_proj = nn.Parameter(torch.empty(e, i, h))
        self.up_proj = nn.Parameter(torch.empty(e, i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))


class MoeBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.top_k, self.norm_topk_prob = c["num_experts_per_tok"], c["norm_topk_prob"]
        self.gate = nn.Linear(c["hidden_size"], c["num_local_experts"], bias=False)
        self.experts = Experts(c)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(x).float(), dim=-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(-1, keepdim=True)
        # Every expert runs on every token and the unchosen ones weigh 0: the same output and
        # gradients as a sparse dispatch, in three batched matmuls with no data-dependent shapes.
        combine = torch.zeros_like(probs).scatter(1, top_i, top_w)
        ex = self.experts
        g = torch.einsum("nh,eih->eni", x, ex.gate_proj.to(x.dtype))
        u = torch.einsum("nh,eih->eni", x, ex.up_proj.to(x.dtype))
        y = torch.einsum("eni,ehi->enh", F.silu(g) * u, ex.down_proj.to(x.dtype))
        y = torch.einsum("enh,ne->nh", y, combine.to(y.dtype))
        # Switch-style load balance: experts' share of the assignments times their mean probability.
        assigned = torch.zeros_like(probs).scatter(1, top_i, 1.0).mean(0) / self.top_k
        aux = probs.shape[-1] * (assigned * probs.mean(0)).sum()
        return y.reshape(shape), aux


class DecoderLayer(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MoeBlock(c)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, cos, sin):
        x = x + self.dropout(self.self_attn(self.input_layernorm(x), cos, sin))
        y, aux = self.mlp(self.post_attention_layernorm(x))
        return x + self.dropout(y), aux


class Inner(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c, dropout) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3Moe(nn.Module):
    def __init__(self, c, dropout=0.0):
        super().__init__()
        assert c["tie_word_embeddings"], "this script writes tied embeddings only"
        self.c = c
        self.model = Inner(c, dropout)
        cos, sin = rope_tables(c["max_position_embeddings"], c["head_dim"], c["rope_parameters"]["rope_theta"], "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        std = c["initializer_range"]
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        aux = 0.0
        for layer in self.model.layers:
            x, a = layer(x, self.cos, self.sin)
            aux = aux + a
        x = self.model.norm(x)
        return x @ self.model.embed_tokens.weight.to(x.dtype).t(), aux / len(self.model.layers)

    def hf_tensors(self):
        """name -> tensor under transformers' checkpoint names (per-expert, as published)."""
        out = {}
        for name, p in self.named_parameters():
            if ".mlp.experts." in name:
                prefix, proj = name.rsplit(".", 1)
                for e in range(p.shape[0]):
                    out[f"{prefix}.{e}.{proj}.weight"] = p[e]
            else:
                out[name] = p
        return out

    def load_hf_tensors(self, tensors):
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".mlp.experts." in name:
                    prefix, proj = name.rsplit(".", 1)
                    p.copy_(torch.stack([tensors[f"{prefix}.{e}.{proj}.weight"] for e in range(p.shape[0])]))
                else:
                    p.copy_(tensors[name])


# ----------------------------------------------------------------------------------------------
# safetensors, written and read by hand (the format: u64 header length, JSON header, raw data)
# ----------------------------------------------------------------------------------------------

def bf16_bytes(t):
    # bf16 has no numpy dtype: the same bits as int16.
    return t.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()


def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        data = bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors_bf16(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        assert m["dtype"] == "BF16", name
        b, e = m["data_offsets"]
        raw = torch.frombuffer(bytearray(data[b:e]), dtype=torch.int16)
        out[name] = raw.view(torch.bfloat16).float().reshape(m["shape"])
    return out


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------

def model_config(a, vocab_size, eos, endoftext):
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": endoftext,
        "decoder_sparse_step": 1,
        "dtype": "bfloat16",
        "eos_token_id": eos,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": 4 * a.hidden,  # the dense MLP's; no layer has one
        "max_position_embeddings": a.seq_len,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": a.moe_intermediate,
        "norm_topk_prob": True,
        "num_attention_heads": a.heads,
        "num_experts_per_tok": a.top_k,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "num_local_experts": a.experts,
        "output_router_logits": False,
        "pad_token_id": None,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "transformers_version": "5.17.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }


def eval_windows(ids, window):
    """tetra eval's windows: consecutive, non-overlapping, each predicting its tokens 1 .. n-1."""
    return [ids[i:i + window] for i in range(0, len(ids), window) if len(ids[i:i + window]) >= 2]


@torch.no_grad()
def heldout_loss(model, windows, device, autocast):
    model.eval()
    total, n = 0.0, 0
    for w in windows:
        x = torch.tensor(w, device=device)[None]
        with autocast():
            logits, _ = model(x[:, :-1])
        total += F.cross_entropy(logits.float()[0], x[0, 1:], reduction="sum").item()
        n += len(w) - 1
    model.train()
    return total / n


def lr_at(step, total, warmup, peak):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def main():
    a = parse_args()
    t_start = time.time()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    device = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if os.path.exists(a.out):
        if not a.force:
            sys.exit(f"train: {a.out} exists; pass --force to replace it")
        shutil.rmtree(a.out)
    os.makedirs(a.out)

    with gzip.open(os.path.join(a.data, "kjv-train.txt.gz"), "rt", encoding="utf-8") as f:
        train_text = f.read()
    with open(os.path.join(a.data, "kjv-heldout.txt"), encoding="utf-8") as f:
        heldout_text = f.read()
    if a.smoke:
        train_text, heldout_text = train_text[:200_000], heldout_text[:20_000]
    log(f"text: train {len(train_text):,} chars, held-out {len(heldout_text):,} chars")

    t0 = time.time()
    if a.tokenizer:
        tok = load_tokenizer(a.tokenizer, a.out)
    else:
        tok = train_tokenizer(train_text, a.vocab, a.out, a.seq_len)
    eos, endoftext = tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")
    vocab_size = -(-tok.size() // 64) * 64  # embedding rows: the tokenizer's, rounded up to 64
    train_ids = tok.encode(train_text)
    chat_ids = chat_samples(tok, train_text, a.chat_per_chapter, rng)
    heldout_ids = tok.encode(heldout_text)
    if isinstance(tok, HfBpe):
        # The merges by rank in plain Python encode as tetra does (checked on the fixture's
        # tokenizer); the same ids here mean tetra will read the held-out text as training did.
        same = PythonBpe(os.path.join(a.out, "tokenizer.json")).encode(heldout_text) == heldout_ids
        log(f"tokenizer check: plain-Python BPE {'equals' if same else 'DIFFERS FROM'} tokenizers on the held-out text")
    log(f"tokenizer: {tok.size()} tokens ({'given' if a.tokenizer else 'trained'}), embedding rows {vocab_size}; "
        f"train {len(train_ids):,} tokens + {len(chat_ids):,} in chat turns, held-out {len(heldout_ids):,} "
        f"({len(train_text) / len(train_ids):.2f} chars a token; {time.time() - t0:.1f} s)")

    tcfg_path = os.path.join(a.out, "tokenizer_config.json")
    if a.tokenizer and os.path.exists(tcfg_path):  # a given tokenizer gets this template and context
        with open(tcfg_path, encoding="utf-8") as f:
            tcfg = json.load(f)
        tcfg["chat_template"], tcfg["model_max_length"] = CHAT_TEMPLATE, a.seq_len
        with open(tcfg_path, "w", encoding="utf-8") as f:
            json.dump(tcfg, f, indent=2, ensure_ascii=False)

    c = model_config(a, vocab_size, eos, endoftext)
    model = Qwen3Moe(c, a.dropout).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    n_active = n_params - n_expert + n_expert * a.top_k // a.experts
    log(f"model: {n_params:,} parameters ({n_expert:,} in experts), {n_active:,} active a token; "
        f"{a.layers} layers, hidden {a.hidden}, {a.experts} experts top-{a.top_k}, device {device}")

    data = torch.tensor(train_ids + chat_ids, dtype=torch.long, device=device)
    windows = eval_windows(heldout_ids, a.seq_len)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    use_bf16 = a.device == "cuda"
    def autocast():
        return torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=use_bf16)

    tokens_per_step = a.batch * a.seq_len
    max_steps = max(1, int(a.max_epochs * len(data) / tokens_per_step))
    total_steps, warmup = max_steps, max(1, min(100, max_steps // 20))
    # Speed is measured over steps 5 .. 25, past the first steps' one-time setup (CUDA context,
    # cuBLAS handles), which would make the time cap look closer than it is.
    eval_every, measure_from, measure_at = max(1, max_steps // 40), min(5, max_steps), min(25, max_steps)
    cap_s = a.minutes * 60
    best = (float("inf"), 0, None)
    curve = []
    offsets_hi = len(data) - a.seq_len - 1
    arange = torch.arange(a.seq_len + 1, device=device)
    t_train = time.time()
    step, loss_avg, aux_avg = 0, None, None
    log(f"train: {tokens_per_step:,} tokens a step, at most {max_steps:,} steps ({a.max_epochs:g} epochs) "
        f"and {cap_s:.0f} s")
    t_measure = t_train
    while step < total_steps:
        if step in (measure_from, measure_at) and a.device == "cuda":
            torch.cuda.synchronize()
        if step == measure_from:
            t_measure = time.time()
        if step == measure_at and measure_at > measure_from:
            # Fit the schedule to the time cap from the measured speed.
            per_step = (time.time() - t_measure) / (measure_at - measure_from)
            by_time = step + int((cap_s - (time.time() - t_train)) / per_step)
            total_steps = max(step + 1, min(max_steps, by_time))
            warmup = max(1, min(warmup, total_steps // 20))
            eval_every = max(1, total_steps // 40)
            log(f"train: {per_step * 1000:.1f} ms a step; running {total_steps:,} steps "
                f"({total_steps * tokens_per_step / len(data):.1f} epochs, about {total_steps * per_step:.0f} s)")
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, warmup, a.lr)
        starts = torch.randint(0, offsets_hi, (a.batch,), device=device)
        batch = data[starts[:, None] + arange]
        with autocast():
            logits, aux = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + a.aux_loss * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        lv, av = loss.item(), float(aux)
        loss_avg = lv if loss_avg is None else 0.95 * loss_avg + 0.05 * lv
        aux_avg = av if aux_avg is None else 0.95 * aux_avg + 0.05 * av
        out_of_time = time.time() - t_train > cap_s
        if step % eval_every == 0 or step == total_steps or out_of_time:
            h = heldout_loss(model, windows, device, autocast)
            curve.append({"step": step, "seconds": round(time.time() - t_train, 1), "train_loss": round(loss_avg, 4),
                          "heldout_loss": round(h, 4)})
            mark = ""
            if h < best[0]:
                best = (h, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
                mark = " *"
            log(f"step {step:6d}  {time.time() - t_train:6.1f} s  lr {opt.param_groups[0]['lr']:.2e}  "
                f"train {loss_avg:.3f}  held-out {h:.3f} (ppl {math.exp(h):.2f})  aux {aux_avg:.3f}{mark}")
        if out_of_time:
            log(f"train: the {a.minutes:g}-minute cap ends training at step {step}")
            break
    train_s = time.time() - t_train

    model.load_state_dict(best[2])
    tensors = model.hf_tensors()
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    gen = {"bos_token_id": endoftext, "eos_token_id": [eos, endoftext], "do_sample": True, "temperature": 0.8,
           "top_p": 0.95, "top_k": 50, "repetition_penalty": 1.1, "transformers_version": "5.17.0"}
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)

    # The saved (BF16-rounded) weights, reloaded and scored in fp32 as tetra's CPU backend would
    # (no TF32 from here on, so the transformers check below compares fp32 with fp32).
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    saved = Qwen3Moe(c).to(device)
    saved.load_hf_tensors({k: v.to(device) for k, v in read_safetensors_bf16(os.path.join(a.out, "model.safetensors")).items()})
    saved_loss = heldout_loss(saved, windows, device, lambda: torch.autocast(device_type=a.device, enabled=False))
    summary = {
        "parameters": n_params, "expert_parameters": n_expert, "active_parameters": n_active,
        "train_tokens": len(train_ids), "chat_tokens": len(chat_ids), "heldout_tokens": len(heldout_ids),
        "steps": step, "best_step": best[1], "epochs": round(step * tokens_per_step / len(data), 2),
        "train_seconds": round(train_s, 1), "total_seconds": round(time.time() - t_start, 1),
        "heldout_loss_best": round(best[0], 4), "heldout_ppl_best": round(math.exp(best[0]), 3),
        "heldout_loss_saved_fp32": round(saved_loss, 4), "heldout_ppl_saved_fp32": round(math.exp(saved_loss), 3),
        "eval_window": a.seq_len, "curve": curve, "args": vars(a),
    }
    check = transformers_check(a.out, windows[:8], saved, device)
    if check:
        summary["transformers_check"] = check
    with open(os.path.join(a.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    log("")
    log(f"summary: {step} steps in {train_s:.0f} s ({summary['epochs']} epochs), best at step {best[1]}")
    log(f"summary: held-out loss {best[0]:.4f} (ppl {math.exp(best[0]):.2f}) during training; saved BF16 "
        f"weights in fp32: {saved_loss:.4f} (ppl {math.exp(saved_loss):.2f}); tetra eval --window {a.seq_len} "
        f"should print about this perplexity")
    for name in sorted(os.listdir(a.out)):
        log(f"summary: {os.path.join(a.out, name)}  {os.path.getsize(os.path.join(a.out, name)):,} bytes")
    log(f"summary: {time.time() - t_start:.0f} s in all")


def transformers_check(out_dir, windows, model, device):
    """Held-out loss of OUT under transformers' own Qwen3MoeForCausalLM against this script's."""
    try:
        from transformers import AutoModelForCausalLM
    except Exception as e:  # not installed here: nothing to check against
        log(f"transformers check: skipped ({type(e).__name__}: {e})")
        return None
    try:
        hf = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
        ours = theirs = 0.0
        n = 0
        with torch.no_grad():
            for w in windows:
                x = torch.tensor(w, device=device)[None]
                lo, _ = model(x[:, :-1])
                lt = hf(x[:, :-1]).logits
                ours += F.cross_entropy(lo.float()[0], x[0, 1:], reduction="sum").item()
                theirs += F.cross_entropy(lt.float()[0], x[0, 1:], reduction="sum").item()
                n += len(w) - 1
        ours, theirs = ours / n, theirs / n
        ok = abs(ours - theirs) < 1e-3
        log(f"transformers check: held-out loss here {ours:.5f}, transformers {theirs:.5f}: "
            f"{'the same model' if ok else 'DIFFERENT: the checkpoint does not mean what this script trained'}")
        return {"ours": ours, "transformers": theirs, "same": ok}
    except Exception as e:
        log(f"transformers check: failed ({type(e).__name__}: {e}); the checkpoint is written all the same")
        return {"error": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    main()
