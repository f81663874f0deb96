#!/usr/bin/env python3
"""The Python package with real torch and transformers: stallbench.torch.profile on a loop whose
DataLoader sleeps in __getitem__, stallbench.hf.StallbenchCallback in a transformers Trainer, and
stallbench.torch.flight_recorder (its environment, a real gloo dump, the analyze-hang hint at exit).

usage: test_python_torch.py STALLBENCH [PYTHON_DIR]     (PYTHON_DIR: default ../../python from here)
Exit 0 pass, 1 fail, 77 skip (torch or transformers not importable, here or in the Python that
$STALLBENCH_TORCH_PYTHON names: meson test runs this with the build's python3, then re-runs it there).
"""
import contextlib
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg, flush=True)
    if not cond:
        failures.append(msg)
    return cond


class Tee(io.StringIO):
    """Captures what is written, and passes it on."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def write(self, s):
        self.stream.write(s)
        return super().write(s)

    def flush(self):
        self.stream.flush()


@contextlib.contextmanager
def captured_stderr():
    tee = Tee(sys.stderr)
    with contextlib.redirect_stderr(tee):
        yield tee


def profiler_steps(trace):
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    return sorted({e["name"] for e in doc.get("traceEvents", [])
                   if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")})


def test_import_is_lazy(pydir):
    code = ("import sys; sys.path.insert(0, %r); import stallbench, stallbench.torch; "
            "a = 'torch' in sys.modules; t = stallbench.torch._torch(); "
            "print(a, t is sys.modules['torch'], hasattr(t, 'profiler'), t.__file__)" % pydir)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    words = out.stdout.split()
    check(out.returncode == 0 and words[:3] == ["False", "True", "True"],
          f"import stallbench, stallbench.torch imports no torch; _torch() is the real one ({' '.join(words[3:])})")


def test_profile_slow_loader(tmp):
    import torch
    from torch.utils.data import DataLoader, Dataset

    import stallbench
    import stallbench.torch as sbt

    class SlowDataset(Dataset):
        def __len__(self):
            return 1000

        def __getitem__(self, i):
            time.sleep(0.02)  # 20 ms a sample: the loader, not the model, sets the pace
            return torch.randn(32), i % 4

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SlowDataset(), batch_size=4, num_workers=0)
    out_dir = os.path.join(tmp, "prof")
    t = time.monotonic()
    with captured_stderr() as err:
        with sbt.profile(steps=3, warmup=1, wait=1, out_dir=out_dir) as p:
            for i, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                p.step()
                if i == 6:
                    break
    took = time.monotonic() - t
    trace = p.trace_path or ""
    check(trace.endswith(".pt.trace.json.gz") and os.path.dirname(trace) == out_dir and os.path.isfile(trace),
          f"profile: the trace is {os.path.basename(trace)} in out_dir ({took:.1f} s)")
    steps = profiler_steps(trace) if os.path.isfile(trace) else []
    check(len(steps) == 3, f"profile: the trace holds 3 ProfilerStep#N (active=3): {steps}")
    r = p.result or {}
    found = stallbench.findings(r)
    print(f"     findings: {[f['cause'] for f in found]}")
    check(r.get("exit_code") == 0 and found and found[0]["cause"] == "a slow host dataloader"
          and found[0]["evidence"]["check"] == "loader",
          "profile: diagnose names 'a slow host dataloader' first (check loader)")
    share = found[0]["evidence"].get("share_pct", 0) if found else 0
    check(share > 50, f"profile: the loader holds {share:.1f}% of the steps")
    check("[a slow host dataloader]" in err.getvalue(), "profile: the summary printed names the cause")

    with captured_stderr():
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with sbt.profile(steps=2, out_dir=os.path.join(tmp, "short")) as q:
                q.step()  # ends during warmup: nothing recorded
    check(q.trace_path is None and q.result is None and any("no trace to diagnose" in str(x.message) for x in w),
          "profile ended before its active steps: no trace, a warning, no result")


def test_trainer_callback(tmp):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from stallbench.hf import StallbenchCallback

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids.clone()}

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                     bos_token_id=0, eos_token_id=0)
    out = os.path.join(tmp, "run")
    args = TrainingArguments(output_dir=out, max_steps=6, per_device_train_batch_size=4, report_to=[],
                             use_cpu=True, save_steps=6, logging_steps=2, dataloader_num_workers=0,
                             disable_tqdm=True)
    cb = StallbenchCallback(start_step=1, steps=3)
    t = time.monotonic()
    with captured_stderr() as err:
        Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=Tokens(), callbacks=[cb]).train()
    took = time.monotonic() - t
    trace = cb.trace_path or ""
    check(trace.endswith(".pt.trace.json.gz") and os.path.isfile(trace)
          and os.path.dirname(trace) == os.path.join(out, "stallbench-profile"),
          f"callback: trace {os.path.relpath(trace, tmp) if trace else None} in OUTPUT_DIR/stallbench-profile "
          f"({took:.1f} s)")
    steps = profiler_steps(trace) if os.path.isfile(trace) else []
    check(len(steps) == 3, f"callback: 3 recorded steps: {steps}")
    found = (cb.result or {}).get("findings")
    check(isinstance(cb.result, dict) and cb.result.get("exit_code") == 0 and bool(found),
          f"callback: a diagnose result with findings: {[f['cause'] for f in found or []]}")
    text = err.getvalue()
    state = os.path.join(out, "checkpoint-6", "trainer_state.json")
    check(cb.state_path == state and f"trainer_state.json: {state}" in text,
          "callback: printed where trainer_state.json is (checkpoint-6)")
    check(f"stallbench diagnose {out}" in text, "callback: printed the `stallbench diagnose OUTPUT_DIR` command")


FR_SCRIPT = textwrap.dedent("""
    import json, os, sys, warnings
    sys.path.insert(0, sys.argv[1])
    import stallbench.torch as sbt
    fr_dir, store, legacy = sys.argv[2], sys.argv[3], sys.argv[4]
    sbt.flight_recorder(fr_dir, legacy_names={"auto": None, "yes": True}[legacy])
    names = [n for pair in sbt.FR_ENV.values() for n in pair]
    print(json.dumps({n: os.environ.get(n) for n in names}), flush=True)
    if legacy == "auto":
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
        x = torch.ones(4)
        for _ in range(3):
            dist.all_reduce(x)
        # what a watchdog timeout does: the recorder's dump to <TORCH_FR_DUMP_TEMP_FILE><rank>
        torch._C._distributed_c10d._dump_fr_trace_file(0)
        warnings.simplefilter("always")
        sbt.flight_recorder(fr_dir + "-late")  # after init_process_group: warns
        dist.destroy_process_group()
""")


def test_flight_recorder(tmp, pydir):
    import stallbench
    import stallbench.torch as sbt

    script = os.path.join(tmp, "fr_child.py")
    with open(script, "w") as f:
        f.write(FR_SCRIPT)
    fr_dir = os.path.join(tmp, "fr")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    env.pop("RANK", None)
    t = time.monotonic()
    out = subprocess.run([sys.executable, script, pydir, fr_dir, os.path.join(tmp, "store"), "auto"],
                         capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t
    if not check(out.returncode == 0, f"flight_recorder child (gloo, 1 rank) exits 0 ({took:.1f} s)"):
        print(out.stdout[-2000:], out.stderr[-3000:])
        return
    got = json.loads(out.stdout.strip().splitlines()[0])
    prefix = os.path.join(fr_dir, "rank_")
    want = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": prefix}
    check(all(got.get(k) == v for k, v in want.items()), f"flight_recorder sets {want}: {got}")
    legacy = sbt._torch_version() is None or sbt._torch_version() < (2, 15)
    check(legacy or all(got.get(k) is None for k in sbt.FR_DEPRECATED),
          f"torch {sbt._torch_version()}: the aliases it deprecates left unset: {sbt.FR_DEPRECATED}")
    check("is deprecated" not in out.stderr, "no deprecation warning from torch")
    check(os.path.isfile(prefix + "0"), "the recorder's dump landed at DIR/rank_0")
    check("too late" in out.stderr, "flight_recorder after init_process_group warns it is too late")
    hint = f"stallbench analyze-hang {fr_dir}"
    check(hint in out.stderr and "1 Flight Recorder dump(s)" in out.stderr,
          f"at exit: '{hint}', with the dump counted")
    if os.path.isfile(prefix + "0"):
        r = stallbench.analyze_hang(fr_dir)
        check(r["exit_code"] == 0 and r["ranks_found"] == [0] and r.get("torch_match_state") == "FULLY_MATCHED",
              f"analyze_hang reads the dump: {r.get('summary')}")

    env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "50"  # a user's own value is kept
    out = subprocess.run([sys.executable, script, pydir, os.path.join(tmp, "fr2"), "", "yes"],
                         capture_output=True, text=True, timeout=120, env=env)
    got = json.loads(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else {}
    check(got.get("TORCH_FR_BUFFER_SIZE") == "50" and got.get("TORCH_NCCL_TRACE_BUFFER_SIZE") == "50"
          and got.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == os.path.join(tmp, "fr2", "rank_"),
          f"legacy_names=True: every alias set, the user's buffer size 50 kept: {got}")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    binary = os.path.abspath(sys.argv[1])
    pydir = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(ROOT, "python")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        other = os.environ.get("STALLBENCH_TORCH_PYTHON")
        if other and not os.environ.get("STALLBENCH_TORCH_PYTHON_RAN"):
            # the test's own Python lacks torch: the one named has it (meson test passes env on).
            # A venv's python is a link to the base interpreter: it is run by its own path, once.
            os.environ["STALLBENCH_TORCH_PYTHON_RAN"] = "1"
            os.execv(other, [other, os.path.abspath(__file__), *sys.argv[1:]])
        print(f"SKIP: torch and transformers are needed ({e}); set STALLBENCH_TORCH_PYTHON to a "
              f"Python that has them, or run: PYTHON {sys.argv[0]} {sys.argv[1]}")
        return 77
    sys.path.insert(0, pydir)
    os.environ["STALLBENCH_BIN"] = binary
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {sys.executable}")
    # one intra-op thread, as the project's CPU traces: with two, the OpenMP pool's wake-up after each
    # 80 ms loader sleep showed up as tens of ms of 'compute' in the tiny model's ops
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="stallbench-pytorch-") as tmp:
        for name, fn, args in (("lazy import", test_import_is_lazy, (pydir,)),
                               ("profile", test_profile_slow_loader, (tmp,)),
                               ("trainer callback", test_trainer_callback, (tmp,)),
                               ("flight recorder", test_flight_recorder, (tmp, pydir))):
            print(f"-- {name}", flush=True)
            t = time.monotonic()
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - a crash is a failure of that part, the rest still run
                import traceback
                traceback.print_exc()
                check(False, f"{name}: raised {type(e).__name__}: {e}")
            print(f"   ({time.monotonic() - t:.1f} s)")
    print(f"{len(failures)} failure(s)" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
