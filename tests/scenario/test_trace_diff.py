#!/usr/bin/env python3
"""diagnose --trace NEW --baseline OLD on pairs made for it: one small CPU training job profiled by real
PyTorch (tests/data/traces/diff/make_diff_traces.py), then the same job with one thing changed. The first
finding must name the change that was made: the GEMMs' dtype (autocast off), the loader (num_workers 2 ->
0), a new synchronization (loss.item() every step). A trace against itself names no change. Bad input
(--baseline without --trace, a job directory, a truncated baseline): exit 2.

usage: test_trace_diff.py STALLBENCH SCHEMA PAIR_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schema_check  # noqa: E402

CAUSE = {"dtype": "the GEMMs' dtype changed", "loader": "the DataLoader's wait changed",
         "sync": "a new synchronization in the step"}
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def diag(exe, args, out):
    p = subprocess.run([exe, "diagnose", *args, "--device", "cpu", "--json", out], capture_output=True, text=True,
                       timeout=120)
    doc = None
    if p.returncode == 0:
        with open(out) as f:
            doc = json.load(f)
    return p, doc


def main():
    exe, schema, pairs = sys.argv[1:4]
    with open(schema) as f:
        schema_doc = json.load(f)
    with open(os.path.join(pairs, "manifest.json")) as f:
        man = json.load(f)
    base = os.path.join(pairs, man["baseline"] + ".pt.trace.json.gz")
    with tempfile.TemporaryDirectory() as tmp:
        for name, kind in man["expected_change"].items():
            new = os.path.join(pairs, name + ".pt.trace.json.gz")
            p, doc = diag(exe, ["--trace", new, "--baseline", base], os.path.join(tmp, name + ".json"))
            if not check(p.returncode == 0, f"{name}: exit {p.returncode}: {p.stderr[-400:]}"):
                continue
            errs = schema_check.errors(doc, schema_doc)
            check(not errs, f"{name}: result JSON against the schema: {errs[:3]}")
            f = doc["findings"][0]
            check(f["cause"] == CAUSE[kind], f"{name}: first finding {f['cause']!r}, the change made was {kind}")
            check(f["evidence"].get("basis") == "measured", f"{name}: the change's time is not labelled measured")
            diff = doc["meta"]["diff"]
            print(f"  {name}: {diff['now']['step_ms']:.2f} ms per step against {diff['baseline']['step_ms']:.2f}; "
                  f"first: {f['cause']}: {f['summary'][:160]}")
            if kind == "dtype":
                check(f["evidence"]["detail"] == {"base_dtype": "bf16", "now_dtype": "f32"}, f"{name}: {f['evidence']}")
            if kind == "loader":
                check(f["evidence"]["detail"]["now_iter"] == "single", f"{name}: {f['evidence']}")
                check(f["speedup"] and f["speedup"] > 1.05, f"{name}: reverting the workers buys {f['speedup']}")
            if kind == "sync":
                check(f["evidence"]["detail"]["calls_per_step"] >= 1, f"{name}: {f['evidence']}")
        # a trace against itself
        p, doc = diag(exe, ["--trace", base, "--baseline", base], os.path.join(tmp, "self.json"))
        check(p.returncode == 0 and doc["findings"][0]["cause"] == "no named change",
              f"a trace against itself: exit {p.returncode}, {doc and doc['findings'][0]['cause']}")
        # bad input
        p, _ = diag(exe, ["--baseline", base], os.path.join(tmp, "x.json"))
        check(p.returncode == 2, f"--baseline without --trace: exit {p.returncode}")
        p, _ = diag(exe, ["--trace", base, "--baseline", pairs], os.path.join(tmp, "y.json"))
        check(p.returncode == 2 and "one trace file" in p.stderr, f"--baseline DIR: exit {p.returncode}: {p.stderr[-200:]}")
        trunc = os.path.join(tmp, "trunc.pt.trace.json")
        with open(trunc, "w") as f:
            f.write('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur"')
        p, _ = diag(exe, ["--trace", base, "--baseline", trunc], os.path.join(tmp, "z.json"))
        check(p.returncode == 2 and "trunc.pt.trace.json" in p.stderr, f"truncated baseline: exit {p.returncode}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK: each pair's change named first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
