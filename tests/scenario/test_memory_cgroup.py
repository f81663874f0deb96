#!/usr/bin/env python3
"""Out-of-memory under a memory limit is a status, never a kill.

Makes a real memory cgroup (v1 or v2) with a 1 GiB limit, runs each
reproducer of issue #24 item 2 inside it, and checks that stallbench is not
killed: it exits 0, writes schema-valid JSON, and every point that cannot fit
is `oom` with a reason naming the bytes and the cgroup. A run that fits still
runs `ok` in the same cgroup, so the budget is not merely refusing everything.

Needs root and a writable memory cgroup hierarchy (CI has both); elsewhere it
exits 77 (SKIP) with the reason.

usage: test_memory_cgroup.py STALLBENCH SCHEMA
"""
import json
import os
import subprocess
import sys
import tempfile

import schema_check

EXE, SCHEMA = sys.argv[1], sys.argv[2]
LIMIT = 1 << 30
failures = []


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def own_memory_cgroup():
    """(directory of our memory cgroup, version, limit file)."""
    v1 = v2 = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                v1 = path
            if hid == "0" and controllers == "":
                v2 = path
    if v1 is not None and os.path.isdir("/sys/fs/cgroup/memory"):
        d = os.path.join("/sys/fs/cgroup/memory", v1.lstrip("/"))
        return (d if os.path.isdir(d) else "/sys/fs/cgroup/memory"), 1, "memory.limit_in_bytes"
    if v2 is not None and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        d = os.path.join("/sys/fs/cgroup", v2.lstrip("/"))
        d = d if os.path.isdir(d) else "/sys/fs/cgroup"
        with open(os.path.join(d, "cgroup.subtree_control")) as f:
            if "memory" not in f.read().split():
                skip(f"cgroup v2 {d} does not delegate the memory controller to its children")
        return d, 2, "memory.max"
    skip("no memory cgroup hierarchy is mounted")


def make_cgroup():
    if os.geteuid() != 0:
        skip("making a memory cgroup needs root")
    parent, version, limit_file = own_memory_cgroup()
    child = os.path.join(parent, f"stallbench-test-{os.getpid()}")
    try:
        os.mkdir(child)
        with open(os.path.join(child, limit_file), "w") as f:
            f.write(str(LIMIT))
    except OSError as e:
        try:
            os.rmdir(child)
        except OSError:
            pass
        skip(f"cannot make a memory cgroup under {parent}: {e}")
    return child, version


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def run_in(cg, args, out):
    def enter():  # in the child, before exec: move into the cgroup
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    return subprocess.run([EXE, "run", *args, "--json", out], capture_output=True, text=True, timeout=300,
                          preexec_fn=enter)


with open(SCHEMA) as f:
    schema = json.load(f)

cg, version = make_cgroup()
try:
    tmp = tempfile.mkdtemp(prefix="sb-cgroup-")
    cases = [
        # (name, args, what every point must be)
        ("naive attention S=8192", ["attention", "--quick", "-p", "seq_len=8192", "-p", "impl=naive", "-p", "pass=fwd"], "oom"),
        ("fp32 GEMM 16384^3", ["precision", "--quick", "-p", "size=16384", "-p", "dtype=fp32"], "oom"),
        ("two 256 MiB samples a batch", ["dataloader", "--quick", "-p", "workers=0", "-p", "steps=2", "-p", "batch=2",
                                         "-p", "sample_bytes=268435456"], "oom"),
        ("400 M sequences", ["packing", "--quick", "-p", "sequences=400000000", "-p", "lengths=fixed:16",
                             "-p", "strategy=pad-max"], "oom"),
        ("64 workers x prefetch 64", ["dataloader", "--quick", "-p", "workers=64", "-p", "prefetch=64", "-p", "steps=300"],
         "oom"),
        # The control: what fits runs.
        ("fp32 GEMM 512^3 (fits)", ["precision", "--quick", "-p", "size=512", "-p", "dtype=fp32"], "ok"),
    ]
    for name, args, want in cases:
        out = os.path.join(tmp, "r.json")
        if os.path.exists(out):
            os.remove(out)
        p = run_in(cg, args, out)
        tail = (p.stderr or "")[-600:]
        if not check(p.returncode == 0, f"{name}: exit {p.returncode} (-9 or 137 is the OOM killer), stderr: {tail}"):
            continue
        if not check(os.path.exists(out), f"{name}: no result JSON written"):
            continue
        with open(out) as f:
            doc = json.load(f)
        errs = schema_check.errors(doc, schema)
        check(not errs, f"{name}: schema: {'; '.join(errs[:3])}")
        statuses = [pt["status"] for pt in doc["points"]]
        check(statuses and all(s == want for s in statuses), f"{name}: statuses {statuses}, want all {want}")
        if want == "oom":
            for pt in doc["points"]:
                reason = pt.get("reason", "")
                check("needs" in reason, f"{name}: the oom reason does not name the bytes: {reason!r}")
                # The 1 GiB cgroup is the tightest bound here, so it must be the one named.
                check(f"cgroup v{version}" in reason, f"{name}: the reason does not name the cgroup: {reason!r}")
        print(f"ok: {name}: exit 0, statuses {sorted(set(statuses))}")
finally:
    for _ in range(50):
        try:
            os.rmdir(cg)
            break
        except OSError:
            import time
            time.sleep(0.1)

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("memory cgroup: every reproducer is a status, not a kill")
