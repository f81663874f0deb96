"""The stallbench binary, found and run: its command line and its result JSON are the API.

Standard library only, so that `import stallbench` works without torch or transformers.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any, Iterable, Mapping, Sequence, Union

PathLike = Union[str, "os.PathLike[str]"]

# Exit codes (stallbench --help).
EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_REGRESSION, EXIT_HANG, EXIT_COLLECTIVE = 0, 1, 2, 3, 4, 5
EXIT_MEANING = {
    EXIT_OK: "ok",
    EXIT_FAILURE: "failure",
    EXIT_BAD_INPUT: "bad input",
    EXIT_REGRESSION: "regression",
    EXIT_HANG: "hang caught",
    EXIT_COLLECTIVE: "a collective failed",
}
# Codes after which the result JSON is still the answer (a hang or a failed collective is a finding).
RESULT_CODES = (EXIT_OK, EXIT_REGRESSION, EXIT_HANG, EXIT_COLLECTIVE)


class StallbenchError(RuntimeError):
    """stallbench could not be found, failed, timed out, or wrote no result.

    exit_code is None when the binary did not run to an exit (not found, timed out)."""

    def __init__(self, message: str, exit_code: int | None = None, stderr: str = "",
                 stdout: str = "", argv: Sequence[str] = (), result: dict | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stderr = stderr
        self.stdout = stdout
        self.argv = list(argv)
        self.result = result  # a partial result JSON, where one was written

    @property
    def stderr_tail(self) -> str:
        return _tail(self.stderr)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def find_binary(binary: PathLike | None = None) -> str:
    """The stallbench executable: `binary`, else $STALLBENCH_BIN, else the one a pip install put in
    this package (stallbench/_bin/stallbench), else the one in this interpreter's scripts directory
    (sysconfig "scripts"), else `stallbench` on PATH.

    Raises StallbenchError naming every place. A $STALLBENCH_BIN that is set but names no
    executable is an error, not skipped: it was asked for."""
    if binary is not None:
        path = os.fspath(binary)
        if _is_exe(path):
            return os.path.abspath(path)
        raise StallbenchError(f"stallbench binary {path!r} is not an executable file")
    env = os.environ.get("STALLBENCH_BIN")
    carried = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "stallbench")
    scripts = sysconfig.get_path("scripts") or ""
    beside = os.path.join(scripts, "stallbench") if scripts else ""
    on_path = shutil.which("stallbench")
    if env and _is_exe(env):
        return os.path.abspath(env)
    if not env:
        for candidate in (carried, beside):
            if candidate and _is_exe(candidate):
                return candidate
        if on_path:
            return on_path
    if env:
        first = f"$STALLBENCH_BIN={env!r}: not an executable file (set, so it is the one used)"
    else:
        first = "$STALLBENCH_BIN: not set"

    def state(path: str) -> str:
        return "present" if path and _is_exe(path) else "no executable there"

    third = f"the interpreter's scripts directory: {beside or '(none)'}: {state(beside)}"
    fourth = f"PATH: {on_path}" if on_path else "PATH: no stallbench on it"
    raise StallbenchError(
        f"stallbench binary not found; looked in:\n  1. {first}\n  2. the package (pip install): "
        f"{carried}: {state(carried)}\n  3. {third}\n  4. {fourth}\n"
        "build it (meson setup build && ninja -C build) and set STALLBENCH_BIN=/path/to/build/stallbench, "
        "or pip install the project"
    )


def _is_exe(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _execute(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """Run argv in its own session; on timeout kill that session (the binary and its children)."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        out, err = proc.communicate()
        raise StallbenchError(f"stallbench timed out after {timeout:g} s: {' '.join(argv)}\n{_tail(err)}",
                              exit_code=None, stderr=err, stdout=out, argv=argv)
    except BaseException:  # KeyboardInterrupt: the binary's session is not the terminal's, so end it all
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()
        raise
    return proc.returncode, out, err


def _fail(argv: Sequence[str], rc: int, out: str, err: str, why: str = "",
          result: dict | None = None) -> StallbenchError:
    meaning = EXIT_MEANING.get(rc, "signal %d" % -rc if rc < 0 else "unknown")
    msg = f"stallbench exited {rc} ({meaning}){': ' + why if why else ''}: {' '.join(argv)}"
    tail = _tail(err) or _tail(out)
    if tail:
        msg += "\n" + tail
    return StallbenchError(msg, exit_code=rc, stderr=err, stdout=out, argv=argv, result=result)


def invoke_json_file(args: Sequence[str], timeout: float, binary: PathLike | None = None) -> dict:
    """Run `stallbench ARGS --json TMP`, return the result JSON with "exit_code" added."""
    exe = find_binary(binary)
    tmpdir = tempfile.mkdtemp(prefix="stallbench-")
    path = os.path.join(tmpdir, "result.json")
    argv = [exe, *args, "--json", path]
    try:
        rc, out, err = _execute(argv, timeout)
        result = None
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    result = json.load(f)
            except (OSError, ValueError) as e:
                raise _fail(argv, rc, out, err, f"its result JSON is unreadable ({e})")
        if rc not in RESULT_CODES or not isinstance(result, dict):
            raise _fail(argv, rc, out, err, "" if rc not in RESULT_CODES else "it wrote no result JSON",
                        result if isinstance(result, dict) else None)
        result["exit_code"] = rc
        return result
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def invoke_json_stdout(args: Sequence[str], timeout: float, binary: PathLike | None = None) -> dict:
    """Run `stallbench ARGS` that prints its JSON on stdout (analyze-hang --json)."""
    exe = find_binary(binary)
    argv = [exe, *args]
    rc, out, err = _execute(argv, timeout)
    if rc not in RESULT_CODES:
        raise _fail(argv, rc, out, err)
    try:
        result = json.loads(out)
    except ValueError as e:
        raise _fail(argv, rc, out, err, f"its output is not JSON ({e})")
    if not isinstance(result, dict):
        raise _fail(argv, rc, out, err, "its output is not a JSON object")
    result["exit_code"] = rc
    return result


def param_value(value: Any) -> str:
    """A Python value as `-p key=VALUE` takes it: bools as true/false, lists as comma lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, set, frozenset, range)):
        return ",".join(param_value(v) for v in value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def param_args(params: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in params.items():
        out += ["-p", f"{key}={param_value(value)}"]
    return out


def paths(path: PathLike | Iterable[PathLike]) -> list[str]:
    if isinstance(path, (str, bytes, os.PathLike)):
        return [os.fspath(path)]  # type: ignore[list-item]
    return [os.fspath(p) for p in path]


def _print(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
