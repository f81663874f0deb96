#!/usr/bin/env python3
"""Records torch.utils.data.DataLoader's scheduling, deterministically.

Each case runs a real DataLoader (num_workers > 0, batch_size=None: one index
is one batch) over a dataset whose __getitem__(b) waits at a gate until this
script releases batch b. One batch is released at a time and this script waits
until that worker has finished it, so the order in which batches finish is
chosen here, never by the scheduler or a clock. What is recorded is what torch
decides given that order:

  dispatch B worker W handed H   torch sent batch B to worker W when H batches
                                 had been handed to the consumer (the one being
                                 handed counted; 0: the prefetch at iter())
  release B                      this script let batch B's worker run it
  deliver B worker W [error]     next() returned (or raised for) batch B

The release policy: among each worker's oldest dispatched, unreleased batch
(a worker runs its index queue in order), the lowest index, except that the
slow worker's first batch waits while any other worker has one: the slow
worker is stuck on its first batch until the others can do nothing more.
The consumer calls next() only when what it returns is already decided: with
in_order=True when the due batch has been released, with in_order=False when
a released batch has not been delivered (then it is the only one in flight).

Dispatch times come from the sampler (DataLoader's _next_index draws the next
index from it as it dispatches) and the worker from the iterator's own
_task_info; the worker is checked against get_worker_info() inside the worker.
Each case runs twice and must record the same lines.

Usage: python3 record.py > schedule.txt
"""
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

GATE_DEADLINE_S = 60.0  # a gate never opened is a failed recording, not a hang


class GatedDataset(Dataset):
    def __init__(self, n, gate_dir, errors):
        self.n, self.gate_dir, self.errors = n, gate_dir, set(errors)

    def __len__(self):
        return self.n

    def __getitem__(self, b):
        wid = get_worker_info().id
        go = os.path.join(self.gate_dir, f"go-{b}")
        t0 = time.monotonic()
        while not os.path.exists(go):
            if time.monotonic() - t0 > GATE_DEADLINE_S:
                raise TimeoutError(f"gate of batch {b} never opened")
            time.sleep(0.001)
        done = os.path.join(self.gate_dir, f"done-{b}")
        with open(done + ".tmp", "w") as f:
            f.write(str(wid))
        os.rename(done + ".tmp", done)  # whole, or not there
        if b in self.errors:
            raise RuntimeError(f"corrupt batch {b}")
        return (b, wid)


class LoggingSampler(Sampler):
    """Yields 0..n-1 and logs each draw: a draw is a dispatch."""

    def __init__(self, n, state):
        self.n, self.state = n, state

    def __len__(self):
        return self.n

    def __iter__(self):
        for b in range(self.n):
            self.state["draws"].append((b, self.state["handed"]))
            yield b


def run_case(workers, prefetch, in_order, batches, slow, errors=()):
    with tempfile.TemporaryDirectory() as gate_dir:
        state = {"handed": 0, "draws": []}
        loader = DataLoader(GatedDataset(batches, gate_dir, errors), batch_size=None,
                            sampler=LoggingSampler(batches, state), num_workers=workers,
                            prefetch_factor=prefetch, in_order=in_order, timeout=60)
        lines = []
        worker_of = {}
        logged = 0

        def log_dispatches(it):
            nonlocal logged
            for b, handed in state["draws"][logged:]:
                w = it._task_info[b][0]  # torch's record of the worker it sent b to
                worker_of[b] = w
                lines.append(f"dispatch {b} worker {w} handed {handed}")
            logged = len(state["draws"])

        it = iter(loader)  # primes prefetch_factor * num_workers dispatches
        log_dispatches(it)
        released, delivered = set(), set()
        slow_first = None  # the slow worker's first batch
        while len(delivered) < batches:
            if in_order:
                due = min(set(range(batches)) - delivered)
                can = due in released
            else:
                can = bool(released - delivered)
            if can:
                expect = due if in_order else min(released - delivered)
                state["handed"] += 1  # draws during this next() count the batch it hands
                try:
                    b, w = next(it)
                    err = ""
                except RuntimeError as e:
                    if "corrupt batch" not in str(e):
                        raise
                    b, w, err = expect, worker_of[expect], " error"
                log_dispatches(it)
                assert b == expect, (b, expect)
                assert w == worker_of[b], (b, w, worker_of[b])
                delivered.add(b)
                lines.append(f"deliver {b} worker {w}{err}")
                continue
            heads = {}
            for b in sorted(worker_of):
                if b not in released and worker_of[b] not in heads:
                    heads[worker_of[b]] = b
            if slow_first is None and slow in heads:
                slow_first = heads[slow]
            pick = [b for b in heads.values() if b != slow_first or slow_first in released]
            if not pick:
                pick = list(heads.values())
            b = min(pick)
            open(os.path.join(gate_dir, f"go-{b}"), "w").close()
            done = os.path.join(gate_dir, f"done-{b}")
            t0 = time.monotonic()
            while not os.path.exists(done):
                if time.monotonic() - t0 > GATE_DEADLINE_S:
                    raise TimeoutError(f"batch {b} released but never run")
                time.sleep(0.001)
            with open(done) as f:
                assert int(f.read()) == worker_of[b], b  # the worker ran what torch says it sent it
            released.add(b)
            lines.append(f"release {b}")
        try:
            next(it)
            raise AssertionError("no StopIteration")
        except StopIteration:
            pass
        assert len(state["draws"]) == batches
        return lines


CASES = [
    # name, workers, prefetch, in_order, batches, slow worker (-1: none), batches that raise
    ("unordered_w2_pf2_slow0", 2, 2, False, 12, 0, ()),
    ("unordered_w3_pf2_slow1", 3, 2, False, 16, 1, ()),
    ("unordered_w4_pf1_slow3", 4, 1, False, 14, 3, ()),
    ("unordered_w3_pf2_error4", 3, 2, False, 12, 2, (4,)),
    ("ordered_w2_pf1_slow1", 2, 1, True, 8, 1, ()),
    ("ordered_w3_pf2_slow0", 3, 2, True, 12, 0, ()),
    ("ordered_w2_pf2_error3", 2, 2, True, 10, 0, (3,)),
]


def main():
    out = [f"# torch {torch.__version__}: made by tests/data/dataloader_torch/record.py (see README.md)"]
    for name, workers, prefetch, in_order, batches, slow, errors in CASES:
        runs = [run_case(workers, prefetch, in_order, batches, slow, errors) for _ in range(2)]
        assert runs[0] == runs[1], f"{name}: two runs differ"
        err = " ".join(str(e) for e in errors) or "none"
        out.append(f"case {name} workers {workers} prefetch {prefetch} in_order {int(in_order)} "
                   f"batches {batches} slow {slow} errors {err}")
        out += runs[0]
        out.append("end")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
