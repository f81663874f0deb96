#!/usr/bin/env python3
"""The Python package (python/stallbench) over the real binary, without torch: import, binary
lookup, run, diagnose_trace, analyze_hang, the exit codes and timeouts.

usage: test_python_api.py STALLBENCH [PYTHON_DIR]     (PYTHON_DIR: default ../../python from here)
Exit 0 pass, 1 fail.
"""
import os
import stat
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "tests", "data")

failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        failures.append(msg)
    return cond


def raises(fn, *args, **kw):
    """The StallbenchError fn raises, or None."""
    import stallbench
    try:
        fn(*args, **kw)
    except stallbench.StallbenchError as e:
        return e
    return None


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    sys.path.insert(0, os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(ROOT, "python"))
    os.environ["STALLBENCH_BIN"] = binary

    # -- import: no torch, no transformers -------------------------------------------------------
    import stallbench
    check("torch" not in sys.modules and "transformers" not in sys.modules,
          "import stallbench imports neither torch nor transformers")
    check(stallbench.find_binary() == binary, "find_binary() takes $STALLBENCH_BIN")

    # -- run ------------------------------------------------------------------------------------
    t = time.monotonic()
    r = stallbench.run("precision", quick=True, device="cpu")
    ok = [p for p in r["points"] if p.get("status") == "ok"]
    check(r["exit_code"] == 0 and r["scenario"] == "precision" and r["kind"] == "result",
          f"run('precision', quick=True): exit 0, a precision result ({time.monotonic() - t:.1f} s)")
    check(len(ok) > 0 and all(p["metrics"]["tflops"]["value"] > 0 and p["metrics"]["ms"]["value"] > 0 for p in ok),
          f"run: {len(ok)} ok points, each with tflops > 0 and ms > 0")
    check(any(p["params"]["dtype"] == "fp32" for p in ok), "run: fp32 measured on this CPU")
    r = stallbench.run("precision", quick=True, size=[256, 320], dtype="fp32", trials=2)
    sizes = sorted(p["params"]["size"] for p in r["points"])
    check(sizes == [256, 320] and all(p["params"]["trials"] == 2 for p in r["points"]),
          f"run: a list is a comma sweep (-p size=256,320), scalars -p k=v: sizes {sizes}")
    check(stallbench._cli.param_args({"in_order": False, "workers": (0, 2)})
          == ["-p", "in_order=false", "-p", "workers=0,2"], "param_args: bools true/false, tuples comma lists")

    # exit 4 (hang caught) still returns the result, with exit_code
    r = stallbench.run("dataloader", quick=True, workers=1, fault="hang@3", timeout_s=0.3)
    check(r["exit_code"] == stallbench.EXIT_HANG and r["points"][0]["status"] == "hang",
          f"run with a hung loader: exit_code {r['exit_code']}, point status {r['points'][0]['status']}")
    check("exit 4 (hang caught)" in stallbench.summarize(r), "summarize names the hang")

    # -- diagnose --trace -----------------------------------------------------------------------
    trace = os.path.join(DATA, "traces", "cpu", "cpu_slow_loader_no_steps.pt.trace.json.gz")
    r = stallbench.diagnose_trace(trace)
    f = stallbench.findings(r)
    check(r["exit_code"] == 0 and len(f) > 0, f"diagnose_trace: {len(f)} findings")
    check(f and f[0]["cause"] == "a slow host dataloader" and f[0]["evidence"]["check"] == "loader"
          and f[0]["speedup"] > 1, "diagnose_trace: first finding 'a slow host dataloader' (check loader, speedup > 1)")
    s = stallbench.summarize(r)
    print(s)
    check("[a slow host dataloader]" in s, "summarize names the cause")
    job = os.path.join(DATA, "traces", "job", "straggler-3r")
    ranks = [os.path.join(job, f"rank{i}.pt.trace.json.gz") for i in range(3)]
    r = stallbench.diagnose_trace(ranks)
    check(stallbench.findings(r)[0]["cause"] == "a straggler rank",
          "diagnose_trace([3 rank traces]): first finding 'a straggler rank'")

    diff = os.path.join(DATA, "traces", "diff")
    r = stallbench.diagnose_trace(os.path.join(diff, "workers.pt.trace.json.gz"),
                                  baseline=os.path.join(diff, "base.pt.trace.json.gz"))
    causes = [f["cause"] for f in stallbench.findings(r)]
    check(any("DataLoader" in c for c in causes[:1]), f"diagnose_trace(NEW, baseline=OLD): the change named: {causes}")
    r = stallbench.diagnose_run(os.path.join(DATA, "run", "transformers-5.25.0", "tiny_run"))
    check(r["exit_code"] == 0 and r["scenario"] == "diagnose" and len(stallbench.findings(r)) > 0,
          f"diagnose_run(a Trainer output dir): {[f['cause'] for f in stallbench.findings(r)]}")

    # -- analyze-hang ---------------------------------------------------------------------------
    r = stallbench.analyze_hang(os.path.join(DATA, "fr", "size-2r"))
    check(r["exit_code"] == 0 and r["culprits"] == [1] and r["seq"] == 5 and r["format"] == "pytorch-flight-recorder",
          f"analyze_hang(fr/size-2r): rank 1 at seq 5 ({r.get('summary')})")
    r = stallbench.analyze_hang(os.path.join(DATA, "fr", "missing-2r-json"))
    check(r["exit_code"] == 0 and r["kind"] == "missing", f"analyze_hang(fr/missing-2r-json): kind {r['kind']}")

    # -- bad input: exit code 2 -----------------------------------------------------------------
    for what, fn, arg in (("diagnose_trace", stallbench.diagnose_trace, "/nonexistent/x.pt.trace.json.gz"),
                          ("analyze_hang", stallbench.analyze_hang, "/nonexistent/dumps"),
                          ("run", stallbench.run, "nosuch-scenario")):
        e = raises(fn, arg)
        check(e is not None and e.exit_code == 2 and ("nonexistent" in str(e) or "nosuch" in str(e)),
              f"{what}({arg!r}) raises StallbenchError, exit_code 2, the stderr tail in its message")
    e = raises(stallbench.run, "precision", quick=True, bogus=1)
    check(e is not None and e.exit_code == 2 and "bogus" in e.stderr_tail, "run with an unknown -p key: exit_code 2")

    # -- timeout: a stand-in binary that sleeps is killed ---------------------------------------
    with tempfile.TemporaryDirectory() as tmp:
        slow = os.path.join(tmp, "stallbench")
        with open(slow, "w") as fh:
            fh.write("#!/bin/sh\nsleep 30\n")
        os.chmod(slow, os.stat(slow).st_mode | stat.S_IXUSR)
        t = time.monotonic()
        e = raises(stallbench.diagnose_trace, trace, timeout=1, binary=slow)
        took = time.monotonic() - t
        check(e is not None and e.exit_code is None and "timed out" in str(e) and took < 10,
              f"a binary that hangs: StallbenchError 'timed out' after {took:.1f} s")

    # -- binary lookup errors -------------------------------------------------------------------
    os.environ["STALLBENCH_BIN"] = "/nonexistent/bin/stallbench"
    e = raises(stallbench.find_binary)
    msg = str(e) if e else ""
    print(msg)
    check(e is not None and e.exit_code is None and "$STALLBENCH_BIN='/nonexistent/bin/stallbench'" in msg
          and "scripts directory" in msg and "PATH" in msg and "_bin" in msg,
          "STALLBENCH_BIN pointing nowhere: an error naming $STALLBENCH_BIN, the package, the scripts directory and PATH")
    e = raises(stallbench.run, "precision", quick=True)
    check(e is not None and "not found" in str(e), "run() with no binary raises the lookup error")
    os.environ["STALLBENCH_BIN"] = binary

    check("torch" not in sys.modules, "still no torch imported at the end")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
