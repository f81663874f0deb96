#!/usr/bin/env python3
"""End-to-end: `stallbench watch` through the fake NVML (tests/fake_nvml, on LD_LIBRARY_PATH) with
recorded series (spiky, steady-low, healthy, stuck, throttled), each classified as recorded; the stuck
alarm (exit 4, the JSON, --on-stuck run with its environment); --exec with real child processes (the exit
code forwarded, SIGINT and SIGTERM sent to stallbench forwarded, the summary printed); --from on recorded
nvidia-smi and dcgmi dmon logs; the live view in a real terminal (tmux: refreshed in place, one line per
GPU); the watch's own CPU cost at 10 ms (under 1% of a core); the HTML report; bad input (exit 2).

usage: test_watch.py STALLBENCH SCHEMA FAKE_NVML_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import schema_check

EXE, SCHEMA, FAKE_DIR = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)
    return cond


def series(rows, name="NVIDIA H200", gpus=1, **extra):
    g = {"name": name, "uuid": "GPU-0000", "mem_total_mib": 143771, "sm_clock_max_mhz": 1980, "power_limit_w": 700,
         "rows": rows}
    return {"driver": "570.86.15", "advance": "call", "end": "hold", "gpus": [g] * gpus, **extra}


def row(util, mem=60000, clock=1980, power=500, reasons=0, **kw):
    r = {"util": util, "mem_util": util // 2, "sm_clock_mhz": clock, "power_w": power, "mem_used_mib": mem,
         "reasons": reasons, "pcie_tx_kb_s": 1000, "pcie_rx_kb_s": 5000, "temp_c": 60}
    r.update(kw)
    return r


# 300 rows each: at --interval 10 one row per sample, 3 s
SERIES = {
    "healthy": [row(95 + i % 5) for i in range(300)],
    "spiky": [row(100 if i % 10 < 4 else 2) for i in range(300)],
    "steady-low": [row(40 + i % 9) for i in range(300)],
    "stuck": [row(90) for _ in range(60)] + [row(0, power=90) for _ in range(240)],
    "throttled": [row(99, clock=1400 if i % 2 else 1980, reasons=0x4 if i % 2 else 0) for i in range(300)],
}
WANT_FINDING = {
    "spiky": "a slow host dataloader",
    "steady-low": "steady-low utilization: fp32 where bf16 would do, or a batch too small",
    "stuck": "a hang: stuck with memory held",
    "throttled": "throttling",
}


def env_for(tmp, doc, fail=None):
    path = os.path.join(tmp, "series.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    env = dict(os.environ, LD_LIBRARY_PATH=FAKE_DIR, FAKE_NVML_SERIES=path)
    env.pop("FAKE_NVML_FAIL", None)
    if fail:
        env["FAKE_NVML_FAIL"] = fail
    return env


def load(path, tag):
    with open(path) as f:
        doc = json.load(f)
    errs = schema_check.errors(doc, SCHEMA_DOC)
    check(not errs, f"{tag}: result against the schema: {errs[:3]}")
    check(doc["scenario"] == "watch", f"{tag}: scenario {doc['scenario']}")
    return doc


def metric(pt, name):
    return pt["metrics"][name]["value"]


def patterns(tmp):
    for name, rows in SERIES.items():
        out = os.path.join(tmp, f"{name}.json")
        args = [EXE, "watch", "--interval", "10", "--duration", "3.2", "--window", "2", "--summary-window", "1",
                "--stuck-after", "0.5", "--plain", "--json", out]
        p = subprocess.run(args, env=env_for(tmp, series(rows)), capture_output=True, text=True, timeout=60)
        want_rc = 4 if name == "stuck" else 0
        if not check(p.returncode == want_rc, f"{name}: exit {p.returncode}, want {want_rc}: {p.stderr[-500:]}"):
            continue
        doc = load(out, name)
        pt = doc["points"][0]
        causes = [f["cause"] for f in doc["findings"]]
        now = pt["info"]["pattern_now"]
        want_now = "healthy" if name == "throttled" else name
        check(now == want_now, f"{name}: pattern at the end {now}, want {want_now}")
        share = pt["info"]["summary"]["pattern_share_pct"]
        if name in ("healthy", "spiky", "steady-low", "throttled"):
            top = max(share, key=share.get)
            check(top == want_now and share[top] >= 90, f"{name}: shares {share}")
        if name in WANT_FINDING:
            check(WANT_FINDING[name] in causes, f"{name}: findings {causes}")
        else:
            check(causes == [], f"{name}: findings {causes}, want none")
        check(metric(pt, "samples") >= 250, f"{name}: {metric(pt, 'samples')} samples in 3.2 s at 10 ms")
        print(f"{name}: pattern {now}, shares {share}, findings {causes}, watch_cpu {metric(pt, 'watch_cpu'):.2f}%")
        if name == "stuck":
            check("ALARM GPU0 stuck" in p.stdout, f"stuck: no alarm line: {p.stdout[-400:]}")
            ep = pt["info"]["summary"]["stuck_episodes"]
            check(len(ep) == 1 and abs(ep[0]["alarm_s"] - ep[0]["start_s"] - 0.5) < 0.1,
                  f"stuck: episodes {ep}")
        if name == "throttled":
            check(45 <= metric(pt, "throttled") <= 55, f"throttled: {metric(pt, 'throttled')}% of loaded time")


def on_stuck(tmp):
    marker = os.path.join(tmp, "on_stuck.txt")
    out = os.path.join(tmp, "on_stuck.json")
    p = subprocess.run([EXE, "watch", "--interval", "10", "--duration", "2", "--stuck-after", "0.3", "--plain",
                        "--json", out, "--on-stuck", f"echo gpu=$STALLBENCH_STUCK_GPU secs=$STALLBENCH_STUCK_SECONDS > {marker}"],
                       env=env_for(tmp, series(SERIES["stuck"])), capture_output=True, text=True, timeout=60)
    check(p.returncode == 4, f"on-stuck: exit {p.returncode}: {p.stderr[-300:]}")
    check(os.path.exists(marker) and open(marker).read().strip() == "gpu=0 secs=0",
          f"on-stuck: marker {open(marker).read() if os.path.exists(marker) else 'missing'}")
    doc = load(out, "on-stuck")
    ep = doc["points"][0]["info"]["summary"]["stuck_episodes"]
    check(ep and ep[0]["on_stuck_rc"] == 0, f"on-stuck: episodes {ep}")
    # a command that outlives its deadline is killed, not waited for
    t0 = time.monotonic()
    p = subprocess.run([EXE, "watch", "--interval", "10", "--duration", "3", "--stuck-after", "0.3", "--plain",
                        "--json", out, "--on-stuck", "sleep 60", "--on-stuck-timeout", "0.5"],
                       env=env_for(tmp, series(SERIES["stuck"])), capture_output=True, text=True, timeout=60)
    check(time.monotonic() - t0 < 10, "on-stuck: a hung --on-stuck held the watch")
    ep = load(out, "on-stuck timeout")["points"][0]["info"]["summary"]["stuck_episodes"]
    check(ep and ep[0]["on_stuck_rc"] == -1, f"on-stuck timeout: {ep}")


def cpu_cost(tmp):
    out = os.path.join(tmp, "cpu.json")
    p = subprocess.run([EXE, "watch", "--interval", "10", "--duration", "5", "--plain", "--print-every", "1",
                        "--json", out], env=env_for(tmp, series(SERIES["healthy"])), capture_output=True, text=True,
                       timeout=60)
    if not check(p.returncode == 0, f"cpu: exit {p.returncode}: {p.stderr[-300:]}"):
        return
    pt = load(out, "cpu")["points"][0]
    cpu = metric(pt, "watch_cpu")
    print(f"the watch's own CPU at 10 ms over 5 s: {cpu:.3f}% of a core ({metric(pt, 'samples'):.0f} samples)")
    check(0 < cpu < 1.0, f"the watch at 10 ms costs {cpu:.3f}% of a core, over 1%")


def execs(tmp):
    env = env_for(tmp, series(SERIES["healthy"]))
    p = subprocess.run([EXE, "watch", "--interval", "20", "--exec", "--", "sh", "-c", "echo child-out; exit 7"],
                       env=env, capture_output=True, text=True, timeout=60, cwd=tmp)
    check(p.returncode == 7, f"exec: exit {p.returncode}, want the child's 7: {p.stderr[-300:]}")
    check("child-out" in p.stdout, "exec: the child's stdout")
    check("watch:" in p.stderr and "sh exited 7" in p.stderr and "mean utilization" in p.stderr,
          f"exec: the summary on stderr: {p.stderr[-500:]}")
    # killed by a signal: 128 + the signal, as a shell says it
    p = subprocess.run([EXE, "watch", "--interval", "20", "--json", os.path.join(tmp, "x.json"), "--exec",
                        "sh", "-c", "kill -9 $$"], env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode == 137, f"exec killed: exit {p.returncode}, want 137")
    # a command that is not there: exit 2, named
    p = subprocess.run([EXE, "watch", "--exec", "--", "no-such-command-xyz"], env=env, capture_output=True, text=True,
                       timeout=60)
    check(p.returncode == 2 and "no-such-command-xyz" in p.stderr, f"exec missing: {p.returncode} {p.stderr[-200:]}")
    # SIGINT and SIGTERM sent to stallbench reach the child, which decides what to do
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGINT, lambda *a: sys.exit(42))\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(43))\n"
             "print('ready', flush=True)\n"
             "time.sleep(30)\n"
             "sys.exit(1)\n")
    for sig, want in ((signal.SIGINT, 42), (signal.SIGTERM, 43)):
        proc = subprocess.Popen([EXE, "watch", "--interval", "20", "--json", os.path.join(tmp, "sig.json"), "--exec",
                                 "--", sys.executable, "-c", child], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        check(line.strip() == "ready", f"exec {sig.name}: child said {line!r}")
        time.sleep(0.3)
        proc.send_signal(sig)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        err = proc.stderr.read()
        check(rc == want, f"exec {sig.name}: exit {rc}, want {want} (forwarded): {err[-300:]}")
        doc = load(os.path.join(tmp, "sig.json"), f"exec {sig.name}")
        check(doc["meta"]["watch"]["child_exit_code"] == want, f"exec {sig.name}: {doc['meta']['watch']}")


def from_logs(tmp):
    # nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,clocks.sm,power.draw,memory.used
    #   --format=csv -lms 100, two GPUs: GPU 0 spiky, GPU 1 healthy
    smi = os.path.join(tmp, "smi.csv")
    with open(smi, "w") as f:
        f.write("timestamp, index, utilization.gpu [%], utilization.memory [%], clocks.sm [MHz], power.draw [W], "
                "memory.used [MiB]\n")
        for i in range(600):
            ts = f"2026/11/30 10:{i // 600:02d}:{(i // 10) % 60:02d}.{(i % 10) * 100:03d}"
            u0 = 100 if i % 10 < 4 else 1
            f.write(f"{ts}, 0, {u0} %, {u0 // 3} %, 1980 MHz, {100 + 5 * u0:.2f} W, 70000 MiB\n")
            f.write(f"{ts}, 1, {96 + i % 4} %, 40 %, 1980 MHz, 650.00 W, 70000 MiB\n")
    out = os.path.join(tmp, "smi.json")
    p = subprocess.run([EXE, "watch", "--from", smi, "--json", out, "--summary-window", "5"], capture_output=True,
                       text=True, timeout=60)
    if check(p.returncode == 0, f"from smi: exit {p.returncode}: {p.stderr[-300:]}"):
        doc = load(out, "from smi")
        got = {pt["params"]["gpu"]: pt["info"]["pattern_now"] for pt in doc["points"]}
        check(got == {0: "spiky", 1: "healthy"}, f"from smi: {got}")
        check(abs(doc["points"][0]["metrics"]["duration"]["value"] - 59.9) < 0.01, "from smi: duration")
        print("from nvidia-smi:", got)
    # dcgmi dmon -e 203,204,1002,1004 -d 100: utilization 100% but SM active 20%: steady-low, not healthy
    dcgm = os.path.join(tmp, "dcgmi.txt")
    with open(dcgm, "w") as f:
        for i in range(200):
            if i % 20 == 0:
                f.write("#Entity   GPUTL  MCUTL  SMACT  TENSO\nID\n")
            f.write(f"GPU 0     100    30     0.200  0.010\n")
    p = subprocess.run([EXE, "watch", "--from", dcgm, "--from-interval", "100", "--json", out], capture_output=True,
                       text=True, timeout=60)
    if check(p.returncode == 0, f"from dcgmi: exit {p.returncode}: {p.stderr[-300:]}"):
        doc = load(out, "from dcgmi")
        pt = doc["points"][0]
        check(pt["info"]["pattern_now"] == "steady-low", f"from dcgmi: {pt['info']['pattern_now']}")
        causes = [f["cause"] for f in doc["findings"]]
        check("fp32 where bf16 would do" in causes, f"from dcgmi: tensor active 1% names fp32: {causes}")
        print("from dcgmi:", pt["info"]["pattern_now"], causes)


def live_view(tmp):
    if not shutil.which("tmux"):
        print("SKIP live view: no tmux")
        return
    env = env_for(tmp, series(SERIES["spiky"], gpus=2))
    sock = os.path.join(tmp, "tmux.sock")
    cmd = f"{EXE} watch --interval 20 --duration 4 --json {tmp}/live.json; echo WATCH-EXIT=$?; sleep 30"
    envs = [f"{k}={env[k]}" for k in ("LD_LIBRARY_PATH", "FAKE_NVML_SERIES")]
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-x", "160", "-y", "30", "env", *envs, "sh", "-c", cmd],
                   check=True, timeout=20)
    try:
        time.sleep(2.5)
        mid = subprocess.run(["tmux", "-S", sock, "capture-pane", "-p"], capture_output=True, text=True,
                             timeout=10).stdout
        deadline = time.monotonic() + 20
        end = ""
        while time.monotonic() < deadline:
            end = subprocess.run(["tmux", "-S", sock, "capture-pane", "-p"], capture_output=True, text=True,
                                 timeout=10).stdout
            if "WATCH-EXIT=" in end:
                break
            time.sleep(0.3)
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True, timeout=10)
    print("tmux pane while running:\n" + mid)
    lines = [l for l in mid.splitlines() if l.startswith("GPU")]
    check(len(lines) == 2, f"live: one line per GPU refreshed in place, got {len(lines)}: {mid!r}")
    check(all("spiky" in l and "▁" in l and "█" in l for l in lines), f"live: sparkline and pattern: {lines}")
    check(all(len(l) <= 160 for l in mid.splitlines()), "live: a line wider than the terminal")
    check(mid.count("stallbench watch") == 1, "live: the header repeated instead of redrawn")
    check("WATCH-EXIT=0" in end, f"live: the watch did not end: {end[-300:]}")
    check(end.count("stallbench watch ") == 1 and "mean utilization" in end, f"live: final screen {end!r}")


def bad_input(tmp):
    env = env_for(tmp, series(SERIES["healthy"]))
    cases = [
        (["--interval", "5"], env, "--interval"),
        (["--gpu", "x"], env, "--gpu"),
        (["--gpu", "7", "--duration", "1"], env, "NVML sees GPUs 0..0"),
        (["--from", os.path.join(tmp, "missing.csv")], env, "missing.csv"),
        (["--from", tmp], env, tmp),
        (["--exec"], env, "name the command"),
        (["--duration", "1", "--exec", "true"], env, "--duration does not apply"),
        (["--duration", "nan"], env, "--duration"),
        (["--stuck-after", "-1"], env, "--stuck-after"),
        (["--duration", "1"], env_for(tmp, series(SERIES["healthy"]), fail="init"), "Driver Not Loaded"),
        (["--duration", "1"], dict(os.environ, LD_LIBRARY_PATH="/nonexistent"), "NVML"),
    ]
    bad_log = os.path.join(tmp, "bad.csv")
    with open(bad_log, "w") as f:
        f.write("timestamp, index, utilization.gpu [%]\n2026/11/30 10:00:00.000, 0, lots %\n")
    cases.append((["--from", bad_log], env, "bad.csv:2"))
    for args, e, want in cases:
        p = subprocess.run([EXE, "watch", "--json", os.path.join(tmp, "bad.json"), *args], env=e, capture_output=True,
                           text=True, timeout=30)
        check(p.returncode == 2 and want in p.stderr, f"bad {args}: exit {p.returncode}, stderr {p.stderr[-300:]!r}")


def html(tmp):
    out, page = os.path.join(tmp, "h.json"), os.path.join(tmp, "h.html")
    p = subprocess.run([EXE, "watch", "--interval", "10", "--duration", "1", "--plain", "--json", out, "--html", page],
                       env=env_for(tmp, series(SERIES["spiky"])), capture_output=True, text=True, timeout=60)
    if check(p.returncode == 0, f"html: exit {p.returncode}: {p.stderr[-300:]}"):
        text = open(page).read()
        check("<h1>stallbench watch</h1>" in text and "<polyline" in text and "<script" not in text
              and "http" not in text.lower().replace("http-equiv", ""), "html: self-contained page with the chart")
        check("a slow host dataloader" in text, "html: the finding")


SCHEMA_DOC = json.load(open(SCHEMA))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for part in (patterns, on_stuck, cpu_cost, execs, from_logs, live_view, bad_input, html):
            t0 = time.monotonic()
            part(tmp)
            print(f"-- {part.__name__}: {time.monotonic() - t0:.1f} s")
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("watch e2e: OK")


main()
