#!/usr/bin/python3
"""Writes a small random checkpoint (config.json + safetensors) in the layout of model/README.md,
with the tiny sizes of MODEL.md §3, for both architectures.

Only for testing the NumPy reference (ref_forward.py) on its own; the C++ tests use the engine's
`shoal mkmodel`.  Not bit-compatible with it (different random streams).

  make_test_checkpoint.py --arch shoal_flash|deepseek_v3 --out DIR [--seed N] [--dtype f32|bf16|fp8]
                          [--shards K] [--set key=json_value ...]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_forward import E4M3_TABLE  # noqa: E402


def tiny_config(arch):
    """MODEL.md §3 tiny sizes; intermediate sizes and conf_head_hidden are this script's choice."""
    cfg = dict(model_type=arch, architectures=["DeepseekV3ForCausalLM"], vocab_size=300,
               hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
               num_attention_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
               qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=16, n_shared_experts=1,
               num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5,
               scoring_func="sigmoid", topk_method="noaux_tc", norm_topk_prob=True,
               rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=512,
               rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=128,
                                 beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
               first_k_dense_replace=1, num_hidden_layers=4, num_nextn_predict_layers=1,
               bos_token_id=256, eos_token_id=257, tie_word_embeddings=False)
    if arch == "shoal_flash":
        cfg.update(q_lora_rank=0, n_encoder_layers=2, n_decoder_layers=2, sliding_window=16,
                   compress_ratio=4, block_size=16, swa_mode="exact", retained_tokens=20,
                   replay_tokens=16, attn_sink=True, conf_head_hidden=16)
    return cfg


class Weights:
    """Deterministic random tensors; linear weights ~ N(0, 1/in), norms ~ 1 + N(0, 0.1)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.t = {}

    def lin(self, name, out_dim, in_dim):
        self.t[name] = self.rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)

    def norm(self, name, dim):
        self.t[name] = 1.0 + 0.1 * self.rng.standard_normal(dim)

    def vec(self, name, dim, std):
        self.t[name] = std * self.rng.standard_normal(dim)


def add_attention(w, c, p, layer_kind):
    """layer_kind: 'enc' (has kv_compress), 'dec' or 'plain'."""
    d, H = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    r = c["kv_lora_rank"]
    if c["q_lora_rank"] > 0:
        w.lin(p + "q_a_proj.weight", c["q_lora_rank"], d)
        w.norm(p + "q_a_layernorm.weight", c["q_lora_rank"])
        w.lin(p + "q_b_proj.weight", H * qk, c["q_lora_rank"])
    else:
        w.lin(p + "q_proj.weight", H * qk, d)
    w.lin(p + "kv_a_proj_with_mqa.weight", r + c["qk_rope_head_dim"], d)
    w.norm(p + "kv_a_layernorm.weight", r)
    w.lin(p + "kv_b_proj.weight", H * (c["qk_nope_head_dim"] + c["v_head_dim"]), r)
    w.lin(p + "o_proj.weight", d, H * c["v_head_dim"])
    if layer_kind == "enc":
        w.lin(p + "kv_compress.weight", 1, d)
        w.t[p + "kv_compress.weight"] *= 4.0  # make run weights far from uniform
    if c.get("attn_sink"):
        w.vec(p + "attn_sink", H, 1.0)


def add_ffn(w, c, p, layer):
    d = c["hidden_size"]
    if layer < c["first_k_dense_replace"]:
        names, widths = ["mlp."], [c["intermediate_size"]]
    else:
        E, I = c["n_routed_experts"], c["moe_intermediate_size"]
        w.lin(p + "mlp.gate.weight", E, d)
        w.vec(p + "mlp.gate.e_score_correction_bias", E, 0.1)
        names = [f"mlp.experts.{e}." for e in range(E)] + ["mlp.shared_experts."]
        widths = [I] * E + [I * c["n_shared_experts"]]
    for name, width in zip(names, widths):
        w.lin(p + name + "gate_proj.weight", width, d)
        w.lin(p + name + "up_proj.weight", width, d)
        w.lin(p + name + "down_proj.weight", d, width)


def build_weights(c, seed):
    w = Weights(seed)
    d, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    w.vec("model.embed_tokens.weight", (V, d), 1.0)
    flash = c["model_type"] == "shoal_flash"
    for layer in range(L + c["num_nextn_predict_layers"]):
        p = f"model.layers.{layer}."
        w.norm(p + "input_layernorm.weight", d)
        w.norm(p + "post_attention_layernorm.weight", d)
        kind = "enc" if flash and layer < c.get("n_encoder_layers", 0) else "plain"
        add_attention(w, c, p + "self_attn.", kind)
        add_ffn(w, c, p, layer)
        if layer >= L:  # MTP module
            w.norm(p + "enorm.weight", d)
            w.norm(p + "hnorm.weight", d)
            w.lin(p + "eh_proj.weight", d, 2 * d)
            w.norm(p + "shared_head.norm.weight", d)
            w.lin(p + "shared_head.head.weight", V, d)
            w.t[p + "embed_tokens.weight"] = w.t["model.embed_tokens.weight"]
    w.norm("model.norm.weight", d)
    w.lin("lm_head.weight", V, d)
    if flash:
        w.norm("model.decoder_kv.input_layernorm.weight", d)
        w.lin("model.decoder_kv.kv_a_proj_with_mqa.weight", c["kv_lora_rank"] + c["qk_rope_head_dim"], d)
        w.norm("model.decoder_kv.kv_a_layernorm.weight", c["kv_lora_rank"])
        w.lin("model.decoder_kv.kv_compress.weight", 1, d)
        w.t["model.decoder_kv.kv_compress.weight"] *= 4.0
    if c.get("conf_head_hidden", 0) > 0:
        w.lin("model.conf_head.fc1.weight", c["conf_head_hidden"], d)
        w.lin("model.conf_head.fc2.weight", 1, c["conf_head_hidden"])
    return w.t


# --- encoding -------------------------------------------------------------------------------

def to_bf16_bytes(x):
    """Round-to-nearest-even float32 -> bf16."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


E4M3_FINITE = np.unique(E4M3_TABLE[np.isfinite(E4M3_TABLE)])


def to_e4m3(x):
    """Nearest e4m3fn code of each value (|x| <= 448)."""
    vals = E4M3_FINITE
    i = np.clip(np.searchsorted(vals, x), 1, len(vals) - 1)
    pick = np.where(np.abs(vals[i - 1] - x) <= np.abs(vals[i] - x), vals[i - 1], vals[i])
    lut = {v: b for b, v in enumerate(E4M3_TABLE) if np.isfinite(v) and not (v == 0 and b == 0x80)}
    return np.vectorize(lut.get)(pick).astype(np.uint8)


def quantize_fp8(w, block=128):
    """(e4m3 codes (rows, cols), scale_inv (ceil(rows/128), ceil(cols/128)) fp32)."""
    rows, cols = w.shape
    nb_r, nb_c = -(-rows // block), -(-cols // block)
    scale = np.ones((nb_r, nb_c), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=np.uint8)
    for i in range(nb_r):
        for j in range(nb_c):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            scale[i, j] = max(np.abs(blk).max(), 1e-12) / 448.0
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = \
                to_e4m3(blk / np.float64(scale[i, j]))
    return codes, scale


def fp8_eligible(name, value):
    skip = ("embed_tokens", "lm_head", "shared_head.head", "mlp.gate.weight", "kv_compress", "conf_head")
    return value.ndim == 2 and name.endswith("_proj.weight") and not any(s in name for s in skip)


def encode(tensors, dtype):
    """name -> (safetensors dtype, shape, bytes); FP8 adds <name>_scale_inv (F32)."""
    out = {}
    for name, value in tensors.items():
        value = np.asarray(value, dtype=np.float64)
        if dtype == "fp8" and fp8_eligible(name, value):
            codes, scale = quantize_fp8(value)
            out[name] = ("F8_E4M3", value.shape, codes.tobytes())
            out[name + "_scale_inv"] = ("F32", scale.shape, scale.astype("<f4").tobytes())
        elif dtype == "bf16" and value.ndim == 2:
            out[name] = ("BF16", value.shape, to_bf16_bytes(value))
        else:
            out[name] = ("F32", value.shape, value.astype("<f4").tobytes())
    return out


def write_safetensors(path, encoded):
    header, offset = {}, 0
    for name, (dt, shape, data) in encoded.items():
        header[name] = dict(dtype=dt, shape=list(shape), data_offsets=[offset, offset + len(data)])
        offset += len(data)
    hbytes = json.dumps(header).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    with open(path, "wb") as f:
        f.write(len(hbytes).to_bytes(8, "little"))
        f.write(hbytes)
        for _, _, data in encoded.values():
            f.write(data)


def write_checkpoint(out, cfg, tensors, dtype="f32", shards=1):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    enc = encode(tensors, dtype)
    if shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), enc)
        return
    names = list(enc)
    weight_map = {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: enc[n] for n in names[k::shards]}
        write_safetensors(os.path.join(out, fname), part)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(dict(metadata={}, weight_map=weight_map), f, indent=1)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["shoal_flash", "deepseek_v3"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "bf16", "fp8"], default="f32")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="config override key=json_value")
    args = ap.parse_args(argv)
    cfg = tiny_config(args.arch)
    for kv in args.set:
        key, value = kv.split("=", 1)
        cfg[key] = json.loads(value)
    write_checkpoint(args.out, cfg, build_weights(cfg, args.seed), args.dtype, args.shards)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
