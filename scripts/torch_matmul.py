#!/usr/bin/env python3
"""Time torch.matmul on a GPU, and compare stallbench's precision results with torch.

Measure mode: for each square size S, a [S,S] @ b [S,S] in the given dtype. There is a
warm-up, then trials timed with CUDA events. Each trial repeats the matmul enough times to
last about --trial-ms. Reported: median ms per matmul over the trials, and TFLOP/s.

    GEMM FLOPs = 2*M*N*K   (M = N = K = S)
    TFLOP/s    = 2*M*N*K / (median ms * 1e-3) / 1e12

    python3 scripts/torch_matmul.py --sizes 1024,2048,4096,8192 --dtype bf16 --json out.json

Compare mode: reads one stallbench precision result and one file this script wrote, in
either order. For each size it prints stallbench TFLOP/s, torch TFLOP/s and the ratio
stallbench/torch. It exits 1 if a ratio at a size >= --min-size (default 4096) is below
--min-ratio (default 0.95), or if stallbench has no ok point at such a size.

    python3 scripts/torch_matmul.py --compare precision-h200.json torch-matmul.json

Exit codes: 0 ok, 1 failure (the comparison failed, no CUDA, torch missing, unreadable
input), 2 bad arguments. torch is imported only in measure mode, so --help and --compare
work without it.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

DTYPES = ("bf16", "fp16", "fp32", "tf32")


def parse_sizes(text):
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes wants a comma list of integers, got {text!r}")
    if not sizes or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes wants positive integers, got {text!r}")
    return sizes


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a positive integer, got {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"wants a positive integer, got {text!r}")
    return v


def positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a positive number, got {text!r}")
    if not v > 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"wants a positive number, got {text!r}")
    return v


def write_json_atomic(path, doc):
    """Writes doc to path: a temporary file in the same directory, fsync'd, then renamed."""
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---------------------------------------------------------------- measure


def measure(args):
    try:
        import torch  # lazily: --help and --compare work without torch
    except ImportError as e:
        print(f"torch_matmul: torch is not importable ({e}); measure mode needs PyTorch", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("torch_matmul: torch.cuda.is_available() is False; measure mode needs a CUDA GPU", file=sys.stderr)
        return 1

    dev = torch.device(args.device)
    torch.cuda.set_device(dev)
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}[args.dtype]
    # tf32 is an fp32 GEMM with tensor-core inputs rounded to 10 mantissa bits; fp32 must not use it.
    torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"

    doc = {
        "tool": "torch",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev),
        "device_index": dev.index if dev.index is not None else torch.cuda.current_device(),
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": (f"torch.matmul(a, b, out=c), a [S,S] @ b [S,S] in {args.dtype}; {args.warmup} warm-up calls, "
                   f"then {args.trials} trials timed with CUDA events, each about {args.trial_ms} ms of repeated "
                   "calls; ms is the median per call over trials; TFLOP/s = 2*S^3 / time"),
        "points": [],
    }

    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    for s in args.sizes:
        m = n = k = s
        flops = 2.0 * m * n * k  # GEMM FLOPs = 2*M*N*K
        point = {"size": s, "dtype": args.dtype}
        try:
            a = torch.randn(m, k, device=dev, dtype=tdtype, generator=gen)
            b = torch.randn(k, n, device=dev, dtype=tdtype, generator=gen)
            c = torch.empty(m, n, device=dev, dtype=tdtype)

            for _ in range(args.warmup):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize(dev)

            # Estimate one call's time, then pick repetitions so a trial lasts ~trial_ms.
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                torch.matmul(a, b, out=c)
            end.record()
            end.synchronize()
            est_ms = max(start.elapsed_time(end) / 3, 1e-4)
            reps = max(1, min(args.max_reps, int(math.ceil(args.trial_ms / est_ms))))

            per_call_ms = []
            for _ in range(args.trials):
                start.record()
                for _ in range(reps):
                    torch.matmul(a, b, out=c)
                end.record()
                end.synchronize()
                per_call_ms.append(start.elapsed_time(end) / reps)

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
            print(f"torch matmul {args.dtype} {s}^3: {point['tflops']:.1f} TFLOP/s "
                  f"({ms:.4f} ms median of {args.trials} trials x {reps} calls)", flush=True)
            del a, b, c
        except torch.cuda.OutOfMemoryError as e:
            point.update({"status": "oom", "reason": str(e).splitlines()[0]})
            print(f"torch matmul {args.dtype} {s}^3: out of memory", flush=True)
        torch.cuda.empty_cache()
        doc["points"].append(point)

    if args.json:
        write_json_atomic(args.json, doc)
        print(f"wrote {args.json}")
    else:
        json.dump(doc, sys.stdout, indent=2)
        print()
    return 0


# ---------------------------------------------------------------- compare


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise SystemExit(f"torch_matmul: cannot read {path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"torch_matmul: {path} is not JSON: {e}")


def square_size(params):
    """The square size of a stallbench point: params.size (when m, n, k are 0 or absent,
    meaning "= size", or equal to it), or m when m == n == k. None for a non-square point."""
    if "size" in params:
        size = int(params["size"])
        for dim in ("m", "n", "k"):
            v = params.get(dim, 0)
            if isinstance(v, (int, float)) and v not in (0, size):
                return None
        return size
    if all(x in params for x in ("m", "n", "k")) and params["m"] == params["n"] == params["k"]:
        return int(params["m"])
    return None


def stallbench_tflops(doc, dtype):
    """size -> (tflops or None, status text) for the result's points of one dtype."""
    out = {}
    for p in doc.get("points", []):
        params = p.get("params", {})
        if params.get("dtype") != dtype:
            continue
        size = square_size(params)
        if size is None:
            continue
        status = p.get("status", "ok")
        metric = p.get("metrics", {}).get("tflops")
        value = metric.get("value") if isinstance(metric, dict) else metric
        if status == "ok" and isinstance(value, (int, float)):
            prev = out.get(size)
            if prev is None or prev[0] is None or value > prev[0]:
                out[size] = (float(value), "ok")
        elif size not in out:
            reason = p.get("reason", "")
            out[size] = (None, f"{status}{': ' + reason if reason else ''}")
    return out


def torch_tflops(doc, dtype):
    out = {}
    for p in doc.get("points", []):
        if p.get("dtype", dtype) != dtype:
            continue
        v = p.get("tflops")
        out[int(p["size"])] = (float(v), "ok") if isinstance(v, (int, float)) else (None, p.get("status", "missing"))
    return out


def compare(args):
    sb_doc = torch_doc = None
    for path in args.compare:
        doc = load(path)
        if isinstance(doc, dict) and doc.get("tool") == "torch":
            if torch_doc is not None:
                raise SystemExit(f"torch_matmul: two torch files given ({torch_doc[0]} and {path})")
            torch_doc = (path, doc)
        elif isinstance(doc, dict) and "points" in doc:
            if doc.get("scenario", "precision") != "precision":
                print(f"torch_matmul: skipping {path}: scenario {doc.get('scenario')!r}, not precision")
                continue
            if sb_doc is not None:
                raise SystemExit(f"torch_matmul: two stallbench precision results given ({sb_doc[0]} and {path})")
            sb_doc = (path, doc)
        else:
            raise SystemExit(f"torch_matmul: {path} is neither a stallbench result nor a torch_matmul file")
    if sb_doc is None or torch_doc is None:
        missing = "stallbench precision result" if sb_doc is None else "torch_matmul file"
        raise SystemExit(f"torch_matmul: --compare needs a {missing}")

    sb = stallbench_tflops(sb_doc[1], args.dtype)
    th = torch_tflops(torch_doc[1], args.dtype)
    print(f"{args.dtype} matmul, stallbench ({sb_doc[0]}) vs torch {torch_doc[1].get('torch_version', '?')} "
          f"on {torch_doc[1].get('device', '?')} ({torch_doc[0]})")
    print(f"gate: stallbench/torch >= {args.min_ratio} at sizes >= {args.min_size}")
    print(f"{'size':>7} {'stallbench':>11} {'torch':>9} {'ratio':>7}  verdict")

    failures = []
    sizes = sorted(set(sb) | set(th))
    if not sizes:
        failures.append(f"no {args.dtype} points in either file")
    for s in sizes:
        sv, sst = sb.get(s, (None, "missing"))
        tv, tst = th.get(s, (None, "missing"))
        gated = s >= args.min_size
        ratio = sv / tv if sv is not None and tv else None
        if ratio is not None:
            ok = ratio >= args.min_ratio
            verdict = ("ok" if ok else "FAIL") if gated else "info (below gate size)"
            if gated and not ok:
                failures.append(f"size {s}: ratio {ratio:.3f} < {args.min_ratio}")
        else:
            why = f"stallbench {sst}" if sv is None else f"torch {tst}"
            if gated and sv is None and s in th:
                verdict = f"FAIL ({why})"
                failures.append(f"size {s}: {why}")
            else:
                verdict = f"not compared ({why})"
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"
        print(f"{s:>7} {fmt(sv):>11} {fmt(tv):>9} {(f'{ratio:.3f}' if ratio is not None else '-'):>7}  {verdict}")

    gated_sizes = [s for s in sizes if s >= args.min_size and s in th]
    if sizes and not gated_sizes:
        failures.append(f"torch has no {args.dtype} size >= {args.min_size} to gate on")
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
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1024,2048,4096,8192"),
                    help="comma list of square sizes S (M=N=K=S); default 1024,2048,4096,8192")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16", help="matmul dtype; default bf16")
    ap.add_argument("--device", default="cuda:0", help="torch device; default cuda:0")
    ap.add_argument("--json", metavar="PATH", help="write the results here (atomically); default: stdout")
    ap.add_argument("--warmup", type=positive_int, default=10, help="warm-up calls per size; default 10")
    ap.add_argument("--trials", type=positive_int, default=15, help="timed trials per size; default 15")
    ap.add_argument("--trial-ms", type=positive_float, default=20.0,
                    help="target length of one trial in ms; default 20")
    ap.add_argument("--max-reps", type=positive_int, default=2000, help="cap on calls per trial; default 2000")
    ap.add_argument("--compare", nargs="+", metavar="FILE",
                    help="compare mode: a stallbench precision result JSON and a torch_matmul JSON, any order")
    ap.add_argument("--min-ratio", type=positive_float, default=0.95,
                    help="compare: lowest acceptable stallbench/torch ratio; default 0.95")
    ap.add_argument("--min-size", type=positive_int, default=4096,
                    help="compare: the ratio gates sizes >= this; default 4096")
    args = ap.parse_args(argv)
    if args.compare is not None:
        if len(args.compare) != 2:
            ap.error(f"--compare takes exactly two files (a stallbench result and a torch file), got {len(args.compare)}")
        return compare(args)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
