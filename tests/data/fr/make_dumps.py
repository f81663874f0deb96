#!/usr/bin/env python3
"""Make real PyTorch Flight Recorder (FR) dumps with the gloo backend.

Run with a PyTorch that has FR for gloo (made with 2.15.0, CPU):
    /tmp/torchvenv/bin/python tests/data/fr/make_dumps.py [case ...]

For every case and world size (2, 3, 4) this starts one process per rank
(plain subprocesses, each with a hard timeout), runs a short training-like
loop of collectives on small tensors in which one rank (the culprit) does
something wrong, and has every rank write its FR dump in a `finally`:

    <case>-<n>r/rank_<i>        pickle form  (_dump_fr_trace())
    <case>-<n>r-json/rank_<i>   JSON form    (_dump_fr_trace_json())
    <case>-<n>r/manifest.json   what was done, what happened, the expected answer
    <case>-<n>r/fr_trace*.txt   PyTorch's analyzer output (reference), see README.md

Then runs `python -m torch.distributed.flight_recorder.fr_trace DIR --prefix rank_`
on each directory.  Time stamps, thread ids and paths in frames vary per run.
"""
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PG_TIMEOUT_S = 3          # init_process_group(timeout=...)
RANK_HARD_TIMEOUT_S = 60  # subprocess kill per rank
FR_BUFFER_SIZE = "50"     # TORCH_FR_BUFFER_SIZE
STEPS = 2
# Ops of one training-like step, in order.  Collective seq ids are 1-based:
# step s, op k -> seq = s * len(STEP_OPS) + k + 1.
STEP_OPS = ["broadcast", "all_gather", "reduce_scatter", "all_reduce"]
NOPS = len(STEP_OPS)


def seq_of(step, op):
    return step * NOPS + STEP_OPS.index(op) + 1


# case -> (kind stallbench must report, culprit rank as a function of world size,
#          (step, op) where the culprit diverges)
CASES = {
    "healthy":         dict(kind=None, culprit=lambda n: None, at=None),
    "missing":         dict(kind="missing", culprit=lambda n: n - 1, at=(1, "all_reduce")),
    "op":              dict(kind="collective_type", culprit=lambda n: 1, at=(0, "all_reduce")),
    # broadcast: the culprit (a receiver) has a bigger buffer, so gloo does not abort
    "size":            dict(kind="size", culprit=lambda n: n - 1, at=(1, "broadcast")),
    "dtype":           dict(kind="dtype", culprit=lambda n: 1, at=(0, "broadcast")),
    # all_reduce with more bytes on one rank: gloo aborts the process that
    # receives the bigger message (SIGABRT, gloo::EnforceNotMet), so that
    # rank writes no dump
    "size-abort":      dict(kind="size", culprit=lambda n: n - 1, at=(1, "all_reduce")),
    "dtype-abort":     dict(kind="dtype", culprit=lambda n: 1, at=(0, "all_reduce")),
    "allgather-count": dict(kind="size", culprit=lambda n: n - 1, at=(1, "all_gather")),
    "state":           dict(kind="state", culprit=lambda n: 1, at=(1, "all_reduce")),
    "dump-missing":    dict(kind="missing", culprit=lambda n: n - 1, at=(1, "all_reduce")),
}
WORLDS = [2, 3, 4]
NOTES = {
    "state": "gloo records no CUDA events: `state` is 'scheduled' in every entry on every rank. "
             "The culprit's dump is taken while its seq-8 all_reduce is in flight, so only "
             "`retired` (False on the culprit's last entry, True elsewhere) and "
             "pg_status.last_completed_collective (7 on the culprit, 8 elsewhere) differ.",
    "allgather-count": "gloo refuses an all_gather output list of world+1 tensors (and an "
                       "all_gather_into_tensor of the wrong size) locally, before FR records it; "
                       "this case records a shard of 6 elements instead of 4 on the culprit.",
    "dump-missing": "The run is the `missing` case; the culprit's dump (pickle and JSON) is then deleted.",
    "size-abort": "gloo aborts (SIGABRT, gloo::EnforceNotMet 'op.preamble.length <= op.nbytes') "
                  "the process that receives the bigger message; that rank writes no dump.",
    "dtype-abort": "as size-abort: float64 doubles the bytes; the receiving rank aborts without a dump.",
    "size": "broadcast from rank 0; the culprit receives into a bigger buffer. A rank that forwards "
            "the bigger buffer in gloo's broadcast tree can make another rank abort.",
    "dtype": "broadcast from rank 0 into a float64 buffer of the same element count on the culprit.",
}


# --------------------------------------------------------------------------
# worker (one rank)
# --------------------------------------------------------------------------
def worker(case, world, rank, port, outdir, jsondir):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    import torch._C._distributed_c10d as c10d

    spec = CASES[case]
    culprit = spec["culprit"](world)
    me_bad = rank == culprit
    log = {"rank": rank, "did": [], "error": None, "dumped": False}

    def did(step, op, what):
        log["did"].append({"seq": seq_of(step, op), "step": step, "op": op, "what": what})

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                init_method=f"tcp://127.0.0.1:{port}",
                                timeout=timedelta(seconds=PG_TIMEOUT_S))
        param = torch.arange(4, dtype=torch.float32) + rank
        grad = torch.ones(8, dtype=torch.float32) * (rank + 1)
        for step in range(STEPS):
            for op in STEP_OPS:
                log["in"] = {"seq": seq_of(step, op), "step": step, "op": op}
                bad = me_bad and spec["at"] == (step, op)
                if op == "broadcast" and bad and case == "size":
                    dist.broadcast(torch.zeros(6), src=0)
                    did(step, op, "broadcast([6] float32, src=0)  <-- WRONG size (others [4])")
                elif op == "broadcast" and bad and case == "dtype":
                    dist.broadcast(torch.zeros(4, dtype=torch.float64), src=0)
                    did(step, op, "broadcast([4] float64, src=0)  <-- WRONG dtype (others float32)")
                elif op == "broadcast":
                    dist.broadcast(param, src=0)
                    did(step, op, "broadcast([4] float32, src=0)")
                elif op == "all_gather":
                    if bad and case == "allgather-count":
                        # A list of world+1 outputs is refused by gloo before it
                        # is recorded, so the recorded mismatch is a shard of a
                        # different element count (6 instead of 4), with a
                        # locally consistent output list.
                        shard = torch.zeros(6)
                        dist.all_gather([torch.zeros(6) for _ in range(world)], shard)
                        did(step, op, f"all_gather(in [6], out {world}x[6])  <-- WRONG shard size")
                    else:
                        dist.all_gather([torch.zeros(4) for _ in range(world)], param)
                        did(step, op, f"all_gather(in [4], out {world}x[4])")
                elif op == "reduce_scatter":
                    out = torch.zeros(2)
                    dist.reduce_scatter_tensor(out, torch.ones(2 * world))
                    did(step, op, f"reduce_scatter_tensor(in [{2 * world}], out [2])")
                elif op == "all_reduce":
                    if bad and case in ("missing", "dump-missing"):
                        did(step, op, "SKIPPED all_reduce  <-- culprit never joins")
                        # stay alive (and connected) until the others time out
                        time.sleep(PG_TIMEOUT_S + 3)
                        return log
                    elif bad and case == "op":
                        dist.all_gather([torch.zeros(8) for _ in range(world)], grad)
                        did(step, op, "all_gather(in [8]) instead of all_reduce  <-- WRONG op")
                    elif bad and case == "size-abort":
                        g = torch.ones(12)
                        dist.all_reduce(g)
                        did(step, op, "all_reduce([12] float32)  <-- WRONG size (others [8])")
                    elif bad and case == "dtype-abort":
                        g = grad.double()
                        dist.all_reduce(g)
                        did(step, op, "all_reduce([8] float64)  <-- WRONG dtype (others float32)")
                    elif case == "state" and step == spec["at"][0]:
                        if me_bad:
                            # The culprit's dump is taken while its last
                            # all_reduce is still in flight (peers are late).
                            w = dist.all_reduce(grad, async_op=True)
                            write_dumps(c10d, rank, outdir, jsondir)
                            log["dumped"] = "while its last all_reduce was in flight"
                            w.wait()
                            did(step, op, "all_reduce([8]) async; DUMPED before wait()  <-- culprit")
                            time.sleep(1.0)
                            return log
                        else:
                            time.sleep(1.5)
                            dist.all_reduce(grad)
                            did(step, op, "all_reduce([8] float32) after 1.5 s delay")
                    else:
                        dist.all_reduce(grad)
                        did(step, op, "all_reduce([8] float32)")
        return log
    except BaseException as e:  # noqa: BLE001
        log["error"] = f"{type(e).__name__}: {e}"[:600]
        log["failed_in"] = log.get("in")
        return log
    finally:
        log.pop("in", None)
        if not log["dumped"]:
            try:
                write_dumps(c10d, rank, outdir, jsondir)
                log["dumped"] = True
            except BaseException as e:  # noqa: BLE001
                log["dump_error"] = repr(e)[:400]
        with open(os.path.join(outdir, f".log_{rank}.json"), "w") as f:
            json.dump(log, f)
        sys.stdout.flush()
        # Do not run destroy_process_group: it can block on a broken group.
        # Give peers time to finish their own time-outs before our sockets go.
        time.sleep(1.0)
        os._exit(0)


def write_dumps(c10d, rank, outdir, jsondir):
    b = c10d._dump_fr_trace()
    with open(os.path.join(outdir, f"rank_{rank}"), "wb") as f:
        f.write(b)
    j = c10d._dump_fr_trace_json()
    with open(os.path.join(jsondir, f"rank_{rank}"), "wb") as f:
        f.write(j if isinstance(j, bytes) else j.encode())


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------
def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run_fr_trace(d, extra=(), name="fr_trace.txt"):
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", d,
           "--prefix", "rank_", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    shown = " ".join(["python", "-m", "torch.distributed.flight_recorder.fr_trace",
                      os.path.relpath(d, HERE) if d.startswith(HERE) else
                      "<copy with pg_config rebuilt>/" + os.path.basename(d),
                      "--prefix", "rank_", *extra])
    with open(os.path.join(d, name), "w") as f:
        f.write(f"$ {shown}\n")
        f.write(p.stdout)
        f.write(p.stderr)
        f.write(f"[exit code {p.returncode}]\n")
    return p.returncode, p.stdout + p.stderr


def run_fr_trace_pgfix(d, world):
    """gloo in this PyTorch records pg_config as {'': {'name': '', 'desc': '', ...}}
    while entries say process_group ('0', 'default_pg'), and fr_trace fails with
    KeyError('0', 0).  For a reference of its matching logic, run it again on a
    temporary copy whose pg_config is rebuilt from the entries (nothing else
    changed).  The copy is not kept."""
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        tdir = os.path.join(td, os.path.basename(d))
        os.makedirs(tdir)
        for r in range(world):
            fn = os.path.join(d, f"rank_{r}")
            if not os.path.exists(fn):
                continue
            with open(fn, "rb") as f:
                dump = pickle.load(f)
            cfg = {}
            for e in dump["entries"]:
                pgn, desc = e["process_group"]
                cfg[pgn] = {"name": pgn, "desc": desc, "ranks": str(list(range(world)))}
            dump["pg_config"] = cfg
            with open(os.path.join(tdir, f"rank_{r}"), "wb") as f:
                pickle.dump(dump, f, protocol=2)
        rcs = {}
        for extra, name in (((), "fr_trace_pgfix.txt"),
                            (("--allow-incomplete-ranks",), "fr_trace_pgfix_allow_incomplete.txt")):
            if extra and len(os.listdir(tdir)) == world:
                continue
            rc, _ = run_fr_trace(tdir, extra, name)
            shutil.move(os.path.join(tdir, name), os.path.join(d, name))
            rcs[name] = rc
        return rcs


def last_completed(d, world):
    out = {}
    for r in range(world):
        fn = os.path.join(d, f"rank_{r}")
        if os.path.exists(fn):
            with open(fn, "rb") as f:
                dump = pickle.load(f)
            out[r] = {pg: st["last_completed_collective"] for pg, st in dump["pg_status"].items()}
    return out


def make_case(case, world):
    spec = CASES[case]
    name = f"{case}-{world}r"
    outdir = os.path.join(HERE, name)
    jsondir = os.path.join(HERE, name + "-json")
    for d in (outdir, jsondir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    port = free_port()
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=FR_BUFFER_SIZE, GLOO_SOCKET_IFNAME="lo")
    procs = []
    t0 = time.time()
    for r in range(world):
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", case, str(world), str(r),
             str(port), outdir, jsondir],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    ranks = {}
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1, RANK_HARD_TIMEOUT_S - (time.time() - t0)))
            hard_killed = False
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            hard_killed = True
        logf = os.path.join(outdir, f".log_{r}.json")
        log = {"rank": r, "did": [], "error": None, "dumped": False}
        if os.path.exists(logf):
            with open(logf) as f:
                log = json.load(f)
            os.remove(logf)
        log["exit_code"] = p.returncode
        log["hard_killed"] = hard_killed
        tail = (out or "").strip().splitlines()[-5:]
        if tail:
            log["output_tail"] = tail
        ranks[r] = log
    culprit = spec["culprit"](world)
    removed = []
    if case == "dump-missing":
        for d in (outdir, jsondir):
            fn = os.path.join(d, f"rank_{culprit}")
            if os.path.exists(fn):
                os.remove(fn)
                removed.append(os.path.relpath(fn, HERE))
    seq = seq_of(*spec["at"]) if spec["at"] else None
    manifest = {
        "case": case,
        "world_size": world,
        "backend": "gloo",
        "pg_timeout_s": PG_TIMEOUT_S,
        "fr_buffer_size": int(FR_BUFFER_SIZE),
        "steps": STEPS,
        "step_ops": STEP_OPS,
        "culprit": culprit,
        "kind": spec["kind"],
        "diverges_at": {"seq": seq, "step": spec["at"][0], "op": spec["at"][1]} if spec["at"] else None,
        "expected": {"kind": spec["kind"], "seq": seq, "culprit": culprit},
        "removed_dump_files": removed,
        "note": NOTES.get(case),
        "ranks": {str(r): ranks[r] for r in ranks},
        "observed_last_completed_collective": {str(k): v for k, v in last_completed(outdir, world).items()},
        "wall_s": round(time.time() - t0, 1),
    }
    return name, outdir, jsondir, manifest


def main(argv):
    import torch
    cases = argv or list(CASES)
    for case in cases:
        for world in WORLDS:
            name, outdir, jsondir, manifest = make_case(case, world)
            manifest["torch_version"] = torch.__version__
            rc, out = run_fr_trace(outdir)
            manifest["fr_trace_exit_code"] = rc
            if case == "dump-missing":
                rc2, _ = run_fr_trace(outdir, ["--allow-incomplete-ranks"],
                                      "fr_trace_allow_incomplete.txt")
                manifest["fr_trace_allow_incomplete_exit_code"] = rc2
            manifest["fr_trace_pgfix_exit_codes"] = run_fr_trace_pgfix(outdir, world)
            run_fr_trace(jsondir)
            with open(os.path.join(outdir, "manifest.json"), "w") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"{name}: {manifest['wall_s']} s, fr_trace rc={rc}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        c, n, r, port, od, jd = sys.argv[2:8]
        worker(c, int(n), int(r), int(port), od, jd)
    else:
        main(sys.argv[1:])
