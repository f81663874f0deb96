"""stallbench in a Hugging Face Trainer: profile a few steps, name their causes.

    from stallbench.hf import StallbenchCallback
    trainer = Trainer(..., callbacks=[StallbenchCallback(start_step=10, steps=5)])

Imports transformers (and torch) when this module is imported; `import stallbench` does not.
"""
from __future__ import annotations

import glob
import importlib
import os
import socket
from typing import Any

from . import _cli
from ._cli import PathLike
from .torch import Profile

_transformers = importlib.import_module("transformers")
TrainerCallback = _transformers.TrainerCallback

__all__ = ["StallbenchCallback"]


def trainer_state_path(output_dir: str) -> str | None:
    """The run's trainer_state.json: output_dir's own (trainer.save_state()), else the newest checkpoint's."""
    own = os.path.join(output_dir, "trainer_state.json")
    if os.path.isfile(own):
        return own
    found = glob.glob(os.path.join(output_dir, "checkpoint-*", "trainer_state.json"))

    def step(p: str) -> int:
        tail = os.path.basename(os.path.dirname(p)).rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    return max(found, key=step) if found else None


class StallbenchCallback(TrainerCallback):  # type: ignore[misc, valid-type]
    """Profile `steps` optimizer steps after `start_step` (plus `warmup` unrecorded), then run
    `stallbench diagnose --trace` on the trace and print the causes.

    Every process writes its trace to out_dir (default OUTPUT_DIR/stallbench-profile), named by
    rank; only process 0 diagnoses. After training: `result` (the diagnose dict, process 0),
    `trace_path`, and the trainer_state.json location with the `stallbench diagnose` command."""

    def __init__(self, start_step: int = 10, steps: int = 5, out_dir: PathLike | None = None, *,
                 warmup: int = 1, diagnose: bool = True, record_shapes: bool = True,
                 with_stack: bool = False, profile_memory: bool = False, timeout: float = 600.0,
                 binary: PathLike | None = None, verbose: bool = True) -> None:
        self.start_step, self.steps, self.warmup = start_step, steps, warmup
        self.out_dir = os.fspath(out_dir) if out_dir is not None else None
        self.diagnose = diagnose
        self._kw = dict(record_shapes=record_shapes, with_stack=with_stack, profile_memory=profile_memory,
                        timeout=timeout, binary=binary)
        self.verbose = verbose
        self.profile: Profile | None = None
        self.last_profile: Profile | None = None
        self.result: dict | None = None
        self.trace_path: str | None = None
        self.state_path: str | None = None
        self._done = False
        self._zero = True

    # -- helpers ---------------------------------------------------------------------------------
    def _start(self, args: Any, state: Any) -> None:
        self._zero = bool(state.is_world_process_zero)
        out = self.out_dir or os.path.join(args.output_dir, "stallbench-profile")
        name = f"{socket.gethostname()}_{os.getpid()}_rank{getattr(args, 'process_index', 0)}"
        self.profile = Profile(steps=self.steps, warmup=self.warmup, wait=0, out_dir=out,
                               diagnose=False, worker_name=name, verbose=self.verbose and self._zero,
                               **self._kw)  # type: ignore[arg-type]
        self.profile.start()
        if self.verbose and self._zero:
            _cli._print(f"stallbench: profiling steps {state.global_step + self.warmup + 1}.."
                        f"{state.global_step + self.warmup + self.steps} into {self.profile.out_dir}")

    def _finish(self) -> None:
        p = self.profile
        if p is None:
            return
        p.stop(diagnose=False)
        self.profile, self._done = None, True
        self.trace_path = p.trace_path
        if self.diagnose and self._zero:
            self.result = p.run_diagnose()
        self.last_profile = p

    # -- TrainerCallback -------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._done and self.profile is None and self.start_step <= state.global_step:
            self._start(args, state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # ProfilerStep#N runs from one step end to the next: it holds the next batch's loading.
        if self.profile is not None:
            self.profile.step()
            if self.profile.trace_path:
                self._finish()
        elif not self._done and state.global_step >= self.start_step:
            self._start(args, state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish()  # training ended inside the window: what was recorded is written
        if not (self.verbose and state.is_world_process_zero):
            return
        out = os.path.abspath(args.output_dir)
        self.state_path = trainer_state_path(out)
        if self.state_path:
            _cli._print(f"stallbench: this run's trainer_state.json: {self.state_path}")
        else:
            _cli._print(f"stallbench: no trainer_state.json in {out} yet: the Trainer writes it with each "
                        "checkpoint (save_strategy) or on trainer.save_state()")
        _cli._print(f"stallbench: to diagnose the run's curves: stallbench diagnose {out}")
