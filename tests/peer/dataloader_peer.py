#!/usr/bin/env python3
"""The real counterpart of stallbench's `dataloader` scenario: a PyTorch DataLoader
feeding a train step on the CPU.

stallbench reproduces "a slow host dataloader" with its own loader (DataLoader semantics
in C++) and a device step calibrated to `step_ms`. This script runs the real thing with
the same knobs, so the two can be put side by side (tests/peer/compare_dataloader.py):

  dataset  a torch Dataset whose __getitem__ does `decode_us` of busy CPU work and returns
           a uint8 tensor of `sample_bytes`. The work is a pure-Python integer mix run for
           a fixed number of iterations, calibrated before the loop (the fastest of many
           short chunks, as stallbench calibrates its decode). Fixed work, not a deadline
           loop and not sleep: a decode that shares a core takes longer in wall time, as
           a real decode (and stallbench's) does.
  loader   DataLoader(batch_size=batch, num_workers=workers, prefetch_factor=prefetch and
           persistent_workers=True and timeout=timeout_s when workers > 0, pin_memory=False).
  step     the batch copied into a preallocated tensor (the CPU analogue of stallbench's
           H2D copy), then `reps` fp32 512x512x512 torch.mm (stallbench's cpu step GEMM),
           reps = round(step_ms / the median of one mm measured alone). The step runs
           synchronously on the loop's thread with torch.set_num_threads(compute_threads);
           0 means half the CPUs, at least one, stallbench's default.

Persistent workers serve a short untimed warm-up epoch (`warmup` steps: worker start-up,
first allocations), then the timed epoch of `steps` batches. As in stallbench, the window
opens when the timed epoch's first batch arrives (the wait for it is first_batch_ms) and
closes when the last step ends. Per worker count:

  busy_pct       time inside train steps / window: the fraction of the time the compute ran
                 (stallbench's device busy fraction; here the step is synchronous)
  step_ms        mean time of one train step (stallbench's info.step_ms_achieved)
  samples_per_s  (steps - 1) * batch / window (stallbench's definition: after the first batch)
  wait_ms        time the loop waited for a batch inside the window, per step
  first_batch_ms from iter(loader) to the first batch

--pin-split mirrors stallbench's CPU split: the train loop's process on the first
compute_threads allowed CPUs, the workers on the rest (with workers=0 the loop loads on
its own CPUs: it is one thread). Without it the OS schedules everything, as a plain
PyTorch job runs.

Where the two sides differ by design (T = step, L = one batch's load):
  - stallbench's step runs on its device (on cpu, a compute thread): the loop waits only
    for the batch copy, so with workers=0 the inline load of the next batch overlaps the
    step, busy ~ min(1, T / L), which its predicted_pct models. Here the step runs on the
    loop's thread, so with workers=0 load and step alternate: busy ~ T / (T + L).
  - stallbench pins its compute to compute_threads CPUs and its loader to the rest, so
    workers never slow the step and never use more than the rest. Unpinned, the step and
    the worker processes share every CPU as the OS schedules them.
  - DataLoader workers are processes: each collates its batch into shared memory and
    passes it through a queue. stallbench's workers are threads that write into staging
    slots allocated once.

    /tmp/torchvenv/bin/python tests/peer/dataloader_peer.py --workers 0,1,2,4,8 --json out.json

Exit codes: 0 ok, 1 failure (a batch timed out, the output cannot be written), 2 bad
arguments, 77 torch is not importable (the script is never part of `meson test`).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

MASK64 = (1 << 64) - 1
GEMM_N = 512  # stallbench's cpu step kernel: fp32 512^3


# ---------------------------------------------------------------- arguments


def int_list(lo, hi):
    def parse(text):
        try:
            vals = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a comma list of integers, got {text!r}")
        if not vals or any(not lo <= v <= hi for v in vals):
            raise argparse.ArgumentTypeError(f"wants integers in {lo}..{hi}, got {text!r}")
        return vals
    return parse


def bounded(kind, lo, hi):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a number, got {text!r}")
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"wants a value in {lo}..{hi}, got {text!r}")
        return v
    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int_list(0, 64), default=[0, 1, 2, 4],
                   help="comma list of DataLoader num_workers (default 0,1,2,4)")
    p.add_argument("--batch", type=bounded(int, 1, 65536), default=32, help="samples per batch")
    p.add_argument("--decode-us", type=bounded(float, 1.0, 1e7), default=2000.0,
                   help="busy CPU work per sample, microseconds (default 2000)")
    p.add_argument("--step-ms", type=bounded(float, 0.1, 10000.0), default=20.0,
                   help="train step time when alone, ms (default 20)")
    p.add_argument("--steps", type=bounded(int, 2, 1000000), default=60, help="timed steps per point")
    p.add_argument("--warmup", type=bounded(int, 0, 1000), default=3,
                   help="untimed steps before the timed epoch (default 3)")
    p.add_argument("--sample-bytes", type=bounded(int, 16, 1 << 28), default=150528,
                   help="bytes per sample (default 150528: a 224x224 RGB uint8 image)")
    p.add_argument("--prefetch", type=bounded(int, 1, 64), default=2,
                   help="prefetch_factor: batches in flight per worker (default 2)")
    p.add_argument("--compute-threads", type=bounded(int, 0, 1024), default=0,
                   help="torch.set_num_threads for the step (0: half the allowed CPUs, at least 1)")
    p.add_argument("--timeout-s", type=bounded(float, 0.05, 3600.0), default=60.0,
                   help="DataLoader timeout: the longest the loop waits for a batch (default 60)")
    p.add_argument("--pin-split", action="store_true",
                   help="pin the loop to compute_threads CPUs and the workers to the rest, as stallbench does")
    p.add_argument("--json", metavar="FILE", help="write the results here (atomically)")
    return p.parse_args(argv)


# ---------------------------------------------------------------- machine


def machine():
    """The CPU this runs on: model, cores this process may use, and the ISA flags that
    name a machine kind (results/published/<kind>/)."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = val.strip()
                elif key == "flags" and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16") if f in flags]
    if "amx_tile" in flags:
        kind = "amx"
    elif "avx512_bf16" in flags:
        kind = "avx512-bf16"
    elif "avx512f" in flags:
        kind = "avx512"
    elif "avx2" in flags:
        kind = "avx2"
    else:
        kind = "x86"
    return {"model": model, "cores": cores, "isa": isa, "kind": f"cpu-{kind}-{cores}c"}


# ---------------------------------------------------------------- output


def write_atomic(path, text):
    """Writes text to path: a temporary file in the same directory, then renamed, so a
    reader never sees half a file."""
    path = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def figure(name, value, unit, direction, note):
    return {"name": name, "value": value, "unit": unit, "direction": direction, "note": note}


# ---------------------------------------------------------------- decode


def mix(iters, h):
    """The decode: a 64-bit multiply-xorshift chain, pure Python, `iters` rounds."""
    for _ in range(iters):
        h = ((h ^ (h >> 29)) * 0x100000001B3 + 0x9E3779B97F4A7C15) & MASK64
    return h


def mix_iters_per_us(seconds=0.1, chunk=2000):
    """Rounds of mix per microsecond: the fastest of many short chunks, so a chunk the
    scheduler interrupted (another process on a small machine) cannot slow every decode."""
    mix(chunk, 1)
    best, t_end = 0.0, time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        mix(chunk, 1)
        t1 = time.perf_counter()
        best = max(best, chunk / ((t1 - t0) * 1e6))
        if t1 >= t_end:
            return best


# ---------------------------------------------------------------- the run


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        from torch.utils.data import DataLoader, Dataset, Sampler, default_collate
    except ImportError as e:
        print(f"dataloader_peer: SKIP: torch is not importable ({e})", file=sys.stderr)
        return 77

    host = machine()  # before --pin-split narrows this process's CPUs
    allowed = sorted(os.sched_getaffinity(0))
    compute_threads = args.compute_threads or max(1, len(allowed) // 2)
    compute_cpus, loader_cpus = allowed, allowed
    if args.pin_split and compute_threads < len(allowed):
        compute_cpus, loader_cpus = allowed[:compute_threads], allowed[compute_threads:]
        os.sched_setaffinity(0, compute_cpus)  # before torch starts its thread pool; workers re-pin
    torch.set_num_threads(compute_threads)

    class DecodeDataset(Dataset):
        """Sample i: `iters` rounds of busy decode, then a uint8 tensor of sample_bytes."""

        def __init__(self, iters, sample_bytes):
            self.iters, self.sample_bytes = iters, sample_bytes

        def __getitem__(self, i):
            h = mix(self.iters, i)
            return torch.full((self.sample_bytes,), h & 0xFF, dtype=torch.uint8)

    class EpochSampler(Sampler):
        """Indices 0..n-1, n set before each epoch: persistent workers serve the warm-up
        epoch and then the timed one."""

        def __init__(self):
            self.n = 0

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            return self.n

    def pin_worker(_worker_id):
        os.sched_setaffinity(0, loader_cpus)

    # --- calibration: the decode, then the step's GEMM, both alone ---
    iters_per_us = mix_iters_per_us()
    dataset = DecodeDataset(max(1, round(args.decode_us * iters_per_us)), args.sample_bytes)
    a = torch.randn(GEMM_N, GEMM_N)
    b = torch.randn(GEMM_N, GEMM_N)
    c = torch.empty(GEMM_N, GEMM_N)
    staging = torch.empty(args.batch, args.sample_bytes, dtype=torch.uint8)

    def timed(fn, n):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    for _ in range(3):
        torch.mm(a, b, out=c)
    gemm_ms = timed(lambda: torch.mm(a, b, out=c), 21)
    reps = max(1, round(args.step_ms / gemm_ms))

    def step(batch):
        staging.copy_(batch)
        for _ in range(reps):
            torch.mm(a, b, out=c)

    one_batch = default_collate([dataset[i] for i in range(args.batch)])
    step_ms_alone = timed(lambda: step(one_batch), 5)
    load_ms_alone = timed(lambda: default_collate([dataset[i] for i in range(args.batch)]), 3)
    del one_batch

    doc = {
        "tool": "dataloader_peer",
        "argv": sys.argv,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": host,
        "torch": {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "num_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()},
        "config": {"batch": args.batch, "decode_us": args.decode_us, "step_ms": args.step_ms, "steps": args.steps,
                   "warmup": args.warmup, "sample_bytes": args.sample_bytes, "prefetch": args.prefetch,
                   "compute_threads": compute_threads, "timeout_s": args.timeout_s, "pin_split": args.pin_split,
                   "compute_cpus": compute_cpus, "loader_cpus": loader_cpus},
        "calibration": {
            "decode": "pure-Python 64-bit multiply-xorshift chain, fixed rounds per sample (busy CPU, not sleep)",
            "decode_rounds_per_us": iters_per_us,
            "decode_rounds": dataset.iters,
            "step": f"copy of the batch into a preallocated tensor + {reps} x fp32 {GEMM_N}^3 torch.mm",
            "gemm_ms": gemm_ms,
            "reps": reps,
            "step_ms_alone": step_ms_alone,
            "load_ms_alone": load_ms_alone,
        },
        "points": [],
    }
    print(f"dataloader_peer: {doc['machine']['model']}, torch {torch.__version__}, {compute_threads} compute "
          f"thread(s); step alone {step_ms_alone:.1f} ms ({reps} x {gemm_ms:.2f} ms mm), "
          f"load alone {load_ms_alone:.1f} ms per batch", flush=True)

    def run_point(workers):
        """One timed epoch at `workers`; the persistent workers are joined on return."""
        sampler = EpochSampler()
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=workers,
                            prefetch_factor=args.prefetch if workers else None, pin_memory=False,
                            persistent_workers=workers > 0, timeout=args.timeout_s if workers else 0,
                            worker_init_fn=pin_worker if args.pin_split and workers else None)
        if args.warmup:
            sampler.n = args.warmup * args.batch
            for batch in loader:
                step(batch)
        sampler.n = args.steps * args.batch
        t_iter = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        t_first = time.perf_counter()  # the window opens: the first batch arrived
        waits, steps = [], []
        for s in range(args.steps):
            if s:
                t0 = time.perf_counter()
                batch = next(it)
                waits.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            step(batch)
            steps.append(time.perf_counter() - t0)
        window = time.perf_counter() - t_first
        return {
            "params": {"workers": workers},
            "metrics": [
                figure("busy_pct", 100 * sum(steps) / window, "%", "higher",
                       "time inside train steps / window (first batch's arrival to the last step's end)"),
                figure("step_ms", 1e3 * statistics.fmean(steps), "ms", "lower",
                       "mean train step: batch copy + GEMMs, synchronous"),
                figure("samples_per_s", (args.steps - 1) * args.batch / window, "samples/s", "higher",
                       "after the first batch, as stallbench counts"),
                figure("wait_ms", 1e3 * sum(waits) / args.steps, "ms", "lower",
                       "time the loop waited for a batch in the window, per step"),
                figure("first_batch_ms", 1e3 * (t_first - t_iter), "ms", "lower",
                       "iter(loader) to the first batch"),
            ],
            "info": {"window_s": window, "step_ms_max": 1e3 * max(steps)},
        }

    for workers in args.workers:
        try:
            point = run_point(workers)
        except RuntimeError as e:  # the DataLoader timed out, or a worker died
            print(f"dataloader_peer: workers={workers}: {e}", file=sys.stderr)
            return 1
        doc["points"].append(point)
        m = {f["name"]: f["value"] for f in point["metrics"]}
        print(f"workers={workers}: busy {m['busy_pct']:.1f}%, step {m['step_ms']:.1f} ms, "
              f"{m['samples_per_s']:.0f} samples/s, wait {m['wait_ms']:.1f} ms/step", flush=True)

    if args.json:
        try:
            write_atomic(args.json, json.dumps(doc, indent=2) + "\n")
        except OSError as e:
            print(f"dataloader_peer: cannot write {args.json}: {e.strerror}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
