#!/usr/bin/env python3
"""Scale of `stallbench analyze-hang` on PyTorch Flight Recorder dumps.

Writes RANKS pickle dumps of ENTRIES entries each (protocol 2, the fields and
shapes of a real gloo/NCCL dump, 8 Python frames per entry; rank RANKS-1 skips
one all_reduce near the end), then times `stallbench analyze-hang` on them:
wall-clock median of 3 runs and the peak resident memory (ru_maxrss).

  bench/fr_scale.py build/stallbench [--ranks 16] [--entries 20000]
"""
import argparse
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def dump(rank, ranks, entries, skip_at):
    frames = [{"name": f"fn{k}", "filename": f"/work/train/module_{k}.py", "line": 100 + k} for k in range(8)]
    ops = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    es = []
    seq = 0
    for i in range(entries):
        op = ops[i % 4]
        if rank == ranks - 1 and i == skip_at:
            continue  # the culprit skips this one: its later seqs shift
        seq += 1
        n = 1024
        es.append({"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                   "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:" + op,
                   "time_created_ns": 1_700_000_000_000_000_000 + i * 1000, "input_sizes": [[n]],
                   "input_dtypes": ["Float"], "output_sizes": [[n * ranks if op == "all_gather" else
                                                                n // ranks if op == "reduce_scatter" else n]],
                   "output_dtypes": ["Float"], "state": "completed" if i < skip_at else "started",
                   "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": i < skip_at,
                   "timeout_ms": 600000, "is_p2p": False, "frames": frames})
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                                   "ranks": str(list(range(ranks)))}},
            "pg_status": {"0": {"last_enqueued_collective": seq, "last_started_collective": -1,
                                "last_completed_collective": skip_at}},
            "entries": es}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stallbench")
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--entries", type=int, default=20000)
    a = ap.parse_args()
    if a.ranks < 2 or a.entries < 10:
        ap.error("--ranks >= 2 and --entries >= 10")
    with tempfile.TemporaryDirectory() as d:
        skip_at = a.entries - 5
        total = 0
        for r in range(a.ranks):
            p = os.path.join(d, f"rank_{r}")
            with open(p, "wb") as f:
                pickle.dump(dump(r, a.ranks, a.entries, skip_at), f, protocol=2)
            total += os.path.getsize(p)
        times, out = [], ""
        for _ in range(3):
            t0 = time.perf_counter()
            r = subprocess.run([a.stallbench, "analyze-hang", d], capture_output=True, text=True, timeout=600)
            times.append(time.perf_counter() - t0)
            out = r.stdout
            if r.returncode != 0:
                sys.exit(f"analyze-hang failed ({r.returncode}): {r.stderr}")
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        verdict = next((l for l in out.splitlines() if l.startswith("verdict")), "?")
        print(f"{a.ranks} ranks x {a.entries} entries, {total / 1e6:.1f} MB of pickle: "
              f"analyze-hang {statistics.median(times):.3f} s (median of 3, wall), peak RSS {rss:.0f} MiB; {verdict}")


if __name__ == "__main__":
    main()
