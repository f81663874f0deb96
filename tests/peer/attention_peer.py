#!/usr/bin/env python3
"""PyTorch's attention on this CPU beside stallbench's, interleaved in one run.

What stallbench's `attention` scenario stands for, run for real:
  eager   a model's eager attention (Hugging Face's eager_attention_forward):
          matmul(q, k^T) * scale, + causal mask, softmax(dtype=float32).to(dtype),
          matmul(., v): every op a fresh tensor. stallbench's `naive` reproduces it.
  math    torch's SDPA math backend (what SDPA falls back to without a fused
          kernel): the same ops inside one call.
  flash   torch's fused SDPA on CPU (SDPBackend.FLASH_ATTENTION). stallbench's
          `flash` stands for it.
stallbench's `naive-prealloc` (S x S buffers allocated once, scale and mask
fused into the softmax) has no PyTorch counterpart: it is the fastest a
materialising implementation gets, the lower bound of naive.

Each round runs every PyTorch form, then `stallbench run attention` with the
same shape, so the two share the machine's state (thermal, other load). Times
are medians of `--reps` timed repetitions after `--warmup`, in ms (lower is
better); fwd+bwd is one forward and its backward, as stallbench times them.

Prints a Markdown table and writes JSON (--out). PyTorch is not part of CI:
without it the script exits 77.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import add_run_arguments, cpu_kind, parse_list, write_pair  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError as e:  # not installed: a skip, as meson counts it
    print(f"SKIP: PyTorch is not installed ({e})")
    sys.exit(77)


def eager(q, k, v, scale, mask):
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    if mask is not None:
        w = w + mask
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


def time_torch(form, seq, args, dtype, passes):
    B, H, D = args.batch, args.heads, args.head_dim
    g = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.rand(B, H, seq, D, generator=g, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
                   for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    scale = D ** -0.5
    mask = None
    if args.causal and form == "eager":  # built per forward, as a model does
        mask_fn = lambda: torch.full((B, 1, seq, seq), torch.finfo(dtype).min, dtype=dtype).triu_(1)
    else:
        mask_fn = lambda: None

    def fwd():
        if form == "eager":
            return eager(q, k, v, scale, mask_fn())
        backend = SDPBackend.MATH if form == "math" else SDPBackend.FLASH_ATTENTION
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal, scale=scale)

    out = {}
    for p in passes:
        def once():
            for t in (q, k, v):
                t.grad = None
            o = fwd()
            if p == "fwd+bwd":
                o.backward(do)
        times = []
        for i in range(args.warmup + args.reps):
            t0 = time.perf_counter()
            once()
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        out[p] = statistics.median(times)
    return out


def time_stallbench(seq, args, dtype_name, passes, impls):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.json")
        cmd = [args.stallbench, "run", "attention", "--device", "cpu", "--json", path,
               "-p", f"seq_len={seq}", "-p", f"impl={','.join(impls)}", "-p", f"dtype={dtype_name}",
               "-p", f"pass={','.join(passes)}", "-p", f"causal={'true' if args.causal else 'false'}",
               "-p", f"batch={args.batch}", "-p", f"heads={args.heads}", "-p", f"head_dim={args.head_dim}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0 or not os.path.exists(path):
            sys.exit(f"stallbench failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
        with open(path) as f:
            res = json.load(f)
    out = {}
    for pt in res["points"]:
        prm = pt["params"]
        ms = pt.get("metrics", {}).get("ms", {}).get("value")
        out[(prm["impl"], prm["pass"])] = ms if pt.get("status") == "ok" else None
    return out, res.get("meta", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=lambda s: parse_list(s, int), default=[512, 1024, 2048])
    ap.add_argument("--pass", dest="passes", type=lambda s: parse_list(s, str), default=["fwd", "fwd+bwd"])
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    add_run_arguments(ap)
    args = ap.parse_args()
    for name in ("batch", "heads", "head_dim", "rounds", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if any(s < 16 for s in args.seq):
        ap.error("--seq values must be at least 16")
    if any(p not in ("fwd", "fwd+bwd") for p in args.passes):
        ap.error("--pass takes fwd and fwd+bwd")
    if not os.access(args.stallbench, os.X_OK):
        ap.error(f"--stallbench {args.stallbench} is not an executable (build it first: scripts/test --suite unit)")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    torch_forms = ["eager", "math", "flash"]
    sb_impls = ["naive", "naive-prealloc", "flash"]

    samples = {}  # (seq, pass, who) -> [ms per round]
    meta = {}
    for rnd in range(args.rounds):
        for seq in args.seq:
            for form in torch_forms:
                for p, ms in time_torch(form, seq, args, dtype, args.passes).items():
                    samples.setdefault((seq, p, "torch " + form), []).append(ms)
            sb, meta = time_stallbench(seq, args, args.dtype, args.passes, sb_impls)
            for (impl, p), ms in sb.items():
                samples.setdefault((seq, p, "stallbench " + impl), []).append(ms)
            print(f"round {rnd + 1}/{args.rounds} S={seq} done", file=sys.stderr)

    def med(seq, p, who):
        v = [x for x in samples.get((seq, p, who), []) if x is not None]
        return statistics.median(v) if v else None

    cols = [f"torch {f}" for f in torch_forms] + [f"stallbench {i}" for i in sb_impls]
    rows = []
    for seq in args.seq:
        for p in args.passes:
            r = {"seq_len": seq, "pass": p, **{c: med(seq, p, c) for c in cols}}
            te, tf = r["torch eager"], r["torch flash"]
            sn, sf = r["stallbench naive"], r["stallbench flash"]
            r["torch eager/flash"] = te / tf if te and tf else None
            r["stallbench naive/flash"] = sn / sf if sn and sf else None
            r["stallbench naive / torch eager"] = sn / te if sn and te else None
            rows.append(r)

    fmt = lambda x: "—" if x is None else f"{x:.2f}"
    head = ["S", "pass"] + [c + " ms" for c in cols] + ["torch eager/flash", "stallbench naive/flash",
                                                        "sb naive / torch eager"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [str(r["seq_len"]), r["pass"]] + [fmt(r[c]) for c in cols] + [
            fmt(r["torch eager/flash"]), fmt(r["stallbench naive/flash"]), fmt(r["stallbench naive / torch eager"])]
        lines.append("| " + " | ".join(vals) + " |")
    table = "\n".join(lines)
    print(table)

    if args.out:
        doc = {
            "what": "PyTorch attention on CPU vs stallbench's attention scenario, interleaved in one run",
            "unit": "ms", "direction": "lower",
            "statistic": f"median over {args.rounds} rounds of the median of {args.reps} reps",
            "machine": {**cpu_kind(), "python": platform.python_version(), "torch": torch.__version__,
                        "torch_threads": torch.get_num_threads(),
                        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
            "stallbench": {k: meta.get(k) for k in ("version", "git_sha", "device") if k in meta},
            "shape": {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "causal": args.causal,
                      "dtype": args.dtype},
            "rows": rows,
            "samples": [{"seq_len": s, "pass": p, "who": w, "ms": v} for (s, p, w), v in samples.items()],
        }
        write_pair(args.out, doc, table)


if __name__ == "__main__":
    main()
