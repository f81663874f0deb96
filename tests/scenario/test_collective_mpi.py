#!/usr/bin/env python3
"""The collective scenario under mpirun (suite `mpi`).

For 2 and 3 ranks and every mismatch kind, with the watchdog: the job ends
within its bound, with the documented exit code, every rank's dump exists,
no process is left behind, and `analyze-hang` names the right step, kind and
rank. With check=fingerprint: every kind is caught at its first bad call,
before anything hangs. Healthy mode: wrong = 0 and busbw = algbw x the
nccl-tests factor, for every op, in both sweep modes (mode=blocking:
MPI_Allreduce...; nonblocking: MPI_Iallreduce... polled), each row naming the
mode and the calls it ran. The mismatch cases hang in the step loop, which is
nonblocking in every mode; a hang inside the size sweep (a rank stopped with
SIGSTOP mid-sweep, so the other waits inside MPI_Allreduce for ever) is
caught by the watchdog thread alone, in both modes.

Every mpirun runs under a hard outer timeout (`timeout -k`), so a hang in
stallbench itself fails this test instead of stalling CI.

With --backend nccl (suite `gpu`) the same checks run on NCCL, one GPU per
rank; they exit 77 (SKIP) without at least two GPUs, or one GPU with NCCL
>= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1.

usage: test_collective_mpi.py STALLBENCH SCHEMA [--backend mpi|nccl]
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import schema_check  # jsonschema where installed, else the strict built-in validator

STALLBENCH = os.path.abspath(sys.argv[1])
SCHEMA = json.load(open(sys.argv[2]))
BACKEND = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "mpi"
MPIRUN = shutil.which("mpirun")
# One machine: shared memory only (fast start-up); root in containers and CI;
# more ranks than cores on a 2-core runner.
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
TIMEOUT_S = 1.5  # the watchdog's
GRACE_S = 3.0    # rank 0 waits at most this for the other dumps
failures = []


def valid(doc, tag):
    """The result JSON obeys results/schema/result.schema.json."""
    errs = schema_check.errors(doc, SCHEMA)
    check(not errs, f"{tag} result JSON is valid against the schema ({schema_check.validator_name()})",
          "; ".join(errs[:3])[:300])


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        if detail:
            print("     " + detail.replace("\n", "\n     "), flush=True)
        failures.append(what)
    return cond


def mpirun(n, args, outer=60):
    if args[:2] == ["run", "collective"]:
        args = [*args, "-p", f"backend={BACKEND}"] + (["--device", "cuda:0"] if BACKEND == "nccl" else ["--device", "cpu"])
    cmd = ["timeout", "-k", "5", str(outer), MPIRUN, *MPI_FLAGS, "-np", str(n), STALLBENCH, *args]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p, time.monotonic() - t0


def leftovers(marker):
    """stallbench processes whose command line names this run's dump dir."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [pid for pid in out if int(pid) != os.getpid()]


def expected_position(kind, step):
    # Each step issues call 0 (the main op, all_reduce here) then call 1
    # (a broadcast): seq = 2 * step + call. A root mismatch is in call 1.
    call = 1 if kind == "root" else 0
    return 2 * step + call, call


# What analyze-hang must call each injected mismatch (kind, pattern).
HANG_KIND = {
    "skip": ("missing", "skip"),
    "order": ("op", "order"),
    "count": ("count", ""),
    "dtype": ("dtype", ""),
    "root": ("root", ""),
    "straggler": ("missing", ""),
}


def analyze(d):
    p = subprocess.run(["timeout", "30", STALLBENCH, "analyze-hang", d, "--json"], capture_output=True, text=True)
    check(p.returncode == 0, f"analyze-hang {d} exits 0 (got {p.returncode})", p.stderr.strip()[-300:])
    return json.loads(p.stdout) if p.returncode == 0 else {}


# Open MPI refuses a count or dtype mismatch itself (MPI_ERR_TRUNCATE, or a crash on a
# float/double mix): exit 5, dumps written all the same. The other kinds hang until the
# watchdog ends the job: exit 4. On a float/double mix a rank may also die of SIGSEGV inside
# the library's reduction (a double message reduced into a float buffer) before the rank that
# saw the error calls MPI_Abort(5): mpirun then exits 139 for the signal (4 ranks, 2026-12-05,
# once in two suite runs here; rank 1 "exited on signal 11", every dump written and analyzed).
LIBRARY_REFUSES = {"count": (5,), "dtype": (5, 128 + 11)}


def hang_case(tmp, n, kind, step=3, culprit=None):
    culprit = n - 1 if culprit is None else culprit
    spec = f"{kind}@{step}:{culprit}"
    d = os.path.join(tmp, f"dumps-{n}-{kind}-{step}-{culprit}")
    out = os.path.join(tmp, f"hang-{n}-{kind}-{step}-{culprit}.json")
    args = ["run", "collective", "--quick", "-p", f"mismatch={spec}", "-p", f"timeout_s={TIMEOUT_S}",
            "-p", f"dump_dir={d}", "-p", "delay_ms=20000", "--json", out]
    p, wall = mpirun(n, args)
    tag = f"[{n} ranks, {spec}]"
    want_rc = LIBRARY_REFUSES.get(kind, (4,))
    check(p.returncode in want_rc, f"{tag} exit code {p.returncode} in {want_rc}", p.stderr[-1500:])
    bound = TIMEOUT_S + GRACE_S + 4
    check(wall < bound, f"{tag} the job ended in {wall:.1f} s (bound {bound:.1f} s)")
    for r in range(n):
        check(os.path.isfile(os.path.join(d, f"rank-{r}.json")), f"{tag} rank {r}'s dump exists")
    time.sleep(0.2)
    check(not leftovers(d), f"{tag} no process left behind")
    rep = analyze(d)
    want_kind, want_pattern = HANG_KIND[kind]
    seq, call = expected_position(kind, step)
    check(rep.get("kind") == want_kind, f"{tag} kind {rep.get('kind')} == {want_kind}: {rep.get('summary')}")
    if want_pattern:
        check(rep.get("pattern") == want_pattern, f"{tag} pattern {rep.get('pattern')} == {want_pattern}")
    check(rep.get("culprits") == [culprit], f"{tag} culprits {rep.get('culprits')} == [{culprit}]")
    check(rep.get("step") == step, f"{tag} step {rep.get('step')} == {step}")
    check(rep.get("seq") == seq, f"{tag} seq {rep.get('seq')} == {seq}")
    # The job's own result, written by rank 0 before the abort, says the same.
    if os.path.isfile(out):
        doc = json.load(open(out))
        pt = doc["points"][0]
        check(pt["status"] in ("hang", "error") and doc["findings"],
              f"{tag} result JSON: status {pt['status']} with a finding")
        check(pt["params"].get("mismatch") == spec, f"{tag} result JSON names its params")
        valid(doc, tag)
    else:
        check(False, f"{tag} rank 0 wrote the result JSON before ending the job")


def multi_point(tmp):
    """Two points in one job: the first completes, the second hangs. The hang's
    analysis reads only its own point's dumps, and the result keeps both."""
    d = os.path.join(tmp, "dumps-multi")
    out = os.path.join(tmp, "multi.json")
    p, wall = mpirun(2, ["run", "collective", "--quick", "-p", "mismatch=straggler@2:1", "-p", "delay_ms=1500",
                         "-p", "timeout_s=5,0.8", "-p", f"dump_dir={d}", "--json", out])
    tag = "[2 ranks, two points, the second hangs]"
    check(p.returncode == 4, f"{tag} exit 4 (got {p.returncode})", p.stderr[-800:])
    rep = analyze(d)
    check(rep.get("kind") == "missing" and rep.get("culprits") == [1] and rep.get("step") == 2,
          f"{tag} the straggler is named: {rep.get('summary')}")
    doc = json.load(open(out)) if os.path.isfile(out) else {"points": []}
    check([pt["status"] for pt in doc["points"]] == ["ok", "hang"], f"{tag} the result keeps the first point",
          str([pt["status"] for pt in doc["points"]]))


def small_ring(tmp):
    """A ring too small to hold the divergence: the report says so instead of
    calling the run healthy."""
    d = os.path.join(tmp, "dumps-ring")
    p, _ = mpirun(3, ["run", "collective", "--quick", "-p", "op=broadcast", "-p", "mismatch=dtype@2:1",
                      "-p", "ring=4", "-p", "timeout_s=1.5", "-p", f"dump_dir={d}", "--json", os.path.join(tmp, "r.json")])
    # Open MPI 4.1 (pml ob1) pairs a float broadcast with a double one silently: the run goes on
    # for all its steps with wrong data (exit 1, the exact check's error), and the 4-entry rings
    # hold only the last calls. The report must say the divergence may have been overwritten,
    # not call the run healthy.
    rep = analyze(d)
    check(p.returncode == 1, f"[small ring] exit 1 for the wrong data (got {p.returncode})", p.stderr[-600:])
    check(rep.get("kind") == "none" and "overwritten" in rep.get("summary", ""),
          "[small ring] the summary says the divergence may be overwritten", rep.get("summary", ""))
    check(rep.get("summary", "").find("raise ring") >= 0, "[small ring] the summary says how to see it (raise ring)")
    out = os.path.join(tmp, "r.json")
    if check(os.path.isfile(out), "[small ring] the result JSON is written"):
        pt = json.load(open(out))["points"][0]
        check(pt["status"] == "error" and "wrong element" in pt.get("reason", ""),
              f"[small ring] the point is an error naming the wrong elements: {pt['status']} {pt.get('reason', '')[:200]}")


def fingerprint_case(tmp, n, kind):
    step = 2
    culprit = 1
    spec = f"{kind}@{step}:{culprit}"
    d = os.path.join(tmp, f"fp-{n}-{kind}")
    out = os.path.join(tmp, f"fp-{n}-{kind}.json")
    delay = 300 if kind == "straggler" else 1000
    args = ["run", "collective", "--quick", "-p", "check=fingerprint", "-p", f"mismatch={spec}",
            "-p", f"timeout_s={TIMEOUT_S + 1}", "-p", f"dump_dir={d}", "-p", f"delay_ms={delay}", "--json", out]
    p, wall = mpirun(n, args)
    tag = f"[fingerprint, {n} ranks, {spec}]"
    doc = json.load(open(out)) if os.path.isfile(out) else None
    check(doc is not None, f"{tag} result written (exit {p.returncode})", p.stderr[-800:])
    if not doc:
        return
    pt = doc["points"][0]
    if kind == "straggler":
        # A stall, not a mismatch: the run completes and names who was late.
        check(p.returncode == 0 and pt["status"] == "ok", f"{tag} completes (exit {p.returncode}, {pt['status']})")
        lost = pt["metrics"].get("stall_lost_ms", {}).get("value", 0)
        check(0.6 * delay < lost < 3 * delay, f"{tag} the others lost {lost:.0f} ms (delay {delay} ms)")
        check(pt["info"]["analysis"]["stall"]["rank"] == culprit, f"{tag} the late rank is {culprit}")
        return
    seq, _ = expected_position(kind, step)
    check(p.returncode == 1 and pt["status"] == "error", f"{tag} refused: exit {p.returncode}, status {pt['status']}")
    check(f"check=fingerprint at seq {seq}," in pt["reason"], f"{tag} caught at the first bad call (seq {seq}): {pt['reason']}")
    check(wall < 15, f"{tag} no hang: {wall:.1f} s")
    rep = analyze(d)
    check(rep.get("culprits") == [culprit], f"{tag} culprits {rep.get('culprits')} == [{culprit}]")
    check(rep.get("seq") == seq and rep.get("step") == step, f"{tag} seq/step {rep.get('seq')}/{rep.get('step')}")
    want_kind, want_pattern = HANG_KIND[kind]
    check(rep.get("kind") == want_kind and rep.get("pattern", "") == want_pattern,
          f"{tag} kind {rep.get('kind')}/{rep.get('pattern')} == {want_kind}/{want_pattern}", rep.get("summary", ""))


def rank_pid(marker, rank):
    """The pid of the stallbench process of this rank whose command line names marker."""
    for pid in leftovers(marker):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and os.path.basename(STALLBENCH).encode() in \
                open(f"/proc/{pid}/cmdline", "rb").read():
            return int(pid)
    return None


def sweep_hang(tmp, mode):
    """A hang inside the size sweep: rank 1 is stopped (SIGSTOP) mid-sweep, so
    rank 0 waits inside its call (mode=blocking: MPI_Allreduce itself) for ever.
    Its watchdog thread alone must dump the ring and end the job (exit 4)."""
    if BACKEND != "mpi":
        return
    d = os.path.join(tmp, f"dumps-sweep-{mode}")
    out = os.path.join(tmp, f"sweep-{mode}.json")
    tag = f"[2 ranks, sweep mode={mode}, rank 1 stopped]"
    args = ["run", "collective", "-p", f"mode={mode}", "-p", "min_bytes=65536", "-p", "max_bytes=65536",
            "-p", "iters=1000000", "-p", "warmup=2", "-p", f"timeout_s={TIMEOUT_S}", "-p", f"dump_dir={d}",
            "--device", "cpu", "-p", "backend=mpi", "--json", out]
    cmd = ["timeout", "-k", "5", "90", MPIRUN, *MPI_FLAGS, "-np", "2", STALLBENCH, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = None
    try:
        # The watchdog makes dump_dir as the sweep's point opens: the calls follow at once.
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and proc.poll() is None and not os.path.isdir(d):
            time.sleep(0.05)
        time.sleep(0.5)
        stopped = rank_pid(d, 1)
        check(stopped is not None and proc.poll() is None, f"{tag} rank 1 found mid-sweep")
        if stopped is None:
            proc.kill()
            proc.communicate()
            return
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        wall = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in leftovers(d):  # only this run's processes: never a broad name
            try:
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    check(proc.returncode == 4, f"{tag} exit 4 (got {proc.returncode})", err[-1500:])
    check("no collective completed" in err, f"{tag} rank 0's watchdog declared the hang", err[-800:])
    bound = TIMEOUT_S + GRACE_S + 8
    check(wall < bound, f"{tag} the job ended {wall:.1f} s after the stop (bound {bound:.1f} s)")
    dump_path = os.path.join(d, "rank-0.json")
    if check(os.path.isfile(dump_path), f"{tag} rank 0's dump exists"):
        dump = json.load(open(dump_path))
        last = dump["entries"][-1]
        check(last["state"] == "started" and last["op"] == "all_reduce" and last["step"] == -1,
              f"{tag} the last call is a sweep all_reduce, started, never completed: {last['state']}")
        check("timed calls of all_reduce" in dump["where"] and
              ("(MPI_Allreduce)" if mode == "blocking" else "(MPI_Iallreduce + MPI_Test)") in dump["where"],
              f"{tag} the dump says where rank 0 was: {dump['where']}")
    if check(os.path.isfile(out), f"{tag} rank 0 wrote the result JSON before ending the job"):
        doc = json.load(open(out))
        pt = doc["points"][-1]
        check(pt["status"] == "hang" and pt["params"].get("mode") == mode,
              f"{tag} result: status {pt['status']}, mode {pt['params'].get('mode')}")
        valid(doc, tag)
    time.sleep(0.2)
    check(not leftovers(d), f"{tag} no process left behind")


def healthy(tmp, n):
    out = os.path.join(tmp, f"healthy-{n}.json")
    ops = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all"
    p, _ = mpirun(n, ["run", "collective", "--quick", "-p", f"op={ops}", "-p", "dtype=fp32,bf16",
                      "-p", "mode=blocking,nonblocking", "-p", f"dump_dir={tmp}/healthy-dumps", "--json", out])
    check(p.returncode == 0, f"[healthy, {n} ranks] exit 0 (got {p.returncode})", p.stderr[-800:])
    if not os.path.isfile(out):
        return
    doc = json.load(open(out))
    valid(doc, f"[healthy, {n} ranks]")
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "all_to_all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}
    seen = set()
    modes = set()
    for pt in doc["points"]:
        m = pt["metrics"]
        op = pt["params"]["op"]
        mode = pt["params"]["mode"]
        seen.add(op)
        tag = f"[healthy, {n} ranks] {op} {pt['params']['dtype']} {pt['params']['bytes']} B mode={mode}"
        check(pt["status"] == "ok" and m["wrong"]["value"] == 0, f"{tag}: ok, wrong = 0")
        # What ran: nccl has no blocking calls, so its rows say nonblocking whatever was asked.
        ran = mode if BACKEND == "mpi" else "nonblocking"
        modes.add(pt["info"].get("mode"))
        check(pt["info"].get("mode") == ran, f"{tag}: info.mode {pt['info'].get('mode')} == {ran}")
        if BACKEND == "mpi":
            calls = pt["info"].get("calls", "")
            check(calls.startswith("MPI_I") == (mode == "nonblocking") and calls.startswith("MPI_"),
                  f"{tag}: info.calls {calls} is the {mode} family")
        # algbw is nccl-tests' size / time (GB/s = 1e9 B/s), from the row's own figures.
        algbw = pt["params"]["bytes"] / (m["time_us"]["value"] * 1e-6) / 1e9
        check(abs(m["algbw"]["value"] / algbw - 1) < 1e-6, f"{tag}: algbw {m['algbw']['value']:.4g} == bytes / time")
        ratio = m["busbw"]["value"] / m["algbw"]["value"]
        check(abs(ratio - factors[op]) < 1e-9, f"{tag}: busbw/algbw {ratio:.4f} == {factors[op]:.4f}")
        check(m["busbw"]["unit"] == "GB/s" and m["busbw"]["direction"] == "higher", f"{tag}: busbw in GB/s, higher")
        check(m["time_us"]["direction"] == "lower", f"{tag}: time_us lower is better")
    check(seen == set(factors), f"[healthy, {n} ranks] every op ran: {sorted(seen)}")
    want_modes = {"blocking", "nonblocking"} if BACKEND == "mpi" else {"nonblocking"}
    check(modes == want_modes, f"[healthy, {n} ranks] both modes ran: {sorted(m or '' for m in modes)}")
    check(doc["meta"]["ranks"]["size"] == n, f"[healthy, {n} ranks] meta.ranks.size")


def main():
    if not MPIRUN:
        print("SKIP: mpirun not found (apt install openmpi-bin)")
        return 77
    help_text = subprocess.run([STALLBENCH, "list", "--names"], capture_output=True, text=True).stdout
    if "collective" not in help_text:
        print("SKIP: this build has no collective scenario")
        return 77
    if BACKEND == "nccl":
        dev = json.loads(subprocess.run([STALLBENCH, "devices", "--json"], capture_output=True, text=True).stdout)
        gpus = len(dev.get("gpus", []))
        nccl = dev.get("versions", {}).get("cuda", {}).get("nccl", "")
        ver = tuple(int(x) for x in nccl.split(".")[:2] if x.isdigit())
        shared = os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1" and ver >= (2, 30)
        if gpus < 2 and not (gpus == 1 and shared):
            print(f"SKIP: backend=nccl needs two GPUs (found {gpus}; NCCL {nccl or 'not built'}), "
                  "or one with NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1")
            return 77
    tmp = tempfile.mkdtemp(prefix="sb-coll-")
    try:
        # Bad input: exit 2 on every rank, nothing left behind.
        p, wall = mpirun(2, ["run", "collective", "--quick", "-p", "mismatch=skip@3:5", "-p", f"dump_dir={tmp}/bad"])
        check(p.returncode == 2 and "rank 5 does not exist" in p.stderr,
          f"a mismatch rank past the job's size: exit {p.returncode} (want 2)", p.stderr[-800:])
        p = subprocess.run(["timeout", "30", STALLBENCH, "run", "collective", "-p", "mode=async"],
                           capture_output=True, text=True)
        check(p.returncode == 2 and "blocking|nonblocking" in p.stderr,
              f"an unknown mode: exit {p.returncode} (want 2) naming the valid ones", p.stderr[-400:])
        # devices under mpirun: every rank reported to rank 0, rank 0's id intact on each (as NCCL's travels)
        if BACKEND == "mpi":
            p, wall = mpirun(3, ["devices", "--json", "-"])
            doc = {}
            try:
                doc = json.loads(p.stdout)
            except ValueError:
                pass
            ranks = doc.get("ranks", {})
            check(p.returncode == 0 and ranks.get("launcher") == "mpirun" and ranks.get("id_agreed") is True
                  and [r.get("rank") for r in ranks.get("per_rank", [])] == [0, 1, 2],
                  f"devices under mpirun -np 3: every rank in rank 0's table: exit {p.returncode}",
                  (p.stdout + p.stderr)[-600:])
        for n in (2, 3):
            healthy(tmp, n)
        for mode in ("blocking", "nonblocking"):
            sweep_hang(tmp, mode)
        for n in (2, 3):
            for kind in ("skip", "order", "count", "dtype", "root", "straggler"):
                hang_case(tmp, n, kind)
        # Culprit rank 0 (the broadcast's root), a mismatch right after the
        # first step (2 ranks: only step 0 shows the program's pattern), and
        # 4 ranks, where Open MPI crashes on a float/double mix.
        hang_case(tmp, 2, "order", step=3, culprit=0)
        hang_case(tmp, 2, "skip", step=1, culprit=1)
        hang_case(tmp, 2, "count", step=1, culprit=0)
        hang_case(tmp, 4, "dtype", step=3, culprit=0)
        hang_case(tmp, 4, "order", step=2, culprit=2)
        multi_point(tmp)
        small_ring(tmp)
        for n in (2, 3):
            for kind in ("skip", "order", "count", "dtype", "root", "straggler"):
                fingerprint_case(tmp, n, kind)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
