#!/usr/bin/env python3
"""End-to-end dataloader runs: the seeds' experiment on sim:h100 (timed waits,
so stable on 2 cores), faults that must never hang the run, and the trace.

usage: test_dataloader_e2e.py STALLBENCH SCHEMA
Bounds are generous on purpose: the tight model-vs-measurement comparison is
in the result JSON (model_error_pts), not asserted here.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import schema_check  # jsonschema where installed, else the strict built-in validator

EXE, SCHEMA = sys.argv[1], sys.argv[2]
failures = []


def run(args, timeout=600):
    t = time.monotonic()
    p = subprocess.run([EXE, "run", "dataloader", *args], capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def validate(doc):
    with open(SCHEMA) as f:
        schema = json.load(f)
    errs = schema_check.errors(doc, schema)
    check(not errs, "schema: " + "; ".join(errs[:3]))


with tempfile.TemporaryDirectory() as tmp:
    # 1. The seeds' experiment on a simulated H100: one worker supplies half the demand.
    out, trace = os.path.join(tmp, "sim.json"), os.path.join(tmp, "trace.json")
    # supply=0.6 rather than the default 0.5: two workers then need 83% of this
    # 2-core machine, not all of it, so the check does not hinge on scheduling.
    p, _ = run(["--device", "sim:h100", "-p", "workers=0,1,2,4", "-p", "steps=30", "-p", "sample_bytes=65536",
                "-p", "supply=0.6", "-p", "step_ms=40", "--json", out, "--trace", trace])
    print(p.stdout[-3000:])
    if check(p.returncode == 0, f"sim run exit {p.returncode}: {p.stderr[-1500:]}"):
        doc = json.load(open(out))
        validate(doc)
        check(doc["meta"]["device"]["simulated"] is True, "sim result not labelled simulated")
        pts = {pt["params"]["workers"]: pt for pt in doc["points"]}
        cores = len(os.sched_getaffinity(0))  # the cores this process may use, not the machine's
        for w, pt in pts.items():
            m = pt["metrics"]
            err = abs(m["busy_pct"]["value"] - m["predicted_pct"]["value"])
            # The model gives each worker a core; past the core count it cannot hold.
            if w <= cores:
                check(err < 12, f"workers={w}: busy {m['busy_pct']['value']:.1f}% vs model {m['predicted_pct']['value']:.1f}%")
        check(pts[0]["info"]["pattern"] == "spiky", f"workers=0 pattern {pts[0]['info']['pattern']}, want spiky")
        check(pts[0]["metrics"]["busy_pct"]["value"] < 75, "workers=0 should leave the device starved")
        # The pattern must agree with the busy fraction.
        for w, pt in pts.items():
            busy, pat = pt["metrics"]["busy_pct"]["value"], pt["info"]["pattern"]
            check(not (pat == "healthy" and busy < 85) and not (pat == "spiky" and busy >= 90),
                  f"workers={w}: pattern {pat} with busy {busy:.1f}%")
        # Two workers supply 1.2x the demand when each really gets a core; the
        # measured load time says whether they did (another process may hold one).
        if pts[2]["metrics"]["predicted_pct"]["value"] >= 99:
            check(pts[2]["info"]["pattern"] == "healthy", f"workers=2 pattern {pts[2]['info']['pattern']}, want healthy")
            check(any("workers=2 is the smallest" in f["summary"] for f in doc["findings"]),
                  f"finding: {[f['summary'] for f in doc['findings']]}")
        else:
            print(f"note: the workers did not get their cores (predicted {pts[2]['metrics']['predicted_pct']['value']:.0f}%"
                  " at workers=2); the healthy check is left out")
        t = json.load(open(trace))
        names = {e["name"] for e in t["traceEvents"]}
        lanes = {e["args"]["name"] for e in t["traceEvents"] if e["name"] == "thread_name"}
        check({"load", "wait", "h2d", "compute", "idle"} <= names, f"trace phases {names}")
        check({"device", "train loop", "worker 0", "worker 3"} <= lanes, f"trace lanes {lanes}")
        check(sum(1 for e in t["traceEvents"] if e["name"] == "process_name") == 4, "one trace process per point")

    # 2. A sample that stalls its worker: caught by the loader timeout, exit 4, never a hang.
    out = os.path.join(tmp, "hang.json")
    p, secs = run(["--device", "cpu", "-p", "workers=2", "-p", "steps=8", "-p", "decode_us=100",
                   "-p", "fault=hang@70", "-p", "timeout_s=0.5", "--json", out], timeout=120)
    check(p.returncode == 4, f"hang: exit {p.returncode}, want 4: {p.stderr[-800:]}")
    check(secs < 60, f"hang run took {secs:.0f} s")
    if os.path.exists(out):
        pt = json.load(open(out))["points"][0]
        check(pt["status"] == "hang", f"hang: status {pt['status']}")
        check("sample 70" in pt.get("reason", "") and "worker" in pt.get("reason", ""),
              f"hang reason should name the sample and worker: {pt.get('reason')}")

    # Inline loading (workers=0) hangs in the main thread: still caught.
    p, secs = run(["--device", "cpu", "-p", "workers=0", "-p", "steps=4", "-p", "decode_us=100",
                   "-p", "fault=hang@3", "-p", "timeout_s=0.3", "--json", os.path.join(tmp, "h0.json")], timeout=120)
    check(p.returncode == 4, f"inline hang: exit {p.returncode}: {p.stderr[-500:]}")

    # 3. A corrupt sample: stop -> status error naming it; skip -> ok, one sample skipped.
    out = os.path.join(tmp, "throw.json")
    p, _ = run(["--device", "cpu", "-p", "workers=2", "-p", "steps=6", "-p", "decode_us=100",
                "-p", "fault=throw@40", "-p", "on_error=stop,skip", "--json", out], timeout=120)
    check(p.returncode == 1, f"throw: exit {p.returncode}, want 1 (a point failed)")
    if os.path.exists(out):
        pts = {pt["params"]["on_error"]: pt for pt in json.load(open(out))["points"]}
        check(pts["stop"]["status"] == "error" and "sample 40" in pts["stop"].get("reason", ""),
              f"throw/stop: {pts['stop']['status']} {pts['stop'].get('reason')}")
        check(pts["skip"]["status"] == "ok" and pts["skip"]["info"]["skipped_samples"] == 1,
              f"throw/skip: {pts['skip']['status']} {pts['skip'].get('info', {}).get('skipped_samples')}")

    # 4. The file source, both read paths, pinned and pageable.
    out = os.path.join(tmp, "file.json")
    p, _ = run(["--device", "cpu", "--quick", "-p", "workers=1", "-p", "source=file", "-p", "read=pread,mmap",
                "-p", "pin=pinned,pageable", "-p", "sample_bytes=4096", "--json", out], timeout=300)
    check(p.returncode == 0, f"file source: exit {p.returncode}: {p.stderr[-800:]}")
    if os.path.exists(out):
        for pt in json.load(open(out))["points"]:
            check(pt["status"] == "ok" and pt["metrics"]["h2d_gbs"]["value"] > 0, f"file point {pt['params']}")

    # 5. Bad input: exit 2 with a message.
    p, _ = run(["-p", "fault=explode@3"])
    check(p.returncode == 2 and "hang@N" in p.stderr, f"bad fault: exit {p.returncode} {p.stderr[-300:]}")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("ok")
