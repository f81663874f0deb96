#!/usr/bin/env python3
"""The dataset-file cache behind `run dataloader -p source=file`, end to end.

- TMPDIR that names no directory: exit 2 naming TMPDIR, before anything runs.
- Written, then reused by the next run, and rewritten when zeroed (a file of
  the right size is never trusted); the result says which (info.dataset_file_cache).
- `stallbench clean --dry-run` lists, `clean` removes.
- SIGINT while a large file is being written: the process ends by SIGINT, says so on
  stderr, and no temporary file is left.

usage: test_dataset_cache.py STALLBENCH SCHEMA (every result is validated against it)
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import schema_check

EXE, SCHEMA = sys.argv[1], sys.argv[2]
with open(SCHEMA) as _f:
    RESULT_SCHEMA = json.load(_f)
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


tmp = tempfile.mkdtemp(prefix="sb-dscache-")
env = dict(os.environ, TMPDIR=tmp)
cache = os.path.join(tmp, f"stallbench-{os.getuid()}")


def run(args, **kw):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300, env=env, **kw)


def cache_state(out):
    with open(out) as f:
        doc = json.load(f)
    errs = schema_check.errors(doc, RESULT_SCHEMA)
    check(not errs, f"{out}: schema: {'; '.join(errs[:3])}")
    return [p["info"].get("dataset_file_cache") for p in doc["points"]], doc


try:
    # 1. A missing TMPDIR is bad input.
    p = subprocess.run([EXE, "run", "dataloader", "--quick", "-p", "source=file"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, TMPDIR=os.path.join(tmp, "missing")))
    check(p.returncode == 2, f"missing TMPDIR: exit {p.returncode}, want 2")
    check("TMPDIR=" in p.stderr and "not a writable directory" in p.stderr, f"missing TMPDIR: message {p.stderr!r}")

    # 2. Written, reused, rewritten when zeroed.
    out = os.path.join(tmp, "r.json")
    args = ["run", "dataloader", "--quick", "-p", "source=file", "-p", "workers=0", "-p", "steps=4",
            "-p", "sample_bytes=4096", "--json", out]
    p = run(args)
    if check(p.returncode == 0, f"first run: exit {p.returncode}: {p.stderr[-400:]}"):
        states, doc = cache_state(out)
        check(states == ["written"], f"first run: {states}, want written")
        path = doc["points"][0]["info"]["dataset_file"]
        check(path.startswith(cache), f"dataset file {path} is not under {cache}")
        p = run(args)
        check(p.returncode == 0 and cache_state(out)[0] == ["reused"], f"second run: {cache_state(out)[0]}")
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(b"\0" * size)
        p = run(args)
        states = cache_state(out)[0]
        check(p.returncode == 0 and len(states) == 1 and states[0].startswith("rewritten: no stallbench dataset header"),
              f"zeroed file: {states}")

    # 3. clean.
    stale = os.path.join(cache, "dataset-1x16-seed1.bin.tmp.999999999.0")
    with open(stale, "w") as f:
        f.write("left by a killed run")
    p = run(["clean", "--dry-run"])
    check(p.returncode == 0 and p.stdout.count("would remove") == 2, f"clean --dry-run: {p.stdout!r}")
    check(len(glob.glob(os.path.join(cache, "dataset-*"))) == 2, "clean --dry-run removed something")
    p = run(["clean"])
    check(p.returncode == 0 and p.stdout.count("removed") == 2, f"clean: {p.stdout!r}")
    check(glob.glob(os.path.join(cache, "dataset-*")) == [], f"clean left {os.listdir(cache)}")

    # 4. SIGINT mid-write: 2 GiB to write, interrupted once the temporary file appears.
    big = subprocess.Popen([EXE, "run", "dataloader", "--quick", "-p", "source=file", "-p", "workers=0",
                            "-p", "steps=16", "-p", "batch=8", "-p", "sample_bytes=16777216",
                            "--json", os.path.join(tmp, "big.json")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                           # a background or nohup test run may have SIGINT ignored: it is inherited
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    seen = False
    while time.monotonic() < deadline and big.poll() is None:
        if glob.glob(os.path.join(cache, "*.tmp.*")):
            seen = True
            break
        time.sleep(0.02)
    if check(seen, "the large dataset file's temporary file never appeared"):
        big.send_signal(signal.SIGINT)
    try:
        big.wait(timeout=60)
    except subprocess.TimeoutExpired:
        big.kill()
        big.wait()
        check(False, "SIGINT did not end the run within 60 s")
    check(big.returncode == -signal.SIGINT, f"SIGINT: returncode {big.returncode}, want {-signal.SIGINT}")
    err = big.stderr.read().decode(errors="replace")
    check("stallbench: interrupted (SIGINT)" in err, f"SIGINT: no line saying the run was interrupted: {err[-300:]!r}")
    left = glob.glob(os.path.join(cache, "*.tmp.*"))
    check(left == [], f"SIGINT left {left}")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("dataset cache: TMPDIR checked, written/reused/rewritten, clean, SIGINT leaves nothing")
