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

Two more families: `p2p-*` (p2p entries added to real dumps, see P2P_CASES)
and `group-order-*` (collectives of several process groups issued in different
orders on different ranks; real runs, nothing added; see GROUP_CASES).
`make_dumps.py group-order` runs the whole group-order family; no argument runs
every family.
"""
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import threading
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
    # the others dump while they wait in seq 8 (as NCCL's dump on timeout or its debug pipe would),
    # and the culprit's dump is lost: analyze-hang names it the suspect (issue 56)
    "dump-missing-waiting": dict(kind="missing", culprit=lambda n: n - 1, at=(1, "all_reduce"),
                                 suspect=lambda n: {"ranks": [n - 1], "confidence": "high" if n >= 3 else "medium"}),
}
DUMP_LOST = ("dump-missing", "dump-missing-waiting")
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
    "dump-missing-waiting": "The `missing` run, but each other rank dumps (pickle and JSON) from a timer thread "
                            "1.5 s into its seq-8 all_reduce, while it waits (the group's time-out is 3 s); "
                            "the culprit's dump is then deleted.",
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
                    if bad and case in ("missing",) + DUMP_LOST:
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
                    elif case == "dump-missing-waiting" and step == spec["at"][0]:
                        def dump_while_waiting():
                            write_dumps(c10d, rank, outdir, jsondir)
                            log["dumped"] = "1.5 s into its seq-8 all_reduce, while it waited"
                        timer = threading.Timer(1.5, dump_while_waiting)
                        timer.start()
                        try:
                            dist.all_reduce(grad)
                            did(step, op, "all_reduce([8] float32)")
                        finally:
                            timer.join()
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
        finish_worker(c10d, rank, outdir, jsondir, log)


def finish_worker(c10d, rank, outdir, jsondir, log):
    """A rank's end, whatever happened: its dumps (unless already written), its log for the driver,
    then a second for the peers' own time-outs, and exit without destroy_process_group (it can block
    on a broken group)."""
    if not log["dumped"]:
        try:
            write_dumps(c10d, rank, outdir, jsondir)
            log["dumped"] = True
        except BaseException as e:  # noqa: BLE001
            log["dump_error"] = repr(e)[:400]
    with open(os.path.join(outdir, f".log_{rank}.json"), "w") as f:
        json.dump(log, f)
    sys.stdout.flush()
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


def fresh_dirs(name):
    """<name>/ and <name>-json/ under HERE, emptied: the pickle and JSON dumps of one case."""
    outdir, jsondir = os.path.join(HERE, name), os.path.join(HERE, name + "-json")
    for d in (outdir, jsondir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    return outdir, jsondir


def run_ranks(worker_args, world, outdir, jsondir, t0, what="calls"):
    """Runs one worker process per rank (this script with worker_args, then the rank, a free port and
    the two output directories), each killed past RANK_HARD_TIMEOUT_S from t0; returns each rank's
    log (the worker's .log_<rank>.json; one with an empty list `what` where it wrote none) with its exit
    code and the tail of its output."""
    port = free_port()
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=FR_BUFFER_SIZE, GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *worker_args, str(r), str(port), outdir,
                               jsondir],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
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
        log = {"rank": r, what: [], "error": None, "dumped": False}
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
    return ranks


def pickled_dumps(d, world):
    """(rank, dump) for each rank_<r> pickle present in d, in rank order."""
    for r in range(world):
        fn = os.path.join(d, f"rank_{r}")
        if os.path.exists(fn):
            with open(fn, "rb") as f:
                yield r, pickle.load(f)


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


def run_fr_trace_pgfix(d, world, group_ranks=None):
    """gloo in this PyTorch records pg_config as {'': {'name': '', 'desc': '', ...}}
    while entries say process_group ('0', 'default_pg'), and fr_trace fails with
    KeyError('0', 0).  For a reference of its matching logic, run it again on a
    temporary copy whose pg_config is rebuilt from the entries (nothing else
    changed).  The copy is not kept.  group_ranks: optional mapping group name
    (as the entries' process_group[0]) -> its global ranks; a group not in it
    (and every group when it is None) gets the whole world."""
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        tdir = os.path.join(td, os.path.basename(d))
        os.makedirs(tdir)
        for r, dump in pickled_dumps(d, world):
            cfg = {}
            for e in dump["entries"]:
                pgn, desc = e["process_group"]
                ranks = (group_ranks or {}).get(pgn, list(range(world)))
                cfg[pgn] = {"name": pgn, "desc": desc, "ranks": str(list(ranks))}
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
    return {r: {pg: st["last_completed_collective"] for pg, st in dump["pg_status"].items()}
            for r, dump in pickled_dumps(d, world)}


def make_case(case, world):
    spec = CASES[case]
    name = f"{case}-{world}r"
    outdir, jsondir = fresh_dirs(name)
    t0 = time.time()
    ranks = run_ranks(["--worker", case, str(world)], world, outdir, jsondir, t0, what="did")
    culprit = spec["culprit"](world)
    removed = []
    if case in DUMP_LOST:
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
        "expected": dict({"kind": spec["kind"], "seq": seq, "culprit": culprit},
                         **({"suspect": spec["suspect"](world)} if "suspect" in spec else {})),
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
            if case in DUMP_LOST:
                rc2, _ = run_fr_trace(outdir, ["--allow-incomplete-ranks"],
                                      "fr_trace_allow_incomplete.txt")
                manifest["fr_trace_allow_incomplete_exit_code"] = rc2
            manifest["fr_trace_pgfix_exit_codes"] = run_fr_trace_pgfix(outdir, world)
            run_fr_trace(jsondir)
            with open(os.path.join(outdir, "manifest.json"), "w") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"{name}: {manifest['wall_s']} s, fr_trace rc={rc}", flush=True)


# --------------------------------------------------------------------------
# point-to-point cases (p2p-*): real runs, p2p entries added afterwards
# --------------------------------------------------------------------------
# gloo in this PyTorch records no send/recv in FR (checked with 2.15.0: a
# send/recv between two all_reduces leaves no entry, only a gap in op_id; a
# FlightRecorderHook attached to the gloo group records nothing either).  So
# each p2p case is a real gloo job (real send/recv, real hang and time-out),
# every rank logs each p2p call it made, and after the run the driver adds
# one entry per p2p call to the rank's real dump, in the form ProcessGroupNCCL
# records them (profiling_name "<lib>:send SRC->DST" / "<lib>:recv DST<-SRC",
# group ranks; is_p2p True; p2p_seq_id the group's p2p counter on that rank;
# collective_seq_id the group's last collective; input and output sizes the
# tensor's), at the op_id slot gloo left for it.  See README.md.
P2P_WORLDS = [2, 3]
P2P_STEPS = 2
# case -> what stallbench must report.  culprit(n) -> rank or list; the seq is
# the p2p_seq_id of the call named in `seq_of` (taken from the run's logs).
P2P_CASES = {
    "p2p-healthy":  dict(kind=None),
    # the last stage never sends step 1's gradient back; it goes on to the all_reduce
    "p2p-missing":  dict(kind="missing", pattern="p2p", culprit=lambda n: n - 1,
                         seq_of=lambda n: (n - 2, "recv", n - 1),
                         # rank n-2 waits in recv from n-1, which waits in the all_reduce n-2 never reached
                         wait_cycle=lambda n: [n - 2, n - 1]),
    # rank 0 receives before it sends in step 1's forward: 0 and 1 each wait in recv from the other
    "p2p-deadlock": dict(kind="missing", pattern="p2p cycle", culprit=lambda n: [0, 1],
                         seq_of=lambda n: (0, "recv", 1)),
    # the last stage sends a [3] gradient where the stage before receives [4] (step 1)
    "p2p-size":     dict(kind="size", pattern="p2p", culprit=lambda n: n - 1,
                         seq_of=lambda n: (n - 1, "send", n - 2)),
    # rank 0 receives step 1's gradient into float64 [4]; rank 1 sends float32 [4]
    "p2p-dtype":    dict(kind="dtype", pattern="p2p", culprit=lambda n: 0,
                         seq_of=lambda n: (0, "recv", 1)),
}
P2P_NOTES = {
    "p2p-healthy": "pipeline of n stages, 2 steps: forward recv from r-1 / send to r+1 ([4] float32), "
                   "backward recv from r+1 / send to r-1 ([4] float32), then all_reduce([8]).",
    "p2p-missing": "step 1: the last rank skips its backward send to rank n-2 and goes on to the all_reduce; "
                   "rank n-2 times out in recv (and in 3 ranks rank 0 then times out in recv from rank 1).",
    "p2p-deadlock": "step 1: rank 0 calls recv from rank 1 before its forward send; rank 1 waits in recv "
                    "from rank 0: both time out.",
    "p2p-size": "step 1: the last rank sends [3] float32 where rank n-2 receives into [4].",
    "p2p-dtype": "step 1: rank 0 receives rank 1's gradient into float64 [4]; rank 1 sends float32 [4].",
}


def p2p_worker(case, world, rank, port, outdir, jsondir):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    import torch._C._distributed_c10d as c10d

    log = {"rank": rank, "calls": [], "error": None, "dumped": False}
    state = {"op_id": 0, "cseq": 0, "p2p": 0}

    def frames():
        # the program's own frames at the call, innermost first (as FR writes them)
        st = traceback.extract_stack()[:-2]
        return [{"name": f.name, "filename": f.filename, "line": f.lineno} for f in reversed(st)]

    def p2p(op, peer, t, step, what):
        state["op_id"] += 1
        state["p2p"] += 1
        call = {"op": op, "peer": peer, "sizes": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                "p2p_seq_id": state["p2p"], "collective_seq_id": state["cseq"], "op_id": state["op_id"],
                "time_created_ns": time.time_ns(), "frames": frames(), "step": step, "what": what,
                "returned": False}
        log["calls"].append(call)
        (dist.send if op == "send" else dist.recv)(t, peer)
        call["returned"] = True

    def coll(name, fn, step):
        state["op_id"] += 1
        state["cseq"] += 1
        call = {"op": name, "collective_seq_id": state["cseq"], "op_id": state["op_id"], "step": step,
                "returned": False}
        log["calls"].append(call)
        fn()
        call["returned"] = True

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                                timeout=timedelta(seconds=PG_TIMEOUT_S))
        last = world - 1
        grad = torch.ones(8)
        for step in range(P2P_STEPS):
            bad = step == P2P_STEPS - 1
            act = torch.arange(4, dtype=torch.float32) + rank
            if case == "p2p-deadlock" and bad and rank == 0:
                # receives the gradient before sending the activation it depends on
                p2p("recv", 1, torch.zeros(4), step, "recv grad from 1 BEFORE sending the activation  <-- deadlock")
            if rank > 0:
                p2p("recv", rank - 1, act, step, "recv activation")
            if rank < last:
                p2p("send", rank + 1, act, step, "send activation")
            if rank < last:
                if case == "p2p-dtype" and bad and rank == 0:
                    p2p("recv", rank + 1, torch.zeros(4, dtype=torch.float64), step,
                        "recv grad into float64 [4]  <-- WRONG dtype (sender float32)")
                else:
                    p2p("recv", rank + 1, torch.zeros(4), step, "recv grad")
            if rank > 0:
                if case == "p2p-missing" and bad and rank == last:
                    log["calls"].append({"op": "send", "peer": rank - 1, "step": step, "skipped": True,
                                         "what": "SKIPPED send grad  <-- culprit"})
                elif case == "p2p-size" and bad and rank == last:
                    p2p("send", rank - 1, torch.ones(3), step, "send grad [3]  <-- WRONG size (receiver [4])")
                else:
                    p2p("send", rank - 1, torch.ones(4), step, "send grad")
            coll("all_reduce", lambda: dist.all_reduce(grad), step)
        return log
    except BaseException as e:  # noqa: BLE001
        log["error"] = f"{type(e).__name__}: {e}"[:600]
        return log
    finally:
        finish_worker(c10d, rank, outdir, jsondir, log)


TORCH_DTYPE = {"float32": "Float", "float64": "Double"}


def p2p_entry(call, rank, lib="gloo"):
    """A p2p call as a FR entry (pickle form), fields in FR's order."""
    me, peer = rank, call["peer"]  # the default group: group rank == global rank
    name = f"{lib}:send {me}->{peer}" if call["op"] == "send" else f"{lib}:recv {me}<-{peer}"
    dt = TORCH_DTYPE[call["dtype"]]
    return {
        "frames": call["frames"], "record_id": None, "pg_id": 0, "process_group": ("0", "default_pg"),
        "collective_seq_id": call["collective_seq_id"], "p2p_seq_id": call["p2p_seq_id"], "op_id": call["op_id"],
        "profiling_name": name, "time_created_ns": call["time_created_ns"],
        "input_sizes": [call["sizes"]], "input_dtypes": [dt], "output_sizes": [call["sizes"]], "output_dtypes": [dt],
        "state": "scheduled", "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        # gloo retires a call that returned or failed alike (as its collectives)
        "retired": True, "timeout_ms": PG_TIMEOUT_S * 1000, "is_p2p": True,
    }


def add_p2p_entries(path, calls, rank, form):
    """Adds the rank's p2p calls to its real dump at `path` (pickle or JSON), each
    before the first entry with a larger op_id; record_id renumbered in order."""
    p2p = [c for c in calls if c["op"] in ("send", "recv") and not c.get("skipped")]
    if form == "pickle":
        with open(path, "rb") as f:
            dump = pickle.load(f)
    else:
        with open(path) as f:
            dump = json.load(f)
    entries = dump.get("entries", [])
    # gloo's collectives must sit at the op_id the log gave them: else the slots are wrong
    logged = {c["collective_seq_id"]: c["op_id"] for c in calls if c["op"] == "all_reduce"}
    for e in entries:
        want = logged.get(e["collective_seq_id"])
        if want is not None and want != e["op_id"]:
            raise SystemExit(f"{path}: collective seq {e['collective_seq_id']} has op_id {e['op_id']}, "
                             f"the log says {want}")
    out = []
    new = []
    for c in p2p:
        e = p2p_entry(c, rank)
        if form == "json":
            e.pop("frames")
            e["process_group"] = list(e["process_group"])
            e["time_discovered_started_ns"] = 0
            e["time_discovered_completed_ns"] = 0
        new.append(e)
    merged = sorted(entries + new, key=lambda e: e["op_id"])
    for i, e in enumerate(merged):
        e["record_id"] = i
        out.append(e)
    dump["entries"] = out
    if form == "pickle":
        with open(path, "wb") as f:
            pickle.dump(dump, f, protocol=2)
    else:
        with open(path, "w") as f:
            json.dump(dump, f)
    return len(new)


def make_p2p_case(case, world):
    import torch
    spec = P2P_CASES[case]
    name = f"{case}-{world}r"
    outdir, jsondir = fresh_dirs(name)
    t0 = time.time()
    ranks = run_ranks(["--p2p-worker", case, str(world)], world, outdir, jsondir, t0)
    added = {}
    for r, log in ranks.items():
        for d, form in ((outdir, "pickle"), (jsondir, "json")):
            fn = os.path.join(d, f"rank_{r}")
            if os.path.exists(fn):
                added[f"{form} rank_{r}"] = add_p2p_entries(fn, log["calls"], r, form)
    expected = {"kind": spec["kind"], "seq": None, "culprit": None}
    if spec["kind"]:
        who, op, peer = spec["seq_of"](world)
        calls = [c for c in ranks[who]["calls"] if c["op"] == op and c.get("peer") == peer and not c.get("skipped")]
        expected = {"kind": spec["kind"], "seq": calls[-1]["p2p_seq_id"], "culprit": spec["culprit"](world),
                    "pattern": spec["pattern"]}
        if "wait_cycle" in spec:
            expected["wait_cycle"] = spec["wait_cycle"](world)
    for log in ranks.values():
        for c in log["calls"]:
            c.pop("frames", None)  # (they are in the dumps)
    manifest = {
        "case": case, "world_size": world, "backend": "gloo", "pg_timeout_s": PG_TIMEOUT_S,
        "fr_buffer_size": int(FR_BUFFER_SIZE), "steps": P2P_STEPS, "kind": spec["kind"],
        "expected": expected, "note": P2P_NOTES.get(case),
        "p2p_entries": "added after the run from each rank's log of its p2p calls (gloo records none): "
                       "see README.md; the collectives' entries, pg_status and pg_config are gloo's own",
        "p2p_entries_added": added, "ranks": {str(r): ranks[r] for r in ranks},
        "observed_last_completed_collective": {str(k): v for k, v in last_completed(outdir, world).items()},
        "wall_s": round(time.time() - t0, 1), "torch_version": torch.__version__,
    }
    return name, outdir, jsondir, manifest


def main_p2p(cases):
    for case in cases:
        for world in P2P_WORLDS:
            name, outdir, jsondir, manifest = make_p2p_case(case, world)
            rc, _ = run_fr_trace(outdir)
            manifest["fr_trace_exit_code"] = rc
            manifest["fr_trace_pgfix_exit_codes"] = run_fr_trace_pgfix(outdir, world)
            run_fr_trace(jsondir)
            with open(os.path.join(outdir, "manifest.json"), "w") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"{name}: {manifest['wall_s']} s, fr_trace rc={rc}", flush=True)


# --------------------------------------------------------------------------
# group-order cases (group-order-*): collectives of several process groups
# issued in different orders on different ranks.  Real gloo runs; nothing is
# added to the dumps (gloo records collectives of every group in FR).
# --------------------------------------------------------------------------
# NCCL documents that operations on several communicators must be issued in
# the same order on all ranks; here one rank swaps two groups' all_reduces in
# one step, so each rank of a cycle waits in one group for a rank that waits
# in another: every rank of the cycle times out (PG_TIMEOUT_S).
GROUP_STEPS = 2
# case -> world size, groups (desc, global ranks), each rank's healthy order of
# groups per step (one all_reduce([8] float32) per group), swap {rank: step}
# (that rank issues its order reversed in that step), expected answer.
_GROUPS_3R = [("A", [0, 1]), ("B", [1, 2]), ("C", [0, 2])]
_ORDER_3R = {0: ["A", "C"], 1: ["A", "B"], 2: ["B", "C"]}
GROUP_CASES = {
    "group-order-2r": dict(world=2, groups=[("A", [0, 1]), ("B", [0, 1])],
                           order={0: ["A", "B"], 1: ["A", "B"]}, swap={1: 1},
                           kind="missing", wait_cycle=[0, 1]),
    "group-order-3r": dict(world=3, groups=_GROUPS_3R, order=_ORDER_3R, swap={0: 1},
                           kind="missing", wait_cycle=[0, 1, 2]),
    "group-order-healthy-3r": dict(world=3, groups=_GROUPS_3R, order=_ORDER_3R, swap={},
                                   kind=None, wait_cycle=None),
}
GROUP_NOTES = {
    "group-order-2r": "groups A = B = [0, 1]; 2 steps of all_reduce([8]) on A then on B. In step 1 "
                      "rank 1 calls B before A: rank 0 waits in A's step-1 all_reduce, rank 1 in B's; "
                      "both time out. Which rank is 'the one that swapped' is not in the dumps (a race): "
                      "any rank of the cycle may be named.",
    "group-order-3r": "groups A = [0, 1], B = [1, 2], C = [0, 2]; per step rank 0: A, C; rank 1: A, B; "
                      "rank 2: B, C (all_reduce([8]) each). In step 1 rank 0 calls C before A: rank 0 "
                      "waits in C for rank 2, rank 2 in B for rank 1, rank 1 in A for rank 0; all time out.",
    "group-order-healthy-3r": "the group-order-3r layout without the swap: every call completes "
                              "(negative control).",
}


def group_worker(case, rank, port, outdir, jsondir):
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    import torch._C._distributed_c10d as c10d

    spec = GROUP_CASES[case]
    world = spec["world"]
    log = {"rank": rank, "calls": [], "error": None, "failed_in": None, "dumped": False, "groups": {}}
    try:
        timeout = timedelta(seconds=PG_TIMEOUT_S)
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                                timeout=timeout)
        groups = {}
        for desc, ranks in spec["groups"]:  # every rank creates every group, in the same order
            g = dist.new_group(ranks, timeout=timeout, group_desc=desc)
            if rank in ranks:
                groups[desc] = g
                log["groups"][desc] = {"group_name": g.group_name, "group_desc": g.group_desc,
                                       "ranks": ranks}
        count = {d: 0 for d in groups}
        for step in range(GROUP_STEPS):
            order = list(spec["order"][rank])
            swapped = spec["swap"].get(rank) == step
            if swapped:
                order.reverse()
            for desc in order:
                count[desc] += 1
                t = torch.ones(8) * (rank + 1)
                call = {"step": step, "group": desc, "op": "all_reduce", "group_call": count[desc],
                        "what": f"all_reduce([8] float32) on {desc}"
                                + ("  <-- order swapped" if swapped else ""),
                        "returned": False}
                log["calls"].append(call)
                dist.all_reduce(t, group=groups[desc])
                call["returned"] = True
                call["result0"] = t[0].item()
        return log
    except BaseException as e:  # noqa: BLE001
        log["error"] = f"{type(e).__name__}: {e}"[:600]
        if log["calls"] and not log["calls"][-1]["returned"]:
            log["failed_in"] = {k: log["calls"][-1][k] for k in ("step", "group", "op", "group_call")}
        return log
    finally:
        finish_worker(c10d, rank, outdir, jsondir, log)


def make_group_case(case):
    import torch
    spec = GROUP_CASES[case]
    world = spec["world"]
    name = case
    outdir, jsondir = fresh_dirs(name)
    t0 = time.time()
    ranks = run_ranks(["--group-worker", case], world, outdir, jsondir, t0)
    wall_s = round(time.time() - t0, 1)
    # the groups as FR records them: entries' process_group (name, desc) and pg_config, per rank
    in_entries = {}
    pg_config = {}
    pg_status = {}
    pg_ids = {}  # entries' pg_id (a per-process counter, the key of pg_status) -> group
    for r, dump in pickled_dumps(outdir, world):
        for e in dump["entries"]:
            pgn, desc = e["process_group"]
            in_entries.setdefault(desc, set()).add(pgn)
            pg_ids.setdefault(str(r), {})[str(e["pg_id"])] = [pgn, desc]
        pg_config[str(r)] = dump["pg_config"]
        pg_status[str(r)] = dump["pg_status"]
    groups = []
    for desc, granks in spec["groups"]:
        names = sorted(in_entries.get(desc, ()))
        told = sorted({log["groups"][desc]["group_name"] for log in ranks.values()
                       if desc in log.get("groups", {})})
        if len(names) != 1 or names != told:
            raise SystemExit(f"{name}: group {desc}: entries name it {names}, new_group said {told}")
        groups.append({"name": names[0], "desc": desc, "ranks": granks})
    expected = {"kind": spec["kind"], "wait_cycle": spec["wait_cycle"], "culprit_in": spec["wait_cycle"]}
    manifest = {
        "case": case, "world_size": world, "backend": "gloo", "pg_timeout_s": PG_TIMEOUT_S,
        "fr_buffer_size": int(FR_BUFFER_SIZE), "steps": GROUP_STEPS, "groups": groups,
        "healthy_order": {str(r): o for r, o in spec["order"].items()},
        "swap": {str(r): {"step": s, "order": list(reversed(spec["order"][r]))} for r, s in spec["swap"].items()},
        "kind": spec["kind"], "expected": expected, "note": GROUP_NOTES.get(case),
        "ranks": {str(r): ranks[r] for r in ranks},
        "observed_pg_status": pg_status, "observed_pg_config": pg_config, "observed_pg_ids": pg_ids,
        "wall_s": wall_s, "torch_version": torch.__version__,
    }
    return name, outdir, jsondir, manifest


def main_group(cases):
    for case in cases:
        name, outdir, jsondir, manifest = make_group_case(case)
        rc, _ = run_fr_trace(outdir)
        manifest["fr_trace_exit_code"] = rc
        manifest["fr_trace_pgfix_exit_codes"] = run_fr_trace_pgfix(
            outdir, manifest["world_size"], {g["name"]: g["ranks"] for g in manifest["groups"]})
        run_fr_trace(jsondir)
        with open(os.path.join(outdir, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"{name}: {manifest['wall_s']} s, fr_trace rc={rc}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        c, n, r, port, od, jd = sys.argv[2:8]
        worker(c, int(n), int(r), int(port), od, jd)
    elif len(sys.argv) > 1 and sys.argv[1] == "--p2p-worker":
        c, n, r, port, od, jd = sys.argv[2:8]
        p2p_worker(c, int(n), int(r), int(port), od, jd)
    elif len(sys.argv) > 1 and sys.argv[1] == "--group-worker":
        c, r, port, od, jd = sys.argv[2:7]
        group_worker(c, int(r), int(port), od, jd)
    else:
        # "group-order" names the whole group-order family
        wanted = [g for c in sys.argv[1:] for g in (list(GROUP_CASES) if c == "group-order" else [c])]
        known = list(CASES) + list(P2P_CASES) + list(GROUP_CASES)
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise SystemExit(f"unknown cases {unknown}: {known + ['group-order']}")
        collective = [c for c in wanted if c in CASES] if wanted else list(CASES)
        if collective:
            main(collective)
        main_p2p([c for c in wanted if c in P2P_CASES] if wanted else list(P2P_CASES))
        main_group([c for c in wanted if c in GROUP_CASES] if wanted else list(GROUP_CASES))
