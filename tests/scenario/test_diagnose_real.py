#!/usr/bin/env python3
"""diagnose on what a real job has, end to end through the binary, nothing measured:
  - an Axolotl config read as Axolotl reads it (--plan: nothing measured, every setting with its source);
  - the model's dims from a Hugging Face cache (HF_HUB_CACHE), never the network;
  - configs Axolotl refuses are exit 2 saying so;
  - a run's output directory (trainer_state.json in checkpoint-N/) and the real trainer logs of
    $STALLBENCH_SHARED_DATA/trainer-logs (those cases skip where the data is absent);
  - a real Trainer run's directory with its training_args.bin and event file (tests/data/run), and a
    training_args.bin whose pickle names os.system (exit 2 naming it).
The configs are written here in the shape of Axolotl's examples (the tag and path each mirrors is named).

usage: test_diagnose_real.py STALLBENCH SCHEMA TRAINER_LOGS_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shared_data  # noqa: E402

EXE, SCHEMA, LOGS = sys.argv[1], sys.argv[2], sys.argv[3]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def run(args, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    t = time.monotonic()
    p = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout, env=e)
    return p, time.monotonic() - t


# examples/llama-3/lora-1b.yml at v0.18.0 (the keys that matter)
LLAMA_LORA = """base_model: NousResearch/Llama-3.2-1B
datasets:
  - path: teknium/GPT4-LLM-Cleaned
    type: alpaca
adapter: lora
lora_r: 16
lora_target_linear: true
sequence_len: 2048
sample_packing: true
gradient_accumulation_steps: 2
micro_batch_size: 2
learning_rate: 0.0002
bf16: auto
tf32: false
gradient_checkpointing: true
attn_implementation: flash_attention_2
"""
# Llama-3.2-1B's config.json (the dims diagnose reads; published with the model)
LLAMA32_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
              "tie_word_embeddings": True}
# examples/qwen2/dpo.yaml at v0.18.0
QWEN_DPO = "base_model: Qwen/Qwen2.5-0.5B\nrl: dpo\nsample_packing: false\nmicro_batch_size: 2\nbf16: auto\n"


with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "lora-1b.yml")
    with open(cfg, "w") as f:
        f.write(LLAMA_LORA)
    # a hub cache as from_pretrained leaves it: refs/main names the snapshot
    hub = os.path.join(tmp, "hub")
    snap = os.path.join(hub, "models--NousResearch--Llama-3.2-1B", "snapshots", "abc123")
    os.makedirs(snap)
    os.makedirs(os.path.join(hub, "models--NousResearch--Llama-3.2-1B", "refs"))
    with open(os.path.join(hub, "models--NousResearch--Llama-3.2-1B", "refs", "main"), "w") as f:
        f.write("abc123")
    with open(os.path.join(snap, "config.json"), "w") as f:
        json.dump(LLAMA32_1B, f)

    # --plan: the settings as used, their sources, the checks the config excludes; no device opened
    p, took = run(["diagnose", cfg, "--plan", "--device", "sim:h100"], env={"HF_HUB_CACHE": hub, "HOME": tmp})
    check(p.returncode == 0, f"--plan: exit {p.returncode}: {p.stderr[-400:]}")
    # no timing claim here (a loaded CI machine): a bound that only catches a plan that measures or hangs
    check(took < 30.0, f"--plan took {took:.2f} s: it should open nothing and measure nothing")
    for want in ["model.hidden_size              2048", os.path.join(snap, "config.json"),
                 "default_dataloader_opts", "loader       skipped", "attention    skipped",
                 "dtype        skipped: already bf16", "padding      skipped: sample_packing is on",
                 "adapter                        lora"]:
        check(want in p.stdout, f"--plan: {want!r} missing:\n{p.stdout[:3000]}")
    # without the cache: the default dims, said so (never a download)
    p, _ = run(["diagnose", cfg, "--plan", "--device", "sim:h100"],
               env={"HF_HUB_CACHE": os.path.join(tmp, "none"), "HF_HOME": os.path.join(tmp, "none"), "HOME": tmp})
    check(p.returncode == 0 and "is not in the Hugging Face cache" in p.stdout,
          f"--plan without the cache: {p.stdout[-1500:]}")
    # an older Axolotl: no worker defaults (0.10), attn_implementation not read (0.11)
    p, _ = run(["diagnose", cfg, "--plan", "--axolotl-version", "0.10.1"], env={"HF_HUB_CACHE": hub, "HOME": tmp})
    check("dataloader_num_workers         0" in p.stdout and "read from Axolotl 0.12.0 on" in p.stdout,
          f"--axolotl-version 0.10.1: {p.stdout[-2500:]}")
    p, _ = run(["diagnose", cfg, "--plan", "--axolotl-version", "eleven"])
    check(p.returncode == 2 and "--axolotl-version" in p.stderr, f"bad version: {p.returncode} {p.stderr}")

    # DPO: packing is no advice; asking for it is refused as Axolotl refuses it
    dpo = os.path.join(tmp, "dpo.yaml")
    with open(dpo, "w") as f:
        f.write(QWEN_DPO)
    p, _ = run(["diagnose", dpo, "--plan"])
    check(p.returncode == 0 and "padding      skipped: rl: dpo" in p.stdout, f"dpo plan: {p.stdout[-2000:]}")
    with open(dpo, "w") as f:
        f.write(QWEN_DPO.replace("sample_packing: false", "sample_packing: true"))
    p, _ = run(["diagnose", dpo, "--plan"])
    check(p.returncode == 2 and "RLHF" in p.stderr, f"dpo with packing: {p.returncode} {p.stderr}")

    # a run directory: the newest checkpoint's trainer_state.json (NaN tokens as the Trainer writes them)
    out = os.path.join(tmp, "output")
    for step, nan_at in ((2, None), (4, 3)):
        d = os.path.join(out, f"checkpoint-{step}")
        os.makedirs(d)
        logs = []
        for s in range(1, step + 1):
            gn = "NaN" if s == nan_at else "1.5"
            logs.append(f'{{"epoch": {s / 10}, "grad_norm": {gn}, "learning_rate": 1e-4, "loss": {2.0 - s / 10}, "step": {s}}}')
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            f.write('{"global_step": %d, "log_history": [%s]}' % (step, ", ".join(logs)))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:  # as PEFT saves it beside the checkpoints
        json.dump({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"],
                   "base_model_name_or_path": "NousResearch/Llama-3.2-1B"}, f)
    res = os.path.join(tmp, "run.json")
    p, _ = run(["diagnose", out, "--json", res])
    check("trains adapters: LORA r=16" in p.stdout, f"diagnose DIR: the adapter not read: {p.stdout[:800]}")
    check(p.returncode == 0, f"diagnose DIR: exit {p.returncode}: {p.stderr[-500:]}")
    check("checkpoint-4" in p.stdout and "grad_norm is NaN at step 3" in p.stdout and
          "reproduce: stallbench run numerics -p case=fp16" in p.stdout, f"diagnose DIR report: {p.stdout[-2000:]}")
    try:
        doc = json.load(open(res))
        import schema_check
        errs = schema_check.errors(doc, json.load(open(SCHEMA)))
        check(not errs, f"diagnose DIR result fails the schema: {errs[:3]}")
        check(doc["meta"]["diagnose"]["source"] == "run" and doc["findings"][0]["evidence"]["step"] == 3,
              f"diagnose DIR result: {doc['findings'][:1]}")
    except (OSError, ValueError, KeyError, IndexError) as e:
        failures.append(f"diagnose DIR result: {e}")
    # a directory that is no run, and a trainer_state.json that is not one: exit 2
    p, _ = run(["diagnose", "--run", tmp])
    check(p.returncode == 2 and "no trainer_state.json" in p.stderr, f"not a run: {p.returncode} {p.stderr}")
    bad = os.path.join(tmp, "bad", "trainer_state.json")
    os.makedirs(os.path.dirname(bad))
    with open(bad, "w") as f:
        f.write('{"log_history": [{"step": "five"}')
    p, _ = run(["diagnose", bad])
    check(p.returncode == 2 and "trainer_state.json" in p.stderr, f"truncated: {p.returncode} {p.stderr}")

    # a real Trainer run's directory with its training_args.bin (tests/data/run, made with transformers 5.25.0):
    # the settings and the plateau at lr 1e-7; the same run from its event file alone; a training_args.bin
    # naming os.system is exit 2 naming it, and nothing runs
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "run", "transformers-5.25.0")
    p, _ = run(["diagnose", os.path.join(data, "tiny_run"), "--json", res])
    check(p.returncode == 0 and "settings: " in p.stdout and "learning_rate 1e-07 constant (training_args.bin)" in p.stdout
          and "configured (training_args.bin): learning_rate 1e-07" in p.stdout,
          f"diagnose DIR with training_args.bin: {p.returncode} {p.stdout[-1500:]} {p.stderr}")
    p, _ = run(["diagnose", "--run", os.path.join(data, "tiny_run_tb_only"), "--json", res])
    check(p.returncode == 0 and "events.out.tfevents.0.tiny: 24 training" in p.stdout
          and "a learning rate too low" in p.stdout, f"diagnose DIR from events: {p.returncode} {p.stdout[-1500:]}")
    evil = os.path.join(tmp, "evil")
    os.makedirs(evil)
    shutil.copy(os.path.join(data, "..", "forbidden_global.bin"), os.path.join(evil, "training_args.bin"))
    shutil.copy(os.path.join(data, "tiny_run", "trainer_state.json"), evil)
    p, _ = run(["diagnose", evil, "--json", res])
    check(p.returncode == 2 and "global os.system refused" in p.stderr and "at offset 2" in p.stderr,
          f"forbidden global: {p.returncode} {p.stderr}")

    # the real runs: each names its README's cause first
    logs = shared_data.directory(LOGS, "trainer-logs")
    if os.path.isdir(logs):
        want = {"poludmik__qlora-fine-tune__lr5-divergence": "the loss diverges at step 2",
                "Rishikarpe__LoRA-Fine-Tuning__zero-loss-zero-grad": "no gradient",
                "ByErenOzer__Whisper_Finetune__whisper-earlystop-patience5": "EarlyStoppingCallback stopped the run",
                "syGOAT__Mistral-v0.2-Translator-bf16__mistral-sft-healthy": "none found"}
        for name, first in want.items():
            p, _ = run(["diagnose", os.path.join(logs, name + ".trainer_state.json"), "--json", res])
            head = p.stdout.split("findings, by the step they start at:")[-1].strip().splitlines()[:1]
            check(p.returncode == 0 and head and first in head[0], f"{name}: first finding {head} (want {first!r})")
    else:
        print(f"note: {logs} absent: the real-run cases were not run")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("ok")
