#!/usr/bin/env python3
"""Time torch.matmul on a GPU, and compare stallbench's precision results with torch.

Measure mode: for each shape and dtype, a [M,K] @ b [K,N] into c [M,N]. Shapes are square
sizes S (--sizes, M = N = K = S) and M x N x K triples (--shapes, e.g. 16384x4096x4096, an
LLM's Linear: tokens x out x in). There is a warm-up, then trials timed with CUDA events (on
--device cpu, a dry run of this script, with the wall clock). Each trial repeats the matmul
enough times to last about --trial-ms. Reported: median ms per matmul over the trials, and
TFLOP/s.

    GEMM FLOPs = 2*M*N*K
    TFLOP/s    = 2*M*N*K / (median ms * 1e-3) / 1e12

    python3 scripts/torch_matmul.py --sizes 1024,2048,4096,8192 --shapes 16384x4096x4096 \
        --dtype fp32,tf32,bf16,fp16 --json out.json

Compare mode: reads stallbench precision results (one or more) and one file this script
wrote, in any order. For each shape and dtype torch measured it prints stallbench TFLOP/s,
torch TFLOP/s and the ratio stallbench/torch (stallbench's best point at that shape and
dtype, whatever its timing mode). It exits 1 if a ratio at a shape of at least --min-size^3
multiply-adds (default 4096) is below --min-ratio (default 0.95), if stallbench has no ok
point there, or if a stallbench result is simulated (a model is never compared with a
measurement).

    python3 scripts/torch_matmul.py --compare precision-h200.json torch-matmul.json

Exit codes: 0 ok, 1 failure (the comparison failed, no CUDA, torch missing, unreadable
input), 2 bad arguments. torch is imported only in measure mode, so --help and --compare
work without it.
"""

import argparse
import json
import math
import statistics
import sys
import time

from torch_script_common import int_list, load_json, positive_float, positive_int, write_json_atomic

DTYPES = ("bf16", "fp16", "fp32", "tf32")


def parse_shapes(text):
    shapes = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        dims = part.lower().split("x")
        try:
            m, n, k = (int(d) for d in dims)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shapes wants MxNxK triples of integers (16384x4096x4096), got {part!r}")
        if min(m, n, k) <= 0:
            raise argparse.ArgumentTypeError(f"--shapes wants positive dimensions, got {part!r}")
        shapes.append((m, n, k))
    if not shapes:
        raise argparse.ArgumentTypeError(f"--shapes wants at least one MxNxK, got {text!r}")
    return shapes


def parse_dtypes(text):
    dts = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in dts if d not in DTYPES]
    if not dts or bad:
        raise argparse.ArgumentTypeError(f"--dtype takes a comma list of {', '.join(DTYPES)}; got {text!r}")
    return list(dict.fromkeys(dts))





# ---------------------------------------------------------------- measure


def measure(args):
    try:
        import torch  # lazily: --help and --compare work without torch
    except ImportError as e:
        print(f"torch_matmul: torch is not importable ({e}); measure mode needs PyTorch", file=sys.stderr)
        return 1
    on_cpu = args.device == "cpu"
    if not on_cpu and not torch.cuda.is_available():
        print("torch_matmul: torch.cuda.is_available() is False; measure mode needs a CUDA GPU "
              "(--device cpu is a dry run of this script, not a figure to compare)", file=sys.stderr)
        return 1

    dev = torch.device(args.device)
    if not on_cpu:
        torch.cuda.set_device(dev)
    tdtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}

    def sync():
        if not on_cpu:
            torch.cuda.synchronize(dev)

    class Timer:  # CUDA events on a GPU; the wall clock on the cpu dry run
        def __init__(self):
            if not on_cpu:
                self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def start(self):
            if on_cpu:
                self.t0 = time.perf_counter()
            else:
                self.a.record()

        def stop_ms(self):
            if on_cpu:
                return (time.perf_counter() - self.t0) * 1e3
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b)

    doc = {
        "tool": "torch",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev) if not on_cpu else "cpu (dry run)",
        "device_index": (dev.index if dev.index is not None else torch.cuda.current_device()) if not on_cpu else None,
        "simulated": False,
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": (f"torch.matmul(a, b, out=c), a [M,K] @ b [K,N] -> c [M,N] in each dtype (tf32: fp32 tensors with "
                   f"torch.backends.cuda.matmul.allow_tf32; fp32 without); {args.warmup} warm-up calls, then "
                   f"{args.trials} trials timed with {'the wall clock' if on_cpu else 'CUDA events'}, each about "
                   f"{args.trial_ms} ms of repeated calls; ms is the median per call over trials; "
                   "TFLOP/s = 2*M*N*K / time"),
        "points": [],
    }

    shapes = [(s, s, s) for s in args.sizes] + list(args.shapes or [])
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    for dtype in args.dtype:
        tdtype = tdtypes[dtype]
        # tf32 is an fp32 GEMM with tensor-core inputs rounded to 10 mantissa bits; fp32 must not use it.
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        for m, n, k in shapes:
            flops = 2.0 * m * n * k  # GEMM FLOPs = 2*M*N*K
            point = {"m": m, "n": n, "k": k, "dtype": dtype}
            if m == n == k:
                point["size"] = m
            label = f"{m}^3" if m == n == k else f"{m}x{n}x{k}"
            try:
                a = torch.randn(m, k, device=dev, dtype=tdtype, generator=gen)
                b = torch.randn(k, n, device=dev, dtype=tdtype, generator=gen)
                c = torch.empty(m, n, device=dev, dtype=tdtype)

                for _ in range(args.warmup):
                    torch.matmul(a, b, out=c)
                sync()

                # Estimate one call's time, then pick repetitions so a trial lasts ~trial_ms.
                t = Timer()
                t.start()
                for _ in range(3):
                    torch.matmul(a, b, out=c)
                est_ms = max(t.stop_ms() / 3, 1e-4)
                reps = max(1, min(args.max_reps, int(math.ceil(args.trial_ms / est_ms))))

                per_call_ms = []
                for _ in range(args.trials):
                    t.start()
                    for _ in range(reps):
                        torch.matmul(a, b, out=c)
                    per_call_ms.append(t.stop_ms() / reps)

                ms = statistics.median(per_call_ms)
                point.update({
                    "status": "ok",
                    "tflops": flops / (ms * 1e-3) / 1e12,
                    "ms": ms,
                    "trials": args.trials,
                    "reps_per_trial": reps,
                    "ms_min": min(per_call_ms),
                    "ms_max": max(per_call_ms),
                })
                print(f"torch matmul {dtype} {label}: {point['tflops']:.1f} TFLOP/s "
                      f"({ms:.4f} ms median of {args.trials} trials x {reps} calls)", flush=True)
                del a, b, c
            except torch.cuda.OutOfMemoryError as e:
                point.update({"status": "oom", "reason": str(e).splitlines()[0]})
                print(f"torch matmul {dtype} {label}: out of memory", flush=True)
            except RuntimeError as e:  # a dtype this device's torch has no matmul for
                point.update({"status": "error", "reason": str(e).splitlines()[0] if str(e) else type(e).__name__})
                print(f"torch matmul {dtype} {label}: {point['reason']}", flush=True)
            if not on_cpu:
                torch.cuda.empty_cache()
            doc["points"].append(point)
    torch.backends.cuda.matmul.allow_tf32 = False

    if args.json:
        write_json_atomic(args.json, doc)
        print(f"wrote {args.json}")
    else:
        json.dump(doc, sys.stdout, indent=2)
        print()
    return 0


# ---------------------------------------------------------------- compare



def point_shape(params):
    """The (M, N, K) of a stallbench precision point: m, n and k, each 0 (or absent) meaning
    "= size", as the scenario reads them. None when neither says."""
    size = params.get("size")
    dims = []
    for d in ("m", "n", "k"):
        v = params.get(d, 0)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        if v == 0:
            if not isinstance(size, (int, float)) or isinstance(size, bool) or size <= 0:
                return None
            v = size
        dims.append(int(v))
    return tuple(dims)


def torch_shape(p):
    if all(isinstance(p.get(d), int) for d in ("m", "n", "k")):
        return (p["m"], p["n"], p["k"])
    if isinstance(p.get("size"), int):  # a file from before --shapes: square sizes only
        return (p["size"],) * 3
    return None


def stallbench_tflops(docs):
    """(shape, dtype) -> (best tflops or None, status text) over the results' points."""
    out = {}
    for doc in docs:
        for p in doc.get("points", []):
            params = p.get("params", {})
            shape = point_shape(params)
            dtype = params.get("dtype")
            if shape is None or not isinstance(dtype, str):
                continue
            key = (shape, dtype)
            status = p.get("status", "ok")
            metric = p.get("metrics", {}).get("tflops")
            value = metric.get("value") if isinstance(metric, dict) else metric
            if status == "ok" and isinstance(value, (int, float)):
                prev = out.get(key)
                if prev is None or prev[0] is None or value > prev[0]:
                    out[key] = (float(value), "ok")
            elif key not in out:
                reason = p.get("reason", "")
                out[key] = (None, f"{status}{': ' + reason if reason else ''}")
    return out


def torch_tflops(doc):
    out = {}
    for p in doc.get("points", []):
        shape = torch_shape(p)
        if shape is None:
            continue
        dtype = p.get("dtype", "bf16")
        v = p.get("tflops")
        out[(shape, dtype)] = (float(v), "ok") if isinstance(v, (int, float)) else (None, p.get("status", "missing"))
    return out


def shape_label(shape):
    m, n, k = shape
    return str(m) if m == n == k else f"{m}x{n}x{k}"


def compare(args):
    sb_docs, torch_doc = [], None
    for path in args.compare:
        doc = load_json(path, "torch_matmul")
        if isinstance(doc, dict) and doc.get("tool") == "torch":
            if torch_doc is not None:
                raise SystemExit(f"torch_matmul: two torch files given ({torch_doc[0]} and {path})")
            torch_doc = (path, doc)
        elif isinstance(doc, dict) and "points" in doc:
            if doc.get("scenario", "precision") != "precision":
                print(f"torch_matmul: skipping {path}: scenario {doc.get('scenario')!r}, not precision")
                continue
            device = doc.get("meta", {}).get("device", {})
            if isinstance(device, dict) and device.get("simulated") is True:
                raise SystemExit(f"torch_matmul: {path} is simulated ({device.get('id', '?')}): a model is never "
                                 "compared with torch's measurement")
            sb_docs.append((path, doc))
        else:
            raise SystemExit(f"torch_matmul: {path} is neither a stallbench result nor a torch_matmul file")
    if not sb_docs or torch_doc is None:
        missing = "stallbench precision result" if not sb_docs else "torch_matmul file"
        raise SystemExit(f"torch_matmul: --compare needs a {missing}")

    sb = stallbench_tflops([d for _, d in sb_docs])
    th = torch_tflops(torch_doc[1])
    print(f"matmul, stallbench ({', '.join(p for p, _ in sb_docs)}) vs torch {torch_doc[1].get('torch_version', '?')} "
          f"on {torch_doc[1].get('device', '?')} ({torch_doc[0]})")
    gate_flops = float(args.min_size) ** 3
    print(f"gate: stallbench/torch >= {args.min_ratio} at shapes of at least {args.min_size}^3 multiply-adds, "
          "for every shape and dtype torch measured")
    print(f"{'shape':>17} {'dtype':>5} {'stallbench':>11} {'torch':>9} {'ratio':>7}  verdict")

    failures = []
    keys = sorted(th, key=lambda x: (x[1], x[0][0] * x[0][1] * x[0][2], x[0]))
    if not keys:
        failures.append("the torch file has no points")
    gated_any = False
    for key in keys:
        shape, dtype = key
        sv, sst = sb.get(key, (None, "missing"))
        tv, tst = th[key]
        gated = shape[0] * shape[1] * shape[2] >= gate_flops
        ratio = sv / tv if sv is not None and tv else None
        if ratio is not None:
            gated_any |= gated
            ok = ratio >= args.min_ratio
            verdict = ("ok" if ok else "FAIL") if gated else "info (below gate size)"
            if gated and not ok:
                failures.append(f"{dtype} {shape_label(shape)}: ratio {ratio:.3f} < {args.min_ratio}")
        else:
            why = f"stallbench {sst}" if sv is None else f"torch {tst}"
            if gated and sv is None and tv is not None:
                verdict = f"FAIL ({why})"
                failures.append(f"{dtype} {shape_label(shape)}: {why}")
            else:
                verdict = f"not compared ({why})"
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"
        print(f"{shape_label(shape):>17} {dtype:>5} {fmt(sv):>11} {fmt(tv):>9} "
              f"{(f'{ratio:.3f}' if ratio is not None else '-'):>7}  {verdict}")
    only_sb = sorted({d for (_, d) in sb} - {d for (_, d) in th})
    if only_sb:
        print(f"not measured by torch: {', '.join(only_sb)} (stallbench's figures stand alone)")
    if keys and not gated_any and not failures:
        failures.append(f"no shape of at least {args.min_size}^3 has both figures to gate on")
    if failures:
        print("comparison FAILED: " + "; ".join(failures))
        return 1
    print("comparison passed")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="torch_matmul.py",
        description="Time torch.matmul on a CUDA GPU, or compare stallbench precision results with it.",
        epilog="Exit codes: 0 ok, 1 comparison failed or measurement impossible, 2 bad arguments.",
    )
    ap.add_argument("--sizes", type=int_list, default=int_list("1024,2048,4096,8192"),
                    help="comma list of square sizes S (M=N=K=S); default 1024,2048,4096,8192")
    ap.add_argument("--shapes", type=parse_shapes, default=None,
                    help="comma list of MxNxK shapes besides the sizes, e.g. 16384x4096x4096")
    ap.add_argument("--dtype", type=parse_dtypes, default=["bf16"],
                    help=f"comma list of matmul dtypes ({', '.join(DTYPES)}); default bf16")
    ap.add_argument("--device", default="cuda:0", help="torch device; default cuda:0")
    ap.add_argument("--json", metavar="PATH", help="write the results here (atomically); default: stdout")
    ap.add_argument("--warmup", type=positive_int, default=10, help="warm-up calls per size; default 10")
    ap.add_argument("--trials", type=positive_int, default=15, help="timed trials per size; default 15")
    ap.add_argument("--trial-ms", type=positive_float, default=20.0,
                    help="target length of one trial in ms; default 20")
    ap.add_argument("--max-reps", type=positive_int, default=2000, help="cap on calls per trial; default 2000")
    ap.add_argument("--compare", nargs="+", metavar="FILE",
                    help="compare mode: stallbench precision result JSONs and one torch_matmul JSON, any order")
    ap.add_argument("--min-ratio", type=positive_float, default=0.95,
                    help="compare: lowest acceptable stallbench/torch ratio; default 0.95")
    ap.add_argument("--min-size", type=positive_int, default=4096,
                    help="compare: the ratio gates shapes of at least this^3 multiply-adds; default 4096")
    args = ap.parse_args(argv)
    if args.compare is not None:
        if len(args.compare) < 2:
            ap.error(f"--compare takes stallbench precision results and one torch file, got {len(args.compare)} file(s)")
        return compare(args)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
