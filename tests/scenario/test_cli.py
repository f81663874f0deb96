#!/usr/bin/env python3
"""Every bad input gets one clear message and exit 2; nothing crashes or hangs.
Also --help, --version, list, devices and compare's exit codes.

usage: test_cli.py STALLBENCH [SCHEMA]
Every result a run here writes (the watchdog's partial one too) is validated against SCHEMA.
"""
import json
import re
import os
import subprocess
import sys
import tempfile

EXE = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = sys.argv[2] if len(sys.argv) > 2 else None
failures = []


def run(*args, timeout=120):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def expect(args, code, must_say=(), stream="stderr"):
    p = run(*args)
    text = getattr(p, stream)
    bad = []
    if p.returncode != code:
        bad.append(f"exit {p.returncode}, want {code}")
    for s in must_say:
        if s not in text:
            bad.append(f"missing {s!r}")
    if "Traceback" in p.stderr or "terminate called" in p.stderr or "Segmentation" in p.stderr:
        bad.append("crashed")
    if stream == "stderr" and code == 2 and len(text.strip().splitlines()) > 3:
        bad.append("more than a short message")
    if bad:
        failures.append(f"{' '.join(args)}: {'; '.join(bad)}\n  stdout: {p.stdout[-500:]}\n  stderr: {p.stderr[-500:]}")
    return p


# The harness watchdog (--timeout): a GEMM that makes no progress within it ends the run as a
# hang, exit 4, naming where it stopped. On sim:h100 a 65536^3 fp32 GEMM is a 8 s modelled wait.
# What was measured before the hang is saved: the points done, and the one that hung as `hang`.
# sim fast-forwards a long operation in real time, but judges a wait's deadline in modelled time: the
# GEMM still hangs (the device's HangError names it), in a fraction of a second of wall time.
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "wd.json")
    # --timeout 3: the first point must finish under load too; the 65536^3 GEMM is an 8 s modelled wait.
    expect(["run", "precision", "--device", "sim:h100", "-p", "size=256,65536", "-p", "dtype=fp32", "--timeout", "3",
            "--json", out], 4, ["no progress", "65536x65536x65536"])
    try:
        with open(out) as f:
            doc = json.load(f)
        if SCHEMA:
            import schema_check
            with open(SCHEMA) as f:
                errs = schema_check.errors(doc, json.load(f))
            if errs:
                failures.append(f"watchdog result fails the schema: {errs[:3]}")
        got = [(p["params"].get("size"), p["status"]) for p in doc["points"]]
        # The device's own wait and the watchdog share the deadline: whichever fires first
        # writes the result (the device's names the op, the watchdog's the phase).
        reason = doc["points"][-1].get("reason", "")
        if got != [(256, "ok"), (65536, "hang")] or not ("watchdog: no progress" in reason
                                                         or "stream made no progress" in reason):
            failures.append(f"watchdog result: points {got}, reason {doc['points'][-1].get('reason')!r}")
    except (OSError, ValueError, KeyError, IndexError) as e:
        failures.append(f"watchdog: no usable result JSON after the hang: {e}")

# A hang only the watchdog sees (the loader's own timeout is 60 s): it saves the result itself,
# the stopped point as hang with the phase named, and ends the run with exit 4.
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "wd.json")
    expect(["run", "dataloader", "--device", "sim:h100", "-p", "workers=1", "-p", "steps=20", "-p", "batch=4",
            "-p", "fault=hang@40", "-p", "timeout_s=60", "--timeout", "2", "--json", out], 4,
           ["watchdog: no progress for 2 s", "exit code 4 (hang)"])
    try:
        with open(out) as f:
            doc = json.load(f)
        last = doc["points"][-1]
        if last["status"] != "hang" or "watchdog: no progress for 2 s" not in last.get("reason", "") \
                or "watchdog" not in doc["meta"]:
            failures.append(f"watchdog-saved result: {last['status']}, {last.get('reason')!r}")
        if SCHEMA:
            import schema_check
            with open(SCHEMA) as f:
                errs = schema_check.errors(doc, json.load(f))
            if errs:
                failures.append(f"watchdog-saved result fails the schema: {errs[:3]}")
    except (OSError, ValueError, KeyError, IndexError) as e:
        failures.append(f"watchdog: no usable result JSON: {e}")

# A real hang on the cpu device (a GEMM far longer than --timeout): reported as a hang, exit 4,
# never a crash (unwinding once freed the operands under the running GEMM). The device's own wait
# and the watchdog share the deadline, as above: whichever fires first reports it (the watchdog
# says "exit code 4 (hang)", the device's wait "[hang] ... stream made no progress"); requiring the
# watchdog's words failed when the device's wait came first (a full run on 2026-12-05; an earlier
# failure of this test that day, also after 23 s, left no log).
with tempfile.TemporaryDirectory() as tmp:
    p = expect(["run", "precision", "--device", "cpu", "-p", "size=8192", "-p", "dtype=fp32", "--timeout", "1",
                "--json", os.path.join(tmp, "h.json")], 4)
    if "exit code 4 (hang)" not in p.stderr and not ("[hang]" in p.stderr and "made no progress" in p.stderr):
        failures.append(f"cpu hang: neither the watchdog's nor the device's hang report in stderr: {p.stderr[-500:]}")

expect(["--help"], 0, ["list", "devices", "run", "diagnose", "compare", "analyze-hang", "exit codes"], "stdout")
# run SCENARIO --help: the run options and that scenario's -p keys (they were only in `list`)
expect(["run", "packing", "--help"], 0, ["--device", "parameters of packing", "-p strategy", "-p max_len"], "stdout")
p = run("run", "packing", "--help")
if "-p workers" in p.stdout:  # the dataloader's key: another scenario's parameters leaked in
    failures.append("run packing --help lists another scenario's parameters")
expect(["run", "--help"], 0, ["run SCENARIO --help lists that scenario's parameters"], "stdout")
expect(["--version"], 0, ["stallbench 0.1.0"], "stdout")
expect([], 2, ["A subcommand is required"])
expect(["frobnicate"], 2, ["unknown command 'frobnicate'", "valid: list, devices, run, diagnose, watch, compare, analyze-hang"])
expect(["run"], 2, ["scenario is required"])
# diagnose: bad input is exit 2 before any device is opened
expect(["diagnose", "--observed-tokens-per-s", "nan"], 2, ["--observed-tokens-per-s"])
expect(["diagnose", "--observed-tokens-per-s", "-5"], 2, ["--observed-tokens-per-s"])
expect(["diagnose", "--config", "/nonexistent/x.yml"], 2, ["/nonexistent/x.yml"])
expect(["diagnose", "/nonexistent/x.yml"], 2, ["/nonexistent/x.yml"])  # the config as a positional
expect(["diagnose", "a.yml", "--config", "b.yml"], 2, ["--config"])  # given twice
expect(["diagnose", "--model-config", "/nonexistent/c.json"], 2, ["/nonexistent/c.json"])
expect(["diagnose", "--lengths", "/nonexistent/l.csv"], 2, ["/nonexistent/l.csv"])
expect(["diagnose", "--json", "/nonexistent-dir/d.json"], 2, ["/nonexistent-dir"])
expect(["diagnose", "--json", "/tmp/sb-same.json", "--html", "/tmp/sb-same.json"], 2, ["name the same file"])
expect(["diagnose", "--device", "gpu7"], 2, ["unknown device 'gpu7'"])
expect(["run", "nosuch"], 2, ["unknown scenario 'nosuch'", "valid: precision"])
expect(["run", "precision", "-p", "sise=64"], 2, ["unknown parameter 'sise'", "valid keys: size, m, n, k, dtype, timing, trials"])
expect(["run", "precision", "-p", "size=abc"], 2, ["'abc' is not an integer", "[16, 65536] elements"])
expect(["run", "precision", "-p", "size=8"], 2, ["out of range", "[16, 65536]"])
expect(["run", "precision", "-p", "dtype=fp64"], 2, ["fp32|tf32|bf16|fp16|fp8_e4m3"])
# A second per submitted op made one step minutes long and --quick no quicker: 10 ms is the bound.
expect(["run", "batch", "--quick", "-p", "dispatch_us=1e6"], 2, ["out of range", "[0, 10000]"])
# An empty path is refused by name everywhere (compare --json "" used to be ignored).
expect(["compare", "a.json", "b.json", "--json", ""], 2, ["--json: the path is empty"])
expect(["analyze-hang", ""], 2, ["the path is empty"])
expect(["run", "precision", "--json", "a.json", "--json", "b.json"], 2, ["--json: given 2 times; give it once"])
expect(["run", "precision", "-p", "size"], 2, ["expected key=value"])
expect(["run", "precision", "-p", "size=64", "-p", "size=128"], 2, ["given twice"])
expect(["run", "precision", "--device", "gpu7"], 2, ["unknown device 'gpu7'", "valid: auto, cpu, cuda:N"])
expect(["run", "precision", "--device", "cpu:1"], 2, ["unknown device"])
expect(["run", "precision", "--bogus"], 2, ["--bogus"])
expect(["run", "precision", "--timeout", "0"], 2)
expect(["compare", "/nonexistent/a.json", "/nonexistent/b.json"], 2, ["cannot read /nonexistent/a.json"])
expect(["run", "collective", "-p", "mismatch=skip@5"], 2, ["mismatch 'skip@5'", "KIND@STEP:RANK"])
expect(["run", "collective", "-p", "mismatch=jump@5:1"], 2, ["unknown kind 'jump'", "straggler"])
expect(["run", "collective", "-p", "mismatch=skip@-1:1"], 2, ["STEP is not an integer >= 0"])
expect(["run", "collective", "-p", "op=allreduce"], 2, ["all_reduce|broadcast|reduce|all_gather"])
# One process: rank 1 does not exist; the same exit 2 as under mpirun.
expect(["run", "collective", "-p", "mismatch=skip@1:1"], 2, ["mismatch rank 1 does not exist", "mpirun -np N"])
expect(["run", "collective", "-p", "min_bytes=4096", "-p", "max_bytes=1024"], 2, ["min_bytes 4096 is above max_bytes 1024"])
expect(["analyze-hang"], 2, ["DIR is required"])
expect(["analyze-hang", "/nonexistent/dumps"], 2, ["/nonexistent/dumps does not exist"])

list_out = expect(["list"], 0, ["precision", "-p size", "default 1024,2048", "range [16, 65536] elements"], "stdout")
expect(["list", "--names"], 0, ["precision"], "stdout")
dev = expect(["devices"], 0, ["cpu", "logical cores", "expected numbers: "], "stdout")
fp = json.loads(run("devices", "--json").stdout)
if not fp["cpu"]["model"] or "cpu" not in fp["versions"]:
    failures.append("devices --json lacks cpu model or versions")
# The CPU's vendor and family, as /proc/cpuinfo gives them, in the fingerprint and the text.
with open("/proc/cpuinfo") as f:
    info = dict(l.split(":", 1) for l in f.read().split("\n\n")[0].splitlines() if ":" in l)
info = {k.strip(): v.strip() for k, v in info.items()}
if "vendor_id" in info:
    if fp["cpu"].get("vendor") != info["vendor_id"] or fp["cpu"].get("family") != int(info["cpu family"]):
        failures.append(f"devices --json cpu {fp['cpu']} does not carry vendor_id/cpu family {info.get('vendor_id')}")
    if info["vendor_id"] not in dev.stdout:
        failures.append(f"devices does not name the vendor {info['vendor_id']}: {dev.stdout[:300]}")
m = re.search(r"expected numbers: (\S+)", dev.stdout)
dev_expected = m.group(1) if m else None

with tempfile.TemporaryDirectory() as tmp:
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write("{not json")
    p = expect(["compare", bad, bad], 2, ["is not valid JSON: line 1, column 3: syntax error"])
    if "json.exception" in p.stderr:  # our message, not nlohmann's [json.exception.parse_error.101] tag
        failures.append(f"compare on malformed JSON shows the library's tag: {p.stderr.strip()}")
    notres = os.path.join(tmp, "notres.json")
    with open(notres, "w") as f:
        json.dump({"hello": 1}, f)
    expect(["compare", notres, notres], 2, ["not a stallbench result"])
    expect(["analyze-hang", tmp], 2, ["no flight-recorder dump"])

    # A real small run, then compare it with itself and with a worse copy.
    a = os.path.join(tmp, "a.json")
    p = run("run", "precision", "--device", "cpu", "--quick", "-p", "size=64", "-p", "dtype=fp32,bf16",
            "--json", a, timeout=300)
    if p.returncode != 0:
        failures.append(f"small run failed: {p.returncode} {p.stderr[-800:]}")
    else:
        # the run is compared with the file `devices` names (or, with none, says there is none)
        if dev_expected and not dev_expected.startswith("none"):
            if f"expected numbers: {dev_expected}" not in p.stdout + p.stderr:
                failures.append(f"devices names {dev_expected}, the run does not: {(p.stdout + p.stderr)[:300]}")
        expect(["compare", a, a, "--tolerance", "0.05"], 0, ["same"], "stdout")
        doc = json.load(open(a))
        for pt in doc["points"]:
            if pt["status"] == "ok":
                pt["metrics"]["tflops"]["value"] *= 2  # B claims twice the throughput
                pt["metrics"]["ms"]["value"] /= 2
        b = os.path.join(tmp, "b.json")
        json.dump(doc, open(b, "w"))
        expect(["compare", a, b, "--tolerance", "0.1"], 3, ["WORSE", "worse than B"], "stdout")
        expect(["compare", a, b], 0, ["WORSE"], "stdout")  # no --tolerance: report only
        expect(["compare", a, b, "--tolerance", "abc"], 2)
        # --json: the same comparison as a document, every row with its full parameters and the
        # per-metric summary (B's tflops are twice A's: A/B 0.5 at every point, all WORSE)
        cj = os.path.join(tmp, "cmp.json")
        expect(["compare", a, b, "--json", cj], 0, ["summary, per metric", "fixed: "], "stdout")
        try:
            c = json.load(open(cj))
            tf = [m for m in c["summary"] if m["metric"] == "tflops"]
            ok_points = sum(1 for pt in doc["points"] if pt["status"] == "ok")
            if c["kind"] != "comparison" or not tf or tf[0]["worse"] != ok_points or \
                    abs(tf[0]["ratio_geomean"] - 0.5) > 1e-6 or tf[0]["points"] != ok_points:
                failures.append(f"compare --json summary wrong: {c.get('summary')}")
            if any("size" not in r["params"] or "dtype" not in r["params"] for r in c["rows"]):
                failures.append("compare --json rows lack their full parameters")
        except (OSError, ValueError, KeyError) as e:
            failures.append(f"compare --json did not write a readable comparison: {e}")
        p = run("compare", a, b, "--json", "-")
        try:
            if json.loads(p.stdout)["kind"] != "comparison" or "summary, per metric" not in p.stderr:
                failures.append("compare --json -: the JSON on stdout, the table on stderr")
        except ValueError as e:
            failures.append(f"compare --json - stdout is not JSON: {e}")
        expect(["compare", a, b, "--json", os.path.join(tmp, "no", "such", "dir", "c.json")], 2, ["--json"])
        # a file replaced keeps its mode (the rename used to leave every result 0644)
        private = os.path.join(tmp, "private.json")
        open(private, "w").write("{}")
        os.chmod(private, 0o600)
        expect(["compare", a, b, "--json", private], 0)
        if os.stat(private).st_mode & 0o777 != 0o600:
            failures.append(f"compare --json over a 0600 file left it {oct(os.stat(private).st_mode & 0o777)}")
        # the comparison never overwrites an input (a measured result would be lost)
        before = open(a).read()
        expect(["compare", a, b, "--json", a], 2, ["is result A", "would destroy it"])
        if open(a).read() != before:
            failures.append("compare --json A overwrote A")
        # a gate that judged nothing fails: B's points are all of another size
        other = json.load(open(b))
        for pt in other["points"]:
            pt["params"]["size"] = 4242
        c_other = os.path.join(tmp, "other.json")
        json.dump(other, open(c_other, "w"))
        expect(["compare", a, c_other, "--tolerance", "0.1"], 1, ["nothing was judged"], "stdout")
        expect(["compare", a, c_other], 0, ["only in A"], "stdout")  # a report without a gate
        other["scenario"] = "batch"
        json.dump(other, open(c_other, "w"))
        expect(["compare", a, c_other], 2, ["A is a precision result and B a batch result"])
        # --json - writes the document to stdout and the table to stderr.
        p = run("run", "precision", "--device", "cpu", "--quick", "-p", "size=32", "-p", "dtype=fp32", "--json", "-")
        try:
            if json.loads(p.stdout)["kind"] != "result":
                failures.append("--json - did not write a result to stdout")
        except json.JSONDecodeError as e:
            failures.append(f"--json - stdout is not JSON: {e}")

# Hostile inputs (issue #24): numbers that are not finite, inputs that are not files, and
# parameter combinations that would measure nothing are exit 2 with the reason, at once.
for opt, val in (("--timeout", "nan"), ("--budget", "inf"), ("--noise", "-1"), ("--budget", "nan")):
    expect(["run", "precision", "--quick", opt, val], 2, [opt])
expect(["run", "precision", "--quick", "--json", ""], 2, ["--json"])
expect(["run", "dataloader", "--quick", "--json", "same.json", "--trace", "same.json"], 2, ["name the same file"])
expect(["run", "train", "--quick", "-p", "sequences=0"], 2, ["sequences=0 means every length of a file"])
# No output is written over an input (a hostile review lost an nvidia-smi log, a 9.8 MB trace, an
# Axolotl config and a lengths file this way, each at exit 0): exit 2 before anything runs, the input kept.
with tempfile.TemporaryDirectory() as tmp:
    lengths = os.path.join(tmp, "len.txt")
    config = os.path.join(tmp, "ax.yml")
    trace = os.path.join(tmp, "trace.json")
    smi = os.path.join(tmp, "smi.csv")
    inputs = {lengths: "100\n200\n", config: "micro_batch_size: 1\nsequence_len: 64\n",
              trace: '{"traceEvents": []}', smi: "timestamp, utilization.gpu [%]\n"}
    for path, text in inputs.items():
        open(path, "w").write(text)
    os.link(config, os.path.join(tmp, "hard.yml"))
    dotted = os.path.join(tmp, ".", "len.txt")
    for args, says in (
            (["run", "packing", "--quick", "-p", "lengths=@" + lengths, "--json", lengths], "input of -p lengths"),
            (["run", "packing", "--quick", "-p", "lengths=@" + lengths, "--trace", dotted], "input of -p lengths"),
            (["diagnose", "--quick", config, "--json", os.path.join(tmp, "hard.yml")], "is the config"),
            (["diagnose", "--quick", config, "--lengths", lengths, "--html", dotted], "is the lengths file"),
            (["diagnose", "--trace", trace, "--json", trace], "is the trace"),
            (["watch", "--from", smi, "--json", smi], "is the log --from reads")):
        expect(args, 2, [says, "would destroy it"])
    for path, text in inputs.items():
        if open(path).read() != text:
            failures.append(f"{path} was overwritten")
# a table that cannot be written is a failure, not exit 0
with open("/dev/full", "w") as full:
    p = subprocess.run([EXE, "list"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    if p.returncode != 1 or "cannot write to stdout" not in p.stderr:
        failures.append(f"list > /dev/full: exit {p.returncode}, stderr {p.stderr[-200:]!r}")
# two documents on stdout would run together
expect(["run", "batch", "--quick", "--json", "-", "--trace", "-"], 2, ["both name stdout"])
expect(["diagnose", "--quick", "--json", "-", "--html", "-"], 2, ["--json - and --html - both name stdout"])
# One --json rule: FILE, or - for stdout with the human text on stderr; an analyzer or a monitor
# writes no file unless asked (diagnose wrote stallbench-diagnose.json, watch stallbench-watch.json)
with tempfile.TemporaryDirectory() as tmp:
    trace = os.path.join(HERE, "..", "data", "traces", "diff", "base.pt.trace.json.gz")
    p = subprocess.run([EXE, "diagnose", "--trace", trace], capture_output=True, text=True, timeout=120, cwd=tmp)
    if p.returncode != 0 or os.listdir(tmp):
        failures.append(f"diagnose --trace without --json: exit {p.returncode}, wrote {os.listdir(tmp)}")
    p = subprocess.run([EXE, "diagnose", "--trace", trace, "--json", "-"], capture_output=True, text=True, timeout=120)
    try:
        if json.loads(p.stdout).get("kind") != "result" or "figures read from the trace" not in p.stderr:
            failures.append("diagnose --trace --json -: want the result on stdout and the report on stderr")
    except ValueError as e:
        failures.append(f"diagnose --trace --json -: stdout is not the JSON ({e}): {p.stdout[:200]!r}")
    # watch --from LOG --json -: the JSON alone on stdout (the view and the summary on stderr)
    smi = os.path.join(HERE, "..", "data", "telemetry", "nvsmi_8gpu_100ms.csv")
    p = subprocess.run([EXE, "watch", "--from", smi, "--json", "-"], capture_output=True, text=True, timeout=120, cwd=tmp)
    try:
        if json.loads(p.stdout).get("kind") != "result" or os.listdir(tmp):
            failures.append(f"watch --from --json -: want the result alone on stdout, no file ({os.listdir(tmp)})")
    except ValueError as e:
        failures.append(f"watch --from --json -: stdout is not the JSON alone ({e}): {p.stdout[:200]!r}")
    expect(["watch", "--from", smi, "--json", "-", "--html", "-"], 2, ["both name stdout"])
    for cmd in (["list"], ["devices"]):
        for form in (["--json"], ["--json", "-"]):
            p = run(*cmd, *form)
            try:
                json.loads(p.stdout)
            except ValueError:
                failures.append(f"{' '.join(cmd + form)}: stdout is not JSON")
        out = os.path.join(tmp, cmd[0] + ".json")
        p = run(*cmd, "--json", out)
        if p.returncode != 0 or not os.path.isfile(out):
            failures.append(f"{cmd[0]} --json FILE: exit {p.returncode}, no {out}")
# --help wrapped to the terminal's width: no line of any command's help past $COLUMNS (80: a pipe's)
for cmd in ([], ["run"], ["diagnose"], ["watch"], ["compare"], ["analyze-hang"], ["list"], ["devices"], ["clean"]):
    for cols in ("80", "100"):
        p = subprocess.run([EXE, *cmd, "--help"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": cols})
        long_lines = [l for l in p.stdout.splitlines() if len(l) > int(cols)]
        if p.returncode != 0 or long_lines:
            failures.append(f"{' '.join(cmd) or 'stallbench'} --help at COLUMNS={cols}: exit {p.returncode}, "
                            f"{len(long_lines)} lines longer, e.g. {long_lines[:1]}")
# run shows each point's place in the sweep and the time left, as diagnose does
with tempfile.TemporaryDirectory() as tmp:
    p = expect(["run", "precision", "--device", "cpu", "-p", "size=64,128,256", "-p", "dtype=fp32", "-p", "trials=1",
                "--json", os.path.join(tmp, "k.json")], 0, ["[1/3] size=64", "[3/3] size=256", "s left)"])
# a histogram file of lengths is packed by pack-hist by default (pack-ffd and pack-bfd expand its counts)
with tempfile.TemporaryDirectory() as tmp:
    hist = os.path.join(tmp, "hist.csv")
    with open(hist, "w") as f:
        f.write("length,count\n" + "".join(f"{n},{1000 + n}\n" for n in range(16, 512, 16)))
    out = os.path.join(tmp, "h.json")
    expect(["run", "packing", "--quick", "--device", "cpu", "-p", f"lengths=@{hist}", "--json", out], 0)
    try:
        with open(out) as f:
            strategies = json.load(f)["params"]["strategy"]
        if "pack-hist" not in strategies or "pack-bfd" in strategies or "pad-max" not in strategies:
            failures.append(f"packing on a histogram file ran {strategies}: want pack-hist (and pad-max), not pack-bfd")
    except (OSError, ValueError, KeyError) as e:
        failures.append(f"packing on a histogram file: no result's params.strategy: {e}")
# a parameter that would do nothing is an error, not ignored: numerics' inject acts only with case=custom
expect(["run", "numerics", "--quick", "-p", "inject=nan@7:2"], 2,
       ["-p inject=nan@7:2 does nothing unless case=custom", "add -p case=custom"])
# run --trace NAME.json.gz writes gzip (HTA's and TensorBoard's loaders open *.json.gz with gzip),
# and diagnose --trace reads it back
with tempfile.TemporaryDirectory() as tmp:
    gz = os.path.join(tmp, "t.pt.trace.json.gz")
    expect(["run", "batch", "--quick", "--json", os.path.join(tmp, "r.json"), "--trace", gz], 0)
    import gzip
    try:
        with gzip.open(gz, "rt") as f:
            events = json.load(f).get("traceEvents", [])
        if not events:
            failures.append(f"run --trace {gz}: no traceEvents in the gzip'ed trace")
    except (OSError, ValueError) as e:
        failures.append(f"run --trace {gz}: not a gzip'ed JSON trace: {e}")
    expect(["diagnose", "--trace", gz, "--json", os.path.join(tmp, "d.json")], 0)
with tempfile.TemporaryDirectory() as tmp:
    # some other JSON given as a trace or as the config: refused, never a diagnosis of nothing
    # ("none of the trace rules fired") or of the built-in default
    other = os.path.join(tmp, "other.json")
    with open(other, "w") as f:
        json.dump({"schema_version": 1, "kind": "result", "points": []}, f)
    expect(["diagnose", "--trace", other, "--json", os.path.join(tmp, "d.json")], 2, ["no traceEvents field"])
    expect(["diagnose", other, "--quick", "--json", os.path.join(tmp, "d.json")], 2, ["a stallbench document"])
    nokeys = os.path.join(tmp, "nokeys.yml")
    with open(nokeys, "w") as f:
        f.write("foo: 1\n")
    expect(["diagnose", nokeys, "--quick", "--json", os.path.join(tmp, "d.json")], 2, ["none of its 1 key(s)"])
with tempfile.TemporaryDirectory() as tmp:
    good = os.path.join(tmp, "good.json")
    run("run", "precision", "--device", "cpu", "--quick", "-p", "size=32", "-p", "dtype=fp32", "--json", good)
    expect(["compare", good, good, "--tolerance", "nan"], 2, ["--tolerance", "not a finite number"])
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    # Each would block forever on a FIFO with no writer: refused by what it is, at once.
    expect(["run", "packing", "--quick", "-p", f"lengths=@{fifo}"], 2, ["is not a regular file (a FIFO)"])
    expect(["compare", fifo, good], 2, ["is not a regular file (a FIFO)"])
    expect(["compare", tmp, good], 2, ["is a directory"])
    expect(["run", "packing", "--quick", "-p", "lengths=@/dev/zero"], 2, ["a character device"])
    expect(["analyze-hang", fifo], 2)
    # Where results go is checked before anything runs; nothing is renamed over a link or a device.
    small = ["run", "precision", "--device", "cpu", "--quick", "-p", "size=32", "-p", "dtype=fp32", "--json"]
    link = os.path.join(tmp, "link.json")
    os.symlink("/dev/null", link)
    expect(small + [link], 2, ["is not a regular file (a symbolic link)"])
    if not os.path.islink(link):
        failures.append("--json onto a symlink replaced the link")
    expect(small + [fifo], 2, ["is not a regular file"])
    expect(small + [os.path.join(tmp, "no", "such", "dir.json")], 2, ["does not exist"])
    expect(small + [tmp], 2, ["is a directory"])
    # stdout closed: the result cannot be written there, so the run fails (exit 1) and saves it elsewhere.
    p = subprocess.run([EXE] + small + ["-"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                       pass_fds=(), close_fds=True, preexec_fn=lambda: os.close(1))
    if p.returncode != 1 or "cannot write the result to stdout" not in p.stderr or "saved to" not in p.stderr:
        failures.append(f"--json - with stdout closed: exit {p.returncode}, want 1 and a fallback: {p.stderr[-300:]}")
    for saved in re.findall(r"saved to (\S+) instead", p.stderr):
        if os.path.isfile(saved):
            os.remove(saved)
    # A CSV histogram with a byte-order mark (spreadsheets write one) is read.
    bom = os.path.join(tmp, "bom.csv")
    with open(bom, "wb") as f:
        f.write(b"\xef\xbb\xbflength,count\n100,30\n300,10\n")
    out = os.path.join(tmp, "bom.json")
    expect(["run", "packing", "--quick", "-p", f"lengths=@{bom}", "-p", "sequences=0", "-p", "strategy=pad-max",
            "-p", "d_model=64", "--json", out], 0)
    if os.path.exists(out) and json.load(open(out))["points"][0]["info"]["real_tokens"] != 100 * 30 + 300 * 10:
        failures.append("the BOM-prefixed CSV was not read as 30 x 100 + 10 x 300 tokens")
expect(["run", "packing", "--quick", "-p", "sequences=0"], 2, ["sequences=0 means every length of a file"])
# Silent no-ops and wrong figures: a fault that cannot fire, a cap that rounds to none, a size that wraps.
expect(["run", "dataloader", "--quick", "-p", "fault=hang@100000", "-p", "steps=2", "-p", "batch=8"], 2,
       ["sample 100000 does not exist", "steps x batch = 16 samples"])
expect(["run", "attention", "--quick", "-p", "mem_limit_gb=1e-10"], 2, ["mem_limit_gb=1e-10 is under 1 MiB"])
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "huge.json")
    expect(["run", "attention", "--device", "cpu", "--quick", "-p", "batch=4096", "-p", "heads=1024",
            "-p", "seq_len=1048576", "-p", "impl=naive", "-p", "pass=fwd", "--json", out], 0)
    if os.path.exists(out):
        pt = json.load(open(out))["points"][0]
        if pt["status"] != "oom" or "PiB" not in pt.get("reason", ""):
            failures.append(f"a wrapping attention size: {pt['status']} {pt.get('reason')}, want oom naming PiB")
    good = os.path.join(tmp, "good.json")
    run("run", "precision", "--device", "cpu", "--quick", "-p", "size=32", "-p", "dtype=fp32", "--json", good)
    doc = json.load(open(good))
    doc["schema_version"] = 4294967297  # once narrowed to 1 and accepted
    bad = os.path.join(tmp, "bad.json")
    json.dump(doc, open(bad, "w"))
    expect(["compare", bad, good], 2, ["schema_version 4294967297"])
expect(["run", "packing", "--quick", "-p", "lengths=fixed:100", "-p", "max_len=8", "-p", "overflow=drop"], 2,
       ["drops every sequence"])
# uniform lengths all over max_len drop every sequence too; a varlen batch's int32 cu_seqlens bound rows x max_len
expect(["run", "packing", "--quick", "-p", "lengths=uniform:3000,4000", "-p", "max_len=2048", "-p", "overflow=drop"],
       2, ["drops every sequence"])
expect(["run", "packing", "--quick", "-p", "rows=2048", "-p", "max_len=1048576"], 2,
       ["int32 cu_seqlens", "2147483648 tokens"])
expect(["run", "packing", "--quick", "-p", "d_model=100", "-p", "heads=3"], 2, ["d_model 100 is not a multiple of heads 3"])
# grouped-query attention: K/V heads that do not divide the heads, in each scenario that declares them
for sc in ("packing", "batch", "memory", "train"):
    expect(["run", sc, "--quick", "-p", "heads=4", "-p", "kv_heads=3"], 2, ["kv_heads=3 does not divide heads=4"])
expect(["run", "packing", "--quick", "-p", "pad_multiple=0"], 2, ["pad_multiple"])

# Malformed fields (issue #24): a field of the wrong type, missing, or out of range is exit 2 naming the
# file and the field's JSON path, never a raw [json.exception...] with exit 1.
PUBLISHED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "results", "published", "cpu-avx512-2c")
EXPECTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "results", "expected")
with tempfile.TemporaryDirectory() as tmp:
    real = os.path.join(PUBLISHED, "precision.json")

    def mutated(name, change, src=real):
        doc = json.load(open(src))
        change(doc)
        path = os.path.join(tmp, name)
        json.dump(doc, open(path, "w"), indent=1)
        return path

    def set_kind(d): d["kind"] = 5
    def set_reason(d): d["points"][1]["reason"] = 5
    def set_n(d): d["points"][2]["metrics"]["ms"]["stats"]["n"] = "5"
    def set_sim(d): d["meta"]["device"]["simulated"] = "yes"
    def set_class(d): d["hardware"]["class"] = 5
    for name, change, say in (
            ("kind.json", set_kind, "kind: expected string, got integer 5"),
            ("reason.json", set_reason, "points[1].reason: expected string, got integer 5"),
            ("n.json", set_n, 'points[2].metrics.ms.stats.n: expected integer in [0, 2147483647], got string "5"'),
            ("sim.json", set_sim, 'meta.device.simulated: expected boolean, got string "yes"')):
        bad = mutated(name, change)
        expect(["compare", bad, real], 2, [f"{bad}: {say}"])  # as A
        expect(["compare", real, bad], 2, [f"{bad}: {say}"])  # as B
    bad_expected = mutated("h100-class5.json", set_class, os.path.join(EXPECTED, "h100-sxm.json"))
    expect(["compare", real, bad_expected], 2, [f"{bad_expected}: hardware.class: expected string, got integer 5"])
    big = os.path.join(tmp, "big.json")
    with open(big, "w") as f:
        f.write(open(real).read().replace('"schema_version": 1', '"schema_version": 1e400', 1))
    expect(["compare", big, real], 2, [f"{big} is not valid JSON"])

    # A bad expected file in the directory loaded on every run is skipped with one warning naming it
    # and the field; the run goes on with the others (sim:h100-sxm is made from one of them).
    data = os.path.join(tmp, "data")
    os.makedirs(os.path.join(data, "expected"))
    for f in os.listdir(EXPECTED):
        if f.endswith(".json"):
            with open(os.path.join(EXPECTED, f)) as src, open(os.path.join(data, "expected", f), "w") as dst:
                dst.write(src.read())
    bad_in_dir = mutated(os.path.join("data", "expected", "bad-h200.json"), set_class,
                         os.path.join(EXPECTED, "h200-sxm.json"))
    out = os.path.join(tmp, "run.json")
    p = subprocess.run([EXE, "run", "precision", "--device", "sim:h100-sxm", "--quick", "-p", "size=256",
                        "-p", "dtype=bf16", "--json", out], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, STALLBENCH_DATA_DIR=data))
    warning = f"stallbench: warning: skipped expected-numbers file {bad_in_dir}: hardware.class: expected string, got integer 5"
    if p.returncode != 0 or p.stderr.count(warning) != 1 or not os.path.isfile(out):
        failures.append(f"a run beside a bad expected file: exit {p.returncode}, want 0 with one warning "
                        f"({warning!r}):\n  stderr: {p.stderr[-800:]}")
    elif json.load(open(out)).get("expected", {}).get("id") != "h100-sxm":
        failures.append("a run beside a bad expected file lost its own expected numbers")

    # analyze-hang: a bad dump is named with its field; alone, it is exit 2; beside a good one, a warning.
    def dump(rank, seq0="ok"):
        entries = [{"seq": s, "step": s, "call": 0, "op": "all_reduce", "count": 1024, "dtype": "fp32", "root": 0,
                    "reduce": "sum", "state": "completed", "t_enqueue_us": 1000 + s, "t_start_us": 1001 + s,
                    "t_complete_us": 1002 + s, "wrong": -1, "error": ""} for s in range(2)]
        if seq0 != "ok":
            entries[0]["seq"] = seq0
        return {"format": "stallbench-flight-recorder", "version": 1, "run_id": "r1", "rank": rank, "size": 2,
                "local_rank": rank, "host": "h", "pid": 1, "backend": "mpi", "device": "host", "reason": "end of run",
                "where": "done", "time_us": 2000, "timeout_s": 30, "capacity": 4, "dropped": 0,
                "last_enqueued_seq": 1, "last_completed_seq": 1, "entries": entries}
    dumps = os.path.join(tmp, "dumps")
    os.makedirs(dumps)
    bad_dump = os.path.join(dumps, "rank-1.json")
    json.dump(dump(1, seq0="zero"), open(bad_dump, "w"))
    say = f'{bad_dump}: entries[0].seq: expected integer in [0, 9007199254740992], got string "zero"'
    expect(["analyze-hang", dumps], 2, [say])
    json.dump(dump(0), open(os.path.join(dumps, "rank-0.json"), "w"))
    expect(["analyze-hang", dumps], 0, [say, "rank 1's dump is missing"], "stdout")
    # Found by fuzz_hang_dump: a dump that is not UTF-8 made `analyze-hang --json` exit 1 with a raw
    # [json.exception.type_error.316] (its warning quoted the bytes); the report is JSON again.
    with open(os.path.join(dumps, "rank-1.json"), "wb") as f:
        f.write(b'{"format": "stallbench-flight-recorder",\n \xe0\xdf\xdd: 1}')
    p = expect(["analyze-hang", dumps, "--json"], 0, ["is not valid JSON"], "stdout")
    try:
        json.loads(p.stdout)
    except ValueError as e:
        failures.append(f"analyze-hang --json beside a dump that is not UTF-8: not JSON ({e})")
    # --json FILE: the JSON there, the report on stdout; bare --json and --json -: the report on stderr
    out = os.path.join(tmp, "hang.json")
    p = expect(["analyze-hang", dumps, "--json", out], 0, ["rank 1"], "stdout")
    try:
        json.load(open(out))
    except (OSError, ValueError) as e:
        failures.append(f"analyze-hang --json FILE: {e}")
    p = run("analyze-hang", dumps, "--json", "-")
    if p.returncode != 0 or not p.stdout.lstrip().startswith("{") or "rank 1" not in p.stderr:
        failures.append(f"analyze-hang --json -: exit {p.returncode}; want JSON on stdout, the report on stderr")

# Other work on the machine while a point runs is recorded and warned of (a compiler beside a run made
# every GEMM read 7.95 ms, with 0.3% noise and no word): one busy process more than the machine has
# CPUs takes well over a quarter of the CPU time it gets (3 on a 2-CPU machine; on 16, 3 would be
# 19%, under the 25% warning). 200 trials at least: the runner reads /proc/stat over the point, and a
# --quick point whose 3 trials settled at once ran under the 0.1 s (20 ticks) that reading needs, and
# was left unjudged (host_cpu {}, seen once on a 2-vCPU Xeon, 2026-12-04).
with tempfile.TemporaryDirectory() as tmp:
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range((os.cpu_count() or 2) + 1)]
    try:
        out = os.path.join(tmp, "busy.json")
        p = subprocess.run([EXE, "run", "precision", "--quick", "-p", "size=512", "-p", "dtype=fp32", "-p", "trials=200",
                            "--json", out],
                           capture_output=True, text=True, timeout=120)
    finally:
        for x in spin:
            x.kill()
            x.wait()
    if p.returncode != 0:
        failures.append(f"precision beside busy processes: exit {p.returncode}: {p.stderr[-300:]}")
    else:
        load = json.load(open(out))["points"][0]["info"].get("host_cpu", {})
        if not load.get("other_pct", 0) >= 25 or "busy with other work" not in p.stdout:
            failures.append(f"{len(spin)} busy processes beside the run: host_cpu {load}, table {p.stdout[-400:]}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("ok")
