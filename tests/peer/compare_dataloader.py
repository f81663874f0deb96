#!/usr/bin/env python3
"""stallbench's `dataloader` scenario beside a real PyTorch DataLoader loop, interleaved.

For each round and each worker count W, this runs

    stallbench run dataloader --device cpu -p workers=W -p decode_us=... (one point)
    dataloader_peer.py --workers W --decode-us ...                      (the real thing)

back to back, in alternating order (round 0 stallbench first, round 1 the peer first, ...),
so load on the machine that drifts during the run falls on both alike. It prints a
Markdown table of the means over rounds: busy % on each side and their difference, the
achieved step, samples/s, and stallbench's queueing-model prediction with its error; then
the samples/s gain of workers=2 over workers=0 on each side. It writes the table (.md) and
every run's figures (.json, each figure with its unit and direction) to --out, by default
results/peer/<machine kind>/dataloader.json, with the machine (CPU model, ISA flags, cores),
the torch version and the stallbench version and commit.

The peer needs PyTorch, which CI does not install: run this with a Python that has it.

    /tmp/torchvenv/bin/python tests/peer/compare_dataloader.py --workers 0,1,2,4,8 --rounds 2

What each side's figures mean, and where they differ, is in tests/peer/dataloader_peer.py.

Exit codes: 0 ok, 1 a run failed or timed out, 2 bad arguments, 77 torch is not importable
by --python (the script is never part of `meson test`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEER = HERE / "dataloader_peer.py"
sys.path.insert(0, str(HERE))
from dataloader_peer import bounded, int_list, machine, write_atomic  # noqa: E402  (stdlib only)

# The figures the table and the summary take from each side: (stallbench metric or info key, peer metric).
FIGURES = {
    "busy_pct": ("busy_pct", "busy_pct"),
    "step_ms": ("step_ms_achieved", "step_ms"),
    "samples_per_s": ("samples_per_s", "samples_per_s"),
    "wait_ms": ("wait_ms", "wait_ms"),
}


class RunFailed(Exception):
    pass


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stallbench", default=str(ROOT / "build" / "stallbench"),
                   help="the stallbench binary (default build/stallbench)")
    p.add_argument("--python", default=sys.executable, help="a Python with torch, for the peer (default: this one)")
    p.add_argument("--workers", type=int_list(0, 64), default=[0, 1, 2, 4, 8],
                   help="comma list of worker counts (default 0,1,2,4,8)")
    p.add_argument("--rounds", type=bounded(int, 1, 100), default=2, help="rounds over the worker counts (default 2)")
    p.add_argument("--batch", type=bounded(int, 1, 65536), default=32)
    p.add_argument("--decode-us", type=bounded(float, 1.0, 1e7), default=2000.0)
    p.add_argument("--step-ms", type=bounded(float, 0.1, 10000.0), default=20.0)
    p.add_argument("--steps", type=bounded(int, 2, 1000000), default=60)
    p.add_argument("--sample-bytes", type=bounded(int, 16, 1 << 28), default=150528)
    p.add_argument("--prefetch", type=bounded(int, 1, 64), default=2)
    p.add_argument("--compute-threads", type=bounded(int, 0, 1024), default=0,
                   help="CPUs for the step on both sides (0: half, stallbench's default)")
    p.add_argument("--pin-split", action="store_true",
                   help="pin the peer's loop and workers to separate CPUs, as stallbench does (default: unpinned)")
    p.add_argument("--run-timeout-s", type=bounded(float, 1.0, 86400.0), default=600.0,
                   help="the longest one run of either side may take (default 600)")
    p.add_argument("--out", help="result JSON path; the table goes beside it as .md "
                                 "(default results/peer/<machine kind>/dataloader.json)")
    return p.parse_args(argv)


def run(cmd, timeout_s, what):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{what}: no result within {timeout_s:.0f} s: {' '.join(cmd)}")
    except OSError as e:
        raise RunFailed(f"{what}: cannot run {cmd[0]}: {e.strerror}")
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
        raise RunFailed(f"{what}: exit {r.returncode}: {' '.join(cmd)}\n{tail}")
    return r


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise RunFailed(f"{what}: cannot read its result {path}: {e}")


def run_stallbench(args, workers, tmp):
    out = os.path.join(tmp, f"stallbench-w{workers}.json")
    params = {"workers": workers, "decode_us": args.decode_us, "batch": args.batch, "step_ms": args.step_ms,
              "steps": args.steps, "sample_bytes": args.sample_bytes, "prefetch": args.prefetch,
              "compute_threads": args.compute_threads}
    cmd = [args.stallbench, "run", "dataloader", "--device", "cpu", "--json", out]
    for k, v in params.items():
        cmd += ["-p", f"{k}={v}"]
    what = f"stallbench workers={workers}"
    run(cmd, args.run_timeout_s, what)
    doc = read_json(out, what)
    point = doc["points"][0]
    if point.get("status") != "ok":
        raise RunFailed(f"{what}: point status {point.get('status')}: {point.get('reason', '')}")
    figures = [{"name": k, **{f: m.get(f) for f in ("value", "unit", "direction")}}
               for k, m in point["metrics"].items()]
    figures.append({"name": "step_ms_achieved", "value": point["info"]["step_ms_achieved"], "unit": "ms",
                    "direction": "lower"})
    info = {k: point["info"][k] for k in ("step_gemm", "cpu_split", "bottleneck", "pattern", "warning")
            if k in point["info"]}
    return {"figures": figures, "info": info}, doc["meta"]


def run_peer(args, workers, tmp):
    out = os.path.join(tmp, f"peer-w{workers}.json")
    cmd = [args.python, str(PEER), "--workers", str(workers), "--batch", str(args.batch),
           "--decode-us", str(args.decode_us), "--step-ms", str(args.step_ms), "--steps", str(args.steps),
           "--sample-bytes", str(args.sample_bytes), "--prefetch", str(args.prefetch),
           "--compute-threads", str(args.compute_threads), "--json", out]
    if args.pin_split:
        cmd.append("--pin-split")
    what = f"peer workers={workers}"
    run(cmd, args.run_timeout_s, what)
    doc = read_json(out, what)
    point = doc["points"][0]
    return {"figures": point["metrics"], "info": point["info"], "calibration": doc["calibration"]}, doc


def value(side, name):
    for f in side["figures"]:
        if f["name"] == name:
            return f["value"]
    raise KeyError(name)


def summarize(rows, workers):
    """Per worker count: each figure's mean and its range over rounds, on each side."""
    out = []
    for w in workers:
        mine = [r for r in rows if r["workers"] == w]
        entry = {"workers": w, "rounds": len(mine)}
        for key, (sb_name, peer_name) in FIGURES.items():
            for side, name in (("stallbench", sb_name), ("peer", peer_name)):
                vals = [value(r[side], name) for r in mine]
                entry[f"{side}_{key}"] = {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}
        for name in ("predicted_pct", "model_error_pts"):
            vals = [value(r["stallbench"], name) for r in mine]
            entry[f"stallbench_{name}"] = {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}
        out.append(entry)
    return out


def table(summary, rounds):
    def m(entry, key):
        return entry[key]["mean"]

    lines = [
        "| workers | stallbench busy % | peer busy % | diff pts | stallbench step ms | peer step ms "
        "| stallbench samples/s | peer samples/s | stallbench predicted % | model_error_pts |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in summary:
        sb, peer = m(e, "stallbench_busy_pct"), m(e, "peer_busy_pct")
        lines.append(f"| {e['workers']} | {sb:.1f} | {peer:.1f} | {sb - peer:+.1f} "
                     f"| {m(e, 'stallbench_step_ms'):.1f} | {m(e, 'peer_step_ms'):.1f} "
                     f"| {m(e, 'stallbench_samples_per_s'):.0f} | {m(e, 'peer_samples_per_s'):.0f} "
                     f"| {m(e, 'stallbench_predicted_pct'):.1f} | {m(e, 'stallbench_model_error_pts'):+.1f} |")
    lines.append("")
    lines.append(f"Means over {rounds} round(s); diff pts = stallbench busy % - peer busy %.")
    by_w = {e["workers"]: e for e in summary}
    gain = None
    if 0 in by_w and 2 in by_w:
        gain = {side: m(by_w[2], f"{side}_samples_per_s") / m(by_w[0], f"{side}_samples_per_s")
                for side in ("stallbench", "peer")}
        lines.append(f"samples/s gain of workers=2 over workers=0: stallbench {gain['stallbench']:.2f}x, "
                     f"peer {gain['peer']:.2f}x.")
    return "\n".join(lines) + "\n", gain


def main(argv=None):
    args = parse_args(argv)
    if not os.access(args.stallbench, os.X_OK):
        print(f"compare_dataloader: {args.stallbench} is not an executable stallbench; build it or pass --stallbench",
              file=sys.stderr)
        return 2
    try:
        probe = subprocess.run([args.python, "-c", "import torch"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"compare_dataloader: cannot run {args.python}: {e}", file=sys.stderr)
        return 1
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        print(f"compare_dataloader: SKIP: torch is not importable by {args.python} ({why})", file=sys.stderr)
        return 77

    host = machine()
    out = Path(args.out) if args.out else ROOT / "results" / "peer" / host["kind"] / "dataloader.json"
    rows, sb_meta, peer_doc = [], None, None
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="compare_dataloader.") as tmp:
            for r in range(args.rounds):
                for w in args.workers:
                    order = ("stallbench", "peer") if r % 2 == 0 else ("peer", "stallbench")
                    row = {"round": r, "workers": w, "order": list(order)}
                    for side in order:
                        if side == "stallbench":
                            row[side], sb_meta = run_stallbench(args, w, tmp)
                        else:
                            row[side], peer_doc = run_peer(args, w, tmp)
                    rows.append(row)
                    print(f"round {r} workers={w}: busy stallbench {value(row['stallbench'], 'busy_pct'):.1f}% "
                          f"peer {value(row['peer'], 'busy_pct'):.1f}%  ({time.monotonic() - t0:.0f} s)",
                          file=sys.stderr, flush=True)
    except RunFailed as e:
        print(f"compare_dataloader: {e}", file=sys.stderr)
        return 1

    summary = summarize(rows, args.workers)
    md, gain = table(summary, args.rounds)
    header = (f"# dataloader: stallbench vs a real PyTorch DataLoader loop ({host['kind']})\n\n"
              f"{host['model']}, {host['cores']} CPUs ({', '.join(host['isa']) or 'no AVX'}); "
              f"torch {peer_doc['torch']['version']}; stallbench {sb_meta.get('version')} "
              f"({sb_meta.get('git_sha')}); {time.strftime('%Y-%m-%d', time.gmtime())}.\n"
              f"decode_us={args.decode_us:g}, batch={args.batch}, step_ms={args.step_ms:g}, steps={args.steps}, "
              f"sample_bytes={args.sample_bytes}, prefetch={args.prefetch}, compute threads "
              f"{peer_doc['config']['compute_threads']}, "
              f"peer {'pinned as stallbench' if args.pin_split else 'unpinned'}; "
              f"{args.rounds} interleaved round(s), {time.monotonic() - t0:.0f} s.\n\n")
    print(md, end="")
    doc = {
        "tool": "compare_dataloader",
        "argv": sys.argv,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host,
        "torch": peer_doc["torch"],
        "stallbench": {"path": args.stallbench, "version": sb_meta.get("version"), "git_sha": sb_meta.get("git_sha"),
                       "build": sb_meta.get("build")},
        "config": {k: getattr(args, k) for k in ("workers", "rounds", "batch", "decode_us", "step_ms", "steps",
                                                 "sample_bytes", "prefetch", "compute_threads", "pin_split")},
        "peer_config": peer_doc["config"],
        "summary": summary,
        "gain_workers2_over_0": gain,
        "runs": rows,
    }
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json.dumps(doc, indent=2) + "\n")
        write_atomic(out.with_suffix(".md"), header + md)
    except OSError as e:
        print(f"compare_dataloader: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {out} and {out.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
