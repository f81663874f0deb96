"""stallbench from Python: a thin wrapper over the `stallbench` binary and its result JSON.

    import stallbench
    r = stallbench.diagnose_trace("trace.pt.trace.json.gz")
    print(stallbench.summarize(r))

The binary is found through $STALLBENCH_BIN, the interpreter's scripts directory, then PATH.
Importing this package imports neither torch nor transformers: `stallbench.torch` and
`stallbench.hf` do, when imported.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from ._cli import (
    EXIT_BAD_INPUT,
    EXIT_COLLECTIVE,
    EXIT_FAILURE,
    EXIT_HANG,
    EXIT_MEANING,
    EXIT_OK,
    EXIT_REGRESSION,
    PathLike,
    StallbenchError,
    find_binary,
    invoke_json_file,
    invoke_json_stdout,
    param_args,
    paths,
)

__version__ = "0.1.0"

__all__ = [
    "StallbenchError", "find_binary", "run", "diagnose_trace", "diagnose_run", "analyze_hang",
    "findings", "summarize",
    "EXIT_OK", "EXIT_FAILURE", "EXIT_BAD_INPUT", "EXIT_REGRESSION", "EXIT_HANG", "EXIT_COLLECTIVE",
]


def run(scenario: str, device: str = "cpu", quick: bool = False, *, timeout: float = 3600.0,
        budget: float | None = None, noise: float | None = None, trace: PathLike | None = None,
        params: Mapping[str, Any] | None = None, binary: PathLike | None = None, **kwparams: Any) -> dict:
    """`stallbench run SCENARIO -p k=v ...`: the result JSON as a dict, with "exit_code".

    Keyword arguments become `-p key=value` (lists: comma lists, a sweep axis; bools: true/false);
    `params` takes the same for keys that clash with this function's own. Exit 4 (hang caught) and
    5 (collective failed) still return the result; other failures raise StallbenchError."""
    args = ["run", scenario, "--device", device]
    if quick:
        args.append("--quick")
    if budget is not None:
        args += ["--budget", str(budget)]
    if noise is not None:
        args += ["--noise", str(noise)]
    if trace is not None:
        args += ["--trace", os.fspath(trace)]
    args += param_args({**(params or {}), **kwparams})
    return invoke_json_file(args, timeout, binary)


def diagnose_trace(path: PathLike | Iterable[PathLike], baseline: PathLike | None = None,
                   timeout: float = 600.0, *, html: PathLike | None = None,
                   binary: PathLike | None = None) -> dict:
    """`stallbench diagnose --trace PATH`: the causes a PyTorch profiler trace shows.

    path: a trace (.json or .json.gz), several (one job's ranks) or a directory of them;
    baseline: an earlier run's trace, to explain the change. The causes are in result["findings"]."""
    args = ["diagnose", "--trace", *paths(path)]
    if baseline is not None:
        args += ["--baseline", os.fspath(baseline)]
    if html is not None:
        args += ["--html", os.fspath(html)]
    return invoke_json_file(args, timeout, binary)


def diagnose_run(output_dir: PathLike, *, gpu: str | None = None, timeout: float = 600.0,
                 binary: PathLike | None = None) -> dict:
    """`stallbench diagnose --run DIR`: a Trainer output directory's trainer_state.json curves."""
    args = ["diagnose", "--run", os.fspath(output_dir)]
    if gpu is not None:
        args += ["--gpu", gpu]
    return invoke_json_file(args, timeout, binary)


def analyze_hang(directory: PathLike, *, timeout: float = 300.0, binary: PathLike | None = None) -> dict:
    """`stallbench analyze-hang DIR --json`: the first collective where the ranks' Flight Recorder
    dumps disagree (result["summary"], result["kind"], result["culprits"])."""
    return invoke_json_stdout(["analyze-hang", os.fspath(directory), "--json"], timeout, binary)


def findings(result: Mapping[str, Any]) -> list[dict]:
    """A result's findings: dicts with "cause", "summary", maybe "speedup" and "evidence"."""
    found = result.get("findings") or []
    return [f for f in found if isinstance(f, dict)]


def summarize(result: Mapping[str, Any], limit: int = 5, width: int = 160) -> str:
    """A few lines naming a result's causes, by estimated gain, as diagnose prints them."""
    found = findings(result)
    if "summary" in result and "kind" in result and not found:  # analyze-hang
        return f"stallbench: {result['summary']}"
    lines = []
    rc = result.get("exit_code")
    if isinstance(rc, int) and rc != 0:
        lines.append(f"stallbench: exit {rc} ({EXIT_MEANING.get(rc, 'unknown')})")
    for p in result.get("points") or []:
        if isinstance(p, dict) and p.get("status") not in ("ok", "skipped", None):
            lines.append(f"  point {p.get('status')}: {p.get('reason', '')}"[:width])
    if not found:
        return "\n".join(lines + ["stallbench: no cause found"])
    lines.append(f"stallbench: {len(found)} finding{'s' if len(found) != 1 else ''}, by estimated gain:")
    for i, f in enumerate(found[:limit], 1):
        head = f"  {i}. [{f.get('cause', '?')}]"
        text = str(f.get("summary", ""))
        room = max(20, width - len(head) - 3)
        if len(text) > room:
            text = text[: room - 3].rstrip() + "..."
        lines.append(f"{head} {text}" if text else head)
    if len(found) > limit:
        lines.append(f"  ... and {len(found) - limit} more")
    return "\n".join(lines)
