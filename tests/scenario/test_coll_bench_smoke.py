#!/usr/bin/env python3
"""coll_bench under mpirun -np 2 at tiny sizes (suite `bench-smoke`).

It must run to the end and write every figure: for each size, the bare loop's
busbw, the scenario's in both modes and their ratios, each a positive number
with its unit and direction. Timing ratios are not asserted (the machine is
noisy); a bad flag exits 2.

usage: test_coll_bench_smoke.py COLL_BENCH
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

BENCH = os.path.abspath(sys.argv[1])
MPIRUN = shutil.which("mpirun")
# As tests/scenario/test_collective_mpi.py: shared memory only; root in
# containers and CI; more ranks than cores on a 2-core runner.
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
SIZES = [4096, 65536]
FIGURES = {"bare_busbw": "GB/s", "blocking_busbw": "GB/s", "nonblocking_busbw": "GB/s",
           "blocking_ratio": "ratio", "nonblocking_ratio": "ratio"}
failures = []


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        if detail:
            print("     " + detail.replace("\n", "\n     "), flush=True)
        failures.append(what)
    return cond


def mpirun(args, outer=120):
    cmd = ["timeout", "-k", "5", str(outer), MPIRUN, *MPI_FLAGS, "-np", "2", BENCH, *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    if not MPIRUN:
        print("SKIP: mpirun not found (apt install openmpi-bin)")
        return 77
    tmp = tempfile.mkdtemp(prefix="sb-coll-bench-")
    try:
        p = mpirun(["--rounds", "x"], outer=60)
        check(p.returncode == 2 and "--rounds x" in p.stderr, f"a bad flag exits 2 (got {p.returncode})",
              p.stderr[-500:])
        out = os.path.join(tmp, "coll.json")
        p = mpirun(["--sizes", ",".join(map(str, SIZES)), "--rounds", "2", "--iters", "5", "--warmup", "1",
                    "--json", out])
        check(p.returncode == 0, f"coll_bench exits 0 (got {p.returncode})", (p.stdout + p.stderr)[-1500:])
        check("blocking" in p.stdout and "nonblocking" in p.stdout, "rank 0 prints the table", p.stdout[-800:])
        if not check(os.path.isfile(out), "--json FILE is written"):
            return 1
        doc = json.load(open(out))
        check(doc.get("ranks") == 2, f"ranks {doc.get('ranks')} == 2")
        rows = {r.get("bytes"): r for r in doc.get("sizes", [])}
        check(sorted(rows) == SIZES, f"a row per size: {sorted(rows)}")
        for b, row in sorted(rows.items()):
            for name, unit in FIGURES.items():
                f = row.get(name)
                tag = f"{b} B {name}"
                if not check(isinstance(f, dict), f"{tag} is present"):
                    continue
                v = f.get("value")
                check(isinstance(v, (int, float)) and math.isfinite(v) and v > 0, f"{tag} = {v} is positive")
                check(f.get("unit") == unit and f.get("direction") == "higher",
                      f"{tag} in {f.get('unit')}, {f.get('direction')} is better")
                rounds = f.get("rounds", [])
                check(len(rounds) == 2 and all(x > 0 for x in rounds), f"{tag}: both rounds positive: {rounds}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
