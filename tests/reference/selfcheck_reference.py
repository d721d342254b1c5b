#!/usr/bin/python3
"""Self-checks of the NumPy reference (ref_forward.py) on random tiny checkpoints written by
make_test_checkpoint.py — equalities the spec implies, so the reference can be trusted before it
judges the C++ engine.  Run: /usr/bin/python3 tests/reference/selfcheck_reference.py
Exit status 0 when every check passes.
"""
import itertools
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_test_checkpoint as mk  # noqa: E402
import ref_forward as rf  # noqa: E402

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}")


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def close(name, a, b, tol=1e-10):
    e = rel_err(np.asarray(a), np.asarray(b))
    check(name, e <= tol, f"rel={e:.2e}")


def make(tmp, arch, tag, **kw):
    out = os.path.join(tmp, tag)
    cfg = mk.tiny_config(arch)
    cfg.update(kw.pop("cfg", {}))
    mk.write_checkpoint(out, cfg, mk.build_weights(cfg, kw.pop("seed", 1)), **kw)
    return out


def tokens_of(n, seed=0):
    return list(np.random.default_rng(seed).integers(0, 256, n))


# --- unit checks --------------------------------------------------------------------------------

def check_e4m3():
    t = rf.E4M3_TABLE
    ok = (t[0x7E] == 448 and t[0x01] == 2.0 ** -9 and t[0x08] == 2.0 ** -6 and t[0x38] == 1.0
          and t[0xB8] == -1.0 and np.isnan(t[0x7F]) and np.isnan(t[0xFF]) and t[0x07] == 7 * 2.0 ** -9)
    check("e4m3fn decode table", ok)


def visible_by_loop(t, n_runs, W, m):
    """Visibility of query t written straight from MODEL.md §2: compressed entries of every run whose
    last position is < t - W + 1, raw entries max(0, t-W+1)..t."""
    comp = [r for r in range(n_runs) if r * m + m - 1 < t - W + 1]
    raw = list(range(max(0, t - W + 1), t + 1))
    return comp, raw


def check_mask():
    ok = True
    for n, W, m in itertools.product([1, 5, 17, 40, 70], [1, 3, 16, 100], [1, 2, 4, 5]):
        mask = rf.flash_mask(n, n // m, W, m)
        for t in range(n):
            comp, raw = visible_by_loop(t, n // m, W, m)
            ok &= list(np.nonzero(mask[t, : n // m])[0]) == comp
            ok &= list(np.nonzero(mask[t, n // m:])[0]) == raw
            covered = {p for r in comp for p in range(r * m, r * m + m)} | set(raw)
            hidden = set(range(t + 1)) - covered  # the straddling run's part before the window
            ok &= len(hidden) <= m - 1 and all(p < t - W + 1 for p in hidden)
            ok &= not (covered & set(range(t + 1, n)))
    check("flash visibility mask == loop definition, hidden positions <= m-1", ok)


def brute_route(model, s, bias):
    """Routing by enumeration of group subsets: best topk_group groups by summed top-2 score."""
    c = model.cfg
    sel = (s + bias).reshape(c.n_group, -1)
    gs = np.sort(sel, axis=1)[:, -2:].sum(axis=1)
    best = max(itertools.combinations(range(c.n_group), c.topk_group), key=lambda g: gs[list(g)].sum())
    cand = [e for g in sorted(best) for e in range(g * sel.shape[1], (g + 1) * sel.shape[1])]
    idx = sorted(cand, key=lambda e: -(s + bias)[e])[: c.num_experts_per_tok]
    w = s[idx] / s[idx].sum() * c.routed_scaling_factor
    return dict(zip(idx, w))


def check_route(model):
    rng = np.random.default_rng(5)
    ok = True
    for _ in range(200):
        s = rf.sigmoid(rng.standard_normal(model.cfg.n_routed_experts))
        bias = 0.3 * rng.standard_normal(model.cfg.n_routed_experts)
        idx, w = model.route(s, bias)
        ref = brute_route(model, s, bias)
        ok &= set(idx) == set(ref) and all(abs(ref[i] - wi) < 1e-12 for i, wi in zip(idx, w))
    check("noaux_tc routing == brute-force group enumeration", ok)


class AbsorbedModel(rf.RefModel):
    """Same model with the absorbed MLA form (README): q_lat = W_UK^T q_nope, o = W_UV (p . c)."""

    def attend(self, p, q_nope, q_pe, keys, mask):
        c = self.cfg
        H, nope, vd, r = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
        kv_b = self.w.get(p + "kv_b_proj.weight").reshape(H, nope + vd, r)
        q_lat = np.einsum("thd,hdr->thr", q_nope, kv_b[:, :nope, :])
        s = (np.einsum("thr,kr->thk", q_lat, keys[:, :r]) + np.einsum("thd,kd->thk", q_pe, keys[:, r:]))
        s = np.where(mask[:, None, :], s * self.scale, -np.inf)
        logits = s
        if c.attn_sink:
            sink = np.broadcast_to(self.w.get(p + "attn_sink")[None, :, None], s.shape[:2] + (1,))
            logits = np.concatenate([s, sink], axis=2)
        pr = np.exp(logits - logits.max(axis=2, keepdims=True))
        pr = (pr / pr.sum(axis=2, keepdims=True))[:, :, : keys.shape[0]]
        o_lat = np.einsum("thk,kr->thr", pr, keys[:, :r])
        o = np.einsum("thr,hdr->thd", o_lat, kv_b[:, nope:, :]).reshape(q_nope.shape[0], H * vd)
        return rf.linear(o, self.w.get(p + "o_proj.weight"))


# --- model-level checks ---------------------------------------------------------------------------

def check_prefix(path, arch):
    model = rf.RefModel(path)
    toks = tokens_of(70, seed=3)
    full = model.forward(toks)
    for n in (1, 2, 5, 16, 17, 21, 40, 69):
        part = model.forward(toks[:n])
        close(f"{arch} prefix n={n}: logits_all[n-1] == forward(prefix).logits",
              full["logits_all"][n - 1], part["logits"])
        if n >= 2 and part["mtp"] is not None:
            close(f"{arch} prefix n={n}: mtp_all[n-2] == forward(prefix).mtp", full["mtp_all"][n - 2], part["mtp"])
        if part["conf"] is not None:
            close(f"{arch} prefix n={n}: conf", full["conf_all"][n - 2], part["conf"])


def compare_models(name, a, b, toks, with_mtp=True, tol=1e-10):
    ra, rb = a.forward(toks), b.forward(toks)
    close(name + " logits_all", ra["logits_all"], rb["logits_all"], tol)
    if with_mtp and ra["mtp_all"] is not None:
        close(name + " mtp_all", ra["mtp_all"], rb["mtp_all"], tol)


def check_flash_degenerate(path):
    """m = 1 or W >= n make shoal_flash plain causal attention (same weights run as deepseek_v3)."""
    toks = tokens_of(40, seed=4)
    causal = rf.RefModel(path, overrides=dict(model_type="deepseek_v3"))
    for m in (1, 4):
        flash = rf.RefModel(path, overrides=dict(compress_ratio=m, sliding_window=40))
        compare_models(f"flash m={m} W=n == causal:", flash, causal, toks)
    enc_only = dict(n_encoder_layers=4, n_decoder_layers=0, compress_ratio=1)
    for W in (1, 5, 16):
        flash = rf.RefModel(path, overrides=dict(enc_only, sliding_window=W))
        compare_models(f"flash encoder-only m=1 W={W} == causal:", flash, causal, toks, with_mtp=False)
    r = rf.RefModel(path).forward(toks)["logits"]  # m=4, W=16 < n: compression is live
    check("flash m=4 W=16 n=40 differs from causal", rel_err(r, causal.forward(toks)["logits"]) > 1e-3)


def check_absorbed(path, arch):
    toks = tokens_of(40, seed=6)
    compare_models(f"{arch} absorbed == naive:", AbsorbedModel(path), rf.RefModel(path), toks)


def check_encodings(tmp, arch):
    """fp8 / bf16 / sharded checkpoints == f32 checkpoints holding the decoded values."""
    toks = tokens_of(17, seed=7)
    base = make(tmp, arch, arch + "_f32")
    for dtype, shards in (("bf16", 1), ("fp8", 1), ("f32", 3)):
        path = make(tmp, arch, f"{arch}_{dtype}_{shards}", dtype=dtype, shards=shards)
        store = rf.TensorStore(path)
        decoded = {n: store.get(n) for n in store.files if not n.endswith("_scale_inv")}
        cfg = mk.tiny_config(arch)
        dec_path = os.path.join(tmp, f"{arch}_{dtype}_{shards}_decoded")
        mk.write_checkpoint(dec_path, cfg, decoded, "f32")
        compare_models(f"{arch} {dtype} x{shards} == its decoded f32:", rf.RefModel(path),
                       rf.RefModel(dec_path), toks, tol=1e-6)
        e = rel_err(rf.RefModel(path).forward(toks)["logits"], rf.RefModel(base).forward(toks)["logits"])
        check(f"{arch} {dtype} x{shards} close to f32 original", e < (0.2 if dtype == "fp8" else 0.02),
              f"rel={e:.2e}")


def check_cli(tmp, path):
    toks = ",".join(str(t) for t in tokens_of(17, seed=8))
    lg, mt = os.path.join(tmp, "l.bin"), os.path.join(tmp, "m.bin")
    run = [sys.executable, os.path.join(HERE, "ref_forward.py")]
    subprocess.run(run + ["--model", path, "--tokens", toks, "--out-logits", lg, "--out-mtp", mt],
                   check=True, stdout=subprocess.DEVNULL)
    cmp = run + ["compare", "--model", path, "--tokens", toks, "--engine-logits", lg, "--engine-mtp", mt]
    ok = subprocess.run(cmp, stdout=subprocess.DEVNULL).returncode == 0
    x = np.fromfile(lg, dtype="<f4")
    x[3] += 0.05 * np.max(np.abs(x))
    x.tofile(lg)
    ok &= subprocess.run(cmp, stdout=subprocess.DEVNULL).returncode == 1
    check("CLI write + compare (pass on own output, fail on a 5% perturbation)", ok)


def main():
    check_e4m3()
    check_mask()
    with tempfile.TemporaryDirectory() as tmp:
        flash = make(tmp, "shoal_flash", "flash")
        v3 = make(tmp, "deepseek_v3", "v3")
        check_route(rf.RefModel(flash))
        for path, arch in ((flash, "shoal_flash"), (v3, "deepseek_v3")):
            check_prefix(path, arch)
            check_absorbed(path, arch)
            check_encodings(tmp, arch)
        check_flash_degenerate(flash)
        check_cli(tmp, flash)
    print(f"{sum(RESULTS)} passed, {len(RESULTS) - sum(RESULTS)} failed")
    return 0 if all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
