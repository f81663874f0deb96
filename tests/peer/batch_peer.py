#!/usr/bin/env python3
"""PyTorch's training step on this CPU beside stallbench's `batch` scenario, interleaved in one run.

The step is the batch scenario's decoder (workloads/decoder.hpp), written the way a
PyTorch user writes it: per layer (pre-norm, no biases, as Llama-style blocks are)
    u1 = rmsnorm(x); q, k, v = split(u1 Wqkv^T); a = attention(q, k, v) (causal)
    x' = x + a Wo^T; u2 = rmsnorm(x'); x'' = x' + gelu_tanh(u2 W1^T) W2^T
then an MSE loss on the last x, loss.backward(), and torch.optim.AdamW (its defaults) once per
gradient_accumulation_steps micro steps, the loss of each divided by them. bf16 is
torch.autocast("cpu", torch.bfloat16) over fp32 parameters (mixed precision, as the scenario's
dtype=bf16 is). attn=fused is F.scaled_dot_product_attention (PyTorch's fused CPU kernel, the
scenario's flash); attn=naive is a model's eager attention (matmul, the causal mask built per
call and added, softmax in fp32, matmul), the scenario's naive.

The global batch is held across the micro-batch sweep, as diagnose holds it: grad_accum =
global_batch / micro_batch. tokens/s is micro_batch x seq_len x grad_accum per optimizer step
(zero_grad, the micro steps, the optimizer), the median of --reps steps after --warmup.

Where the two sides differ by design:
  - stallbench's attention output is a stand-in (its time is real, its values are not wired
    into the projections); here q, k and v come from the projection and the output feeds Wo,
    with the reshapes that takes.
  - stallbench models the framework's cost per op (dispatch_us, 10 us a submission, spent on
    the host while the compute thread runs the previous op); here PyTorch's own dispatch and
    autograd run on the thread that also computes.
  - stallbench computes on all CPUs but one, which it keeps for the host (its compute thread
    and OpenMP team pinned there: one core of two); PyTorch computes on the thread that
    dispatches, with its intra-op pool (every core by default: --threads 1 is like for like
    on a 2-core machine).

What it answers: does the micro batch buy tokens/s on this CPU at this shape, with the global
batch held, for PyTorch too; and does bf16, and a fused attention, buy the step what they buy
stallbench's step. Prints a Markdown table, writes JSON (--out) and the table beside it.

    /tmp/torchvenv/bin/python tests/peer/batch_peer.py --out results/peer/<kind>/batch.json

Exit codes: 0 ok, 1 a stallbench run failed, 2 bad arguments, 77 torch is not importable
(the script is never part of `meson test`).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import add_run_arguments, cpu_kind, parse_list, write_pair  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # not installed: a skip, as meson counts it
    print(f"SKIP: PyTorch is not installed ({e})")
    sys.exit(77)


def rmsnorm(x, eps=1e-6):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


def eager_attention(q, k, v):
    S, D = q.shape[-2], q.shape[-1]
    w = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
    mask = torch.full((S, S), torch.finfo(w.dtype).min, dtype=w.dtype).triu_(1)  # built per call
    w = torch.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v)


class Decoder:
    def __init__(self, args, seed=11):
        d, g = args.d_model, torch.Generator().manual_seed(seed)
        self.args = args
        # stallbench's decoder step: Wqkv projects Q at every head and K, V at kv_heads (grouped-query
        # attention), the MLP d_ff wide (4 d unless given)
        f = args.d_ff or 4 * d
        self.kv = args.kv_heads or args.heads
        if args.heads % self.kv:
            raise SystemExit(f"--kv-heads {self.kv} does not divide --heads {args.heads}")
        q_out = d + 2 * self.kv * (d // args.heads)
        self.layers = []
        for _ in range(args.layers):
            ws = [torch.empty(o, i).uniform_(-1, 1, generator=g).mul_(i ** -0.5).requires_grad_(True)
                  for o, i in ((q_out, d), (d, d), (f, d), (d, f))]
            self.layers.append(ws)
        self.params = [w for ws in self.layers for w in ws]

    def forward(self, x, attn):
        B, S, d = x.shape
        H = self.args.heads
        for wqkv, wo, w1, w2 in self.layers:
            qkv = F.linear(rmsnorm(x), wqkv)
            hd, kv = d // H, self.kv
            q, k, v = qkv.split([d, kv * hd, kv * hd], dim=-1)
            q = q.view(B, S, H, hd).transpose(1, 2)
            # repeat_kv, as an eager Llama step does: each K/V head serves H / kv query heads
            k, v = (t.view(B, S, kv, hd).transpose(1, 2).repeat_interleave(H // kv, dim=1) for t in (k, v))
            if attn == "fused":
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                a = eager_attention(q, k, v)
            x = x + F.linear(a.transpose(1, 2).reshape(B, S, d), wo)
            x = x + F.linear(F.gelu(F.linear(rmsnorm(x), w1), approximate="tanh"), w2)
        return x


def time_torch(args, dtype, attn, mb, ga):
    model = Decoder(args)
    opt = torch.optim.AdamW(model.params, lr=1e-4)
    g = torch.Generator().manual_seed(5)
    x = torch.empty(mb, args.seq, args.d_model).uniform_(-1, 1, generator=g)
    y = torch.empty(mb, args.seq, args.d_model).uniform_(-0.5, 0.5, generator=g)

    def step():
        opt.zero_grad()
        for _ in range(ga):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                out = model.forward(x, attn)
            loss = F.mse_loss(out.float(), y) / ga
            loss.backward()
        opt.step()
        return loss.item()  # a training loop's loss.item(): the step is done

    times = []
    for i in range(args.warmup + args.reps):
        t0 = time.perf_counter()
        step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return mb * args.seq * ga / statistics.median(times)


def framework_cost(args, dtype, attn):
    """PyTorch's own cost of one micro step (forward, loss, backward) at a shape with next to no compute
    (seq 8, d_model 16, the same layers and ops): its dispatch, autograd and autocast per op, which on
    CPU runs on the thread that computes and so adds to every micro step. Median of 200, in ms."""
    class Tiny:
        seq, d_model, heads, layers = 8, 16, args.heads if 16 % args.heads == 0 else 4, args.layers
        d_ff, kv_heads = 0, 0
    model = Decoder(Tiny)
    x, y = torch.rand(1, Tiny.seq, Tiny.d_model), torch.rand(1, Tiny.seq, Tiny.d_model)

    def micro():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            out = model.forward(x, attn)
        F.mse_loss(out.float(), y).backward()

    for _ in range(20):
        micro()
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        micro()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def time_stallbench(args, dtype, attn, sizes):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.json")
        cmd = [args.stallbench, "run", "batch", "--device", "cpu", "--json", path,
               "-p", "micro_batch=" + ",".join(map(str, sizes)), "-p", "grad_accum=1",
               "-p", f"global_batch={args.global_batch}", "-p", f"seq_len={args.seq}",
               "-p", f"d_model={args.d_model}", "-p", f"heads={args.heads}", "-p", f"layers={args.layers}",
               "-p", f"kv_heads={args.kv_heads}", "-p", f"d_ff={args.d_ff}",
               "-p", f"dtype={dtype}", "-p", f"attn={attn}", "-p", f"trials={args.reps}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0 or not os.path.exists(path):
            print(f"stallbench failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}", file=sys.stderr)
            sys.exit(1)
        with open(path) as f:
            res = json.load(f)
    out = {}
    for pt in res["points"]:
        m = pt.get("metrics", {})
        if pt.get("status") == "ok":
            out[pt["params"]["micro_batch"]] = (m["tokens_per_s"]["value"], m["launches"]["value"])
    return out, res.get("meta", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro-batch", type=lambda s: parse_list(s, int), default=[1, 2, 4, 8])
    ap.add_argument("--global-batch", type=int, default=8, help="sequences per optimizer step, held")
    ap.add_argument("--dtype", type=lambda s: parse_list(s, str), default=["fp32", "bf16"])
    ap.add_argument("--attn", type=lambda s: parse_list(s, str), default=["fused", "naive"])
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0, help="K/V heads (grouped-query attention); 0: --heads")
    ap.add_argument("--d-ff", type=int, default=0, help="the MLP's width; 0: 4 x --d-model")
    ap.add_argument("--layers", type=int, default=2)
    add_run_arguments(ap)
    args = ap.parse_args()
    for name in ("global_batch", "seq", "d_model", "heads", "layers", "rounds", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        ap.error("--warmup must be at least 0")
    if not args.micro_batch or any(m < 1 for m in args.micro_batch):
        ap.error("--micro-batch values must be at least 1")
    if args.d_model % args.heads:
        ap.error("--d-model must be a multiple of --heads")
    if any(d not in ("fp32", "bf16") for d in args.dtype):
        ap.error("--dtype takes fp32 and bf16")
    if any(a not in ("fused", "naive") for a in args.attn):
        ap.error("--attn takes fused and naive")
    if not os.access(args.stallbench, os.X_OK):
        ap.error(f"--stallbench {args.stallbench} is not an executable (build it first: scripts/test --suite unit)")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = sorted(set(args.micro_batch))

    samples = {}  # (dtype, attn, mb, who) -> [tokens/s per round]
    fw = {}  # (dtype, attn) -> [PyTorch's framework ms per micro step, per round]
    launches = {}  # (dtype, attn) -> stallbench's submissions per micro step (its `launches` metric)
    meta = {}
    for rnd in range(args.rounds):
        for dtype in args.dtype:
            for attn in args.attn:
                for mb in sizes:
                    tps = time_torch(args, dtype, attn, mb, max(1, args.global_batch // mb))
                    samples.setdefault((dtype, attn, mb, "torch"), []).append(tps)
                sb, meta = time_stallbench(args, dtype, attn, sizes)
                for mb, (tps, subs) in sb.items():
                    samples.setdefault((dtype, attn, mb, "stallbench"), []).append(tps)
                    launches[(dtype, attn)] = subs  # the same at every micro batch
                fw.setdefault((dtype, attn), []).append(framework_cost(args, dtype, attn))
                print(f"round {rnd + 1}/{args.rounds} {dtype} attn={attn} done", file=sys.stderr)

    def med(*key):
        v = samples.get(key, [])
        return statistics.median(v) if v else None

    def ratio(a, b):
        return a / b if a and b else None

    rows = []
    base_dtype, base_attn = args.dtype[0], args.attn[-1]
    for dtype in args.dtype:
        for attn in args.attn:
            for mb in sizes:
                r = {"dtype": dtype, "attn": attn, "micro_batch": mb,
                     "grad_accum": max(1, args.global_batch // mb)}
                for who in ("torch", "stallbench"):
                    r[f"{who} tokens/s"] = med(dtype, attn, mb, who)
                    # the micro batch's gain over the smallest, the global batch held
                    r[f"{who} vs micro batch {sizes[0]}"] = ratio(med(dtype, attn, mb, who),
                                                                  med(dtype, attn, sizes[0], who))
                    # bf16's gain over fp32, fused attention's over naive, at the same point
                    r[f"{who} vs {base_dtype}"] = ratio(med(dtype, attn, mb, who), med(base_dtype, attn, mb, who))
                    r[f"{who} vs attn={base_attn}"] = ratio(med(dtype, attn, mb, who),
                                                          med(dtype, base_attn, mb, who))
                r["stallbench / torch"] = ratio(r["stallbench tokens/s"], r["torch tokens/s"])
                for who in ("torch", "stallbench"):  # the rounds' max over min: this machine's noise at the point
                    v = samples.get((dtype, attn, mb, who), [])
                    r[f"{who} spread"] = max(v) / min(v) if v and min(v) > 0 else None
                rows.append(r)

    f2 = lambda x: "—" if x is None else f"{x:.2f}"
    f0 = lambda x: "—" if x is None else f"{x:,.0f}"
    head = ["dtype", "attn", "micro batch x accum", "torch tok/s", "stallbench tok/s", "stallbench / torch",
            f"torch vs mb {sizes[0]}", f"sb vs mb {sizes[0]}", f"torch vs {base_dtype}", f"sb vs {base_dtype}",
            f"torch vs {base_attn}", f"sb vs {base_attn}", "torch spread", "sb spread"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = [r["dtype"], r["attn"], f"{r['micro_batch']} x {r['grad_accum']}", f0(r["torch tokens/s"]),
                f0(r["stallbench tokens/s"]), f2(r["stallbench / torch"]),
                f2(r[f"torch vs micro batch {sizes[0]}"]), f2(r[f"stallbench vs micro batch {sizes[0]}"]),
                f2(r[f"torch vs {base_dtype}"]), f2(r[f"stallbench vs {base_dtype}"]),
                f2(r[f"torch vs attn={base_attn}"]), f2(r[f"stallbench vs attn={base_attn}"]),
                f2(r["torch spread"]), f2(r["stallbench spread"])]
        lines.append("| " + " | ".join(vals) + " |")
    lines += ["", "| dtype | attn | PyTorch's own cost per micro step (ms, tiny shape) | stallbench submissions per "
              "micro step | the same cost per submission (us) |", "|---|---|---|---|---|"]
    framework = []
    for (dtype, attn), v in fw.items():
        ms, n = statistics.median(v), launches.get((dtype, attn))
        framework.append({"dtype": dtype, "attn": attn, "torch_ms_per_micro_step": ms,
                          "stallbench_submissions_per_micro_step": n,
                          "torch_us_per_stallbench_submission": 1e3 * ms / n if n else None})
        lines.append(f"| {dtype} | {attn} | {ms:.2f} | {f0(n)} | {f0(1e3 * ms / n if n else None)} |")
    table = "\n".join(lines)
    print(table)

    if args.out:
        doc = {
            "what": "PyTorch's decoder training step on CPU vs stallbench's batch scenario, interleaved in one run",
            "unit": "tokens/s", "direction": "higher",
            "statistic": f"median over {args.rounds} rounds of the median of {args.reps} optimizer steps "
                         f"(stallbench: its own trials={args.reps} timing)",
            "machine": {**cpu_kind(), "python": platform.python_version(), "torch": torch.__version__,
                        "torch_threads": torch.get_num_threads(),
                        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
            "stallbench": {k: meta.get(k) for k in ("version", "git_sha", "device") if k in meta},
            "shape": {"seq_len": args.seq, "d_model": args.d_model, "heads": args.heads, "layers": args.layers,
                      "kv_heads": args.kv_heads or args.heads, "d_ff": args.d_ff or 4 * args.d_model,
                      "global_batch": args.global_batch, "optimizer": "AdamW"},
            "rows": rows,
            "framework": framework,
            "samples": [{"dtype": k[0], "attn": k[1], "micro_batch": k[2], "who": k[3], "tokens_per_s": v}
                        for k, v in samples.items()],
        }
        write_pair(args.out, doc, table)


if __name__ == "__main__":
    main()
