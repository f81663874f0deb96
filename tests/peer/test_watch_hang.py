#!/usr/bin/env python3
"""`watch --exec` on a real two-rank gloo job that hangs (PyPI torch, torchrun): rank 1 skips the
all-reduce of step 6 and sleeps; the job's own progress lines stop; the watch raises the stuck alarm
within --stuck-after plus a few seconds, asks every rank for its Flight Recorder dump through the
pipes stallbench.torch.flight_recorder opened, names the rank and the call from those dumps
(analyze-hang), takes py-spy stacks where py-spy is installed, and ends the job (--kill-on-stuck).
A healthy job under the same watch raises nothing and returns 0; a job that prints no step line is
never called stuck (and the result says why).

usage: test_watch_hang.py STALLBENCH PYTHON_DIR
Exit 0 pass, 1 fail, 77 skip (no torch here nor in $STALLBENCH_TORCH_PYTHON).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

failures = []


def check(cond, msg, detail=""):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)
        if detail:
            print("     " + detail.replace("\n", "\n     "), flush=True)
    return cond


def torch_python():
    for py in (sys.executable, os.environ.get("STALLBENCH_TORCH_PYTHON")):
        if py and os.path.exists(py):
            p = subprocess.run([py, "-c", "import torch.distributed.run"], capture_output=True, timeout=300)
            if p.returncode == 0:
                return py
    return None


JOB = r'''
import datetime, os, sys, time
sys.path.insert(0, {pydir!r})
import stallbench.torch as sbt
sbt.flight_recorder()          # its directory: $STALLBENCH_FR_DIR, from the watch
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank = dist.get_rank()
t = torch.ones(8)
for step in range({steps}):
    if step == {hang_at} and rank == 1:
        time.sleep(600)        # rank 1 never calls this step's all_reduce
    dist.all_reduce(t)
    print(f"step {{step}} loss 1.0 rank {{rank}}", flush=True)
    time.sleep(0.2)
'''


def watch(sb, py, tmp, name, job_text, extra=()):
    """Runs the job under watch --exec; returns (rc, [(t, stream, line)], result json)."""
    job = os.path.join(tmp, name + ".py")
    with open(job, "w") as f:
        f.write(job_text)
    out_json = os.path.join(tmp, name + ".json")
    env = dict(os.environ, PATH=os.path.dirname(py) + os.pathsep + os.environ.get("PATH", ""))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    cmd = [sb, "watch", "--stuck-after", "3", "--fr-dir", os.path.join(tmp, name + "-fr"), "--json", out_json,
           *extra, "--exec", "--", py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", job]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
    lines = []
    lock = threading.Lock()

    def pump(stream, tag):
        for ln in stream:
            with lock:
                lines.append((time.monotonic() - t0, tag, ln.rstrip("\n")))

    ts = [threading.Thread(target=pump, args=(p.stdout, "out")), threading.Thread(target=pump, args=(p.stderr, "err"))]
    for t in ts:
        t.start()
    try:
        p.wait(timeout=180)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        lines.append((time.monotonic() - t0, "err", "[killed by the test after 180 s]"))
    for t in ts:
        t.join()
    doc = json.load(open(out_json)) if os.path.exists(out_json) else {}
    return p.returncode, lines, doc


def main():
    sb, pydir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    py = torch_python()
    if not py:
        print("SKIP: torch is not importable here nor in $STALLBENCH_TORCH_PYTHON (the job is a real gloo job)")
        return 77
    tmp = tempfile.mkdtemp(prefix="sb-watch-hang-")
    try:
        # 1. the hang
        rc, lines, doc = watch(sb, py, tmp, "hang", JOB.format(pydir=pydir, steps=1000, hang_at=6), ["--kill-on-stuck"])
        text = "\n".join(f"{t:6.1f} {tag} {ln}" for t, tag, ln in lines)
        # two ranks' unbuffered prints (PYTHONUNBUFFERED: the text and its newline are two writes) can
        # share a line, as on a terminal: the steps are counted, not the lines
        steps = [t for t, tag, ln in lines if tag == "out" and "loss 1.0 rank" in ln]
        n_steps = sum(len(re.findall(r"step \d+ loss 1\.0 rank \d", ln)) for _, tag, ln in lines if tag == "out")
        alarm = [t for t, tag, ln in lines if "ALARM the job is stuck" in ln]
        check(n_steps == 12, f"the job's output passes through stallbench's stdout: steps 0-5 of both ranks ({n_steps})",
              text[-1500:])
        check(alarm and steps and alarm[0] - steps[-1] <= 3 + 2,
              "the stuck alarm within --stuck-after (3 s) + 2 s of the last step line: %s" %
              (f"{alarm[0] - steps[-1]:.1f} s" if alarm and steps else "no alarm"), text[-1500:])
        check(any("asked 2 rank(s) for a Flight Recorder dump; 2 written" in ln for _, _, ln in lines),
              "both ranks dumped on request (gloo: the dump pipes of stallbench.torch.flight_recorder)", text[-1500:])
        check(any("verdict: missing at seq 7; culprit 1" in ln for _, _, ln in lines),
              "from the dumps it triggered: rank 1 never joined the all_reduce at seq 7", text[-1500:])
        check(rc != 0 and any("--kill-on-stuck" in ln for _, _, ln in lines),
              f"--kill-on-stuck ended the job; watch returns its exit code ({rc})")
        prog = doc.get("meta", {}).get("watch", {}).get("progress", {})
        found = (prog.get("alarms") or [{}])[0]
        check(found.get("analyze_hang", {}).get("culprits") == [1] and found.get("pipes_written") == 2,
              "the result JSON records the alarm, the dumps and analyze-hang's culprit",
              json.dumps(prog)[:800])
        sleep_line = JOB.format(pydir=pydir, steps=1000, hang_at=6).splitlines().index(
            "        time.sleep(600)        # rank 1 never calls this step's all_reduce") + 1
        if shutil.which("py-spy", path=os.path.dirname(py) + os.pathsep + os.environ.get("PATH", "")):
            check(any(f"main thread: <module> (hang.py:{sleep_line})" in ln for _, _, ln in lines) and
                  any("main thread: all_reduce" in ln for _, _, ln in lines),
                  f"py-spy: rank 1 sleeps at hang.py:{sleep_line}, rank 0 waits in all_reduce", text[-1500:])
        else:
            print("note: py-spy not installed: its stacks are not checked")

        # 2. a healthy job: no alarm, exit 0
        rc, lines, doc = watch(sb, py, tmp, "healthy", JOB.format(pydir=pydir, steps=12, hang_at=-1))
        check(rc == 0 and not any("ALARM" in ln for _, _, ln in lines),
              f"a healthy job: no alarm, exit 0 ({rc})", "\n".join(ln for _, _, ln in lines)[-800:])
        check(doc.get("meta", {}).get("watch", {}).get("progress", {}).get("steps_seen", 0) >= 12,
              "its steps are counted in the result")

        # 3. a job that prints no step line and then sleeps past --stuck-after: never called stuck
        quiet = "import time\nprint('loading the model', flush=True)\ntime.sleep(6)\n"
        rc, lines, doc = watch(sb, py, tmp, "quiet", quiet)
        prog = doc.get("meta", {}).get("watch", {}).get("progress", {})
        check(rc == 0 and not any("ALARM" in ln for _, _, ln in lines) and "no step line" in prog.get("note", ""),
              "a job with no step line is not called stuck, and the result says why",
              json.dumps(prog)[:400])
    finally:
        if not failures:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"(left {tmp})")
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
