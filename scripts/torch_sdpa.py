#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention at stallbench's attention
shapes, timed with CUDA events, and a comparison with a stallbench result.

  torch_sdpa.py --seq 2048,4096,8192,16384 --batch 1 --heads 16 --head-dim 128 --json OUT
  torch_sdpa.py --compare STALLBENCH_ATTENTION.json TORCH.json

FLOPs follow stallbench (docs/DESIGN.md): forward 4*B*H*S^2*D, halved for causal;
forward+backward 3.5x forward. The comparison prints, per seq_len and pass,
stallbench's cudnn TFLOP/s, torch's and the ratio. It informs; it does not gate.
"""
import argparse
import json
import os
import sys
import tempfile


def flops(b, h, s, d, causal, bwd):
    f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return f * (3.5 if bwd else 1.0)


def measure(args):
    import torch  # imported here so --help and --compare work without torch
    import torch.nn.functional as F

    dev = torch.device("cuda:0")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    points = []
    for s in [int(x) for x in args.seq.split(",")]:
        shape = (args.batch, args.heads, s, args.head_dim)
        q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
        do = torch.randn(shape, device=dev, dtype=dtype)
        for bwd in (False, True):
            def step():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
                if bwd:
                    o.backward(do)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            times = []
            for _ in range(args.trials):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                step()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b))
            times.sort()
            ms = times[len(times) // 2]
            f = flops(args.batch, args.heads, s, args.head_dim, args.causal, bwd)
            points.append({"seq_len": s, "pass": "fwd+bwd" if bwd else "fwd", "ms": ms, "tflops": f / (ms * 1e-3) / 1e12})
            print(f"torch sdpa S={s:6d} {'fwd+bwd' if bwd else 'fwd':7s} {ms:9.3f} ms {points[-1]['tflops']:8.1f} TFLOP/s")
    doc = {"tool": "torch", "op": "scaled_dot_product_attention", "torch_version": torch.__version__,
           "device": torch.cuda.get_device_name(0), "dtype": args.dtype, "causal": args.causal,
           "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "points": points}
    d = os.path.dirname(os.path.abspath(args.json))
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, args.json)


def compare(a_path, b_path):
    docs = []
    for p in (a_path, b_path):
        try:
            with open(p) as f:
                docs.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            print(f"torch_sdpa: cannot read {p}: {e}", file=sys.stderr)
            return 2
    sb = next((d for d in docs if d.get("kind") == "result"), None)
    th = next((d for d in docs if d.get("tool") == "torch"), None)
    if not sb or not th:
        print("torch_sdpa: --compare needs one stallbench result and one torch_sdpa.py output", file=sys.stderr)
        return 2
    torch_pts = {(p["seq_len"], p["pass"]): p for p in th["points"]}
    print(f"{'seq_len':>8} {'pass':8} {'stallbench cudnn':>17} {'torch sdpa':>11} {'ratio':>6}")
    for p in sb.get("points", []):
        prm = p["params"]
        if prm.get("impl") != "cudnn" or p.get("status") != "ok":
            continue
        t = torch_pts.get((prm["seq_len"], prm["pass"]))
        if not t:
            continue
        mine = p["metrics"]["tflops"]["value"]
        print(f"{prm['seq_len']:8d} {prm['pass']:8} {mine:17.1f} {t['tflops']:11.1f} {mine / t['tflops']:6.3f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", default="2048,4096,8192,16384")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--json")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.json:
        ap.error("--json is required when measuring")
    measure(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
