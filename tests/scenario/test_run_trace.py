#!/usr/bin/env python3
"""diagnose DIR reads the profiler traces a run left beside its logs: a real Trainer run's output directory
(tests/data/run, made with transformers 5.25.0) with a torch.profiler trace put under it (a CPU trace made
with real torch: an .item() every step, tests/data/traces/cpu) gets the trace's findings beside the curves',
marked as the trace's; without a trace the `trace` check says how to make one; a lone trace that is not one
is exit 2, as diagnose --trace says.

usage: test_run_trace.py STALLBENCH SCHEMA DATA_DIR
"""
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schema_check  # noqa: E402

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def diag(exe, d, out):
    p = subprocess.run([exe, "diagnose", d, "--device", "cpu", "--json", out], capture_output=True, text=True,
                       timeout=120)
    doc = None
    if p.returncode == 0:
        with open(out) as f:
            doc = json.load(f)
    return p, doc


def main():
    exe, schema, data = sys.argv[1:4]
    with open(schema) as f:
        schema_doc = json.load(f)
    run = os.path.join(data, "run", "transformers-5.25.0", "tiny_run")
    trace = os.path.join(data, "traces", "cpu", "cpu_item_sync.pt.trace.json.gz")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        shutil.copytree(run, out)
        p, doc = diag(exe, out, os.path.join(tmp, "none.json"))
        if check(p.returncode == 0, f"run without a trace: exit {p.returncode}: {p.stderr[-300:]}"):
            pt = next(x for x in doc["points"] if x["params"]["check"] == "trace")
            check(pt["status"] == "skipped" and "torch.profiler" in pt["reason"], f"no trace: {pt}")
        os.makedirs(os.path.join(out, "profiler"))
        shutil.copy(trace, os.path.join(out, "profiler"))
        p, doc = diag(exe, out, os.path.join(tmp, "with.json"))
        if check(p.returncode == 0, f"run with a trace: exit {p.returncode}: {p.stderr[-300:]}"):
            check(not schema_check.errors(doc, schema_doc), "schema")
            t = doc["meta"]["run"]["traces"]
            check(len(t.get("read", [])) == 1 and t["read"][0].endswith("cpu_item_sync.pt.trace.json.gz"), f"traces {t}")
            from_trace = [f for f in doc["findings"] if f["evidence"].get("source") == "trace"]
            causes = [f["cause"] for f in from_trace]
            check("a sync in the step (.item() every step)" in causes, f"the trace's sync not named: {causes}")
            check(all(f["summary"].startswith("(the profiler trace)") for f in from_trace), "trace findings unmarked")
            # the curves' own findings stay first: the run's plateau at lr 1e-7
            check(doc["findings"][0]["evidence"].get("source") != "trace", f"first: {doc['findings'][0]['cause']}")
            print(f"  run + trace: {[f['cause'] for f in doc['findings']]}")
        # a lone trace that is not one: exit 2 naming it
        bad = os.path.join(out, "profiler", "cpu_item_sync.pt.trace.json.gz")
        with gzip.open(bad, "wt") as f:
            f.write('{"traceEvents": [')
        p, _ = diag(exe, out, os.path.join(tmp, "bad.json"))
        check(p.returncode == 2 and "cpu_item_sync.pt.trace.json.gz" in p.stderr, f"bad trace: exit {p.returncode}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
