"""scripts/torch_matmul.py and scripts/torch_sdpa.py without a GPU: their compare modes (what
a GPU lease's torch-compare and torch-sdpa-compare stages run) on real cpu results and torch
files written in the format their measure modes write, and their argument checks. A defect
here would cost a lease, so it is caught here.

usage: test_torch_scripts.py STALLBENCH SCRIPTS_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

sb, scripts = sys.argv[1], sys.argv[2]
script = os.path.join(scripts, "torch_matmul.py")
failures = []


def run(*args, timeout=120, tool=None):
    return subprocess.run([sys.executable, tool or script, *args], capture_output=True, text=True, timeout=timeout)


def expect(args, code, must_say=(), where="stdout", tool=None):
    p = run(*args, tool=tool)
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

# ---- torch_sdpa.py: stallbench's attention (impl flash on cpu, where there is no cudnn) against
# SDPA's best backend per shape
sdpa = os.path.join(scripts, "torch_sdpa.py")
expect(["--help"], 0, ["--backends", "--causal", "--compare"], tool=sdpa)
for bad in (["--seq", "0"], ["--causal", "maybe"], ["--backends", "cudnn,magic"], ["--pass", "bwd"],
            ["--trials", "0"], ["--compare", "one.json"], ["--seq", "128"]):  # the last: no --json
    expect(bad, 2, [], "stderr", tool=sdpa)
with tempfile.TemporaryDirectory() as tmp:
    att, sim = os.path.join(tmp, "att.json"), os.path.join(tmp, "sim.json")
    stallbench("run", "attention", "--device", "cpu", "--quick", "-p", "impl=flash", "-p", "seq_len=64,128",
               "-p", "causal=false,true", "-p", "batch=1", "-p", "heads=2", "-p", "head_dim=32", "--json", att)
    stallbench("run", "attention", "--device", "sim:h100", "--quick", "-p", "impl=cudnn", "-p", "seq_len=128",
               "--json", sim)
    keys = ("batch", "heads", "head_dim", "seq_len", "causal", "pass", "dtype")
    mine = {tuple(p["params"][k] for k in keys): p["metrics"]["tflops"]["value"]
            for p in json.load(open(att))["points"] if p["status"] == "ok"}
    if len(mine) != 8:  # 2 lengths x 2 causal x 2 passes
        sys.exit(f"the cpu attention run did not give the 8 points this test needs: {sorted(mine)}")

    def sdpa_file(path, per_key):
        pts = []
        for k, v in mine.items():
            for backend, tf in per_key(k, v):
                p = dict(zip(keys, k))
                p.update({"backend": backend, "status": "ok" if tf else "unsupported", "tflops": tf} if tf else
                         {"backend": backend, "status": "unsupported", "reason": "No viable backend"})
                pts.append(p)
        json.dump({"tool": "torch", "op": "scaled_dot_product_attention", "torch_version": "2.x (test)",
                   "device": "test device", "points": pts}, open(path, "w"))

    # torch's best backend is at stallbench's figure (another slower, a third unsupported): all 1.000
    even = os.path.join(tmp, "even.json")
    sdpa_file(even, lambda k, v: [("flash", v), ("efficient", v / 2), ("cudnn", None)])
    p = expect(["--compare", att, even, "--impl", "flash", "--min-seq", "64"], 0, ["comparison passed"], tool=sdpa)
    if p.stdout.count(" flash   1.000  ok") != 8:
        failures.append(f"eight ratios of 1.000 against torch's flash, each ok, expected:\n{p.stdout}")
    # causal fwd+bwd at S=128: torch's best 1/0.8 of stallbench: FAIL naming the shape
    slow = os.path.join(tmp, "slow.json")
    sdpa_file(slow, lambda k, v: [("efficient", v / 0.8 if (k[3], k[4], k[5]) == (128, True, "fwd+bwd") else v)])
    expect(["--compare", slow, att, "--impl", "flash", "--min-seq", "64"], 1,
           ["comparison FAILED: B=1 H=2 D=32 S=128 causal fwd+bwd fp32: ratio 0.800 < 0.95"], tool=sdpa)
    expect(["--compare", slow, att, "--impl", "flash", "--min-seq", "256"], 1, ["no shape from seq_len 256"],
           tool=sdpa)  # nothing gated: a failure, not a vacuous pass
    # every torch backend unsupported at a shape: named, not a crash, and that shape not gated
    none = os.path.join(tmp, "none.json")
    sdpa_file(none, lambda k, v: [("cudnn", None if k[3] == 64 else v)])
    expect(["--compare", att, none, "--impl", "flash", "--min-seq", "64"], 0,
           ["not compared (torch: cudnn: unsupported)", "comparison passed"], tool=sdpa)
    expect(["--compare", att, even, "--min-seq", "64"], 1, ["no impl=cudnn point"], tool=sdpa)  # the default impl
    expect(["--compare", sim, even], 1, ["is simulated"], "both", tool=sdpa)
    expect(["--compare", os.path.join(tmp, "nope.json"), even], 1, ["cannot read"], "both", tool=sdpa)
    expect(["--compare", att, att], 1, ["needs a torch_sdpa.py file"], "both", tool=sdpa)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("torch_matmul.py and torch_sdpa.py: compare modes and argument checks as expected")
