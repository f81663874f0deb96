#!/usr/bin/env python3
"""Reference numbers from Holistic Trace Analysis (HTA) for the real traces of HTA's test data.

The traces are third-party data, not in the repository: they are read from
$STALLBENCH_SHARED_DATA/traces (default: ../shared/traces beside the source root).
For each trace (default: every *.json.gz there) this runs HTA, the PyPI package
`HolisticTraceAnalysis`, in a child process of its own (so that its peak RSS is that trace's),
with the trace copied alone into a temporary folder (HTA reads a folder of rank traces), and
writes tests/data/traces/hta/<trace name without .json.gz>.json with:

  - the HTA, pandas and numpy versions, and how HTA read the trace (backend, rank, filter);
  - per rank: get_temporal_breakdown as HTA returns it;
  - per (rank, stream): get_idle_time_breakdown (host wait, kernel wait, other, in us, HTA's
    rounded ratios and the exact ratios), with the consecutive kernel delay threshold;
  - per rank: get_cuda_kernel_launch_stats summarised (pairs; sum, mean, median, min, max of
    cpu_duration, gpu_duration, launch_delay; short kernels; runtime and launch-delay outliers);
  - get_gpu_kernel_breakdown's kernel-type table;
  - an error string for every analysis HTA fails on, in place of its result;
  - "perf": HTA's wall time to parse (the TraceAnalysis constructor) and to run each analysis,
    and the child's peak RSS (getrusage ru_maxrss, KiB). This block is the only part that is
    not deterministic; everything else is sorted and rounded to 1e-6 so the fixtures diff cleanly.

Needs: python3 -m pip install HolisticTraceAnalysis psutil   (HTA 0.5.0 imports psutil but does
not declare it). docs/trace-analysis.md describes what HTA computes.

Usage: scripts/hta_reference.py [TRACE.json.gz ...] [--out-dir DIR] [--no-perf]
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
# HTA's traces (third-party data) are outside the repository; the answers computed here are the
# project's own and are committed.
TRACE_DIR = Path(os.environ.get("STALLBENCH_SHARED_DATA") or REPO.parent / "shared") / "traces"
OUT_DIR = REPO / "tests" / "data" / "traces" / "hta"

# HTA's defaults (hta/trace_analysis.py, TraceAnalysis, version 0.5.0), passed explicitly.
CONSECUTIVE_KERNEL_DELAY = 30  # get_idle_time_breakdown(consecutive_kernel_delay=30)
RUNTIME_CUTOFF = 50  # get_cuda_kernel_launch_stats(runtime_cutoff=50)
LAUNCH_DELAY_CUTOFF = 100  # get_cuda_kernel_launch_stats(launch_delay_cutoff=100)
INCLUDE_MEMORY_EVENTS = True  # get_cuda_kernel_launch_stats(include_memory_events=True)
INCLUDE_MEMORY_KERNELS = True  # get_gpu_kernel_breakdown(include_memory_kernels=True)


def trace_stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def clean(x: Any) -> Any:
    """Make a value JSON-ready and deterministic: numpy scalars to Python, floats rounded to 1e-6,
    NaN/inf to None, integral floats kept as floats."""
    try:
        import numpy as np  # noqa: F401

        if isinstance(x, np.generic):
            x = x.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        r = round(x, 6)
        return 0.0 if r == 0 else r
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return str(x)


def error_string(e: BaseException) -> str:
    """'Type: message (at hta/file.py:line in function)' for the innermost HTA frame."""
    where = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if f"{os.sep}hta{os.sep}" in frame.filename:
            rel = frame.filename[frame.filename.rfind(f"{os.sep}hta{os.sep}") + 1 :]
            where = f" (at {rel}:{frame.lineno} in {frame.name}: {frame.line})"
            break
    msg = str(e).strip().replace("\n", " ")
    return f"{type(e).__name__}: {msg}{where}"


def timed(fn: Callable[[], Any]) -> Tuple[Any, Optional[str], float]:
    t0 = time.perf_counter()
    try:
        return fn(), None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - every HTA failure is recorded, not raised
        return None, error_string(e), time.perf_counter() - t0


def summarise(values) -> Dict[str, Any]:
    n = int(len(values))
    if n == 0:
        return {"sum": 0.0, "mean": None, "median": None, "min": None, "max": None}
    return {
        "sum": float(values.sum()),
        "mean": float(values.mean()),
        "median": float(values.median()),
        "min": float(values.min()),
        "max": float(values.max()),
    }


# ----------------------------------------------------------------------------- child side


def run_child(trace: str, result_path: str) -> None:
    os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)  # HTA's default: round ns-resolution ts
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    import logging

    import numpy as np
    import pandas as pd

    import hta
    from hta.common.trace_parser import get_default_trace_parsing_backend
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import get_kernel_type

    logging.getLogger("hta").setLevel(logging.ERROR)
    try:
        from importlib.metadata import version as dist_version

        hta_version = dist_version("HolisticTraceAnalysis")
    except Exception:  # pragma: no cover
        hta_version = getattr(hta, "__version__", "unknown")

    rss_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out: Dict[str, Any] = {
        "trace": os.path.basename(trace),
        "hta_version": hta_version,
        "environment": {
            "pandas": pd.__version__,
            "numpy": np.__version__,
            "python": ".".join(map(str, sys.version_info[:3])),
            "parser_backend": str(get_default_trace_parsing_backend().value),
            "ns_rounding": True,
        },
        "parameters": {
            "consecutive_kernel_delay": CONSECUTIVE_KERNEL_DELAY,
            "runtime_cutoff": RUNTIME_CUTOFF,
            "launch_delay_cutoff": LAUNCH_DELAY_CUTOFF,
            "include_memory_events": INCLUDE_MEMORY_EVENTS,
            "include_memory_kernels": INCLUDE_MEMORY_KERNELS,
            "include_last_profiler_step": False,
        },
        "errors": {},
    }
    perf: Dict[str, Any] = {"analysis_s": {}}

    tmp = tempfile.mkdtemp(prefix="hta_ref_")
    try:
        shutil.copy(trace, os.path.join(tmp, os.path.basename(trace)))
        ta, err, dt = timed(lambda: TraceAnalysis(trace_dir=tmp))
        perf["parse_s"] = dt
        if err is not None:
            out["errors"]["parse"] = err
        else:
            analyse(ta, out, perf, get_kernel_type, pd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    perf["rss_at_start_kib"] = rss_start
    perf["rss_after_imports_kib"] = rss_imports
    perf["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["perf"] = perf
    with open(result_path, "w") as fh:
        json.dump(clean(out), fh)


def analyse(ta, out: Dict[str, Any], perf: Dict[str, Any], get_kernel_type, pd) -> None:
    t = ta.t
    ranks: List[int] = t.get_ranks()
    sym_table = t.symbol_table.get_sym_table()
    sym_index = t.symbol_table.get_sym_id_map()
    profiler_step_syms = sorted(k for k in sym_index if "ProfilerStep" in k)

    # ---- how HTA read the trace (after parsing, alignment and the iteration filter)
    read: Dict[str, Any] = {
        "ranks": ranks,
        "profiler_step_names": profiler_step_syms,
        "iteration_filter_applied": len(profiler_step_syms) > 1,
        "min_ts_us": int(t.min_ts),
        "per_rank": {},
    }
    for rank in ranks:
        df = t.get_trace(rank)
        gpu = df[df["stream"].ne(-1)]
        cats: Dict[str, int] = {}
        for c, n in gpu["cat"].map(lambda i: sym_table[i]).value_counts().items():
            cats[str(c)] = int(n)
        types: Dict[str, int] = {}
        for ktype, n in (
            gpu["name"].map(lambda i: get_kernel_type(sym_table[i])).value_counts().items()
        ):
            types[str(ktype)] = int(n)
        info: Dict[str, Any] = {
            "events": int(len(df)),
            "gpu_events": int(len(gpu)),
            "gpu_events_by_cat": dict(sorted(cats.items())),
            "gpu_events_by_kernel_type": dict(sorted(types.items())),
            "streams": sorted(int(s) for s in gpu["stream"].unique()),
            "gpu_zero_dur": int((gpu["dur"] == 0).sum()),
            "gpu_negative_dur": int((gpu["dur"] < 0).sum()),
        }
        if len(gpu):
            info["gpu_first_ts_us"] = float(gpu["ts"].min())
            info["gpu_last_end_us"] = float((gpu["ts"] + gpu["dur"]).max())
        read["per_rank"][str(rank)] = info
    out["read"] = read

    # ---- temporal breakdown
    res, err, dt = timed(lambda: ta.get_temporal_breakdown(visualize=False))
    perf["analysis_s"]["temporal_breakdown"] = dt
    if err is not None:
        out["errors"]["temporal_breakdown"] = err
    else:
        temporal = {}
        for row in res.to_dict("records"):
            temporal[str(int(row["rank"]))] = {k: v for k, v in row.items() if k != "rank"}
        out["temporal_breakdown"] = temporal

    # ---- idle time breakdown (HTA's default is ranks=[0]; we pass the trace's ranks)
    res, err, dt = timed(
        lambda: ta.get_idle_time_breakdown(
            ranks=ranks,
            visualize=False,
            consecutive_kernel_delay=CONSECUTIVE_KERNEL_DELAY,
        )
    )
    perf["analysis_s"]["idle_time_breakdown"] = dt
    if err is not None:
        out["errors"]["idle_time_breakdown"] = err
    else:
        idle_df = res[0]
        streams: Dict[str, Dict[str, Any]] = {}
        for row in idle_df.to_dict("records"):
            key = f"{int(row['rank'])}:{int(row['stream'])}"
            entry = streams.setdefault(
                key,
                {
                    "rank": int(row["rank"]),
                    "stream": int(row["stream"]),
                    "idle_time_us": {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0},
                    "hta_ratio": {"host_wait": None, "kernel_wait": None, "other": None},
                    "categories_returned": [],
                },
            )
            cat = str(row["idle_category"])
            entry["idle_time_us"][cat] = float(row["idle_time"])
            entry["hta_ratio"][cat] = row["idle_time_ratio"]
            entry["categories_returned"].append(cat)
        for entry in streams.values():
            total = sum(entry["idle_time_us"].values())
            entry["total_idle_us"] = total
            entry["ratio_exact"] = {
                k: (v / total if total != 0 else None) for k, v in entry["idle_time_us"].items()
            }
            entry["categories_returned"].sort()
        out["idle_time_breakdown"] = {
            "consecutive_kernel_delay": CONSECUTIVE_KERNEL_DELAY,
            "streams": streams,  # keyed "rank:stream"; the file is written with sort_keys
        }
        # Interval counts per category (a second call with HTA's own describe()).
        stats, err2, _ = timed(
            lambda: ta.get_idle_time_breakdown(
                ranks=ranks,
                visualize=False,
                show_idle_interval_stats=True,
                consecutive_kernel_delay=CONSECUTIVE_KERNEL_DELAY,
            )[1]
        )
        if err2 is not None:
            out["errors"]["idle_interval_stats"] = err2
        elif stats is not None:
            for cat, row in stats.iterrows():
                key = f"{int(row['rank'])}:{int(row['stream'])}"
                if key in streams:
                    streams[key].setdefault("interval_count", {})[str(cat)] = int(row["count"])

    # ---- kernel launch statistics
    res, err, dt = timed(
        lambda: ta.get_cuda_kernel_launch_stats(
            ranks=ranks,
            runtime_cutoff=RUNTIME_CUTOFF,
            launch_delay_cutoff=LAUNCH_DELAY_CUTOFF,
            include_memory_events=INCLUDE_MEMORY_EVENTS,
            visualize=False,
        )
    )
    perf["analysis_s"]["cuda_kernel_launch_stats"] = dt
    if err is not None:
        out["errors"]["cuda_kernel_launch_stats"] = err
    else:
        launch: Dict[str, Any] = {
            "runtime_cutoff": RUNTIME_CUTOFF,
            "launch_delay_cutoff": LAUNCH_DELAY_CUTOFF,
            "include_memory_events": INCLUDE_MEMORY_EVENTS,
            "per_rank": {},
        }
        for rank, ev in sorted(res.items()):
            df = t.get_trace(rank)
            cpu = df[df["stream"].eq(-1) & df["correlation"].isin(ev["correlation"])]
            by_name = cpu["name"].map(lambda i: sym_table[i]).value_counts()
            launch["per_rank"][str(rank)] = {
                "pairs": int(len(ev)),
                "unique_correlations": int(ev["correlation"].nunique()),
                "runtime_events_by_name": {str(k): int(v) for k, v in sorted(by_name.items())},
                "cpu_duration": summarise(ev["cpu_duration"]),
                "gpu_duration": summarise(ev["gpu_duration"]),
                "launch_delay": summarise(ev["launch_delay"]),
                "short_kernels_gpu_lt_cpu": int((ev["gpu_duration"] < ev["cpu_duration"]).sum()),
                "short_kernels_hta_plot": int(
                    (
                        (ev["cpu_duration"] <= RUNTIME_CUTOFF)
                        & (ev["gpu_duration"] < ev["cpu_duration"])
                    ).sum()
                ),
                "runtime_outliers": int((ev["cpu_duration"] > RUNTIME_CUTOFF).sum()),
                "launch_delay_outliers": int((ev["launch_delay"] > LAUNCH_DELAY_CUTOFF).sum()),
            }
        out["cuda_kernel_launch_stats"] = launch

    # ---- GPU kernel breakdown (kernel-type table)
    res, err, dt = timed(
        lambda: ta.get_gpu_kernel_breakdown(
            visualize=False, include_memory_kernels=INCLUDE_MEMORY_KERNELS
        )
    )
    perf["analysis_s"]["gpu_kernel_breakdown"] = dt
    if err is not None:
        out["errors"]["gpu_kernel_breakdown"] = err
    else:
        kernel_type_df = res[0]
        out["gpu_kernel_breakdown"] = {
            str(r["kernel_type"]): {"sum_us": r["sum"], "percentage": r["percentage"]}
            for r in kernel_type_df.to_dict("records")
        }


# ----------------------------------------------------------------------------- parent side


def run_one(trace: str, out_dir: Path, perf: bool = True) -> Dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result_path = fh.name
    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", trace, "--result", result_path],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if proc.returncode != 0 or os.path.getsize(result_path) == 0:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            result = {
                "trace": os.path.basename(trace),
                "errors": {"child": f"exit {proc.returncode}: " + " | ".join(tail)},
            }
        else:
            with open(result_path) as fh2:
                result = json.load(fh2)
    finally:
        os.unlink(result_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / f"{trace_stem(trace)}.json"
    written = result if perf else {k: v for k, v in result.items() if k != "perf"}
    with open(dest, "w") as fh3:
        json.dump(clean(written), fh3, indent=1, sort_keys=True)
        fh3.write("\n")
    return {"dest": str(dest), **result}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="*", help=f"trace files (default: {TRACE_DIR}/*.json.gz)")
    ap.add_argument("--out-dir", default=str(OUT_DIR))
    ap.add_argument(
        "--no-perf",
        action="store_true",
        help='leave out the "perf" block (timings, RSS), the only non-deterministic part',
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        run_child(args.child, args.result)
        return 0

    traces = args.traces or sorted(glob.glob(str(TRACE_DIR / "*.json.gz")))
    if not traces:
        where = "" if args.traces else f" in {TRACE_DIR} (set STALLBENCH_SHARED_DATA)"
        print("no traces" + where, file=sys.stderr)
        return 1
    status = 0
    for trace in traces:
        r = run_one(trace, Path(args.out_dir), perf=not args.no_perf)
        perf = r.get("perf", {})
        errs = r.get("errors", {})
        print(
            f"{os.path.basename(r['dest'])}: parse {perf.get('parse_s', float('nan')):.3f}s, "
            f"peak RSS {perf.get('peak_rss_kib', 0) / 1024:.1f} MiB, "
            f"errors: {', '.join(sorted(errs)) or 'none'}"
        )
        if "child" in errs or "parse" in errs:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
