#!/usr/bin/env python3
"""The collective scenario under a real Slurm: a one-node cluster (Debian's slurmctld, slurmd and
munge, a generated slurm.conf for this host and its cores, private ports and socket) started and
stopped here, every step with a deadline, cleaned up on failure. Then:

  1. srun -n 3 --mpi=pmix: a healthy sweep (PMIx: Debian's Open MPI 4.1 is built with PMIx, not
     with Slurm's PMI-2, which it refuses at MPI_Init);
  2. the same with a deliberate mismatch (rank 1 skips the all-reduce of step 3): caught, dumped,
     and explained by analyze-hang as under mpirun;
  3. srun --mpi=none with MASTER_ADDR/MASTER_PORT: the env:// rendezvous (no MPI in the ranks);
  4. docs/slurm/collective.sbatch in its CPU form, through sbatch --wait.

usage: test_slurm.py STALLBENCH
Exit 0 pass, 1 fail, 77 skip (Slurm or munge not installed, or not root: slurmd runs as root).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
failures = []


def check(cond, msg, detail=""):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)
        if detail:
            print("     " + detail.replace("\n", "\n     "), flush=True)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def wait_for(what, pred, deadline_s):
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if pred():
            return True
        time.sleep(0.3)
    return False


class Cluster:
    """A one-node Slurm in tmp: munged, slurmctld and slurmd in the foreground, as children."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.conf = os.path.join(tmp, "slurm.conf")
        self.munge_dir = os.path.join(tmp, "munge")
        self.sock = os.path.join(self.munge_dir, "munge.sock")
        self.host = socket.gethostname().split(".")[0]

    def env(self, extra=None):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_")) and
               k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        env["SLURM_CONF"] = self.conf
        env.update(extra or {})
        return env

    def start(self):
        os.makedirs(self.munge_dir, mode=0o700)
        key = os.path.join(self.tmp, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o600)
        subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={self.sock}",
                        f"--pid-file={self.munge_dir}/munged.pid", f"--log-file={self.munge_dir}/munged.log",
                        f"--seed-file={self.munge_dir}/seed"], check=True, timeout=30)
        if not wait_for("munge", lambda: os.path.exists(self.sock), 10):
            raise RuntimeError("munged did not open its socket in 10 s")
        for d in ("state", "spool"):
            os.makedirs(os.path.join(self.tmp, d))
        cpus = os.cpu_count() or 1
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=stallbench
SlurmctldHost={self.host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.sock}
StateSaveLocation={self.tmp}/state
SlurmdSpoolDir={self.tmp}/spool
SlurmctldPidFile={self.tmp}/slurmctld.pid
SlurmdPidFile={self.tmp}/slurmd.pid
SlurmctldLogFile={self.tmp}/slurmctld.log
SlurmdLogFile={self.tmp}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={self.host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
""")
        for daemon in ("slurmctld", "slurmd"):
            log = open(os.path.join(self.tmp, daemon + ".out"), "w")
            self.procs.append(subprocess.Popen([daemon, "-D", "-f", self.conf], stdout=log, stderr=subprocess.STDOUT,
                                               env=self.env(), start_new_session=True))

        def idle():
            p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env(), timeout=10)
            return p.returncode == 0 and p.stdout.strip() == "idle"
        if not wait_for("idle", idle, 45):
            raise RuntimeError("the node did not come up idle in 45 s:\n" + self.logs())

    def logs(self):
        out = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            p = os.path.join(self.tmp, name)
            if os.path.exists(p):
                out.append(f"--- {name}\n" + open(p, errors="replace").read()[-1500:])
        return "\n".join(out)

    def stop(self):
        try:
            subprocess.run(["scancel", "--full", "--partition", "debug"], env=self.env(), timeout=10,
                           capture_output=True)
        except (OSError, subprocess.SubprocessError):
            pass
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        pid_file = os.path.join(self.munge_dir, "munged.pid")
        if os.path.exists(pid_file):
            try:
                os.kill(int(open(pid_file).read().strip()), signal.SIGTERM)
            except (OSError, ValueError):
                pass


def run(cluster, cmd, timeout=180, extra=None, cwd=None):
    t0 = time.monotonic()
    p = subprocess.run(["timeout", "-k", "5", str(timeout)] + cmd, capture_output=True, text=True,
                       env=cluster.env(extra), cwd=cwd)
    return p, time.monotonic() - t0


def main():
    sb = os.path.abspath(sys.argv[1])
    missing = [t for t in ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "munged") if not shutil.which(t)]
    if missing:
        print(f"SKIP: {', '.join(missing)} not found (apt install slurmd slurmctld slurm-client munge; "
              "scripts/test installs them as root)")
        return 77
    if os.geteuid() != 0:
        print("SKIP: the one-node Slurm runs slurmd as root; run this test as root")
        return 77
    tmp = tempfile.mkdtemp(prefix="sb-slurm-")
    cluster = Cluster(tmp)
    try:
        try:
            cluster.start()
        except (RuntimeError, subprocess.SubprocessError, OSError) as e:
            check(False, f"a one-node Slurm starts: {e}", cluster.logs())
            return 1
        print(f"slurm up on {cluster.host} ({tmp})")
        srun = ["srun", "--overcommit", "-n", "3", "--mpi=pmix", "--kill-on-bad-exit=1"]

        # 1. a healthy sweep under srun with PMIx
        out = os.path.join(tmp, "healthy.json")
        p, s = run(cluster, srun + [sb, "run", "collective", "--quick", "--device", "cpu", "-p", "backend=mpi",
                                    "-p", f"dump_dir={tmp}/healthy-dumps", "--json", out])
        doc = json.load(open(out)) if os.path.exists(out) else {}
        ranks = doc.get("meta", {}).get("ranks", {})
        statuses = {pt.get("status") for pt in doc.get("points", [])}
        check(p.returncode == 0 and ranks.get("launcher") == "srun" and ranks.get("size") == 3 and statuses == {"ok"},
              f"srun -n 3 --mpi=pmix: healthy sweep, 3 ranks via srun, every point ok ({s:.1f} s)",
              f"rc {p.returncode}; ranks {ranks}; statuses {statuses}\n{p.stderr[-1200:]}")

        # 2. rank 1 skips the all-reduce of step 3: caught, dumped, explained
        dumps = os.path.join(tmp, "hang-dumps")
        p, s = run(cluster, srun + [sb, "run", "collective", "--quick", "--device", "cpu", "-p", "backend=mpi",
                                    "-p", "mismatch=skip@3:1", "-p", "timeout_s=3", "-p", f"dump_dir={dumps}",
                                    "--json", os.path.join(tmp, "hang.json")])
        check(p.returncode != 0 and "exit code 4" in p.stderr and s < 90,
              f"the mismatch under srun is caught: task 0 exits 4, the step ends ({s:.1f} s)",
              f"rc {p.returncode}\n{p.stderr[-1200:]}")
        a = subprocess.run([sb, "analyze-hang", dumps, "--json"], capture_output=True, text=True, timeout=60)
        rep = json.loads(a.stdout) if a.returncode == 0 else {}
        check(rep.get("kind") == "missing" and rep.get("pattern") == "skip" and rep.get("culprits") == [1]
              and rep.get("step") == 3 and rep.get("ranks_found") == [0, 1, 2],
              "analyze-hang on the dumps srun's ranks wrote: rank 1 skipped at step 3 (as under mpirun)",
              f"rc {a.returncode}: {a.stderr[-300:]} {json.dumps({k: rep.get(k) for k in ('kind', 'pattern', 'culprits', 'step', 'seq', 'ranks_found')})}")

        # 3. srun without PMI: the env:// rendezvous from SLURM_PROCID/SLURM_NTASKS and MASTER_ADDR/PORT
        port = free_port()
        p, s = run(cluster, ["srun", "--overcommit", "-n", "3", "--mpi=none", sb, "devices", "--json", "-"],
                   extra={"MASTER_ADDR": cluster.host, "MASTER_PORT": str(port), "STALLBENCH_RDZV_TIMEOUT": "30"})
        try:
            dev = json.loads(p.stdout)
        except ValueError:
            dev = {}
        r = dev.get("ranks", {})
        check(p.returncode == 0 and r.get("launcher") == "srun (env://)" and r.get("size") == 3
              and r.get("id_agreed") is True and [x.get("local_rank") for x in r.get("per_rank", [])] == [0, 1, 2],
              f"srun --mpi=none with MASTER_ADDR/PORT: 3 ranks meet over env://, local ranks from SLURM_LOCALID ({s:.1f} s)",
              f"rc {p.returncode}: {r}\n{p.stderr[-800:]}")

        # 4. the sbatch template, in its CPU form (no GPU request, no 8 tasks a node: 3 tasks on this node's
        #    cores, overcommitted; backend=mpi), as its comment says
        with open(os.path.join(ROOT, "docs", "slurm", "collective.sbatch")) as f:
            script = "".join(ln for ln in f if "--gpus-per-task" not in ln and "--ntasks-per-node" not in ln)
        job_dir = os.path.join(tmp, "sbatch")
        os.makedirs(job_dir)
        path = os.path.join(job_dir, "collective-cpu.sbatch")
        with open(path, "w") as f:
            f.write(script)
        p, s = run(cluster, ["sbatch", "--wait", "--parsable", "--nodes=1", "--ntasks=3", "--overcommit",
                             f"--chdir={job_dir}", "--export=ALL", path], timeout=240,
                   extra={"STALLBENCH_BACKEND": "mpi", "STALLBENCH": sb, "STALLBENCH_QUICK": "1",
                          "NCCL_SOCKET_IFNAME": "lo"})
        job = p.stdout.strip().split(";")[0]
        result = os.path.join(job_dir, f"stallbench-collective-{job}.json")
        log = os.path.join(job_dir, f"stallbench-collective-{job}.out")
        text = open(log, errors="replace").read() if os.path.exists(log) else ""
        doc = json.load(open(result)) if os.path.exists(result) else {}
        check(p.returncode == 0 and doc.get("meta", {}).get("ranks", {}).get("size") == 3
              and "NCCL_SOCKET_IFNAME=lo" in text,
              f"docs/slurm/collective.sbatch (CPU form) through sbatch --wait: job {job}, 3 ranks, NCCL's "
              f"variables shown ({s:.1f} s)",
              f"rc {p.returncode} {p.stderr[-400:]}\n{text[-1200:]}")
    finally:
        cluster.stop()
        if not failures:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(cluster.logs())
            print(f"(left {tmp} for a look)")
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
