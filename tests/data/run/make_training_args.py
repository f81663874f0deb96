#!/usr/bin/env python3
"""Makes the test data of `diagnose DIR`'s training_args.bin and TensorBoard readers with the real
libraries (see README.md for the versions used): run it with a Python that has torch, transformers,
accelerate and tensorboard.

    python3 tests/data/run/make_training_args.py [OUT_DIR]     (default: this script's directory)
    python3 tests/data/run/make_training_args.py --trl          (TRL's SFTConfig and DPOConfig only)
    python3 tests/data/run/make_training_args.py --axolotl      (Axolotl's; see README.md for its PYTHONPATH)

Writes, under OUT_DIR/transformers-<version>/ (one folder per transformers release it is run with):
  bf16_w4_gc.bin    TrainingArguments(bf16, 4 workers, gradient checkpointing, cosine, warmup 100, lr 2e-4,
                    max_steps 1000, batch 8 x 4), saved as the Trainer saves it (torch.save) after the
                    device was set up (so accelerate's PartialState and torch.device are in the pickle)
  fp16_w0.bin       fp16, 0 workers, no pinned memory, linear, lr 5e-5, 3 epochs, batch 2
  defaults.bin      TrainingArguments(output_dir) and nothing else
  tiny_run/         a real Trainer run: a 2-layer GPT-2 of random weights on random tokens, 48 steps at
                    learning_rate 1e-7 (a plateau at a tiny learning rate), TensorBoardCallback on;
                    kept: training_args.bin, trainer_state.json, config.json and the event file under
                    runs/tiny/ (the weights and optimizer state are deleted: the readers never need them)
  tiny_run_tb_only/ the same run's training_args.bin and event file, without trainer_state.json
and, once, in OUT_DIR:
  forbidden_global.bin   a torch.save-shaped zip whose data.pkl calls os.system (made by hand; never
                         unpickled here): the reader must refuse it, naming the global and its offset
  hf_tags_nan.tfevents   events.out.tfevents written by torch.utils.tensorboard.SummaryWriter with the
                         tags HF's TensorBoardCallback uses (train/loss, train/grad_norm,
                         train/learning_rate, train/epoch, train/train_samples_per_second, ...): 40 steps,
                         grad_norm NaN at step 25 and the loss NaN from step 30
"""

import glob
import json
import math
import os
import random
import shutil
import sys
import warnings
import zipfile

warnings.simplefilter("ignore")  # transformers' deprecation notices

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

MAJOR = int(transformers.__version__.split(".")[0])


def args(out, **kw):
    # bf16 and fp16 are refused without a GPU unless use_cpu is given (transformers 5); the fields
    # the tests read are as set here either way
    kw.setdefault("report_to", "none")
    if (kw.get("bf16") or kw.get("fp16")) and not torch.cuda.is_available():
        kw["use_cpu"] = True
    a = TrainingArguments(output_dir=out, **kw)
    _ = a.device  # as the Trainer does before it saves them: distributed_state and the device cached
    return a


def save_args(a, path):
    torch.save(a, path)  # what Trainer._save does (TRAINING_ARGS_NAME)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def tiny_run(folder):
    """A real Trainer run with TensorBoardCallback, then only its small files kept."""
    out = os.path.join(folder, "tiny_run")
    shutil.rmtree(out, ignore_errors=True)
    os.environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(out, "runs", "tiny")  # no host name in the path
    torch.manual_seed(0)
    random.seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=64))
    # transformers 4 writes the events under logging_dir (gone in 5, which reads the variable above)
    logdir = {"logging_dir": os.environ["TENSORBOARD_LOGGING_DIR"]} if MAJOR < 5 else {}
    a = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=48, learning_rate=1e-7,
                          lr_scheduler_type="constant", logging_steps=2, save_strategy="no", report_to="tensorboard",
                          use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True, **logdir)
    trainer = Trainer(model=model, args=a, train_dataset=RandomTokens(256, 32, 128, 0))
    trainer.train()
    trainer.save_model(out)  # writes training_args.bin and config.json beside the weights
    trainer.save_state()     # trainer_state.json with the final summary
    for pattern in ("*.safetensors", "*.bin.index.json", "generation_config.json", "pytorch_model.bin"):
        for p in glob.glob(os.path.join(out, pattern)):
            os.remove(p)
    events = glob.glob(os.path.join(out, "runs", "tiny", "events.out.tfevents.*"))
    assert len(events) == 1, events
    # stable name: the writer's names carry the time and host
    os.replace(events[0], os.path.join(out, "runs", "tiny", "events.out.tfevents.0.tiny"))
    tb_only = os.path.join(folder, "tiny_run_tb_only")
    shutil.rmtree(tb_only, ignore_errors=True)
    os.makedirs(os.path.join(tb_only, "runs", "tiny"))
    shutil.copy(os.path.join(out, "training_args.bin"), tb_only)
    shutil.copy(os.path.join(out, "runs", "tiny", "events.out.tfevents.0.tiny"), os.path.join(tb_only, "runs", "tiny"))
    del os.environ["TENSORBOARD_LOGGING_DIR"]


def forbidden_global(path):
    """torch.save's layout around a data.pkl that names os.system: PROTO 2, GLOBAL 'os system',
    BINUNICODE 'echo pwned', TUPLE1, REDUCE, STOP. Written, never loaded."""
    s = b"echo pwned"
    pkl = b"\x80\x02" + b"cos\nsystem\n" + b"X" + len(s).to_bytes(4, "little") + s + b"\x85" + b"R" + b"."
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("forbidden_global/data.pkl", pkl)
        z.writestr("forbidden_global/byteorder", "little")
        z.writestr("forbidden_global/version", "3\n")


def hf_tags_nan(path):
    """Scalars under HF TensorBoardCallback's tags (rewrite_logs: train/<key>, eval/<key>), a NaN
    grad_norm at step 25 and a NaN loss from step 30, written by SummaryWriter itself."""
    d = path + ".dir"
    shutil.rmtree(d, ignore_errors=True)
    w = SummaryWriter(log_dir=d)
    for step in range(1, 41):
        loss = 2.0 * math.exp(-step / 20) + 0.5 if step < 30 else float("nan")
        grad = float("nan") if step == 25 or step >= 30 else 1.0 / step
        w.add_scalar("train/loss", loss, step)
        w.add_scalar("train/grad_norm", grad, step)
        w.add_scalar("train/learning_rate", 2e-4 * (1 - step / 40), step)
        w.add_scalar("train/epoch", step / 40, step)
    for key, v in (("train_runtime", 12.5), ("train_samples_per_second", 51.2), ("train_steps_per_second", 3.2),
                   ("train_loss", 1.25)):
        w.add_scalar("train/" + key, v, 40)
    w.close()
    (event,) = glob.glob(os.path.join(d, "events.out.tfevents.*"))
    os.replace(event, path)
    shutil.rmtree(d)


def trl_args(root):
    """TRL's own TrainingArguments subclasses, as its trainers save them (torch.save of the config):
    SFTConfig with packing at max_length 2048 in bf16, DPOConfig at a learning rate of 5e-7. Under
    trl-<version>/; the reader must accept the classes (its allow-list) and read max_length and packing."""
    import trl
    from trl import DPOConfig, SFTConfig

    folder = os.path.join(root, "trl-" + trl.__version__)
    os.makedirs(folder, exist_ok=True)
    scratch = os.path.join(folder, "scratch")
    cpu = {} if torch.cuda.is_available() else {"use_cpu": True}
    sft = SFTConfig(output_dir=scratch, report_to="none", max_length=2048, packing=True, bf16=True,
                    per_device_train_batch_size=4, gradient_accumulation_steps=8, learning_rate=2e-5, **cpu)
    _ = sft.device
    save_args(sft, os.path.join(folder, "sft_packed_bf16.bin"))
    dpo = DPOConfig(output_dir=scratch, report_to="none", learning_rate=5e-7, beta=0.1, max_length=1024,
                    per_device_train_batch_size=2, **cpu)
    _ = dpo.device
    save_args(dpo, os.path.join(folder, "dpo_lr5e-7.bin"))
    shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(folder, "versions.json"), "w") as f:
        json.dump({"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                   "trl": trl.__version__}, f, indent=1)
        f.write("\n")
    print("wrote", folder)


def axolotl_args(root):
    """Axolotl's own TrainingArguments subclasses as its trainer builder saves them: the SFT one with
    sample packing at max_seq_length 4096 in bf16 (micro batch 2 x 4, one worker, prefetch 256), and
    AxolotlDPOConfig at a learning rate of 5e-7. Under axolotl-<version>/. Axolotl pins its own TRL; the
    files were made with the axolotl 0.19.0 wheel installed --no-deps, trl 1.9.0 (its pin) and the few
    modules its imports need on PYTHONPATH (see README.md), over this venv's torch and transformers."""
    import axolotl
    import trl
    from axolotl.core.trainers.dpo.args import AxolotlDPOConfig
    from axolotl.core.training_args import AxolotlTrainingArguments

    folder = os.path.join(root, "axolotl-" + axolotl.__version__)
    os.makedirs(folder, exist_ok=True)
    scratch = os.path.join(folder, "scratch")
    cpu = {} if torch.cuda.is_available() else {"use_cpu": True}
    sft = AxolotlTrainingArguments(output_dir=scratch, report_to="none", bf16=True, per_device_train_batch_size=2,
                                   gradient_accumulation_steps=4, sample_packing=True, max_seq_length=4096,
                                   learning_rate=2e-4, dataloader_num_workers=1, dataloader_prefetch_factor=256, **cpu)
    _ = sft.device
    save_args(sft, os.path.join(folder, "sft_packed_bf16.bin"))
    dpo = AxolotlDPOConfig(output_dir=scratch, report_to="none", learning_rate=5e-7, max_length=2048, **cpu)
    _ = dpo.device
    save_args(dpo, os.path.join(folder, "dpo_lr5e-7.bin"))
    shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(folder, "versions.json"), "w") as f:
        json.dump({"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                   "trl": trl.__version__, "axolotl": axolotl.__version__}, f, indent=1)
        f.write("\n")
    print("wrote", folder)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else os.path.dirname(os.path.abspath(__file__))
    if "--trl" in sys.argv:  # only TRL's configs (they need trl installed)
        trl_args(root)
        return
    if "--axolotl" in sys.argv:  # only Axolotl's (they need axolotl and its TRL)
        axolotl_args(root)
        return
    folder = os.path.join(root, "transformers-" + transformers.__version__)
    os.makedirs(folder, exist_ok=True)
    scratch = os.path.join(folder, "scratch")  # output_dir: the args record it; nothing is written there
    save_args(args(scratch, per_device_train_batch_size=8, gradient_accumulation_steps=4, bf16=True,
                   dataloader_num_workers=4, gradient_checkpointing=True, learning_rate=2e-4,
                   lr_scheduler_type="cosine", warmup_steps=100, max_steps=1000),
              os.path.join(folder, "bf16_w4_gc.bin"))
    save_args(args(scratch, per_device_train_batch_size=2, fp16=True, dataloader_num_workers=0,
                   dataloader_pin_memory=False, learning_rate=5e-5, lr_scheduler_type="linear", num_train_epochs=3),
              os.path.join(folder, "fp16_w0.bin"))
    save_args(args(scratch), os.path.join(folder, "defaults.bin"))
    tiny_run(folder)
    shutil.rmtree(scratch, ignore_errors=True)
    forbidden_global(os.path.join(root, "forbidden_global.bin"))
    hf_tags_nan(os.path.join(root, "hf_tags_nan.tfevents"))
    with open(os.path.join(folder, "versions.json"), "w") as f:
        import accelerate
        import tensorboard
        json.dump({"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                   "accelerate": accelerate.__version__, "tensorboard": tensorboard.__version__}, f, indent=1)
        f.write("\n")
    print("wrote", folder)


if __name__ == "__main__":
    main()
