#!/usr/bin/env python3
"""NVFP4 fixtures: the BF16 fixtures quantized as `tetra quantize` does, with transformers'
greedy output on their dequantized weights.

Runs on the GPU machine (torch, transformers 5.17), all numerics on its CPU in float32. For each
BF16 fixture tests/fixtures/NAME it writes OUT/NAME-nvfp4/:

  model.safetensors, config.json, hf_quant_config.json   the W4A16_NVFP4 checkpoint as
        tools/nvfp4_ref.py (and so `tetra quantize`, byte for byte) writes it, tokenizer files
        copied
  expected.json      the BF16 fixture's prompts re-run greedily on the dequantized model, in
                     the BF16 fixture's format (cases: prompt_ids, max_new_tokens, token_ids,
                     logprobs, min_margin, min_topk_gap), plus "quantization": how it was made
                     and the torch cross-check of the reference
  debug.safetensors  case 0 through the dequantized model once (as make_fixtures.py writes it)

The dequantized model: the BF16 checkpoint with every quantized linear's weight replaced by
    W = e2m1(code) * f32(f32(weight_scale) * weight_scale_2)     (ModelOpt's dequantize order)
stored as F32 and loaded with from_pretrained(dtype=float32), so transformers' own loading
(per-expert tensors into its fused expert modules) puts exactly these values in place.

The reference quantizer is also checked against ModelOpt's formula written in torch ops
(torch.searchsorted, .to(torch.float8_e4m3fn)): every packed byte and scale must agree. If the
`modelopt` package is importable, NVFP4QTensor.quantize itself is compared too.

One command, on the GPU machine, from the repository root:
  python3 tools/make_nvfp4_fixtures.py --out $OUT/nvfp4 [--only qwen3_moe-tiny,...]
then unpack OUT/nvfp4/* into tests/fixtures/ (each folder is NAME-nvfp4).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import make_fixtures as mf  # noqa: E402  (greedy, debug_tensors, eos_list, log)
import nvfp4_ref as ref  # noqa: E402

DEFAULT = ["qwen3_moe-tiny", "glm4_moe-tiny", "mixtral-tiny", "qwen3_moe-nonorm",
           "deepseek_v3-tiny", "glm4_moe_lite-tiny", "glm_moe_dsa-tiny", "deepseek_v3-noqlora"]


def torch_modelopt_quantize(w_bf16: torch.Tensor, gs: float):
    """ModelOpt's NVFP4 weight path written in torch ops (nvfp4_tensor.py), for the cross-check."""
    x = w_bf16.float()
    n, k = x.shape
    gs_t = torch.tensor(gs, dtype=torch.float32)
    blocks = x.view(n, k // 16, 16)
    block_amax = blocks.abs().amax(dim=-1).float()
    s = block_amax / (6.0 * gs_t)
    s[s == 0] = 1.0
    s = s.clamp(min=2 ** -9, max=448.0).to(torch.float8_e4m3fn)
    scaled = blocks / (s.to(torch.float32) * gs_t).unsqueeze(-1)
    scaled = scaled.view(n, k)
    sign = (scaled < 0).to(torch.uint8)
    a = scaled.abs()
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    ordinal = torch.searchsorted(bounds, a, out_int32=True).to(torch.uint8)
    odd = torch.any(a.unsqueeze(-1) == bounds[[1, 3, 5]], dim=-1).to(torch.uint8)
    q = (sign << 3) + ordinal + odd
    packed = (q[..., 1::2] << 4) | q[..., 0::2]
    return packed.numpy(), s.view(torch.uint8).numpy()


def modelopt_quantize(w_bf16: torch.Tensor, gs: float):
    """NVFP4QTensor.quantize from the modelopt package, or None when it is not installed."""
    try:
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    except Exception:  # noqa: BLE001
        return None
    qt, scale, _ = NVFP4QTensor.quantize(w_bf16, 16, None,
                                         torch.tensor(gs, dtype=torch.float32))
    return qt._quantized_data.numpy(), scale.view(torch.uint8).numpy()


def cross_check(src_dir, dst_dir):
    """Compares the reference's bytes with the torch formula (and modelopt when present)."""
    where_s, _ = ref.open_checkpoint(src_dir)
    where_d, _ = ref.open_checkpoint(dst_dir)
    n, n_modelopt, bad = 0, 0, []
    for name in sorted(where_d):
        if not name.endswith(".weight_scale_2"):
            continue
        module = name[: -len(".weight_scale_2")]
        gs = float(where_d[name].array(name))
        w = where_s[module + ".weight"]
        dtype, _ = w.info(module + ".weight")
        arr = ref.to_f32(w.array(module + ".weight"), dtype)
        wt = torch.from_numpy(np.ascontiguousarray(arr)).to(torch.bfloat16) \
            if dtype == "BF16" else torch.from_numpy(np.ascontiguousarray(arr))
        packed = np.asarray(where_d[module + ".weight"].array(module + ".weight"))
        scales = np.asarray(where_d[module + ".weight_scale"].array(module + ".weight_scale"))
        if gs == 0:  # all-zero weight: the torch formula writes NaN there (see nvfp4_ref.py)
            continue
        p, s = torch_modelopt_quantize(wt, gs)
        n += 1
        if not (np.array_equal(p, packed) and np.array_equal(s, scales)):
            bad.append(module)
        mo = modelopt_quantize(wt, gs)
        if mo is not None:
            n_modelopt += 1
            if not (np.array_equal(mo[0], packed) and np.array_equal(mo[1], scales)):
                bad.append(module + " (modelopt)")
    return {"modules_checked_against_torch_formula": n,
            "modules_checked_against_modelopt": n_modelopt, "mismatches": bad}


def write_dequantized(src_dir, q_dir, out_dir):
    """The BF16 checkpoint with each quantized weight replaced by its F32 dequantization."""
    ref.dequantize_checkpoint(src_dir, q_dir, out_dir)


def load_fp32(folder):
    from transformers import AutoModelForCausalLM
    base = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    last = None
    for extra in ({"experts_implementation": "eager"}, {}):
        try:
            model, info = AutoModelForCausalLM.from_pretrained(folder, **base, **extra)
            problems = {k: list(v) for k, v in (info or {}).items() if v and k != "missing_keys"}
            missing = [m for m in (info or {}).get("missing_keys", []) or []
                       if not str(m).startswith("lm_head")]
            if problems or missing:
                raise RuntimeError(f"loading problems: {problems} missing {missing[:8]}")
            model.eval()
            return model
        except Exception as e:  # noqa: BLE001
            last = e
            mf.log(f"  from_pretrained({extra}) failed: {type(e).__name__}: {str(e)[:300]}")
    raise RuntimeError(f"from_pretrained failed: {last}")


def check_weights_in_place(model, deq_dir):
    """Every F32 (dequantized) tensor must appear bit-exactly among the model's parameters
    (as a whole parameter or an expert's slice of a fused one)."""
    where, _ = ref.open_checkpoint(deq_dir)
    params = [p.detach() for p in model.state_dict().values() if torch.is_floating_point(p)]
    missing = []
    for name, f in where.items():
        dtype, shape = f.info(name)
        if dtype != "F32" or len(shape) != 2:
            continue
        w = torch.from_numpy(np.ascontiguousarray(f.array(name)))
        found = False
        for p in params:
            if p.dim() == 2 and p.shape == w.shape and torch.equal(p, w):
                found = True
            elif p.dim() == 3:
                # fused experts: [E, out, in] (or [E, in, out]); gate/up may be concatenated
                for cand in (p, p.transpose(1, 2)):
                    if cand.shape[2] != w.shape[1]:
                        continue
                    for e in range(cand.shape[0]):
                        rows = cand[e]
                        for off in range(0, rows.shape[0] - w.shape[0] + 1, w.shape[0]):
                            if torch.equal(rows[off:off + w.shape[0]], w):
                                found = True
                                break
                        if found:
                            break
                    if found:
                        break
            if found:
                break
        if not found:
            missing.append(name)
    return missing


def make_one(name, fixtures, out_root):
    import transformers
    src = os.path.join(fixtures, name)
    dst = os.path.join(out_root, name + "-nvfp4")
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    with open(os.path.join(src, "expected.json")) as fh:
        bf16_expected = json.load(fh)
    quantized = ref.quantize_checkpoint(src, dst)
    for leftover in ("expected.json", "debug.safetensors", "tokenizer_expected.json"):
        p = os.path.join(dst, leftover)
        if os.path.exists(p):
            os.remove(p)
    check = cross_check(src, dst)
    mf.log(f"  quantized {len(quantized)} linears; torch cross-check: {check}")
    if check["mismatches"]:
        raise RuntimeError(f"reference disagrees with the torch formula: {check['mismatches'][:5]}")
    with tempfile.TemporaryDirectory() as tmp:
        write_dequantized(src, dst, tmp)
        model = load_fp32(tmp)
        not_in_place = check_weights_in_place(model, tmp)
    if not_in_place:
        raise RuntimeError(f"dequantized weights not found in the loaded model: {not_in_place[:5]}")
    eos = mf.eos_list(model.config)
    cases = []
    for c in bf16_expected["cases"]:
        r = mf.greedy(model, c["prompt_ids"], c["max_new_tokens"], eos, abort=False)
        cases.append({"prompt_ids": c["prompt_ids"], "max_new_tokens": c["max_new_tokens"],
                      "token_ids": r["token_ids"], "logprobs": r["logprobs"],
                      "min_margin": min(r["margins"]), "min_topk_gap": r["min_topk_gap"],
                      "same_tokens_as_bf16": r["token_ids"] == c["token_ids"]})
        mf.log(f"  case: min_margin {cases[-1]['min_margin']:.4f}, min_topk_gap "
               f"{r['min_topk_gap']}, same tokens as BF16: {cases[-1]['same_tokens_as_bf16']}"
               f"{'' if r['ok'] else ' (' + r['why'] + ')'}")
    dbg = mf.debug_tensors(model, cases[0]["prompt_ids"])
    from safetensors.torch import save_file
    save_file(dbg, os.path.join(dst, "debug.safetensors"))
    notes = [f"case {i}: min_margin {c['min_margin']:.4f} below {mf.MARGIN_MIN}: compare "
             f"logprobs with a tolerance, tokens only up to the near-tie"
             for i, c in enumerate(cases) if c["min_margin"] < mf.MARGIN_MIN]
    expected = {
        "fixture": name + "-nvfp4",
        "model_type": bf16_expected["model_type"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "compute_dtype": "float32",
        "device": "cpu",
        "layer_kinds": bf16_expected.get("layer_kinds"),
        "eos_token_ids": sorted(eos),
        "quantization": {
            "source_fixture": name,
            "quant_algo": "W4A16_NVFP4",
            "quantized_linears": len(quantized),
            "made_by": "tools/nvfp4_ref.py (byte-identical to tetra quantize)",
            "dequantization": "e2m1(code) * f32(f32(weight_scale) * weight_scale_2), float32",
            "reference_check": check,
        },
        "method": "greedy on the BF16 fixture's prompts; the model is the BF16 checkpoint with "
                  "each quantized linear replaced by its dequantized float32 weight, loaded with "
                  "dtype float32 and eager attention; each step runs the whole sequence with "
                  "use_cache=False and takes log_softmax of the last position's logits",
        "notes": notes,
        "cases": cases,
        "debug": {k: [list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in dbg.items()},
    }
    with open(os.path.join(dst, "expected.json"), "w", encoding="utf-8") as fh:
        json.dump(expected, fh, indent=1)
        fh.write("\n")
    return {"fixture": name + "-nvfp4", "quantized": len(quantized),
            "min_margin": min(c["min_margin"] for c in cases),
            "same_tokens_as_bf16": sum(c["same_tokens_as_bf16"] for c in cases),
            "status": "ok" if not notes else "weak"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the NAME-nvfp4 fixture folders")
    ap.add_argument("--fixtures", default="tests/fixtures", help="the BF16 fixtures")
    ap.add_argument("--only", default="", help="comma-separated BF16 fixture names")
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers
    mf.log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
           f"numpy {np.__version__}")
    names = args.only.split(",") if args.only else \
        [n for n in DEFAULT if os.path.exists(os.path.join(args.fixtures, n, "model.safetensors"))]
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name in names:
        mf.log(f"== {name}")
        t0 = time.time()
        try:
            row = make_one(name, args.fixtures, args.out)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            row = {"fixture": name + "-nvfp4", "status": f"FAILED: {type(e).__name__}: {e}"[:300]}
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        mf.log(f"  -> {row['status']} in {row['seconds']} s")
    with open(os.path.join(args.out, "summary.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
        fh.write("\n")
    for r in rows:
        mf.log(json.dumps(r))
    return 0 if all(not r["status"].startswith("FAILED") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
