#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention at stallbench's attention shapes, each of
torch's fused backends forced in turn, and a comparison with stallbench's attention results.

Measure mode: for each batch, sequence length and causal flag, q, k, v of [B, H, S, D] in the
dtype, and each backend of --backends (cudnn, flash, efficient, math) forced with
torch.nn.attention.sdpa_kernel; a backend torch cannot run at a shape is recorded with its
reason, not a figure. There is a warm-up, then trials timed with CUDA events (on --device cpu,
a dry run of this script, with the wall clock). Reported: median ms of the trials and TFLOP/s.

    FLOPs: forward 4*B*H*S^2*D, halved for causal; forward+backward 3.5x forward
    (stallbench's attention scenario counts the same, docs/DESIGN.md)

    python3 scripts/torch_sdpa.py --seq 2048,4096,8192,16384 --batch 1,4 --causal false,true \\
        --heads 16 --head-dim 128 --json torch-sdpa.json

Compare mode: stallbench attention results (one or more) and one file this script wrote, in
any order. For each shape stallbench ran with impl=cudnn (batch, heads, head_dim, seq_len,
causal, pass, dtype) it prints stallbench's TFLOP/s, the best torch backend's and which it was,
and the ratio. It exits 1 if a ratio at a sequence length of at least --min-seq (default 4096)
is below --min-ratio (default 0.95), if nothing could be gated, or if a stallbench result is
simulated (a model is never compared with a measurement).

    python3 scripts/torch_sdpa.py --compare attention-h200.json torch-sdpa.json

Exit codes: 0 ok, 1 failure (the comparison failed, no CUDA, torch missing, unreadable input),
2 bad arguments. torch is imported only in measure mode, so --help and --compare work without
it.
"""
import argparse
import statistics
import sys
import time

from torch_script_common import int_list, load_json, positive_float, positive_int, write_json_atomic

BACKENDS = ("cudnn", "flash", "efficient", "math")


def flops(b, h, s, d, causal, bwd):
    f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return f * (3.5 if bwd else 1.0)


def bool_list(text):
    out = []
    for x in (x.strip().lower() for x in text.split(",") if x.strip()):
        if x not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"--causal takes true, false or both (false,true), got {text!r}")
        out.append(x == "true")
    if not out:
        raise argparse.ArgumentTypeError(f"--causal takes true, false or both (false,true), got {text!r}")
    return list(dict.fromkeys(out))


def choice_list(choices, what):
    def parse(text):
        v = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in v if x not in choices]
        if not v or bad:
            raise argparse.ArgumentTypeError(f"{what} takes a comma list of {', '.join(choices)}; got {text!r}")
        return list(dict.fromkeys(v))
    return parse





# ---------------------------------------------------------------- measure


def measure(args):
    try:
        import torch  # imported here so --help and --compare work without torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"torch_sdpa: torch (2.3 or later, for torch.nn.attention) is not importable ({e}); measure mode "
              "needs it", file=sys.stderr)
        return 1
    on_cpu = args.device == "cpu"
    if not on_cpu and not torch.cuda.is_available():
        print("torch_sdpa: torch.cuda.is_available() is False; measure mode needs a CUDA GPU "
              "(--device cpu is a dry run of this script, not a figure to compare)", file=sys.stderr)
        return 1
    dev = torch.device(args.device)
    if not on_cpu:
        torch.cuda.set_device(dev)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    backend_of = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}

    def sync():
        if not on_cpu:
            torch.cuda.synchronize(dev)

    def timed_ms(fn):
        if on_cpu:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    points = []
    for batch in args.batch:
        for s in args.seq:
            for causal in args.causal:
                shape = (batch, args.heads, s, args.head_dim)
                try:
                    q, k, v = (torch.randn(shape, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
                    do = torch.randn(shape, device=dev, dtype=dtype)
                except torch.cuda.OutOfMemoryError as e:
                    for name in args.backends:
                        for pas in args.passes:
                            points.append({"batch": batch, "heads": args.heads, "head_dim": args.head_dim,
                                           "seq_len": s, "causal": causal, "pass": pas, "dtype": args.dtype,
                                           "backend": name, "status": "oom", "reason": str(e).splitlines()[0]})
                    continue
                for name in args.backends:
                    for pas in args.passes:
                        bwd = pas == "fwd+bwd"
                        point = {"batch": batch, "heads": args.heads, "head_dim": args.head_dim, "seq_len": s,
                                 "causal": causal, "pass": pas, "dtype": args.dtype, "backend": name}

                        def step():
                            with sdpa_kernel([backend_of[name]]):
                                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                if bwd:
                                    o.backward(do)

                        label = f"S={s} B={batch} {'causal' if causal else 'dense'} {pas} {name}"
                        try:
                            for _ in range(args.warmup):
                                step()
                            sync()
                            times = [timed_ms(step) for _ in range(args.trials)]
                            ms = statistics.median(times)
                            f = flops(batch, args.heads, s, args.head_dim, causal, bwd)
                            point.update({"status": "ok", "ms": ms, "tflops": f / (ms * 1e-3) / 1e12,
                                          "trials": args.trials, "ms_min": min(times), "ms_max": max(times)})
                            print(f"torch sdpa {label}: {ms:.3f} ms, {point['tflops']:.1f} TFLOP/s", flush=True)
                        except torch.cuda.OutOfMemoryError as e:
                            point.update({"status": "oom", "reason": str(e).splitlines()[0]})
                            print(f"torch sdpa {label}: out of memory", flush=True)
                        except RuntimeError as e:  # the backend cannot run this shape or dtype here
                            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                            point.update({"status": "unsupported", "reason": reason[:300]})
                            print(f"torch sdpa {label}: not run ({reason[:120]})", flush=True)
                        q.grad = k.grad = v.grad = None
                        points.append(point)
                del q, k, v, do
                if not on_cpu:
                    torch.cuda.empty_cache()
    doc = {"tool": "torch", "op": "scaled_dot_product_attention", "torch_version": torch.__version__,
           "device": torch.cuda.get_device_name(dev) if not on_cpu else "cpu (dry run)", "simulated": False,
           "argv": sys.argv, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "method": (f"F.scaled_dot_product_attention(q, k, v, is_causal) under sdpa_kernel([backend]), q/k/v "
                      f"[B,H,S,D] {args.dtype}; fwd+bwd adds o.backward(do); {args.warmup} warm-up calls, then "
                      f"{args.trials} trials timed with {'the wall clock' if on_cpu else 'CUDA events'}; "
                      "ms is the median; FLOPs 4*B*H*S^2*D forward (halved causal), x3.5 with the backward"),
           "dtype": args.dtype, "heads": args.heads, "head_dim": args.head_dim, "points": points}
    write_json_atomic(args.json, doc)
    print(f"wrote {args.json}")
    return 0


# ---------------------------------------------------------------- compare



KEY = ("batch", "heads", "head_dim", "seq_len", "causal", "pass", "dtype")


def key_of(d):
    k = tuple(d.get(x) for x in KEY)
    return None if any(x is None for x in k) else k


def label(k):
    b, h, d, s, causal, pas, dt = k
    return f"B={b} H={h} D={d} S={s} {'causal' if causal else 'dense'} {pas} {dt}"


def compare(args):
    sb_docs, th = [], None
    for path in args.compare:
        doc = load_json(path, "torch_sdpa")
        if isinstance(doc, dict) and doc.get("tool") == "torch":
            if th is not None:
                raise SystemExit(f"torch_sdpa: two torch files given ({th[0]} and {path})")
            th = (path, doc)
        elif isinstance(doc, dict) and doc.get("kind") == "result":
            if doc.get("scenario") != "attention":
                print(f"torch_sdpa: skipping {path}: scenario {doc.get('scenario')!r}, not attention")
                continue
            device = doc.get("meta", {}).get("device", {})
            if isinstance(device, dict) and device.get("simulated") is True:
                raise SystemExit(f"torch_sdpa: {path} is simulated ({device.get('id', '?')}): a model is never "
                                 "compared with torch's measurement")
            sb_docs.append((path, doc))
        else:
            raise SystemExit(f"torch_sdpa: {path} is neither a stallbench result nor a torch_sdpa.py file")
    if not sb_docs or th is None:
        raise SystemExit(f"torch_sdpa: --compare needs {'a stallbench attention result' if not sb_docs else 'a torch_sdpa.py file'}")

    best = {}  # key -> (tflops, backend) over torch's backends that ran
    why_not = {}  # key -> reasons of those that did not
    for p in th[1].get("points", []):
        k = key_of(p)
        if k is None:
            continue
        if p.get("status") == "ok" and isinstance(p.get("tflops"), (int, float)):
            if k not in best or p["tflops"] > best[k][0]:
                best[k] = (float(p["tflops"]), p.get("backend", "?"))
        else:
            why_not.setdefault(k, []).append(f"{p.get('backend', '?')}: {p.get('status', '?')}")
    mine = {}  # key -> (tflops or None, status)
    for _, doc in sb_docs:
        for p in doc.get("points", []):
            prm = p.get("params", {})
            if prm.get("impl") != args.impl:
                continue
            k = key_of(prm)
            if k is None:
                continue
            m = p.get("metrics", {}).get("tflops", {})
            v = m.get("value") if isinstance(m, dict) else None
            if p.get("status") == "ok" and isinstance(v, (int, float)):
                if k not in mine or mine[k][0] is None or v > mine[k][0]:
                    mine[k] = (float(v), "ok")
            elif k not in mine:
                mine[k] = (None, p.get("status", "?"))

    print(f"attention, stallbench impl={args.impl} ({', '.join(p for p, _ in sb_docs)}) vs torch "
          f"{th[1].get('torch_version', '?')} SDPA's best backend on {th[1].get('device', '?')} ({th[0]})")
    print(f"gate: stallbench/torch >= {args.min_ratio} from seq_len {args.min_seq}")
    print(f"{'shape':>44} {'stallbench':>11} {'torch':>9} {'backend':>9} {'ratio':>7}  verdict")
    failures, gated_any = [], False
    for k in sorted(mine, key=lambda k: tuple(str(x) if isinstance(x, str) else x for x in k)):
        sv, sst = mine[k]
        tv, tb = best.get(k, (None, "-"))
        gated = k[3] >= args.min_seq
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"
        if sv is not None and tv:
            ratio = sv / tv
            gated_any |= gated
            ok = ratio >= args.min_ratio
            verdict = ("ok" if ok else "FAIL") if gated else "info (below gate length)"
            if gated and not ok:
                failures.append(f"{label(k)}: ratio {ratio:.3f} < {args.min_ratio}")
            rtext = f"{ratio:.3f}"
        else:
            rtext = "-"
            if sv is None:
                verdict = f"not compared (stallbench {sst})"
                if gated and tv:
                    verdict = f"FAIL (stallbench {sst})"
                    failures.append(f"{label(k)}: stallbench {sst}")
            else:
                verdict = "not compared (torch: " + ("; ".join(why_not.get(k, [])) or "not measured") + ")"
        print(f"{label(k):>44} {fmt(sv):>11} {fmt(tv):>9} {tb:>9} {rtext:>7}  {verdict}")
    if not mine:
        failures.append(f"no impl={args.impl} point in the stallbench results")
    elif not gated_any and not failures:
        failures.append(f"no shape from seq_len {args.min_seq} has both figures to gate on")
    if failures:
        print("comparison FAILED: " + "; ".join(failures))
        return 1
    print("comparison passed")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="torch_sdpa.py",
        description="Time torch's scaled_dot_product_attention per backend on a CUDA GPU, or compare stallbench's "
                    "attention results with it.",
        epilog="Exit codes: 0 ok, 1 comparison failed or measurement impossible, 2 bad arguments.")
    ap.add_argument("--seq", type=int_list, default=int_list("2048,4096,8192,16384"),
                    help="comma list of sequence lengths; default 2048,4096,8192,16384")
    ap.add_argument("--batch", type=int_list, default=[1], help="comma list of batch sizes; default 1")
    ap.add_argument("--heads", type=positive_int, default=16, help="default 16")
    ap.add_argument("--head-dim", type=positive_int, default=128, help="default 128")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--causal", type=bool_list, default=[False], help="false, true, or false,true; default false")
    ap.add_argument("--pass", dest="passes", type=choice_list(("fwd", "fwd+bwd"), "--pass"),
                    default=["fwd", "fwd+bwd"], help="fwd, fwd+bwd or both; default both")
    ap.add_argument("--backends", type=choice_list(BACKENDS, "--backends"), default=["cudnn", "flash", "efficient"],
                    help=f"comma list of {', '.join(BACKENDS)}; default cudnn,flash,efficient")
    ap.add_argument("--device", default="cuda:0", help="torch device; default cuda:0 (cpu: a dry run)")
    ap.add_argument("--warmup", type=positive_int, default=3, help="warm-up calls per point; default 3")
    ap.add_argument("--trials", type=positive_int, default=10, help="timed calls per point; default 10")
    ap.add_argument("--json", metavar="PATH", help="where measure mode writes its results (atomically)")
    ap.add_argument("--compare", nargs="+", metavar="FILE",
                    help="compare mode: stallbench attention result JSONs and one torch_sdpa.py JSON, any order")
    ap.add_argument("--impl", default="cudnn", help="compare: stallbench's implementation to compare; default cudnn")
    ap.add_argument("--min-ratio", type=positive_float, default=0.95,
                    help="compare: lowest acceptable stallbench/torch ratio; default 0.95")
    ap.add_argument("--min-seq", type=positive_int, default=4096,
                    help="compare: the ratio gates sequence lengths >= this; default 4096")
    args = ap.parse_args(argv)
    if args.compare is not None:
        if len(args.compare) < 2:
            ap.error(f"--compare takes stallbench attention results and one torch file, got {len(args.compare)} file(s)")
        return compare(args)
    if not args.json:
        ap.error("--json is required when measuring")
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
