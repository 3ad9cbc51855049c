"""Full training steps of mtkit (``Trainer.train_step``) against Hugging Face's MarianMTModel.

A step is forward, label-smoothed loss (ε = 0.1), backward, gradient-norm and the
AdamW update. mtkit runs its own ``Trainer.train_step`` (fused AdamW, noam schedule)
on real Multi30k batches from its token batching (``--max-tokens`` 4096): the
training split is prepared with an 8k joint SentencePiece vocabulary into a
temporary directory (or ``--data-dir``, which keeps it between runs) from
``../shared/data/multi30k`` (read only). MarianMT of the same dimensions (random
init, same dropout) trains the way a Hugging Face user does: fixed-size sentence
batches in random order padded to the longest (``--hf-batch`` sentences; by
default as many as give the same real target tokens per batch as mtkit's),
``F.cross_entropy(label_smoothing=0.1)``, ``clip_grad_norm_(1.0)`` and fused AdamW
(the Trainer's default optimizer). Shapes: ``tiny`` (the multi30k recipe's model,
vocab 8k) and ``base`` (transformer-base, vocab 32k, on the same Multi30k ids, with
``--base-tokens`` per batch so that it runs in reasonable time). All runners'
steps are interleaved round by round and the median is kept. MFU as in
benchmarks/model.py (FLOPs counted in benchmarks/common.py).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/train.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/train.py --shapes base --steps 3

Needs ``pip install 'mtkit[bench]'`` (transformers, psutil).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import make_runner, precision_context  # noqa: E402

from mtkit.config import PAD_ID, config_from_dict  # noqa: E402
from mtkit.engines.precision import grad_scaler  # noqa: E402
from mtkit.training import distributed  # noqa: E402
from mtkit.training.loss import TranslationLoss  # noqa: E402
from mtkit.training.optim import build_optimizer  # noqa: E402
from mtkit.training.trainer import Trainer  # noqa: E402


def log(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepared_store(data: Path, out: Path):
    """Multi30k train, prepared by mtkit with an 8k joint vocabulary (reused when ``out`` holds it)."""
    from mtkit.commands.prepare import prepare
    from mtkit.data.store import ParallelStore

    if not (out / "manifest.json").is_file():
        log(f"preparing Multi30k into {out}")
        config = config_from_dict({"data": {"train": {"kind": "files", "src": str(data / "train.en"),
                                                      "tgt": str(data / "train.de")},
                                            "spm": {"vocab_size": 8000}}})
        prepare(config, out, progress=False)
    return ParallelStore.open(out, "train")


def mtkit_trainer(shape: str, precision: str, compile: bool = False) -> Trainer:
    """A Trainer with only what ``train_step`` uses (no data directory, run directory or log)."""
    model_cfg = common.SHAPES[shape][0]
    config = config_from_dict({"model": model_cfg, "train": {"precision": precision, "device": "cpu",
                                                             "compile": compile, "warmup": 4000}})
    trainer = Trainer.__new__(Trainer)
    trainer.config, trainer.cfg = config, config.train
    trainer.dist = distributed.DistContext()
    trainer.device = torch.device("cpu")
    trainer.model = common.build_mtkit(shape)
    trainer.criterion = TranslationLoss(trainer.model, 0.1, PAD_ID)
    trainer.train_model = torch.compile(trainer.criterion, dynamic=True) if compile else trainer.criterion
    trainer.optimizer = build_optimizer(trainer.model.parameters(), trainer.cfg, "cpu")
    trainer.scaler = grad_scaler(precision, "cpu")
    trainer.step = 0
    return trainer


def marian_trainer(shape: str, precision: str):
    model = common.build_marian(shape).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True)

    def step(batch) -> None:
        with precision_context(precision):
            loss = common.marian_loss(model, batch, 0.1)
        (loss / batch.n_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="tiny,base", help="comma-separated: tiny, small, base")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per runner")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per runner first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4096, help="mtkit's token budget (tiny, small)")
    ap.add_argument("--base-tokens", type=int, default=1024, help="mtkit's token budget at the base shape")
    ap.add_argument("--hf-batch", type=int, default=0, help="MarianMT sentences per batch (0: match mtkit's tokens)")
    ap.add_argument("--compile", action="store_true", help="also time mtkit with train.compile=true (slow to compile)")
    ap.add_argument("--data", type=Path, default=common.DEFAULT_MULTI30K, help="the raw Multi30k folder (read only)")
    ap.add_argument("--data-dir", type=Path, help="prepared data to reuse (created when missing); default: a temp dir")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    shapes = [s for s in args.shapes.split(",") if s]
    precisions = [p for p in args.precisions.split(",") if p]

    with tempfile.TemporaryDirectory(prefix="mtkit-bench-") as tmp:
        store = prepared_store(args.data, args.data_dir or Path(tmp) / "data")
        print(f"# benchmarks/train.py, {datetime.date.today()}, {common.machine()}, {args.threads} threads")
        print(f"# full training steps on Multi30k train ({len(store)} pairs, 8k joint BPE); "
              f"{args.steps} timed steps after {args.warmup} warm-up, median")
        rows, prec_rows = [], []
        for shape in shapes:
            cfg, V = common.model_config(shape), common.vocab_size(shape)
            budget = args.base_tokens if shape == "base" else args.max_tokens
            n = args.warmup + args.steps
            batches = common.token_batches(store, budget, n)
            hf_bs = args.hf_batch or common.naive_batch_size(store, batches)
            naive = common.sentence_batches(store, hf_bs, n)
            probes = {p: common.PeakProbe(torch.float32 if p == "fp32" else torch.bfloat16,
                                          common.peak_sizes(cfg, V, budget)) for p in precisions}
            runners = []
            for p in precisions:
                trainer = mtkit_trainer(shape, p)
                runners.append(make_runner(f"mtkit {p}", lambda b, t=trainer: t.train_step([b]), batches))
                runners.append(make_runner(f"marian {p}", marian_trainer(shape, p), naive))
                if args.compile:
                    ctrainer = mtkit_trainer(shape, p, compile=True)
                    runners.append(make_runner(f"mtkit {p} compiled", lambda b, t=ctrainer: t.train_step([b]), batches))
            log(f"{shape}: {len(runners)} runners, {args.warmup}+{args.steps} steps each")
            common.interleaved(runners + [make_runner(f"peak {p}", probes[p], batches) for p in precisions],
                               args.warmup, args.steps, log)
            peaks = {p: probe.peak() for p, probe in probes.items()}
            log(f"{shape}: peaks " + ", ".join(f"{p} {v / 1e9:.0f} GFLOP/s" for p, v in peaks.items()))
            by_name = {r.name: r for r in runners}
            for p in precisions:
                for variant in ["mtkit"] + (["mtkit compiled"] if args.compile else []):
                    m = by_name[f"mtkit {p}" if variant == "mtkit" else f"mtkit {p} compiled"]
                    h = by_name[f"marian {p}"]
                    mt_tps, hf_tps = common.tokens_per_s(m), common.tokens_per_s(h)
                    rows.append([shape, p, variant, f"{mt_tps:,.0f}", f"{common.padding_fraction(batches):.1%}",
                                 f"{hf_tps:,.0f}", f"{common.padding_fraction(naive):.1%} ({hf_bs}/batch)",
                                 f"{mt_tps / hf_tps:.2f}x",
                                 f"{common.flops_per_s(cfg, V, m) / peaks[p]:.2f}",
                                 f"{common.flops_per_s(cfg, V, h) / peaks[p]:.2f}"])
            if {"fp32", "bf16"} <= set(precisions):
                t32, t16 = (common.tokens_per_s(by_name[f"mtkit {p}"]) for p in ("fp32", "bf16"))
                h32, h16 = (common.tokens_per_s(by_name[f"marian {p}"]) for p in ("fp32", "bf16"))
                prec_rows.append([shape, f"{t16 / t32:.2f}x", "bf16" if t16 > t32 else "fp32",
                                  f"{h16 / h32:.2f}x", f"{peaks['bf16'] / peaks['fp32']:.2f}x",
                                  f"{peaks['fp32'] / 1e9:.0f} / {peaks['bf16'] / 1e9:.0f}"])
            log(f"{shape} done")

    print()
    print("## training steps: mtkit (token batches) vs MarianMT (fixed-size sentence batches), target tokens/s")
    common.print_table(["shape", "precision", "mtkit", "mtkit tok/s", "mtkit pad", "MarianMT tok/s", "MarianMT pad",
                        "ratio", "mtkit MFU", "MarianMT MFU"], rows)
    if prec_rows:
        print()
        print("## bf16 against fp32 (same run)")
        common.print_table(["shape", "mtkit bf16/fp32", "mtkit faster in", "MarianMT bf16/fp32",
                            "matmul peak bf16/fp32", "peak GFLOP/s fp32 / bf16"], prec_rows)


if __name__ == "__main__":
    main()
