#!/usr/bin/python3
"""Independent NumPy reference of the shoal forward pass (deepseek_v3 and shoal_flash).

Written from design/MODEL.md §1–§2 and model/README.md only (never from model/forward*.cpp), so
that it can cross-check the C++ engine: attention is computed in the plain "naive" form (every
latent entry expanded through kv_b_proj into per-head k_nope and v), everything in float64, over
the whole sequence at once. Run with Debian's /usr/bin/python3 (needs numpy).

CLI:
  ref_forward.py --model DIR --tokens 1,2,3 [--out-logits F.bin] [--out-mtp G.bin] [--out-conf C.bin]
  ref_forward.py compare --model DIR --tokens 1,2,3 --engine-logits F.bin [--engine-mtp G.bin] [--tol 1e-3]
      [--image RGB_FILE:W:H:POS ... --engine-vision V.bin]
An image (raw RGB bytes, H rows of W pixels) goes through the vision encoder (MODEL.md §2,
model/README.md "Vision"); its rows replace the input embeddings at positions POS.. of the prompt.
"""
import argparse
import json
import math
import os
import sys

import numpy as np


# ----------------------------------------------------------------------------------------------
# Checkpoint reading (MODEL.md §1 "Loaded from a Hugging Face directory"; README "FP8 checkpoints")
# ----------------------------------------------------------------------------------------------

def e4m3fn_table():
    """The 256 values of float8 e4m3fn: sign, 4-bit exponent (bias 7), 3-bit mantissa,
    subnormals at exponent 0, no infinities, 0x7f / 0xff are NaN."""
    table = np.empty(256, dtype=np.float64)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exp = (byte >> 3) & 0xF
        mant = byte & 0x7
        if exp == 0xF and mant == 0x7:
            table[byte] = np.nan
        elif exp == 0:
            table[byte] = sign * (mant / 8.0) * 2.0 ** (1 - 7)
        else:
            table[byte] = sign * (1.0 + mant / 8.0) * 2.0 ** (exp - 7)
    return table


E4M3_TABLE = e4m3fn_table()


def decode_tensor(dtype, raw, shape):
    """Raw little-endian bytes of one safetensors tensor -> float64 array."""
    if dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F64":
        arr = np.frombuffer(raw, dtype="<f8")
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2")
    elif dtype == "BF16":  # bf16 = top half of an fp32
        arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F8_E4M3":
        arr = E4M3_TABLE[np.frombuffer(raw, dtype=np.uint8)]
    else:
        raise ValueError(f"unsupported safetensors dtype {dtype}")
    return arr.astype(np.float64).reshape(shape)


def read_safetensors_header(path):
    """Returns ({name: (dtype, shape, begin, end)}, data_start) of one .safetensors file:
    8-byte LE header length, JSON header, then the data region (offsets relative to it)."""
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        entries[name] = (info["dtype"], tuple(info["shape"]), begin, end)
    return entries, 8 + header_len


class TensorStore:
    """Lazy access to every tensor of a checkpoint dir (single file or index + shards).
    get(name) returns float64, with FP8 weights dequantised by their 128x128 block scales."""

    def __init__(self, model_dir, block=(128, 128)):
        self.block = tuple(block)  # FP8 scale block (rows, cols)
        self.files = {}  # name -> (path, dtype, shape, abs_begin, abs_end)
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        else:
            shards = ["model.safetensors"]
        for shard in shards:
            path = os.path.join(model_dir, shard)
            entries, data_start = read_safetensors_header(path)
            for name, (dtype, shape, begin, end) in entries.items():
                self.files[name] = (path, dtype, shape, data_start + begin, data_start + end)
        self.cache = {}

    def __contains__(self, name):
        return name in self.files

    def raw(self, name):
        path, dtype, shape, begin, end = self.files[name]
        with open(path, "rb") as f:
            f.seek(begin)
            data = f.read(end - begin)
        return dtype, decode_tensor(dtype, data, shape)

    def get(self, name):
        if name not in self.cache:
            if name not in self.files:
                raise KeyError(f"checkpoint has no tensor {name}")
            dtype, value = self.raw(name)
            if dtype == "F8_E4M3":
                value = dequant_fp8(value, self.raw(name + "_scale_inv")[1], self.block)
            self.cache[name] = value
        return self.cache[name]


def dequant_fp8(w, scale_inv, block=(128, 128)):
    """w (rows, cols) e4m3 values, scale_inv (ceil(rows/128), ceil(cols/128)): w * scale_inv per block."""
    rows, cols = w.shape
    full = np.repeat(np.repeat(scale_inv, block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return w * full


# ----------------------------------------------------------------------------------------------
# Config (MODEL.md §1 config fields, §2 "Config"; README defaults)
# ----------------------------------------------------------------------------------------------

class Config:
    """config.json fields as attributes, with the defaults shoal assumes when a field is absent."""

    DEFAULTS = dict(q_lora_rank=0, first_k_dense_replace=0, n_routed_experts=0, n_shared_experts=0,
                    num_experts_per_tok=0, n_group=1, topk_group=1, routed_scaling_factor=1.0,
                    norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                    num_nextn_predict_layers=0, n_encoder_layers=0, n_decoder_layers=0,
                    sliding_window=0, compress_ratio=1, attn_sink=False, conf_head_hidden=0,
                    scoring_func="sigmoid", topk_method="noaux_tc")

    def __init__(self, fields):
        self.fields = dict(self.DEFAULTS)
        self.fields.update(fields)
        for key, value in self.fields.items():
            setattr(self, key, value)
        self.flash = self.model_type == "shoal_flash"
        if self.model_type not in ("deepseek_v3", "shoal_flash"):
            raise ValueError(f"unsupported model_type {self.model_type}")
        if self.flash and self.n_encoder_layers + self.n_decoder_layers != self.num_hidden_layers:
            raise ValueError("n_encoder_layers + n_decoder_layers != num_hidden_layers")
        if self.scoring_func != "sigmoid" or self.topk_method != "noaux_tc":
            raise ValueError("only scoring_func sigmoid / topk_method noaux_tc are specified")

    @staticmethod
    def load(model_dir, overrides=None):
        with open(os.path.join(model_dir, "config.json")) as f:
            fields = json.load(f)
        fields.update(overrides or {})
        return Config(fields)


# ----------------------------------------------------------------------------------------------
# Common pieces (README "Common pieces")
# ----------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """x (..., d) * (mean(x^2) + eps)^-1/2 * w (d)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(z):
    return z / (1.0 + np.exp(-z))


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def yarn_mscale(scale, k):
    """m(s, k) = 0.1 k ln(s) + 1 for s > 1, else 1."""
    return 0.1 * k * math.log(scale) + 1.0 if scale > 1.0 else 1.0


def rope_tables(cfg):
    """(inv_freq (d_r/2), attn_factor, softmax_scale) — README RoPE / YaRN / softmax scale."""
    d_r = cfg.qk_rope_head_dim
    theta = cfg.rope_theta
    extra = theta ** (-(np.arange(0, d_r, 2, dtype=np.float64) / d_r))
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    rs = cfg.rope_scaling or {}
    if rs.get("type", rs.get("rope_type")) != "yarn":
        return extra, 1.0, scale
    factor = float(rs["factor"])
    orig = float(rs.get("original_max_position_embeddings", 4096))
    beta_fast, beta_slow = float(rs.get("beta_fast", 32)), float(rs.get("beta_slow", 1))
    mscale, mscale_all = float(rs.get("mscale", 1)), float(rs.get("mscale_all_dim", 0))

    def corr(n_rot):
        return d_r * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), d_r - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d_r // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv_freq = (extra / factor) * ramp + extra * (1.0 - ramp)
    attn_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
    return inv_freq, attn_factor, scale * yarn_mscale(factor, mscale_all) ** 2


def apply_rope(x, pos, inv_freq, attn_factor):
    """x (n, ..., d_r): rotate interleaved pairs (x[2i], x[2i+1]) by pos*inv_freq[i], times attn_factor."""
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # (n, d_r/2)
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (ang.shape[1],)
    cos, sin = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out * attn_factor


def linear(x, w):
    """y = W x for W (out, in), x (n, in) -> (n, out)."""
    return x @ w.T


def layer_norm(x, w, b, eps=1e-6):
    """(x - mean) / sqrt(var + eps) * w + b over the last axis (population variance)."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    """tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# ----------------------------------------------------------------------------------------------
# Attention visibility (README "shoal_flash" Compression / Visibility; MODEL.md §2 Sliding window)
# ----------------------------------------------------------------------------------------------

def causal_mask(n):
    """deepseek_v3: query t sees entries 0..t.  (n, n) bool."""
    return np.tril(np.ones((n, n), dtype=bool))


def flash_mask(n, n_runs, window, ratio):
    """shoal_flash: query t sees compressed runs r with r*m + m - 1 < t - W + 1, then raw entries
    max(0, t-W+1)..t.  Returns (n, n_runs + n) bool, compressed columns first."""
    t = np.arange(n)[:, None]
    r = np.arange(n_runs)[None, :]
    j = np.arange(n)[None, :]
    start = t - window + 1
    comp = r * ratio + ratio - 1 < start
    raw = (j >= np.maximum(start, 0)) & (j <= t)
    return np.concatenate([comp, raw], axis=1)


def compress_runs(entries, logits, ratio):
    """entries (n, entry_dim), logits (n): one entry per complete run r (positions [r*m, r*m+m)),
    the softmax(logits)-weighted sum of its token entries.  Incomplete trailing runs are never
    visible (a visible run ends before t - W + 1 <= t), so they are not formed.  (n // m, entry_dim)"""
    n_runs = entries.shape[0] // ratio
    e = entries[: n_runs * ratio].reshape(n_runs, ratio, entries.shape[1])
    g = logits[: n_runs * ratio].reshape(n_runs, ratio)
    p = np.exp(g - g.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return np.einsum("rm,rme->re", p, e)


# ----------------------------------------------------------------------------------------------
# The model (README "MLA attention of one layer", "Feed-forward", "deepseek_v3", "shoal_flash", MTP)
# ----------------------------------------------------------------------------------------------

class RefModel:
    """Holds config + weights; forward(tokens) runs the whole sequence in float64."""

    def __init__(self, model_dir, overrides=None, store=None):
        self.cfg = Config.load(model_dir, overrides)
        qc = self.cfg.fields.get("quantization_config") or {}
        block = qc.get("weight_block_size", (128, 128))  # HF FP8 checkpoints state it; 128x128 default
        self.w = store if store is not None else TensorStore(model_dir, block)
        self.inv_freq, self.attn_factor, self.scale = rope_tables(self.cfg)
        self.min_route_margin = math.inf  # smallest gap at any top-k / group decision (diagnostic)

    def norm(self, x, name):
        return rms_norm(x, self.w.get(name), self.cfg.rms_norm_eps)

    def rope(self, x, pos):
        return apply_rope(x, pos, self.inv_freq, self.attn_factor)

    # --- MLA pieces -----------------------------------------------------------------------
    def queries(self, p, xn, pos):
        """q (n, H, nope+rope) from normed input xn (n, d) -> q_nope (n,H,nope), roped q_pe (n,H,rope)."""
        c = self.cfg
        if c.q_lora_rank > 0:
            qa = self.norm(linear(xn, self.w.get(p + "q_a_proj.weight")), p + "q_a_layernorm.weight")
            q = linear(qa, self.w.get(p + "q_b_proj.weight"))
        else:
            q = linear(xn, self.w.get(p + "q_proj.weight"))
        q = q.reshape(xn.shape[0], c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim)
        return q[:, :, : c.qk_nope_head_dim], self.rope(q[:, :, c.qk_nope_head_dim:], pos)

    def entries(self, p, xn, pos):
        """Latent entries e = (RMSNorm(c) || RoPE(k_pe)) of each token: (n, kv_lora_rank + rope).
        p is the tensor prefix holding kv_a_proj_with_mqa / kv_a_layernorm."""
        r = self.cfg.kv_lora_rank
        kv = linear(xn, self.w.get(p + "kv_a_proj_with_mqa.weight"))
        c = self.norm(kv[:, :r], p + "kv_a_layernorm.weight")
        return np.concatenate([c, self.rope(kv[:, r:], pos)], axis=1)

    def attend(self, p, q_nope, q_pe, keys, mask):
        """Naive MLA: expand every visible entry through kv_b_proj.  keys (K, r + rope), mask (n, K).
        Score = (q_nope.k_nope + q_pe.k_pe) * scale, softmax (+ optional sink in the denominator),
        o[h] = sum_j p_j v_j[h]; output o_proj(concat_h o[h]).  Returns (n, d)."""
        c = self.cfg
        H, nope, vd, r = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
        kv_b = self.w.get(p + "kv_b_proj.weight").reshape(H, nope + vd, r)
        k_nope = np.einsum("kr,hdr->khd", keys[:, :r], kv_b[:, :nope, :])  # (K, H, nope)
        v = np.einsum("kr,hdr->khd", keys[:, :r], kv_b[:, nope:, :])  # (K, H, v)
        s = np.einsum("thd,khd->thk", q_nope, k_nope) + np.einsum("thd,kd->thk", q_pe, keys[:, r:])
        s = np.where(mask[:, None, :], s * self.scale, -np.inf)  # (n, H, K)
        top = s.max(axis=2, keepdims=True)
        sink = None
        if c.attn_sink:  # raw logit per head, joins the denominator only (README)
            sink = self.w.get(p + "attn_sink")[None, :, None]
            top = np.maximum(top, sink)
        e = np.exp(s - top)
        denom = e.sum(axis=2, keepdims=True) + (np.exp(sink - top) if sink is not None else 0.0)
        o = np.einsum("thk,khd->thd", e / denom, v).reshape(q_nope.shape[0], H * vd)
        return linear(o, self.w.get(p + "o_proj.weight"))

    # --- feed-forward -----------------------------------------------------------------------
    def swiglu(self, p, x):
        g = linear(x, self.w.get(p + "gate_proj.weight"))
        u = linear(x, self.w.get(p + "up_proj.weight"))
        return linear(silu(g) * u, self.w.get(p + "down_proj.weight"))

    def route(self, s, bias):
        """noaux_tc routing of one token: s (E) sigmoid scores -> (expert ids (k), weights (k))."""
        c = self.cfg
        sel = s + bias
        groups = sel.reshape(c.n_group, -1)
        gscore = np.sort(groups, axis=1)[:, -2:].sum(axis=1)  # sum of the two largest s' per group
        gorder = np.argsort(-gscore, kind="stable")  # ties -> lower group index
        masked = np.full_like(groups, -np.inf)
        masked[gorder[: c.topk_group]] = groups[gorder[: c.topk_group]]
        masked = masked.reshape(-1)
        order = np.argsort(-masked, kind="stable")  # ties -> lower expert index
        idx = order[: c.num_experts_per_tok]
        self.note_margin(gscore[gorder], c.topk_group)
        self.note_margin(masked[order], c.num_experts_per_tok)
        w = s[idx]
        if c.norm_topk_prob:
            w = w / w.sum()
        return idx, w * c.routed_scaling_factor

    def note_margin(self, sorted_desc, k):
        if k < len(sorted_desc) and np.isfinite(sorted_desc[k]):
            self.min_route_margin = min(self.min_route_margin, sorted_desc[k - 1] - sorted_desc[k])

    def moe(self, p, x):
        """MoE feed-forward of x (n, d): routed experts + shared expert."""
        s = sigmoid(linear(x, self.w.get(p + "gate.weight")))  # (n, E)
        bias = self.w.get(p + "gate.e_score_correction_bias")
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            idx, wts = self.route(s[t], bias)
            for e, wt in zip(idx, wts):
                out[t] += wt * self.swiglu(f"{p}experts.{e}.", x[t: t + 1])[0]
        if self.cfg.n_shared_experts > 0:
            out += self.swiglu(p + "shared_experts.", x)
        return out

    def ffn(self, layer, x):
        p = f"model.layers.{layer}.mlp."
        c = self.cfg
        if c.n_routed_experts > 0 and layer >= c.first_k_dense_replace:
            return self.moe(p, x)
        return self.swiglu(p, x)

    # --- one transformer layer ----------------------------------------------------------------
    def layer(self, layer, x, pos, shared=None):
        """Layer `layer` over x (n, d).  deepseek_v3: causal over its own entries.  shoal_flash:
        compressed entries (its own kv_compress runs, or `shared` = the decoder block cache) plus
        its own raw window.  Returns (n, d)."""
        c = self.cfg
        p = f"model.layers.{layer}.self_attn."
        xn = self.norm(x, f"model.layers.{layer}.input_layernorm.weight")
        q_nope, q_pe = self.queries(p, xn, pos)
        raw = self.entries(p, xn, pos)
        n = x.shape[0]
        if not c.flash:
            keys, mask = raw, causal_mask(n)
        else:
            comp = shared if shared is not None else self.encoder_runs(p, xn, raw)
            keys = np.concatenate([comp, raw], axis=0)
            mask = flash_mask(n, comp.shape[0], c.sliding_window, c.compress_ratio)
        h = x + self.attend(p, q_nope, q_pe, keys, mask)
        h2 = self.norm(h, f"model.layers.{layer}.post_attention_layernorm.weight")
        return h + self.ffn(layer, h2)

    def encoder_runs(self, p, xn, raw):
        """Compressed entries of an encoder layer; logits g_t = kv_compress . xn_t (normed input)."""
        m = self.cfg.compress_ratio
        if m == 1:  # softmax over one token = 1: the compressed entry is the token's entry
            return raw.copy()
        g = linear(xn, self.w.get(p + "kv_compress.weight"))[:, 0]
        return compress_runs(raw, g, m)

    def decoder_cache(self, h_enc, pos):
        """The one shared decoder block cache, projected from h_E (not normed) by model.decoder_kv.*."""
        p = "model.decoder_kv."
        hn = self.norm(h_enc, p + "input_layernorm.weight")
        e = self.entries(p, hn, pos)
        m = self.cfg.compress_ratio
        if m == 1:
            return e
        return compress_runs(e, linear(hn, self.w.get(p + "kv_compress.weight"))[:, 0], m)

    # --- vision encoder (model/README.md "Vision") ---------------------------------------------
    def vision(self, rgb, width, height):
        """Encoder rows (patches, d) of one image: rgb uint8 (height, width, 3)."""
        v = self.cfg.fields["vision"]
        p, dv, heads, g = v["patch_size"], v["hidden"], v["heads"], v["image_size"] // v["patch_size"]
        gh, gw = height // p, width // p
        x = rgb.astype(np.float64) / 127.5 - 1.0
        patches = x.reshape(gh, p, gw, p, 3).transpose(0, 2, 1, 3, 4).reshape(gh * gw, p * p * 3)
        W = self.w.get
        h = linear(patches, W("vision.patch_embed.weight")) + W("vision.patch_embed.bias")
        grid = np.arange(gh)[:, None] * g + np.arange(gw)[None, :]
        h = h + W("vision.pos_embed")[grid.reshape(-1)]
        for i in range(v["layers"]):
            b = f"vision.layers.{i}."
            t = layer_norm(h, W(b + "norm1.weight"), W(b + "norm1.bias"))
            qkv = linear(t, W(b + "attn.qkv.weight")) + W(b + "attn.qkv.bias")
            n, hd = h.shape[0], dv // heads
            q, k, val = (qkv[:, j * dv:(j + 1) * dv].reshape(n, heads, hd) for j in range(3))
            s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd)
            s = np.exp(s - s.max(axis=2, keepdims=True))
            s = s / s.sum(axis=2, keepdims=True)
            o = np.einsum("hij,jhd->ihd", s, val).reshape(n, dv)
            h = h + linear(o, W(b + "attn.proj.weight")) + W(b + "attn.proj.bias")
            t = layer_norm(h, W(b + "norm2.weight"), W(b + "norm2.bias"))
            u = gelu(linear(t, W(b + "mlp.fc1.weight")) + W(b + "mlp.fc1.bias"))
            h = h + linear(u, W(b + "mlp.fc2.weight")) + W(b + "mlp.fc2.bias")
        h = layer_norm(h, W("vision.post_norm.weight"), W("vision.post_norm.bias"))
        y = gelu(linear(h, W("vision.projector.fc1.weight")) + W("vision.projector.fc1.bias"))
        return linear(y, W("vision.projector.fc2.weight")) + W("vision.projector.fc2.bias")

    # --- whole model --------------------------------------------------------------------------
    def trunk(self, tokens, images=()):
        """Embedding (image rows at their positions) + all layers -> (h (n, d) last hidden state
        before model.norm, shared decoder cache or None).  images: (rows (k, d), first position)."""
        c = self.cfg
        pos = np.arange(len(tokens))
        h = self.w.get("model.embed_tokens.weight")[np.asarray(tokens)].copy()
        for rows, at in images:
            h[at:at + rows.shape[0]] = rows
        n_enc = c.n_encoder_layers if c.flash else c.num_hidden_layers
        for layer in range(n_enc):
            h = self.layer(layer, h, pos)
        shared = self.decoder_cache(h, pos) if c.flash else None
        for layer in range(n_enc, c.num_hidden_layers):
            h = self.layer(layer, h, pos, shared)
        return h, shared

    def head(self, h):
        return linear(self.norm(h, "model.norm.weight"), self.w.get("lm_head.weight"))

    def mtp_tensor(self, layer, name, fallback):
        """MTP embed/head: the module's own copy when the checkpoint has one, else the main model's."""
        own = f"model.layers.{layer}.{name}"
        return self.w.get(own if own in self.w else fallback)

    def mtp(self, h, tokens, shared):
        """MTP modules k = 0..nextn-1 (README "MTP").  Module k at position i takes h^{k-1}_i
        (h^{-1} = main model) and token t_{i+k+1}, for i = 0..n-k-2.  Returns a list over k of
        (draft logits (n-k-1, V), module output before shared_head.norm (n-k-1, d))."""
        c = self.cfg
        out = []
        for k in range(c.num_nextn_predict_layers):
            layer, m = c.num_hidden_layers + k, len(tokens) - 1 - k
            if m <= 0:
                break
            pfx = f"model.layers.{layer}."
            emb = self.mtp_tensor(layer, "embed_tokens.weight", "model.embed_tokens.weight")
            e = self.norm(emb[np.asarray(tokens[k + 1: k + 1 + m])], pfx + "enorm.weight")
            x = linear(np.concatenate([e, self.norm(h[:m], pfx + "hnorm.weight")], axis=1),
                       self.w.get(pfx + "eh_proj.weight"))
            h = self.layer(layer, x, np.arange(m), shared)
            head = self.mtp_tensor(layer, "shared_head.head.weight", "lm_head.weight")
            out.append((linear(self.norm(h, pfx + "shared_head.norm.weight"), head), h))
        return out

    def confidence(self, h_mtp, layer):
        """Confidence head (README): sigmoid(fc2 silu(fc1 RMSNorm(out; shared_head.norm))).  (n,)"""
        u = self.norm(h_mtp, f"model.layers.{layer}.shared_head.norm.weight")
        z = linear(silu(linear(u, self.w.get("model.conf_head.fc1.weight"))),
                   self.w.get("model.conf_head.fc2.weight"))
        return sigmoid(z[:, 0])

    def forward(self, tokens, images=()):
        """Full-sequence forward.  Returns dict with
        logits_all (n, V); logits (V) at the last position;
        mtp_all (n-1, V) / mtp (V) = MTP module 0 draft logits (at i = n-2), None without MTP / n < 2;
        mtp_modules: list over k of draft logits (n-k-1, V);
        conf_all / conf: confidence head over module 0 outputs, None when absent."""
        c = self.cfg
        h, shared = self.trunk(tokens, images)
        res = dict(logits_all=self.head(h), mtp_all=None, mtp=None, conf_all=None, conf=None,
                   mtp_modules=[])
        res["logits"] = res["logits_all"][-1]
        mods = self.mtp(h, tokens, shared)
        if mods:
            res["mtp_modules"] = [lg for lg, _ in mods]
            res["mtp_all"] = mods[0][0]
            res["mtp"] = mods[0][0][-1]
            if c.conf_head_hidden > 0 and "model.conf_head.fc1.weight" in self.w:
                res["conf_all"] = self.confidence(mods[0][1], c.num_hidden_layers)
                res["conf"] = res["conf_all"][-1]
        return res


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

def parse_tokens(text):
    return [int(t) for t in text.split(",") if t.strip() != ""]


def write_f32(path, arr):
    np.asarray(arr, dtype="<f4").tofile(path)


def compare_arrays(label, engine, ref, tol):
    """Prints one line with max |a-b| and rel = max|a-b| / max|b| (b = reference); True if rel <= tol."""
    if engine.shape != ref.shape:
        print(f"{label}: FAIL size mismatch engine {engine.size} values, reference {ref.size}")
        return False
    diff = np.abs(engine.astype(np.float64) - ref)
    max_abs = float(np.max(diff)) if diff.size else 0.0
    denom = float(np.max(np.abs(ref))) if ref.size else 0.0
    rel = max_abs / denom if denom > 0 else max_abs
    ok = bool(np.all(np.isfinite(engine))) and rel <= tol
    same_top = int(np.argmax(engine)) == int(np.argmax(ref))
    print(f"{label}: max_abs={max_abs:.3e} rel={rel:.3e} tol={tol:.1e} "
          f"argmax_equal={same_top} {'PASS' if ok else 'FAIL'}")
    return ok


def parse_image(spec):
    """RGB_FILE:W:H:POS -> (rgb (H, W, 3) uint8, W, H, POS)."""
    path, w, h, at = spec.rsplit(":", 3)
    w, h, at = int(w), int(h), int(at)
    rgb = np.fromfile(path, dtype=np.uint8)
    if rgb.size != w * h * 3:
        raise SystemExit(f"{path}: {rgb.size} bytes, not {w}x{h}x3")
    return rgb.reshape(h, w, 3), w, h, at


def cmd_compare(args):
    model = RefModel(args.model)
    tokens = parse_tokens(args.tokens)
    images, ok = [], True
    for spec in args.image or []:
        rgb, w, h, at = parse_image(spec)
        images.append((model.vision(rgb, w, h), at))
    if args.engine_vision:
        ref = np.concatenate([r for r, _ in images]).reshape(-1) if images else np.zeros(0)
        ok &= compare_arrays("vision", np.fromfile(args.engine_vision, dtype="<f4"), ref, args.tol)
    res = model.forward(tokens, images)
    ok &= compare_arrays("logits", np.fromfile(args.engine_logits, dtype="<f4"), res["logits"], args.tol)
    if args.engine_mtp:
        if res["mtp"] is None:
            print("mtp: FAIL engine gave MTP logits but the reference has none "
                  f"(num_nextn_predict_layers={model.cfg.num_nextn_predict_layers}, n={len(tokens)})")
            ok = False
        else:
            ok &= compare_arrays("mtp", np.fromfile(args.engine_mtp, dtype="<f4"), res["mtp"], args.tol)
    if model.min_route_margin < 1e-5:
        print(f"note: closest MoE routing decision margin {model.min_route_margin:.2e} "
              "(an fp32 engine may legitimately pick another expert)")
    return 0 if ok else 1


def cmd_run(args):
    res = RefModel(args.model).forward(parse_tokens(args.tokens))
    if args.out_logits:
        write_f32(args.out_logits, res["logits"])
    if args.out_mtp:
        if res["mtp"] is None:
            print("no MTP logits (no MTP layer or fewer than 2 tokens)", file=sys.stderr)
            return 1
        write_f32(args.out_mtp, res["mtp"])
    if args.out_conf and res["conf"] is not None:
        write_f32(args.out_conf, [res["conf"]])
    lg = res["logits"]
    print(f"logits: V={lg.size} argmax={int(np.argmax(lg))} max={lg.max():.6f}")
    if res["mtp"] is not None:
        print(f"mtp: argmax={int(np.argmax(res['mtp']))}" +
              (f" conf={res['conf']:.6f}" if res["conf"] is not None else ""))
    return 0


def main(argv):
    if argv and argv[0] == "compare":
        ap = argparse.ArgumentParser(prog="ref_forward.py compare")
        ap.add_argument("--model", required=True)
        ap.add_argument("--tokens", required=True)
        ap.add_argument("--engine-logits", required=True)
        ap.add_argument("--engine-mtp")
        ap.add_argument("--image", action="append", help="RGB_FILE:W:H:POS (repeatable)")
        ap.add_argument("--engine-vision", help="the engine's encoder rows of every --image, in order")
        ap.add_argument("--tol", type=float, default=1e-3, help="bound on max|a-b| / max|b|")
        return cmd_compare(ap.parse_args(argv[1:]))
    ap = argparse.ArgumentParser(prog="ref_forward.py")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out-logits")
    ap.add_argument("--out-mtp")
    ap.add_argument("--out-conf")
    return cmd_run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
