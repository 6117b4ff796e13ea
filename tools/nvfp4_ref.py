#!/usr/bin/env python3
"""Reference NVFP4 quantizer: ModelOpt's weight export re-stated in numpy, step by step.

`tetra quantize` must write the same bytes; tests/formats/quantize_checkpoint_test.cpp runs
this script on the same BF16 checkpoint and compares every tensor byte for byte.

The steps follow NVIDIA Model Optimizer (modelopt/torch/quantization/qtensor/nvfp4_tensor.py,
NVFP4QTensor, and modelopt/torch/export/quant_utils.py), all in float32:
  1. weight_scale_2 = amax / (6 * 448)             get_weights_scaling_factor_2[_from_quantizer]
     gate_proj/up_proj (Mixtral w1/w3) of one MLP take the larger amax of the two
                                                   preprocess_linear_fusion, sync_moe_gate_up_amax
  2. s = block_amax / f32(6 * weight_scale_2)      get_weights_scaling_factor
     s == 0 -> 1.0; clamp to [2^-9, 448]; cast to E4M3 (round to nearest, ties to even)
                                                   _cast_per_block_scale_to_fp8
  3. q = w / f32(f32(s_e4m3) * weight_scale_2)     quantize: scaled_weight
  4. code = sign(q < 0) << 3 | searchsorted(bounds, |q|, left) + (|q| in {0.75, 1.75, 3.5})
                                                   _cast_fp4
  5. byte = code[2i] | code[2i+1] << 4             quantize: packed_weight
Dequantization is code_value * f32(f32(s_e4m3) * weight_scale_2) (NVFP4QTensor.dequantize).
One deliberate difference: an all-zero tensor (amax 0) has weight_scale_2 = 0, where the torch
formula computes 0/0 and writes NaN scales; here (and in tetra) its block scales are 1.0 and its
codes 0, so it dequantizes to exact zeros.

Usage:
  nvfp4_ref.py checkpoint --model BF16_DIR --out DIR [--input-amax AMAX.json]
  nvfp4_ref.py dequantize --model BF16_DIR --quantized NVFP4_DIR --out DIR
  nvfp4_ref.py selftest
Needs only numpy (Debian's python3-numpy).
"""

import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

E2M1_MAX = np.float32(6.0)
E4M3_MAX = np.float32(448.0)
GLOBAL_DIVISOR = np.float32(6.0 * 448.0)  # 2688, exact
BLOCK = 16
E2M1_BOUNDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                       dtype=np.float32)

# ---------------------------------------------------------------------------------------------
# E4M3 (float8_e4m3fn): value of every code, and f32 -> code with round-to-nearest-even.


def _e4m3_table():
    vals = np.zeros(256, dtype=np.float64)
    for c in range(256):
        e, m = (c >> 3) & 0xF, c & 7
        v = m * 2.0 ** -9 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        if e == 0xF and m == 7:
            v = np.nan
        vals[c] = -v if c & 0x80 else v
    return vals


E4M3_VALUES = _e4m3_table()
_POS_CODES = np.arange(0, 0x7F)           # 0 .. 0x7e: non-negative finite values, increasing
_POS_VALUES = E4M3_VALUES[_POS_CODES]


def e4m3_from_f32(x):
    """Non-negative f32 array -> E4M3 codes, nearest value, ties to the even code.

    Inputs are already clamped to [2^-9, 448], so there is no overflow or sign to handle."""
    x = np.asarray(x, dtype=np.float64)  # exact image of the f32 values
    hi = np.clip(np.searchsorted(_POS_VALUES, x, side="left"), 0, len(_POS_VALUES) - 1)
    lo = np.clip(hi - 1, 0, None)
    d_lo = x - _POS_VALUES[lo]
    d_hi = _POS_VALUES[hi] - x
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (_POS_CODES[hi] % 2 == 0))
    exact = _POS_VALUES[hi] == x
    return np.where(exact | pick_hi, _POS_CODES[hi], _POS_CODES[lo]).astype(np.uint8)


def e4m3_to_f32(codes):
    return E4M3_VALUES[codes].astype(np.float32)


# ---------------------------------------------------------------------------------------------
# NVFP4 of one [N, K] float32 weight.


def global_scale(amax):
    return np.float32(amax) / GLOBAL_DIVISOR                         # step 1


def cast_fp4(q):
    """Step 4, ModelOpt's _cast_fp4 on a float32 array."""
    sign = (q < 0).astype(np.uint8)                                  # -0.0 < 0 is False
    a = np.abs(q)
    ordinal = np.searchsorted(E2M1_BOUNDS, a, side="left").astype(np.uint8)
    odd_tie = np.isin(a, np.array([0.75, 1.75, 3.5], dtype=np.float32)).astype(np.uint8)
    return (sign << 3) + ordinal + odd_tie


def quantize(w, gs):
    """w: float32 [N, K] (K % 16 == 0), gs: float32 weight_scale_2.
    Returns (packed uint8 [N, K/2], block scales uint8 (E4M3) [N, K/16])."""
    n, k = w.shape
    assert k % BLOCK == 0
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    gs = np.float32(gs)
    if gs == 0:  # all-zero tensor: see the module docstring
        scales = np.full((n, k // BLOCK), e4m3_from_f32(np.array([1.0]))[0], dtype=np.uint8)
        return np.zeros((n, k // 2), dtype=np.uint8), scales
    block_amax = np.abs(blocks).max(axis=-1)                         # f32
    s = block_amax / np.float32(E2M1_MAX * gs)                       # step 2, f32 / f32
    s = np.where(s == 0, np.float32(1.0), s)
    s = np.clip(s, np.float32(2.0 ** -9), E4M3_MAX).astype(np.float32)
    scales = e4m3_from_f32(s)
    denom = (e4m3_to_f32(scales) * gs).astype(np.float32)           # step 3
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (blocks / denom[..., None]).astype(np.float32)
    codes = np.where(denom[..., None] == 0, np.uint8(0), cast_fp4(q)).astype(np.uint8)
    codes = codes.reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)  # step 5
    return packed, scales


def dequantize(packed, scales, gs):
    n, half = packed.shape
    codes = np.empty((n, half * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    mult = (e4m3_to_f32(scales) * np.float32(gs)).astype(np.float32)
    vals = E2M1_VALUES[codes].reshape(n, -1, BLOCK) * mult[..., None]
    return vals.reshape(n, half * 2).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# safetensors, enough of it for checkpoints (FORMATS.md §4).

DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4),
          "U8": (np.uint8, 1), "F8_E4M3": (np.uint8, 1), "I32": (np.int32, 4),
          "I64": (np.int64, 8), "F64": (np.float64, 8), "BOOL": (np.uint8, 1),
          "I8": (np.int8, 1), "I16": (np.int16, 2), "U16": (np.uint16, 2)}


class SafetensorsFile:
    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            self.header = json.loads(f.read(n))
        self.offset = 8 + n
        self.meta = self.header.pop("__metadata__", None)
        self.data = np.memmap(path, dtype=np.uint8, mode="r")

    def names(self):
        return sorted(self.header, key=lambda k: self.header[k]["data_offsets"][0])

    def info(self, name):
        h = self.header[name]
        return h["dtype"], list(h["shape"])

    def raw(self, name):
        b, e = self.header[name]["data_offsets"]
        return self.data[self.offset + b:self.offset + e]

    def array(self, name):
        dtype, shape = self.info(name)
        return self.raw(name).view(DTYPES[dtype][0]).reshape(shape)


def to_f32(arr, dtype):
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes). Ordered as the reference writer does."""
    align = {k: v[1] for k, v in DTYPES.items()}
    tensors = sorted(tensors, key=lambda t: (-align[t[1]], t[0]))
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in tensors:
            f.write(data)


def open_checkpoint(folder):
    """{tensor name: SafetensorsFile} and the shard file names in order."""
    index = os.path.join(folder, "model.safetensors.index.json")
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        f = SafetensorsFile(single)
        return {n: f for n in f.header}, ["model.safetensors"]
    with open(index) as fh:
        weight_map = json.load(fh)["weight_map"]
    files, where = {}, {}
    for name, shard in weight_map.items():
        if shard not in files:
            files[shard] = SafetensorsFile(os.path.join(folder, shard))
        where[name] = files[shard]
    return where, sorted(files)


# ---------------------------------------------------------------------------------------------
# Which tensors are quantized: every MLP linear (routed experts, shared experts, dense MLPs;
# Mixtral's block_sparse_moe w1/w2/w3); attention, routers, embeddings, lm_head, norms and
# biases stay; MTP layers (index >= num_hidden_layers) stay whole.

MLP_LINEAR = re.compile(
    r"^(?P<module>.*\.(?:mlp|block_sparse_moe)(?:\.(?:experts\.\d+|shared_experts|shared_expert))?"
    r"\.(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3))\.weight$")
PARTNER = {"gate_proj": "up_proj", "up_proj": "gate_proj", "w1": "w3", "w3": "w1"}
LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def mtp_layer(name, n_layers):
    m = LAYER.match(name)
    return m is not None and int(m.group(1)) >= n_layers


def plan(where, n_layers):
    """Returns (quantized modules {module: partner or None}, unquantized linear modules,
    MTP layer prefixes)."""
    quantized, unquantized, mtp = {}, [], set()
    for name, f in where.items():
        if mtp_layer(name, n_layers):
            mtp.add("model.layers.%d" % int(LAYER.match(name).group(1)))
            continue
        dtype, shape = f.info(name)
        m = MLP_LINEAR.match(name)
        ok = (m is not None and dtype in ("BF16", "F16", "F32") and len(shape) == 2
              and shape[1] > 0 and shape[1] % BLOCK == 0)
        if ok:
            proj = m.group("proj")
            partner = None
            if proj in PARTNER:
                partner = m.group("module")[: -len(proj)] + PARTNER[proj]
            quantized[m.group("module")] = partner
        elif name.endswith(".weight") and len(shape) == 2 and "embed_tokens" not in name:
            unquantized.append(name[: -len(".weight")])
    for module, partner in quantized.items():  # a partner that is not quantized shares nothing
        if partner is not None and partner not in quantized:
            quantized[module] = None
    return quantized, unquantized, sorted(mtp)


def summarize_exclusions(unquantized, quantized):
    """ModelOpt's _prefix_wildcard_summarize_exclude_modules: the shortest `prefix*` at a dot
    (or the pair {prefix, prefix.*}, or the name itself) that matches no quantized module."""
    negative = set()
    for q in quantized:
        negative.add(q)
        for i in range(len(q) + 1):
            negative.add(q[:i] + "*")
    result = set()
    for layer in unquantized:
        candidates = []
        for i, c in enumerate(layer):
            if c == ".":
                candidates.append([layer[:i] + "*"])
                candidates.append([layer[:i], layer[:i] + ".*"])
        candidates.append([layer])
        for wildcards in candidates:
            if any(w in negative for w in wildcards):
                continue
            result.update(wildcards)
            break
    return sorted(result)


def quant_configs(algo, exclude, producer):
    hf = {"producer": producer,
          "quantization": {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": BLOCK,
                           "exclude_modules": exclude}}
    weights = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": BLOCK}
    group = {}
    if algo == "NVFP4":
        group["input_activations"] = dict(weights)
    group["weights"] = weights
    group["targets"] = ["Linear"]
    qc = {"config_groups": {"group_0": group}, "ignore": exclude, "quant_algo": algo,
          "producer": producer, "quant_method": "modelopt"}
    return hf, qc


PRODUCER = {"name": "tetra", "version": "0.1"}


def quantize_checkpoint(src, dst, input_amax=None):
    with open(os.path.join(src, "config.json")) as fh:
        config = json.load(fh)
    n_layers = int(config.get("num_hidden_layers", 1 << 62))
    where, shards = open_checkpoint(src)
    quantized, unquantized, mtp = plan(where, n_layers)

    amax_cache = {}

    def amax(module):
        if module not in amax_cache:
            name = module + ".weight"
            dtype, _ = where[name].info(name)
            amax_cache[module] = np.float32(np.abs(to_f32(where[name].array(name), dtype)).max())
        return amax_cache[module]

    os.makedirs(dst, exist_ok=True)
    per_shard = {s: [] for s in shards}
    weight_map = {}
    for name, f in where.items():
        shard = os.path.basename(f.path)
        dtype, shape = f.info(name)
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module in quantized and not mtp_layer(name, n_layers):
            partner = quantized[module]
            a = amax(module) if partner is None else max(amax(module), amax(partner))
            gs = global_scale(a)
            w = to_f32(f.array(name), dtype)
            packed, scales = quantize(w, gs)
            out = [(name, "U8", packed.shape, packed.tobytes()),
                   (module + ".weight_scale", "F8_E4M3", scales.shape, scales.tobytes()),
                   (module + ".weight_scale_2", "F32", [], np.float32(gs).tobytes())]
            if input_amax is not None:
                x = np.float32(input_amax.get(module, 0.0))
                if partner is not None:
                    x = max(x, np.float32(input_amax.get(partner, 0.0)))
                if x == 0:  # export_amax: a zero amax becomes maxbound (6)
                    x = E2M1_MAX
                out.append((module + ".input_scale", "F32", [],
                            np.float32(x / GLOBAL_DIVISOR).tobytes()))
        else:
            out = [(name, dtype, shape, f.raw(name).tobytes())]
        per_shard[shard].extend(out)
        for t in out:
            weight_map[t[0]] = shard

    total = 0
    for shard, tensors in per_shard.items():
        write_safetensors(os.path.join(dst, shard), tensors, {"format": "pt"})
        total += sum(len(t[3]) for t in tensors)
    if len(shards) > 1 or shards[0] != "model.safetensors":
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": dict(sorted(weight_map.items()))}, fh, indent=2)

    algo = "NVFP4" if input_amax is not None else "W4A16_NVFP4"
    exclude = summarize_exclusions(unquantized, list(quantized)) + [m + "*" for m in mtp]
    hf, qc = quant_configs(algo, exclude, PRODUCER)
    with open(os.path.join(dst, "hf_quant_config.json"), "w") as fh:
        json.dump(hf, fh, indent=4)
    config["quantization_config"] = qc
    with open(os.path.join(dst, "config.json"), "w") as fh:
        json.dump(config, fh, indent=4)
    for entry in os.listdir(src):
        if (entry.endswith(".safetensors") or entry in ("model.safetensors.index.json",
                                                        "config.json", "hf_quant_config.json")
                or entry.startswith(".")):
            continue
        s = os.path.join(src, entry)
        if os.path.isdir(s):
            shutil.copytree(s, os.path.join(dst, entry))
        else:
            shutil.copyfile(s, os.path.join(dst, entry))
    return quantized


def dequantize_checkpoint(src, quantized, dst):
    """The BF16 checkpoint `src` with each weight that `quantized` holds in NVFP4 replaced by its
    F32 dequantization (code value * f32(f32(weight_scale) * weight_scale_2)): the model a
    quantized checkpoint stands for, loadable by any reader of BF16 checkpoints."""
    where_s, _ = open_checkpoint(src)
    where_q, _ = open_checkpoint(quantized)
    tensors = []
    for name, f in where_s.items():
        dtype, shape = f.info(name)
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and module + ".weight_scale_2" in where_q:
            gs = np.float32(where_q[module + ".weight_scale_2"].array(module + ".weight_scale_2"))
            packed = np.asarray(where_q[name].array(name))
            scales = np.asarray(where_q[module + ".weight_scale"].array(module + ".weight_scale"))
            w = dequantize(packed, scales, gs)
            tensors.append((name, "F32", list(w.shape), w.astype(np.float32).tobytes()))
        else:
            tensors.append((name, dtype, shape, f.raw(name).tobytes()))
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), tensors, {"format": "pt"})
    for extra in ("config.json", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copyfile(os.path.join(src, extra), os.path.join(dst, extra))


# ---------------------------------------------------------------------------------------------


def selftest():
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 7.0], dtype=np.float32)
    assert cast_fp4(ties).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 7], cast_fp4(ties)
    assert cast_fp4(-ties).tolist() == [8, 10, 10, 12, 12, 14, 14, 15, 15]
    assert cast_fp4(np.array([-0.0, -0.1, 0.1], dtype=np.float32)).tolist() == [0, 8, 0]
    assert e4m3_from_f32(np.array([448.0, 1.0, 2.0 ** -9, 1.0625, 1.1875])).tolist() == \
        [0x7E, 0x38, 0x01, 0x38, 0x3A]
    w = np.random.default_rng(0).normal(0, 0.02, (4, 64)).astype(np.float32)
    p, s = quantize(w, global_scale(np.abs(w).max()))
    d = dequantize(p, s, global_scale(np.abs(w).max()))
    assert np.abs(d - w).max() < 0.01
    print("nvfp4_ref selftest: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("checkpoint", help="quantize a BF16 checkpoint folder")
    c.add_argument("--model", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--input-amax", help="JSON {module: calibrated input amax}: writes input_scale")
    d = sub.add_parser("dequantize", help="BF16 checkpoint with the NVFP4 weights dequantized (F32)")
    d.add_argument("--model", required=True, help="the BF16 source")
    d.add_argument("--quantized", required=True, help="its NVFP4 checkpoint")
    d.add_argument("--out", required=True)
    sub.add_parser("selftest")
    args = ap.parse_args()
    if args.cmd == "selftest":
        selftest()
        return 0
    if args.cmd == "dequantize":
        dequantize_checkpoint(args.model, args.quantized, args.out)
        return 0
    amax = None
    if args.input_amax:
        with open(args.input_amax) as fh:
            amax = {k: float(v) for k, v in json.load(fh).items()}
    q = quantize_checkpoint(args.model, args.out, amax)
    print("quantized %d linear modules into %s" % (len(q), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
