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
    recheck(doc)


def load(path):
    with open(path) as f:
        doc = json.load(f)
    validate(doc)
    return doc


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def pattern_of(u, progressed=True):
    """The rule of harness/sampler.hpp, written again from its definition."""
    if not progressed:
        return "stuck"
    if not u:
        return "idle"
    mean = sum(u) / len(u)
    if mean < 0.05:
        return "idle"
    if mean >= 0.90:
        return "healthy"
    if sum(x <= 0.2 for x in u) / len(u) >= 0.15 and sum(x >= 0.8 for x in u) / len(u) >= 0.15:
        return "spiky"
    return "steady-low"


def recheck(doc):
    """Each derived figure of each ok point, from the point's own data."""
    for pt in doc["points"]:
        if pt["status"] != "ok":
            continue
        m, i, w = pt["metrics"], pt["info"], pt["params"]["workers"]
        tag = f"workers={w} {pt['params'].get('pin')}"
        load, train = m["load_ms"]["value"], m["train_ms"]["value"]
        pred = 100 * min(1.0, max(1, w) * train / load)
        check(close(m["predicted_pct"]["value"], pred), f"{tag}: predicted_pct {m['predicted_pct']['value']} != {pred}")
        check(close(m["model_error_pts"]["value"], m["busy_pct"]["value"] - m["predicted_pct"]["value"], 1e-6),
              f"{tag}: model_error_pts != busy - predicted")
        check(i["bottleneck"] == ("loader" if load / max(1, w) > train else "device"), f"{tag}: bottleneck")
        check(close(i["step_ms_achieved"], train), f"{tag}: step_ms_achieved != train_ms")
        u = i["util_series"]
        if u:
            check(close(m["sampled_util_pct"]["value"], 100 * sum(u) / len(u), 1e-9),
                  f"{tag}: sampled_util_pct != mean of util_series")
        check(i["pattern"] == pattern_of(u, i["steps"] > 0), f"{tag}: pattern {i['pattern']} != rule's {pattern_of(u)}")
        check(0 <= m["first_batch_ms"]["value"] <= 1e3 * i["wall_s"], f"{tag}: first_batch_ms outside the run")
        window = i["wall_s"] - m["first_batch_ms"]["value"] / 1e3
        check(close(m["samples_per_s"]["value"], max(0, i["steps"] - 1) * pt["params"]["batch"] / window, 1e-6),
              f"{tag}: samples_per_s != (steps - 1) * batch / (wall - first batch)")


with tempfile.TemporaryDirectory() as tmp:
    # 1. The seeds' experiment on a simulated H100: one worker supplies half the demand.
    out, trace = os.path.join(tmp, "sim.json"), os.path.join(tmp, "trace.json")
    # supply=0.6 rather than the default 0.5: two workers then need 83% of this
    # 2-core machine, not all of it, so the check does not hinge on scheduling.
    p, _ = run(["--device", "sim:h100", "-p", "workers=0,1,2,4", "-p", "steps=30", "-p", "sample_bytes=65536",
                "-p", "supply=0.6", "-p", "step_ms=40", "--json", out, "--trace", trace])
    print(p.stdout[-3000:])
    if check(p.returncode == 0, f"sim run exit {p.returncode}: {p.stderr[-1500:]}"):
        doc = load(out)
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
        # The finding follows from the points, whatever this machine's load made of them: the
        # smallest worker count at >= 90% busy, its gain in samples/s over the worst point.
        ok90 = sorted(w for w, pt in pts.items() if pt["metrics"]["busy_pct"]["value"] >= 90)
        sums = [f["summary"] for f in doc["findings"]]
        worst = min(pts, key=lambda w: pts[w]["metrics"]["busy_pct"]["value"])
        if ok90 and ok90[0] != worst:
            f = next((f for f in doc["findings"] if f"workers={ok90[0]} is the smallest" in f["summary"]), None)
            if check(f is not None, f"finding should name workers={ok90[0]}: {sums}"):
                gain = pts[ok90[0]]["metrics"]["samples_per_s"]["value"] / pts[worst]["metrics"]["samples_per_s"]["value"]
                check(abs(f["speedup"] - gain) <= 1e-9 * gain, f"finding gain {f['speedup']} != samples/s ratio {gain}")
        elif not ok90:
            check(any("no worker count tried keeps" in s_ for s_ in sums), f"finding should say none is enough: {sums}")
        # Two workers supply 1.2x the demand when each really gets a core; the
        # measured load time says whether they did (another process may hold one).
        if pts[2]["metrics"]["predicted_pct"]["value"] >= 99:
            check(pts[2]["info"]["pattern"] == "healthy", f"workers=2 pattern {pts[2]['info']['pattern']}, want healthy")
        # The trace is a PyTorch profiler (Kineto) trace of the whole run: steps and the
        # DataLoader's __next__ as torch names them, the workers' loads on their own threads,
        # each kernel and copy paired with its launch by correlation id.
        t = json.load(open(trace))
        evs = [e for e in t["traceEvents"] if e.get("ph") == "X"]
        steps = [e for e in evs if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#")]
        check(len(steps) >= 4 * 29, f"trace: {len(steps)} ProfilerStep#N annotations for 4 points of 30 steps")
        # (a Python record_function in torch's DataLoader: user_annotation, as torch's traces have it)
        nexts = {e["name"] for e in evs if e["cat"] == "user_annotation" and e["name"].startswith("enumerate(DataLoader)#")}
        check(nexts == {"enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"}, f"trace: __next__ ops {nexts}")
        load_tids = {e["tid"] for e in evs if e["name"] == "DataLoader worker: load + collate"}
        check(len(load_tids) >= 4, f"trace: worker loads on {len(load_tids)} threads, want >= 4 (workers=4)")
        launches = {e["args"]["correlation"] for e in evs if e["cat"] == "cuda_runtime"}
        gpu = [e for e in evs if e["cat"] in ("kernel", "gpu_memcpy")]
        check(gpu and all(e["args"]["correlation"] in launches and e["pid"] == 0 for e in gpu),
              "trace: every GPU event on device 0 with its launch's correlation id")
        copies = [e for e in evs if e["cat"] == "gpu_memcpy" and e["name"].startswith("Memcpy HtoD")]
        check(copies and all(e["args"].get("bytes") == 32 * 65536 for e in copies),
              f"trace: H2D copies with the batch's bytes ({len(copies)} copies)")
        check(t["deviceProperties"][0]["name"] and "simulated" in t["stallbench"]["note"],
              "trace: deviceProperties and the simulated label")
        # read back: diagnose --trace names the loader (workers=0 and 1 starve the device)
        dj = os.path.join(tmp, "diag.json")
        q = subprocess.run([EXE, "diagnose", "--trace", trace, "--device", "cpu", "--json", dj],
                           capture_output=True, text=True, timeout=300)
        if check(q.returncode == 0, f"diagnose --trace exit {q.returncode}: {q.stderr[-800:]}"):
            fs = json.load(open(dj))["findings"]
            causes = [f["cause"] for f in fs]
            check("a slow host dataloader" in causes, f"diagnose --trace of the run: {causes}")
            # the trace's loaders already had workers (_MultiProcessingDataLoaderIter at workers 1-4): the
            # line says more than now, not a flat "dataloader_num_workers: 4" the run already used
            line = next((f["evidence"].get("config_line", "") for f in fs if f["cause"] == "a slow host dataloader"), "")
            check("more than now" in line and "_MultiProcessingDataLoaderIter" in line, f"loader line: {line}")

    # A sweep of pin at one worker count is not a sweep of workers: no finding names "the smallest
    # worker count", and each names its pin (it read "workers=1 is the smallest worker count ...;
    # workers=1 left it ...", found by a README walk-through).
    out = os.path.join(tmp, "pin.json")
    # supply=0.25: one worker loads a quarter of what the step takes, so the device waits at either pin
    # (30-38% busy here), and each pin has a finding to check
    p, _ = run(["--device", "cpu", "--quick", "-p", "workers=1", "-p", "supply=0.25", "-p", "pin=pinned,pageable",
                "--json", out])
    if check(p.returncode == 0 and os.path.exists(out), f"pin sweep: exit {p.returncode}: {p.stderr[-600:]}"):
        doc = load(out)
        sums = [f["summary"] for f in doc["findings"]]
        check(all("smallest worker count" not in s_ and s_.startswith(("pin=pinned: ", "pin=pageable: "))
                  for s_ in sums), f"pin sweep findings: {sums}")
        for pin in ("pinned", "pageable"):
            check(any(s_.startswith(f"pin={pin}: workers=1 leaves") for s_ in sums), f"pin={pin}: no finding: {sums}")

    # 2. A sample that stalls its worker: caught by the loader timeout, exit 4, never a hang.
    out = os.path.join(tmp, "hang.json")
    p, secs = run(["--device", "cpu", "-p", "workers=2", "-p", "steps=8", "-p", "decode_us=100",
                   "-p", "fault=hang@70", "-p", "timeout_s=0.5", "--json", out], timeout=120)
    check(p.returncode == 4, f"hang: exit {p.returncode}, want 4: {p.stderr[-800:]}")
    check(secs < 60, f"hang run took {secs:.0f} s")
    if check(os.path.exists(out), f"{out} was not written"):
        pt = load(out)["points"][0]
        check(pt["status"] == "hang", f"hang: status {pt['status']}")
        check("sample 70" in pt.get("reason", "") and "worker" in pt.get("reason", ""),
              f"hang reason should name the sample and worker: {pt.get('reason')}")

    # Inline loading (workers=0) hangs in the main thread: still caught.
    p, secs = run(["--device", "cpu", "-p", "workers=0", "-p", "steps=4", "-p", "decode_us=100",
                   "-p", "fault=hang@3", "-p", "timeout_s=0.3", "--json", os.path.join(tmp, "h0.json")], timeout=120)
    check(p.returncode == 4, f"inline hang: exit {p.returncode}: {p.stderr[-500:]}")
    if check(os.path.exists(os.path.join(tmp, "h0.json")), "inline hang: no result written"):
        pt = load(os.path.join(tmp, "h0.json"))["points"][0]
        check(pt["status"] == "hang" and "sample 3" in pt.get("reason", ""),
              f"inline hang: status {pt['status']}, reason {pt.get('reason')}")

    # 3. A corrupt sample: stop -> status error naming it; skip -> ok, one sample skipped.
    out = os.path.join(tmp, "throw.json")
    p, _ = run(["--device", "cpu", "-p", "workers=2", "-p", "steps=6", "-p", "decode_us=100",
                "-p", "fault=throw@40", "-p", "on_error=stop,skip", "--json", out], timeout=120)
    check(p.returncode == 1, f"throw: exit {p.returncode}, want 1 (a point failed)")
    if check(os.path.exists(out), f"{out} was not written"):
        pts = {pt["params"]["on_error"]: pt for pt in load(out)["points"]}
        check(pts["stop"]["status"] == "error" and "sample 40" in pts["stop"].get("reason", ""),
              f"throw/stop: {pts['stop']['status']} {pts['stop'].get('reason')}")
        check(pts["skip"]["status"] == "ok" and pts["skip"]["info"]["skipped_samples"] == 1,
              f"throw/skip: {pts['skip']['status']} {pts['skip'].get('info', {}).get('skipped_samples')}")

    # 4. The file source, both read paths, pinned and pageable.
    out = os.path.join(tmp, "file.json")
    p, _ = run(["--device", "cpu", "--quick", "-p", "workers=1", "-p", "source=file", "-p", "read=pread,mmap",
                "-p", "pin=pinned,pageable", "-p", "sample_bytes=4096", "--json", out], timeout=300)
    check(p.returncode == 0, f"file source: exit {p.returncode}: {p.stderr[-800:]}")
    if check(os.path.exists(out), f"{out} was not written"):
        for pt in load(out)["points"]:
            check(pt["status"] == "ok" and pt["metrics"]["h2d_gbs"]["value"] > 0, f"file point {pt['params']}")

    # 5. Bad input: exit 2 with a message.
    p, _ = run(["-p", "fault=explode@3"])
    check(p.returncode == 2 and "hang@N" in p.stderr, f"bad fault: exit {p.returncode} {p.stderr[-300:]}")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("ok")
