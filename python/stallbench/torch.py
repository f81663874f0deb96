"""stallbench around PyTorch: a profiler that diagnoses its own trace, and Flight Recorder setup.

    import stallbench.torch as sbt
    with sbt.profile(steps=5) as p:
        for batch in loader:
            train_step(batch)
            p.step()
    p.result  # diagnose --trace's result JSON

This module is named `torch` inside the `stallbench` package; it imports the real torch lazily,
by absolute name (importlib), so `import stallbench` never imports torch.
"""
from __future__ import annotations

import atexit
import importlib
import os
import socket
import sys
import warnings
from types import ModuleType
from typing import Any, Iterable

from . import _cli, diagnose_trace, summarize
from ._cli import PathLike, StallbenchError

__all__ = ["Profile", "profile", "flight_recorder", "FR_ENV"]

TRACE_SUFFIX = ".pt.trace.json.gz"


def _torch() -> ModuleType:
    """The real torch (absolute import, never this module)."""
    return importlib.import_module("torch")


def _rank() -> int | None:
    """This process's rank if torch.distributed is already initialized, else None (imports nothing)."""
    if "torch" not in sys.modules:
        return None
    try:
        dist = importlib.import_module("torch.distributed")
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # noqa: BLE001 - a best-effort probe
        pass
    return None


def _traces_in(directory: str) -> set[str]:
    try:
        return {os.path.join(directory, f) for f in os.listdir(directory) if f.endswith(TRACE_SUFFIX)}
    except OSError:
        return set()


class Profile:
    """torch.profiler.profile with schedule(wait, warmup, active=steps) and a gzip
    tensorboard_trace_handler(out_dir); on exit, `stallbench diagnose --trace` on the trace.

    Call step() once per training iteration, as with torch's profiler. After the block:
    trace_path (the *.pt.trace.json.gz written), result (the diagnose dict, or None), error."""

    def __init__(self, steps: int = 5, warmup: int = 1, wait: int = 1,
                 out_dir: PathLike = "./stallbench-profile", diagnose: bool = True, *,
                 activities: Iterable[Any] | None = None, record_shapes: bool = True,
                 with_stack: bool = False, profile_memory: bool = False, worker_name: str | None = None,
                 baseline: PathLike | None = None, timeout: float = 600.0,
                 binary: PathLike | None = None, verbose: bool = True, summary_limit: int = 5) -> None:
        if steps < 1 or warmup < 0 or wait < 0:
            raise ValueError("steps must be >= 1, warmup and wait >= 0")
        self.steps, self.warmup, self.wait = steps, warmup, wait
        self.out_dir = os.path.abspath(os.fspath(out_dir))
        self.diagnose = diagnose
        self.activities = activities
        self.record_shapes, self.with_stack, self.profile_memory = record_shapes, with_stack, profile_memory
        self.worker_name = worker_name
        self.baseline, self.timeout, self.binary = baseline, timeout, binary
        self.verbose, self.summary_limit = verbose, summary_limit
        self.profiler: Any = None  # the torch.profiler.profile
        self.traces: list[str] = []
        self.trace_path: str | None = None
        self.result: dict | None = None
        self.error: StallbenchError | None = None
        self.steps_called = 0
        self._handler: Any = None

    # -- torch profiler ----------------------------------------------------------------------
    def _make_profiler(self) -> Any:
        tp = importlib.import_module("torch.profiler")
        torch = _torch()
        acts = list(self.activities) if self.activities is not None else None
        if acts is None:
            acts = [tp.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(tp.ProfilerActivity.CUDA)
        name = self.worker_name
        if not name:
            rank = _rank()
            name = f"{socket.gethostname()}_{os.getpid()}" + (f"_rank{rank}" if rank is not None else "")
        os.makedirs(self.out_dir, exist_ok=True)
        self._handler = tp.tensorboard_trace_handler(self.out_dir, worker_name=name, use_gzip=True)
        return tp.profile(
            activities=acts,
            schedule=tp.schedule(wait=self.wait, warmup=self.warmup, active=self.steps, repeat=1),
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.record_shapes,
            with_stack=self.with_stack,
            profile_memory=self.profile_memory,
        )

    def _on_trace_ready(self, prof: Any) -> None:
        before = _traces_in(self.out_dir)
        self._handler(prof)
        new = sorted(_traces_in(self.out_dir) - before, key=os.path.getmtime)
        self.traces += new
        if new:
            self.trace_path = new[-1]
            if self.verbose:
                _cli._print(f"stallbench: profiler trace written: {self.trace_path}")

    def start(self) -> "Profile":
        self.profiler = self._make_profiler()
        self.profiler.start()
        return self

    def step(self) -> None:
        """Mark the end of one training iteration (torch.profiler.profile.step)."""
        self.steps_called += 1
        if self.profiler is not None:
            self.profiler.step()

    def stop(self, diagnose: bool | None = None) -> dict | None:
        """Stop the profiler (a recording in progress is written), then diagnose its trace."""
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None
        if diagnose if diagnose is not None else self.diagnose:
            return self.run_diagnose()
        return None

    def run_diagnose(self) -> dict | None:
        """`stallbench diagnose --trace` on the trace; prints the summary, keeps the dict as result."""
        if not self.trace_path:
            need = self.wait + self.warmup + 1
            warnings.warn(f"stallbench: no trace to diagnose: step() was called {self.steps_called} times, "
                          f"the schedule records from step {need} (wait={self.wait}, warmup={self.warmup})",
                          stacklevel=3)
            return None
        try:
            self.result = diagnose_trace(self.trace_path, baseline=self.baseline, timeout=self.timeout,
                                         binary=self.binary)
            self.error = None
        except StallbenchError as e:
            self.error = e
            warnings.warn(f"stallbench: diagnose --trace failed: {e}", stacklevel=3)
            return None
        if self.verbose:
            _cli._print(summarize(self.result, self.summary_limit))
            _cli._print(f"stallbench: full report: stallbench diagnose --trace {self.trace_path}")
        return self.result

    def __enter__(self) -> "Profile":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        ok = exc_type is None or (isinstance(exc_type, type) and issubclass(exc_type, KeyboardInterrupt))
        self.stop(diagnose=self.diagnose and ok)


def profile(steps: int = 5, warmup: int = 1, wait: int = 1, out_dir: PathLike = "./stallbench-profile",
            diagnose: bool = True, **kwargs: Any) -> Profile:
    """A Profile (use it with `with`, call p.step() each iteration); see Profile for the options."""
    return Profile(steps=steps, warmup=warmup, wait=wait, out_dir=out_dir, diagnose=diagnose, **kwargs)


# -- Flight Recorder -------------------------------------------------------------------------------
# The names torch 2.15 reads, the TORCH_FR_ name first (torch's precedence: the first one set wins):
#   buffer size:     TORCH_FR_BUFFER_SIZE, then TORCH_NCCL_TRACE_BUFFER_SIZE
#                    (include/torch/csrc/distributed/c10d/FlightRecorder.hpp, FlightRecorder();
#                    distributed/distributed_c10d.py, _maybe_attach_flight_recorder); ProcessGroupNCCL.hpp
#                    still reads TORCH_NCCL_TRACE_BUFFER_SIZE alone (default 2000)
#   dump on timeout: TORCH_FR_DUMP_ON_TIMEOUT, then TORCH_NCCL_DUMP_ON_TIMEOUT (FlightRecorder.hpp);
#                    ProcessGroupNCCL.hpp reads TORCH_NCCL_DUMP_ON_TIMEOUT alone
#   dump file:       <TORCH_FR_DUMP_TEMP_FILE><rank> (FlightRecorder.hpp, dump_fr_trace_file), older
#                    TORCH_NCCL_DEBUG_INFO_TEMP_FILE (both strings in lib/libtorch_cpu.so)
# torch 2.15 warns "Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated" (and so for
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE) when those aliases are set; older releases read only them.
FR_ENV = {
    "buffer_size": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    "dump_on_timeout": ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"),
    "dump_file": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
}
# Aliases torch 2.15 marks deprecated: set only for an older torch (or legacy_names=True).
FR_DEPRECATED = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_fr_dirs: list[str] = []


def _torch_version() -> tuple[int, int] | None:
    """The installed torch's (major, minor), without importing it; None if unknown."""
    text = None
    if "torch" in sys.modules:
        text = getattr(sys.modules["torch"], "__version__", None)
    if text is None:
        try:
            from importlib.metadata import PackageNotFoundError, version
            text = version("torch")
        except (ImportError, PackageNotFoundError):  # type: ignore[misc]
            return None
    try:
        major, minor = str(text).split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def flight_recorder(directory: PathLike | None = None, buffer_size: int = 2000, *,
                    prefix: str = "rank_", legacy_names: bool | None = None,
                    verbose: bool = True, dump_pipe: bool = True) -> dict[str, str]:
    """Turn on PyTorch's Flight Recorder, dumping to DIRECTORY/rank_<N> when a collective times out.

    Call before init_process_group: torch reads these when the process group starts. Sets the buffer
    size (a value above 0 already set is kept), dump-on-timeout and the dump file prefix, under the
    TORCH_FR_ names and TORCH_NCCL_DUMP_ON_TIMEOUT; legacy_names adds the older TORCH_NCCL_ aliases
    (default: only for a torch before 2.15, which deprecates them). Returns what it set. At exit,
    prints the `stallbench analyze-hang DIRECTORY` command.

    DIRECTORY defaults to $STALLBENCH_FR_DIR (set by `stallbench watch --exec`), else ./stallbench-fr.
    dump_pipe: a thread of this process waits on DIRECTORY/stallbench_pipe_<prefix><N>.pipe (a FIFO);
    whatever writes to it (`stallbench watch` at its stuck alarm) gets this rank's dump written at
    once, for any backend (gloo too), while the main thread is blocked in a collective."""
    if directory is None:
        directory = os.environ.get("STALLBENCH_FR_DIR") or "./stallbench-fr"
    d = os.path.abspath(os.fspath(directory))
    os.makedirs(d, exist_ok=True)
    if legacy_names is None:
        v = _torch_version()
        legacy_names = v is None or v < (2, 15)
    size = None
    for var in FR_ENV["buffer_size"]:  # torch's precedence: the first one set wins
        value = os.environ.get(var)
        if value:
            try:
                size = int(value)
            except ValueError:
                size = 0
            break
    if size is None or size <= 0:
        if size is not None:
            warnings.warn(f"stallbench: the Flight Recorder buffer size was set to 0 (off) or garbage; "
                          f"set to {buffer_size}", stacklevel=2)
        size = buffer_size
    env = {var: str(size) for var in FR_ENV["buffer_size"]}
    env.update({var: "1" for var in FR_ENV["dump_on_timeout"]})
    env.update({var: os.path.join(d, prefix) for var in FR_ENV["dump_file"]})
    if not legacy_names:
        env = {k: v for k, v in env.items() if k not in FR_DEPRECATED}
    os.environ.update(env)
    if _rank() is not None:
        warnings.warn("stallbench: flight_recorder() called after torch.distributed.init_process_group: "
                      "too late for the process group already made; call it first", stacklevel=2)
    if d not in _fr_dirs:
        _fr_dirs.append(d)
        atexit.register(_fr_at_exit, d, prefix, verbose)
        if dump_pipe:
            _start_dump_pipe(d, prefix)
    if verbose:
        _cli._print(f"stallbench: Flight Recorder on ({size} entries); "
                    f"a collective timeout dumps to {os.path.join(d, prefix)}<rank>")
    return env


def _start_dump_pipe(directory: str, prefix: str) -> None:
    """A daemon thread: each write to the rank's FIFO dumps its Flight Recorder to directory/<prefix><rank>
    (atomically: a temporary file renamed). The rank is RANK from the launcher (torchrun), else the
    process group's once it exists, else the pid."""
    import threading

    def rank_now() -> str:
        r = os.environ.get("RANK") or (str(_rank()) if _rank() is not None else "")
        return r or f"pid{os.getpid()}"

    rank = rank_now()
    fifo = os.path.join(directory, f"stallbench_pipe_{prefix}{rank}.pipe")
    try:
        if os.path.exists(fifo):
            os.remove(fifo)
        os.mkfifo(fifo, 0o600)
    except OSError as e:
        warnings.warn(f"stallbench: no dump pipe ({fifo}: {e}); a dump comes only on a timeout", stacklevel=3)
        return

    def serve() -> None:
        while True:
            try:
                with open(fifo, "rb") as f:  # blocks until a writer comes
                    f.read(64)
                c10d = importlib.import_module("torch._C._distributed_c10d")
                data = c10d._dump_fr_trace()
                target = os.path.join(directory, f"{prefix}{rank_now()}")
                tmp = f"{target}.tmp.{os.getpid()}"
                with open(tmp, "wb") as out:
                    out.write(data)
                os.replace(tmp, target)
            except Exception as e:  # noqa: BLE001 - never take the job down; say why once per request
                try:
                    sys.stderr.write(f"stallbench: the Flight Recorder dump on request failed: {e}\n")
                except Exception:  # noqa: BLE001
                    pass
                if not os.path.exists(fifo):
                    return

    threading.Thread(target=serve, name="stallbench-fr-dump-pipe", daemon=True).start()
    atexit.register(lambda: os.path.exists(fifo) and os.remove(fifo))


def _fr_at_exit(directory: str, prefix: str, verbose: bool) -> None:
    if not verbose or os.environ.get("RANK", "0") not in ("", "0"):
        return
    try:
        dumps = [f for f in os.listdir(directory) if f.startswith(prefix)]
    except OSError:
        dumps = []
    what = f"{len(dumps)} Flight Recorder dump(s) in {directory}" if dumps else \
        f"no Flight Recorder dump in {directory} yet (written when a collective times out)"
    _cli._print(f"stallbench: {what}; to explain a hang: stallbench analyze-hang {directory}")
