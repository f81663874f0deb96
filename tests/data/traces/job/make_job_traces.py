#!/usr/bin/env python3
"""Makes the multi-rank CPU traces of diagnose --trace's job tests: a real PyTorch job (gloo, one plain
process per rank on 127.0.0.1, no GPU) profiled with torch.profiler on every rank, a step of a small MLP's
forward and backward, then an all_reduce of its gradients (as DDP does, by hand so that nothing else
differs between ranks). One rank sleeps before its all_reduce each step: the straggler the others wait for.

  /path/to/venv/bin/python tests/data/traces/job/make_job_traces.py [OUT_DIR]

writes OUT_DIR/<case>/rank<i>.pt.trace.json.gz (default: this script's directory) and manifest.json beside
them: the case, the world size, the delayed rank and its delay. Cases:
  straggler-3r   3 ranks, rank 2 sleeps 40 ms before each all_reduce
  balanced-3r    3 ranks, nobody sleeps
"""
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

CASES = {"straggler-3r": (3, 2, 0.040), "balanced-3r": (3, -1, 0.0)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, late_rank, delay, out):
    import time
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    torch.manual_seed(rank)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        if rank == late_rank:
            time.sleep(delay)
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()

    for _ in range(3):  # warm-up outside the profile
        step()
    dist.barrier()
    sched = torch.profiler.schedule(wait=0, warmup=1, active=4, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                record_shapes=True) as prof:
        for _ in range(5):
            step()
            prof.step()
    tmp = os.path.join(out, f"rank{rank}.pt.trace.json")
    prof.export_chrome_trace(tmp)
    with open(tmp, "rb") as f, gzip.open(tmp + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(tmp)
    dist.destroy_process_group()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank, world, port, late, delay, out = sys.argv[2:8]
        rank_main(int(rank), int(world), int(port), int(late), float(delay), out)
        return 0
    here = os.path.dirname(os.path.abspath(__file__))
    root = sys.argv[1] if len(sys.argv) > 1 else here
    import torch
    for case, (world, late, delay) in CASES.items():
        out = os.path.join(root, case)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        port = free_port()
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), str(port), str(late),
                                   str(delay), out]) for r in range(world)]
        codes = [p.wait(timeout=120) for p in procs]
        if any(codes):
            print(f"{case}: rank exit codes {codes}", file=sys.stderr)
            return 1
        with open(os.path.join(out, "manifest.json"), "w") as f:
            json.dump({"case": case, "world_size": world, "late_rank": late if late >= 0 else None,
                       "delay_s": delay, "torch": torch.__version__, "backend": "gloo",
                       "expected_straggler": late if late >= 0 else None}, f, indent=2)
            f.write("\n")
        print(f"{case}: {world} ranks in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
