#!/usr/bin/env python3
"""Makes the trace pairs of diagnose --trace NEW --baseline OLD's tests: one small CPU training job (an
MLP in bf16 autocast, a DataLoader with 2 workers whose samples cost 0.5 ms each to make), profiled with
torch.profiler (record_shapes=True, a schedule: ProfilerStep#N), then the same job with one thing changed:

  base.pt.trace.json.gz      bf16 autocast, num_workers=2, no .item() in the step
  dtype.pt.trace.json.gz     autocast off: the GEMMs run in fp32
  workers.pt.trace.json.gz   num_workers=0: the samples are made in the training process
  sync.pt.trace.json.gz      loss.item() every step (a print of the loss)

  /path/to/venv/bin/python tests/data/traces/diff/make_diff_traces.py [OUT_DIR]

manifest.json beside them names each pair's change and torch's version.
"""
import gzip
import json
import os
import shutil
import sys
import time

VARIANTS = {
    "base": dict(bf16=True, workers=2, item=False),
    "dtype": dict(bf16=False, workers=2, item=False),
    "workers": dict(bf16=True, workers=0, item=False),
    "sync": dict(bf16=True, workers=2, item=True),
}
EXPECTED = {"dtype": "dtype", "workers": "loader", "sync": "sync"}


def make(out, name, bf16, workers, item):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            time.sleep(0.0005)  # decoding, tokenizing: 0.5 ms a sample
            g = torch.Generator().manual_seed(i)
            return torch.randn(256, generator=g), torch.randn(256, generator=g)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Slow(), batch_size=32, num_workers=workers, persistent_workers=workers > 0,
                        prefetch_factor=4 if workers > 0 else None)
    sched = torch.profiler.schedule(wait=0, warmup=2, active=8, repeat=1)
    it = iter(loader)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                record_shapes=True) as prof:
        for _ in range(10):
            x, y = next(it)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = (model(x).float() - y).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if item:
                print(f"loss {loss.item():.4f}", file=open(os.devnull, "w"))
            prof.step()
    tmp = os.path.join(out, f"{name}.pt.trace.json")
    prof.export_chrome_trace(tmp)
    with open(tmp, "rb") as f, gzip.open(tmp + ".gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    os.remove(tmp)


def main():
    import torch
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, v in VARIANTS.items():
        make(out, name, **v)
        print(f"{name}: {v}")
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"torch": torch.__version__, "variants": VARIANTS, "baseline": "base",
                   "expected_change": EXPECTED}, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
