#!/usr/bin/env python3
"""The env:// process group (kernels/tcp/env_group.cpp) without torch: processes started with the
variables torchrun gives its workers (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RUN_ID), as `stallbench devices` uses it:
the rendezvous and rank 0's 128-byte id reaching every rank, a rank that never joins named by
rank and deadline (exit 4, on every rank), ranks that disagree on WORLD_SIZE or claim one rank
(exit 2), half a launch (exit 2), and torchrun's agent store on MASTER_PORT (rank 0 listens on
MASTER_PORT + 1). tests/peer/test_torchrun.py runs the same under a real torchrun.

usage: test_env_launch.py STALLBENCH
"""
import json
import os
import socket
import subprocess
import sys
import time

failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)
    return cond


def free_port():
    """A port nobody listens on now, with its successor free too."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair")


def base_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "STALLBENCH_RDZV_PORT",
                        "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS")}
    env.update(extra or {})
    return env


def launch(sb, ranks, world, port, args, per_rank=None, common=None, timeout=60):
    """Starts one process per rank in `ranks` with torchrun's variables; returns [(rank, rc, out, err, s)]."""
    procs = []
    t0 = time.monotonic()
    for r in ranks:
        env = base_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "STALLBENCH_RDZV_TIMEOUT": "4"})
        env.update(common or {})
        env.update((per_rank or {}).get(r, {}))
        procs.append((r, subprocess.Popen([sb] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)))
    out = []
    for r, p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
            e += "\n[killed by the test: no answer in %d s]" % timeout
        out.append((r, p.returncode, o, e, time.monotonic() - t0))
    return out


def main():
    sb = sys.argv[1]

    # 1. three ranks: one rendezvous, one id, three pids; rank 0 alone prints
    port = free_port()
    res = launch(sb, [0, 1, 2], 3, port, ["devices", "--json", "-"])
    check(all(rc == 0 for _, rc, _, _, _ in res), "3 env:// ranks: devices exits 0 on each: %s" %
          [(r, rc, e[-300:]) for r, rc, _, e, _ in res if rc != 0])
    doc = json.loads(res[0][2]) if res[0][1] == 0 else {}
    ranks = doc.get("ranks", {})
    check(ranks.get("size") == 3 and ranks.get("launcher") == "env://", "rank 0's JSON: 3 ranks via env://: %s" %
          {k: ranks.get(k) for k in ("size", "launcher", "rendezvous")})
    check(ranks.get("id_agreed") is True and ranks.get("id_bytes") == 128, "rank 0's 128-byte id reached every rank")
    per = ranks.get("per_rank", [])
    check([x.get("rank") for x in per] == [0, 1, 2] and len({x.get("pid") for x in per}) == 3,
          "every rank reported, each its own process: %s" % [(x.get("rank"), x.get("pid")) for x in per])
    check([x.get("local_rank") for x in per] == [0, 1, 2] and all(x.get("local_size") == 3 for x in per),
          "LOCAL_RANK and LOCAL_WORLD_SIZE as the launcher gave them")
    check(f"127.0.0.1:{port}, port: MASTER_PORT" in ranks.get("rendezvous", ""), "rank 0 listened on MASTER_PORT: %s" %
          ranks.get("rendezvous"))
    check(res[1][2] == "" and res[2][2] == "", "ranks 1 and 2 print nothing")

    # the table, as a user reads it
    port = free_port()
    res = launch(sb, [0, 1], 2, port, ["devices"], per_rank={1: {"LOCAL_RANK": "1"}})
    text = res[0][2]
    check(res[0][1] == 0 and "ranks    2 via env://" in text and "128-byte id reached every rank" in text,
          "the table names the launch and the id check:\n" + text[:600])

    # 2. torchrun's agent store holds MASTER_PORT: rank 0 listens on MASTER_PORT + 1
    port = free_port()
    store = socket.socket()
    store.bind(("0.0.0.0", port))
    store.listen(8)
    try:
        res = launch(sb, [0, 1], 2, port, ["devices", "--json", "-"],
                     common={"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job-a"})
    finally:
        store.close()
    ok = res[0][1] == 0 and res[1][1] == 0
    doc = json.loads(res[0][2]) if ok else {}
    rdzv = doc.get("ranks", {}).get("rendezvous", "")
    check(ok and f":{port + 1}, port: MASTER_PORT + 1: torchrun's agent store holds MASTER_PORT" in rdzv
          and doc["ranks"]["launcher"] == "torchrun",
          "beside torchrun's store: MASTER_PORT + 1, launcher torchrun: %s %s" % (rdzv, [e[-200:] for _, _, _, e, _ in res]))

    # 3. a rank that never joins: named by rank and deadline, on rank 0 and on the rank that did join
    port = free_port()
    res = launch(sb, [0, 1], 3, port, ["devices"])
    (_, rc0, _, err0, s0), (_, rc1, _, err1, s1) = res
    check(rc0 == 4 and "rank 2 of 3 did not join within 4 s" in err0,
          "rank 0: exit 4 (hang), names rank 2 and the deadline: rc %s %s" % (rc0, err0.strip()[-300:]))
    check(rc1 == 4 and "rank 2 of 3 did not join" in err1 and "(said by rank 0)" in err1,
          "rank 1: exit 4, the same message from rank 0: rc %s %s" % (rc1, err1.strip()[-300:]))
    check(max(s0, s1) < 20, "both ended %.1f s after the start (deadline 4 s)" % max(s0, s1))

    # rank 0 never started: the joining rank gives up at its deadline
    port = free_port()
    res = launch(sb, [1], 2, port, ["devices"])
    _, rc, _, err, s = res[0]
    check(rc == 4 and "rank 1 could not reach rank 0 at 127.0.0.1:%d within" % port in err and s < 20,
          "no rank 0: exit 4 in %.1f s, names the address: %s" % (s, err.strip()[-300:]))

    # 4. ranks that disagree: WORLD_SIZE, two processes claiming one rank; half a launch
    port = free_port()
    res = launch(sb, [0, 1], 2, port, ["devices"], per_rank={1: {"WORLD_SIZE": "3"}})
    check(all(rc == 2 for _, rc, _, _, _ in res) and all("WORLD_SIZE differs: rank 1 says 3, rank 0 says 2" in e
                                                          for _, _, _, e, _ in res),
          "WORLD_SIZE differs: exit 2 on both ranks: %s" % [(rc, e.strip()[-200:]) for _, rc, _, e, _ in res])
    port = free_port()
    res = launch(sb, [0, 1, 1], 3, port, ["devices"])
    check(res[0][1] == 2 and "two processes claim rank 1" in res[0][3],
          "two processes claim rank 1: exit 2 on rank 0: %s" % res[0][3].strip()[-300:])
    for extra, want in (({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
                         "RANK=2 is not below WORLD_SIZE=2"),
                        ({"RANK": "0", "WORLD_SIZE": "2"}, "RANK is set but MASTER_ADDR is not"),
                        ({"RANK": "0", "WORLD_SIZE": "two", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
                         "WORLD_SIZE='two' is not an integer"),
                        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
                         "MASTER_PORT='70000' is not an integer in [1, 65535]")):
        p = subprocess.run([sb, "devices"], env=base_env(extra), capture_output=True, text=True, timeout=30)
        check(p.returncode == 2 and want in p.stderr, "%s: exit 2, '%s': rc %s %s" %
              (extra, want, p.returncode, p.stderr.strip()[-200:]))

    # 5. a stray program on the port does not stop the job: dropped, and the rendezvous goes on
    port = free_port()
    procs = []
    env0 = base_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                     "STALLBENCH_RDZV_TIMEOUT": "15"})
    p0 = subprocess.Popen([sb, "devices", "--json", "-"], env=env0, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    for _ in range(100):  # until rank 0 listens
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 64)
            break
        except OSError:
            time.sleep(0.1)
    env1 = dict(env0, RANK="1")
    p1 = subprocess.run([sb, "devices"], env=env1, capture_output=True, text=True, timeout=60)
    o0, e0 = p0.communicate(timeout=60)
    check(p0.returncode == 0 and p1.returncode == 0 and "dropped a connection" in e0,
          "a stray connection is dropped, the ranks still meet: rc %s %s, %s" % (p0.returncode, p1.returncode,
                                                                                 e0.strip()[-300:]))

    # 6. the collective scenario under an env:// launch: the group opens; backend=mpi says why it cannot run
    port = free_port()
    res = launch(sb, [0, 1], 2, port, ["run", "collective", "--quick", "-p", "backend=mpi", "--json", "-"],
                 timeout=120)
    doc = {}
    try:
        doc = json.loads(res[0][2])
    except ValueError:
        pass
    reasons = [p.get("reason", "") for p in doc.get("points", [])]
    check(doc.get("meta", {}).get("ranks", {}).get("launcher") == "env://" and doc["meta"]["ranks"]["size"] == 2,
          "collective under env://: the result records 2 ranks via env://: %s" % doc.get("meta", {}).get("ranks"))
    check(reasons and all("not by mpirun or srun with PMI" in r for r in reasons),
          "backend=mpi under env:// is skipped with the reason: %s %s" % (reasons[:1], res[0][3][-300:]))

    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
