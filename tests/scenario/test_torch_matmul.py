"""scripts/torch_matmul.py without a GPU: its compare mode (what a GPU lease's torch-compare
stage runs) on real cpu precision results and torch files written in the format its measure
mode writes, and its argument checks. A defect here would cost a lease, so it is caught here.

usage: test_torch_matmul.py STALLBENCH SCRIPT
"""
import json
import os
import subprocess
import sys
import tempfile

sb, script = sys.argv[1], sys.argv[2]
failures = []


def run(*args, timeout=120):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=timeout)


def expect(args, code, must_say=(), where="stdout"):
    p = run(*args)
    text = p.stdout + p.stderr if where == "both" else getattr(p, where)
    bad = [f"exit {p.returncode}, want {code}"] if p.returncode != code else []
    bad += [f"missing {s!r}" for s in must_say if s not in text]
    if "Traceback" in p.stderr:
        bad.append("a Python traceback")
    if bad:
        failures.append(f"{' '.join(args)}: {'; '.join(bad)}\n  stdout: {p.stdout[-800:]}\n  stderr: {p.stderr[-400:]}")
    return p


def stallbench(*args):
    p = subprocess.run([sb, *args], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"stallbench {' '.join(args)} failed ({p.returncode}): {p.stderr[-800:]}")


def sb_tflops(doc):
    """(m, n, k, dtype) -> tflops of the ok points, read as the scenario defines the shape."""
    out = {}
    for p in doc["points"]:
        if p["status"] != "ok":
            continue
        q = p["params"]
        shape = tuple(q[d] or q["size"] for d in ("m", "n", "k"))
        key = shape + (q["dtype"],)
        out[key] = max(out.get(key, 0.0), p["metrics"]["tflops"]["value"])  # the best, as the script takes
    return out


def torch_file(path, points, **extra):
    doc = {"tool": "torch", "torch_version": "2.x (test)", "device": "test device", "points": points}
    doc.update(extra)
    with open(path, "w") as f:
        json.dump(doc, f)


expect(["--help"], 0, ["--shapes", "--dtype", "--compare"])
for bad in (["--dtype", "fp64"], ["--shapes", "12x3"], ["--shapes", "0x4x4"], ["--sizes", "-1"],
            ["--compare", "only-one.json"], ["--min-ratio", "nan"]):
    expect(bad, 2, [], "stderr")
try:
    import torch  # noqa: F401

    have_torch = True
except ImportError:
    have_torch = False
if not have_torch:  # measure mode names what it needs, exit 1, no traceback
    expect(["--sizes", "64"], 1, ["torch is not importable"], "stderr")

with tempfile.TemporaryDirectory() as tmp:
    sq, llm, sim = (os.path.join(tmp, n) for n in ("sq.json", "llm.json", "sim.json"))
    stallbench("run", "precision", "--device", "cpu", "--quick", "-p", "size=64,128", "-p", "dtype=fp32",
               "--json", sq)
    stallbench("run", "precision", "--device", "cpu", "--quick", "-p", "m=128", "-p", "n=64", "-p", "k=96",
               "-p", "dtype=fp32", "--json", llm)
    stallbench("run", "precision", "--device", "sim:h100", "--quick", "-p", "size=128", "-p", "dtype=fp32",
               "--json", sim)
    have = {}
    for f in (sq, llm):
        have.update(sb_tflops(json.load(open(f))))
    want = {(64, 64, 64, "fp32"), (128, 128, 128, "fp32"), (128, 64, 96, "fp32")}
    if set(have) != want:
        sys.exit(f"the cpu runs did not give the points this test needs: {sorted(have)}")

    def pt(m, n, k, dtype, tflops, **kw):
        p = {"m": m, "n": n, "k": k, "dtype": dtype, "status": "ok", "tflops": tflops}
        if m == n == k:
            p["size"] = m
        p.update(kw)
        return p

    # torch at exactly stallbench's figures: every ratio 1.000, gated at 64^3 and up: passes
    same = os.path.join(tmp, "torch-same.json")
    torch_file(same, [pt(m, n, k, d, v) for (m, n, k, d), v in have.items()])
    p = expect(["--compare", sq, llm, same, "--min-size", "64"], 0, ["comparison passed", "128x64x96"])
    if p.stdout.count(" 1.000  ok") != 3:
        failures.append(f"three ratios of 1.000, each ok, expected:\n{p.stdout}")

    # torch 1/0.9 of stallbench at the LLM shape: ratio 0.900 < 0.95 there, FAIL naming it
    slow = os.path.join(tmp, "torch-slow.json")
    torch_file(slow, [pt(m, n, k, d, v / 0.9 if (m, n, k) == (128, 64, 96) else v) for (m, n, k, d), v in have.items()])
    p = expect(["--compare", slow, sq, llm, "--min-size", "64"], 1,
               ["comparison FAILED: fp32 128x64x96: ratio 0.900 < 0.95"])
    # below the gate size the same ratio is information only: 128x64x96 is 786432 < 100^3 multiply-adds
    p = expect(["--compare", slow, sq, llm, "--min-size", "100"], 0, ["info (below gate size)", "comparison passed"])

    # a dtype torch measured and stallbench did not: FAIL where gated, with the reason
    extra = os.path.join(tmp, "torch-bf16.json")
    torch_file(extra, [pt(m, n, k, d, v) for (m, n, k, d), v in have.items()] + [pt(128, 128, 128, "bf16", 1.0)])
    expect(["--compare", sq, llm, extra, "--min-size", "64"], 1, ["fp32", "bf16 128: stallbench missing"])
    # the LLM-shape result left out: its shape is "stallbench missing"
    expect(["--compare", sq, same, "--min-size", "64"], 1, ["fp32 128x64x96: stallbench missing"])

    # a torch file from before --shapes (size only, square): still read
    old = os.path.join(tmp, "torch-old.json")
    torch_file(old, [{"size": m, "dtype": d, "status": "ok", "tflops": v} for (m, n, k, d), v in have.items()
                     if m == n == k])
    expect(["--compare", sq, old, "--min-size", "64"], 0, ["comparison passed"])

    # nothing at or above the gate size: a failure, not a vacuous pass
    expect(["--compare", sq, llm, same, "--min-size", "4096"], 1, ["no shape of at least 4096^3"])
    # a simulated result is never compared with a measurement
    expect(["--compare", sim, same, "--min-size", "64"], 1, ["is simulated"], "both")
    # unreadable and foreign inputs: a message, exit 1, no traceback
    expect(["--compare", os.path.join(tmp, "nope.json"), same], 1, ["cannot read"], "both")
    junk = os.path.join(tmp, "junk.json")
    open(junk, "w").write("{not json")
    expect(["--compare", junk, same], 1, ["is not JSON"], "both")
    expect(["--compare", sq, llm], 1, ["needs a torch_matmul file"], "both")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("torch_matmul.py: compare mode and argument checks as expected")
