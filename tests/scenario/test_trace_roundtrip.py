#!/usr/bin/env python3
"""Round trip: each scenario's injected cause, captured with --trace (a PyTorch profiler / Kineto
trace) and fed back to `stallbench diagnose --trace`, is named as that cause, on cpu and sim:h100.

Causes a profiler trace can show: fp32 GEMMs (precision dtype=fp32), a starved loader (dataloader
workers=0), attention on the math path (attention impl=naive; cpu only: sim's eager attention is one
modelled interval, not the GEMM, softmax, GEMM kernels a trace shows), a launch-bound small batch (batch micro_batch=1), memory pressure (memory: its search runs at
the limit). Causes it cannot show, said so by diagnose and not tested for a finding: padding (packing:
a trace has no token counts), NaN and stalled losses (numerics), a collective mismatch across ranks
(collective: a hang, diagnosed from Flight Recorder dumps by analyze-hang). Their traces must still be
written in the format, read back, and validate against the result schema.

usage: test_trace_roundtrip.py STALLBENCH SCHEMA
"""
import json
import os
import subprocess
import sys
import tempfile

import schema_check

EXE, SCHEMA = sys.argv[1], sys.argv[2]
failures = []

CASES = [
    # (scenario, params, devices, the cause diagnose must name)
    # on sim a 256^3 GEMM is modelled at about a microsecond: a host stall of a loaded 2-core machine
    # could then make it under 5% of the GPU window (seen once in six runs); 2048^3 is ~0.3 ms, and
    # costs sim nothing more
    ("precision", {"cpu": ["-p", "dtype=fp32", "-p", "size=256"], "sim:h100": ["-p", "dtype=fp32", "-p", "size=2048"]},
     ["cpu", "sim:h100"], "fp32 where bf16 would do"),
    ("dataloader", ["-p", "workers=0"], ["cpu", "sim:h100"], "a slow host dataloader"),
    ("attention", ["-p", "impl=naive"], ["cpu"], "attention without a fused kernel"),
    ("batch", ["-p", "micro_batch=1"], ["cpu", "sim:h100"], "a batch too small (launch-bound)"),
    ("memory", [], ["cpu", "sim:h100"], "memory pressure"),
    ("packing", [], ["cpu"], None),
    ("numerics", [], ["cpu"], None),
]


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def no_steps(t, tag, tmp, dev, schema):
    """The same trace as a user profiling without a schedule writes it: no ProfilerStep#N. The loader must
    still be named, its iterations recovered from the DataLoader's own __next__ calls."""
    t = dict(t)
    t["traceEvents"] = [e for e in t["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    trace = os.path.join(tmp, f"nosteps-{dev.replace(':', '_')}.trace.json")
    with open(trace, "w") as f:
        json.dump(t, f)
    out = trace + ".diag.json"
    q = subprocess.run([EXE, "diagnose", "--trace", trace, "--device", "cpu", "--json", out],
                       capture_output=True, text=True, timeout=300)
    if not check(q.returncode == 0, f"{tag} without steps: exit {q.returncode}: {q.stderr[-400:]}"):
        return
    with open(out) as f:
        doc = json.load(f)
    check(not schema_check.errors(doc, schema), f"{tag} without steps: schema")
    loader = next(pt for pt in doc["points"] if pt["params"]["check"] == "loader")
    causes = [f["cause"] for f in doc["findings"]]
    check(loader["status"] == "ok" and "DataLoader" in loader["info"].get("iterations", ""),
          f"{tag} without steps: the loader's iterations not recovered: {loader.get('reason') or loader['info']}")
    check("a slow host dataloader" in causes, f"{tag} without steps: named {causes}")
    print(f"{tag} without ProfilerStep#N: iterations from {loader['info'].get('iterations')}; {causes}")


def main():
    with open(SCHEMA) as f:
        schema = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        for sc, by_device, devices, cause in CASES:
            for dev in devices:
                params = by_device[dev] if isinstance(by_device, dict) else by_device
                tag = f"{sc} {' '.join(params)} on {dev}"
                trace = os.path.join(tmp, f"{sc}-{dev.replace(':', '_')}.trace.json")
                res = os.path.join(tmp, f"{sc}.json")
                p = subprocess.run([EXE, "run", sc, "--device", dev, "--quick", *params, "--json", res, "--trace", trace],
                                   capture_output=True, text=True, timeout=600)
                if not check(p.returncode == 0, f"{tag}: run exit {p.returncode}: {p.stderr[-600:]}"):
                    continue
                with open(trace) as f:
                    t = json.load(f)
                evs = [e for e in t["traceEvents"] if e.get("ph") == "X"]
                kernels = [e for e in evs if e["cat"] == "kernel"]
                launches = {e["args"]["correlation"] for e in evs if e["cat"] == "cuda_runtime"}
                check(kernels, f"{tag}: the trace has no kernel")
                check(all(e["args"]["correlation"] in launches for e in kernels),
                      f"{tag}: a kernel without its launch's correlation id")
                check(t["deviceProperties"] and t["stallbench"]["scenario"] == sc, f"{tag}: trace header")
                out = os.path.join(tmp, f"{sc}-{dev.replace(':', '_')}.diag.json")
                q = subprocess.run([EXE, "diagnose", "--trace", trace, "--device", "cpu", "--json", out],
                                   capture_output=True, text=True, timeout=300)
                if not check(q.returncode == 0, f"{tag}: diagnose --trace exit {q.returncode}: {q.stderr[-600:]}"):
                    continue
                with open(out) as f:
                    doc = json.load(f)
                errs = schema_check.errors(doc, schema)
                check(not errs, f"{tag}: diagnose result against the schema: {errs[:3]}")
                causes = [f["cause"] for f in doc["findings"]]
                padding = next(pt for pt in doc["points"] if pt["params"]["check"] == "padding")
                check(padding["status"] == "skipped" and "token counts" in padding["reason"],
                      f"{tag}: padding should be said to be invisible in a trace")
                if cause:
                    check(cause in causes, f"{tag}: diagnose --trace named {causes}, not '{cause}'")
                print(f"{tag}: {len(evs)} events; diagnose --trace: {causes}")
                if sc == "dataloader":
                    no_steps(t, tag, tmp, dev, schema)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK: every injected cause a trace can show was named from its trace")
    return 0


if __name__ == "__main__":
    sys.exit(main())
