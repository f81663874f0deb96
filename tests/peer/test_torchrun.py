#!/usr/bin/env python3
"""stallbench under a real torchrun (PyPI torch): `torchrun --no-python stallbench devices` opens
the env:// process group beside torchrun's own agent store, three ranks agree on rank 0's 128-byte
id; a rank that never joins is named by rank and deadline; a rank whose WORLD_SIZE differs is exit 2.

usage: test_torchrun.py STALLBENCH
Exit 0 pass, 1 fail, 77 skip (no torch here nor in the Python $STALLBENCH_TORCH_PYTHON names).
"""
import json
import os
import shutil
import subprocess
import sys
import time

failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)
    return cond


def torch_python():
    """A Python whose torch imports (this one, or $STALLBENCH_TORCH_PYTHON's); None when none."""
    for py in (sys.executable, os.environ.get("STALLBENCH_TORCH_PYTHON")):
        if py and shutil.which(py) or (py and os.path.exists(py)):
            p = subprocess.run([py, "-c", "import torch.distributed.run, torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=300)
            if p.returncode == 0:
                return py, p.stdout.strip()
    return None, None


def torchrun(py, nproc, cmd, timeout=120):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
                        "PMI_SIZE", "PMIX_RANK", "STALLBENCH_RDZV_PORT")}
    env["STALLBENCH_RDZV_TIMEOUT"] = "5"
    t0 = time.monotonic()
    # --standalone: a rendezvous on a free port of this host, as a single-node job uses it
    p = subprocess.run([py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                        "--no-python"] + cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def main():
    sb = os.path.abspath(sys.argv[1])
    py, version = torch_python()
    if not py:
        print("SKIP: torch is not importable here nor in $STALLBENCH_TORCH_PYTHON (it brings torchrun)")
        return 77
    print(f"torch {version} from {py}")

    # 1. three ranks under torchrun: one group, one id
    p, s = torchrun(py, 3, [sb, "devices", "--json", "-"])
    check(p.returncode == 0, "torchrun --nproc-per-node 3 stallbench devices: exit 0 (%.1f s): %s" %
          (s, p.stderr[-600:]))
    doc = {}
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        check(False, "rank 0's JSON on stdout:\n" + p.stdout[:400])
    ranks = doc.get("ranks", {})
    check(ranks.get("size") == 3 and ranks.get("launcher") == "torchrun", "3 ranks via torchrun: %s" %
          {k: ranks.get(k) for k in ("size", "launcher", "rendezvous")})
    check("MASTER_PORT + 1: torchrun's agent store holds MASTER_PORT" in ranks.get("rendezvous", ""),
          "rank 0 listened beside torchrun's store: %s" % ranks.get("rendezvous"))
    per = ranks.get("per_rank", [])
    check(ranks.get("id_agreed") is True and [x.get("rank") for x in per] == [0, 1, 2]
          and [x.get("local_rank") for x in per] == [0, 1, 2] and len({x.get("pid") for x in per}) == 3,
          "each rank reported once, local ranks 0-2, rank 0's id intact on all: %s" %
          [(x.get("rank"), x.get("local_rank"), x.get("pid")) for x in per])

    # 2. rank 2 exits without joining: rank 0 and rank 1 name it within the deadline
    wrapper = ['sh', '-c', 'if [ "$RANK" = 2 ]; then exit 0; fi; exec "$0" devices', sb]
    p, s = torchrun(py, 3, wrapper)
    check(p.returncode != 0 and "rank 2 of 3 did not join within 5 s" in p.stderr and s < 60,
          "rank 2 never joins: named with the deadline, in %.1f s: rc %s %s" % (s, p.returncode, p.stderr[-800:]))
    check("exitcode  : 4" in p.stderr or "exit code 4" in p.stderr or "exitcode: 4" in p.stderr.replace("  ", " "),
          "torchrun reports the ranks' exit code 4 (a hang): %s" % p.stderr[-400:])

    # 3. one rank's WORLD_SIZE differs from the others': exit 2 (bad input), said on the ranks
    wrapper = ['sh', '-c', 'if [ "$RANK" = 1 ]; then WORLD_SIZE=4; export WORLD_SIZE; fi; exec "$0" devices', sb]
    p, s = torchrun(py, 2, wrapper)
    check(p.returncode != 0 and "WORLD_SIZE differs: rank 1 says 4, rank 0 says 2" in p.stderr,
          "a wrong WORLD_SIZE: named (%.1f s): %s" % (s, p.stderr[-800:]))
    check("exitcode  : 2" in p.stderr or "exitcode: 2" in p.stderr.replace("  ", " "),
          "torchrun reports exit code 2 (bad input): %s" % p.stderr[-300:])

    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
