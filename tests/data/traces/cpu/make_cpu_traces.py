#!/usr/bin/env python3
"""Makes the CPU-only PyTorch profiler traces that tests/unit/test_trace_cpu.cpp reads.

Each trace trains a small model on the CPU under torch.profiler (activities=[CPU],
record_shapes=True) with one cause injected, and is written gzip'd beside this script
(<name>.pt.trace.json.gz, gzip mtime 0). README.md beside it says what each one injects and the
first finding `stallbench diagnose --trace` gives it.

    /path/to/venv/bin/python tests/data/traces/cpu/make_cpu_traces.py [--out DIR] [--only NAME ...]

One intra-op thread (torch.set_num_threads(1)) and fixed seeds: the traces are small and their
shares stable from run to run. Needs only torch (CPU wheels do).
"""
import argparse
import gzip
import json
import os
import platform
import shutil
import tempfile
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

HERE = os.path.dirname(os.path.abspath(__file__))


class MLP(nn.Module):
    """The model every trace trains: fp32 Linear/ReLU layers and a classifier."""

    def __init__(self, d_in, hidden, layers, classes, extra=None):
        super().__init__()
        mods = [nn.Linear(d_in, hidden), nn.ReLU()]
        if extra is not None:
            mods.append(extra)
        for _ in range(layers - 1):
            mods += [nn.Linear(hidden, hidden), nn.ReLU()]
        mods.append(nn.Linear(hidden, classes))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


class RowNorm(nn.Module):
    """A custom layer written as a Python loop over the batch's rows: each row scaled by its own
    norm, one small op at a time (what torch.nn.functional.normalize does in one call)."""

    def __init__(self, width):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x):
        rows = []
        for i in range(x.shape[0]):
            r = x[i]
            rows.append(r * self.scale / (r.norm() + 1e-6))
        return torch.stack(rows)


def batches(n, batch, d_in, classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, d_in, generator=g), torch.randint(0, classes, (batch,), generator=g))
            for _ in range(n)]


def step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def write(prof_or_path, name, out):
    """Exports (or takes) a Chrome trace, drops the machine's host name and the temporary path, gzips it
    with mtime 0."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "t.json")
        if isinstance(prof_or_path, str):
            shutil.copy(prof_or_path, raw)
        else:
            prof_or_path.export_chrome_trace(raw)
        with open(raw) as f:
            doc = json.load(f)
    doc.pop("host_name", None)
    doc["traceName"] = name + ".pt.trace.json"  # not the temporary file's path
    dst = os.path.join(out, name + ".pt.trace.json.gz")
    with open(dst, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(json.dumps(doc, separators=(",", ":")).encode())
    print(f"{dst}: {os.path.getsize(dst) / 1024:.0f} KiB, {len(doc['traceEvents'])} events")


def profiled_loop(name, out, model, opt, data, per_step=None, with_stack=False, active=4):
    """Trains over `data` under a schedule (wait 1, warm-up 1, `active` steps recorded), calling
    prof.step() once per step: ProfilerStep#N in the trace. `per_step(i, x, y, loss)` runs inside
    each step after the optimizer's."""
    sched = schedule(wait=1, warmup=1, active=active, repeat=1)
    done = {}

    def ready(p):
        done["trace"] = True
        write(p, name, out)

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=with_stack,
                 schedule=sched, on_trace_ready=ready) as prof:
        for i, (x, y) in enumerate(data[: 2 + active]):
            loss = step(model, opt, x, y)
            if per_step:
                per_step(i, x, y, loss)
            prof.step()
    assert done, name


def healthy(out):
    """(a) the baseline: a fp32 MLP at batch 256, compute-bound, nothing injected."""
    model = MLP(512, 1024, 2, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    profiled_loop("cpu_healthy_fp32", out, model, opt, batches(6, 256, 512, 10))


def item_sync(out):
    """(b) the baseline's loop with the loss and the batch's accuracy read and printed every step:
    loss.item() and (pred == y).float().mean().item(), two aten::item per step."""
    model = MLP(512, 1024, 2, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def log(i, x, y, loss):
        with torch.no_grad():
            acc = (model(x[:8]).argmax(1) == y[:8]).float().mean()
        print(f"step {i} loss {loss.item():.4f} acc {acc.item():.3f}", flush=True)

    profiled_loop("cpu_item_sync", out, model, opt, batches(6, 256, 512, 10), per_step=log, with_stack=True)


def alloc_churn(out):
    """(c) the baseline's loop with a 64 MiB scratch buffer made fresh by torch.zeros every step (a
    per-step buffer not kept across steps): the allocator maps fresh pages and zeroes them each time."""
    model = MLP(512, 1024, 2, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def scratch(i, x, y, loss):
        buf = torch.zeros(16 * 1024 * 1024)  # 64 MiB of fp32
        buf[: y.numel()] = y  # used a little, then dropped at the step's end

    profiled_loop("cpu_alloc_churn", out, model, opt, batches(6, 256, 512, 10), per_step=scratch,
                  with_stack=True)


def slow_layer(out):
    """(d) a custom RowNorm layer (a Python loop over the batch's 64 rows) after the first layer of a
    narrower MLP (256 -> 256 -> 10), with with_stack=True: the profiler names it nn.Module: RowNorm_0."""
    model = MLP(256, 256, 1, 10, extra=RowNorm(256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    profiled_loop("cpu_slow_layer", out, model, opt, batches(5, 64, 256, 10), with_stack=True, active=2)


class SlowDecode(torch.utils.data.Dataset):
    """A dataset whose __getitem__ does a sample's worth of Python work (a stand-in for decoding and
    augmenting an image in Python): about a millisecond a sample."""

    def __init__(self, n, d_in, classes):
        self.n, self.d_in, self.classes = n, d_in, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        acc = 0
        for k in range(12000):
            acc = (acc * 31 + k + i) % 1000003
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.d_in, generator=g) * (acc % 7 + 1) / 7, i % self.classes


def slow_loader(out):
    """(e) a DataLoader with num_workers=0 over SlowDecode, profiled without a schedule (no
    ProfilerStep#N, no prof.step()): the iterations are the loader's own __next__ calls."""
    model = MLP(512, 1024, 2, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(SlowDecode(64 * 6, 512, 10), batch_size=64, num_workers=0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for i, (x, y) in enumerate(loader):
            step(model, opt, x, y)
            if i == 4:
                break
    write(prof, "cpu_slow_loader_no_steps", out)


def tiny_matmuls(out):
    """(f) the framework's overhead around tiny matmuls: 8 Linear(16, 16) layers at batch 4, each op
    a few microseconds of math in its dispatch."""
    model = MLP(16, 16, 8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    profiled_loop("cpu_tiny_matmuls", out, model, opt, batches(6, 4, 16, 4))


def bf16_autocast(out):
    """(g) the baseline under torch.autocast('cpu', dtype=torch.bfloat16): its GEMMs in bf16."""
    model = MLP(512, 1024, 2, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = schedule(wait=1, warmup=1, active=4, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched,
                 on_trace_ready=lambda p: write(p, "cpu_bf16_autocast", out)) as prof:
        for x, y in batches(6, 256, 512, 10):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            prof.step()


TRACES = {"healthy": healthy, "item_sync": item_sync, "alloc_churn": alloc_churn, "slow_layer": slow_layer,
          "slow_loader": slow_loader, "tiny_matmuls": tiny_matmuls, "bf16_autocast": bf16_autocast}


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in have]
    except OSError:
        pass
    return []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--only", nargs="*", choices=sorted(TRACES))
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, flags {cpu_flags()}")
    for name in a.only or TRACES:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        TRACES[name](a.out)
        print(f"  {name}: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
