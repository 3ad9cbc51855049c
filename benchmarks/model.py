"""Forward+backward speed of mtkit's Transformer against Hugging Face's MarianMTModel.

For each shape (``tiny``: the multi30k recipe's transformer-tiny, vocab 8k; ``small``:
d_model 256, 3+3 layers, 4 heads, FFN 1024, vocab 8k; ``base``: transformer-base,
vocab 32k) and precision (fp32; bf16 = CPU autocast), both models run forward, the
label-smoothed loss (ε = 0.1, summed over real target tokens) and backward on the
same synthetic batches: random ids with Multi30k-like lengths (10-30 source tokens),
cut by mtkit's token batching (``--max-tokens``, 4,096 tokens; ``--base-tokens`` for base,
by default the same 4,096, which takes about 3 minutes at base on 2 cores; real base training
batches 25k tokens per update). MarianMT is randomly initialized with
the same dimensions and dropout, and its loss is ``F.cross_entropy(label_smoothing=0.1)``.
Steps of all runners are interleaved round by round and the median is kept.

MFU = achieved model FLOPs/s ÷ the best matmul FLOP/s measured in this run at the
same precision on the model's own matmul sizes; FLOPs are counted as described in
benchmarks/common.py (6 × matmul parameters × real tokens, plus attention).

Then, for ``--lever-shapes``, each speed lever is measured on its own against the
mtkit default (eager model, the (N, V) logits then the chunked loss, token batches):
  * the loss: the output projection fused into the chunked loss (the logits never whole; the
    GPU default), or the reference formula (a float32 log-softmax of the whole N × V matrix);
  * ``torch.compile`` of the model, and of the model and the reference loss;
  * bf16 only: the model's weights stored in bf16 (no autocast, no casts at all: an
    upper bound on what fewer dtype casts could give; not used for training);
  * padding: naive fixed-size sentence batches instead of token batches;
  * the kernels: ``kernels=reference`` (every formula as written: ``F.dropout``, the plain attention
    formula, the reference loss) instead of ``auto``; and, each alone within ``auto`` (a
    :class:`mtkit.kernels.Kernels` with one kernel swapped, passed to the model at construction):
  * dropout: ``F.dropout`` (bernoulli_ masks) instead of mtkit's CPU dropout (16-bit masks);
  * attention: always the fused ``scaled_dot_product_attention`` kernel, where ``auto`` on CPU
    training uses the plain formula in bf16 and for heads with d_k < 64;
  * the optimizer step alone: AdamW fused / foreach / for-loop (ms per step).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/model.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/model.py --shapes base --steps 5 --lever-shapes none

Needs ``pip install 'mtkit[bench]'`` (transformers, psutil).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import Runner, make_runner, precision_context  # noqa: E402

from mtkit.config import PAD_ID  # noqa: E402
from mtkit.kernels import AUTO, Kernels, reference_dropout, sdpa_attention  # noqa: E402
from mtkit.kernels.loss import label_smoothed_loss, reference_label_smoothed_loss  # noqa: E402
from mtkit.model import Transformer  # noqa: E402
from mtkit.training.loss import TranslationLoss  # noqa: E402

EPS = 0.1


def log(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def mtkit_step(model, precision: str, loss_fn=None, autocast: bool = True, fuse_projection=None):
    """One step of mtkit: by default what training runs (TranslationLoss with the model's kernels: on
    CPU the logits, then the chunked loss); ``fuse_projection=True``: the output projection fused into
    the loss (the GPU default); with ``loss_fn``, the model's logits and that loss."""
    criterion = TranslationLoss(model, EPS, PAD_ID, fuse_projection=fuse_projection,
                                kernels=getattr(model, "kernels", "auto"))

    def step(batch) -> None:
        model.zero_grad(set_to_none=True)
        with precision_context(precision if autocast else "fp32"):
            if loss_fn is None:
                loss, _, n = criterion(batch.src, batch.tgt_in, batch.tgt_out)
            else:
                logits = model(batch.src, batch.tgt_in)  # (B, T, V)
        if loss_fn is not None:
            loss, _, n = loss_fn(logits, batch.tgt_out, EPS, PAD_ID)
        (loss / n).backward()

    return step


def build_mtkit(shape: str, kernels: str | Kernels = "auto"):
    """mtkit's model of ``shape`` with the given kernels; the same weights as ``common.build_mtkit``."""
    V = common.vocab_size(shape)
    torch.manual_seed(0)
    return Transformer(common.model_config(shape), V, V, pad_id=PAD_ID, kernels=kernels)


# Each lever swaps one kernel of ``auto`` (no monkeypatching: the model is built with these kernels).
BERNOULLI_DROPOUT = replace(AUTO, name="auto, F.dropout", dropout=reference_dropout)
SDPA_ATTENTION = replace(AUTO, name="auto, SDPA attention", attention=sdpa_attention)


def compiled_loss(loss_fn):
    compiled = torch.compile(loss_fn, dynamic=True)
    return compiled


def marian_step(model, precision: str):
    def step(batch) -> None:
        model.zero_grad(set_to_none=True)
        with precision_context(precision):
            loss = common.marian_loss(model, batch, EPS)
        (loss / batch.n_tgt_tokens).backward()

    return step


def optimizer_ms(model, mode: str, reps: int) -> float:
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    kwargs = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    opt = torch.optim.AdamW(params, **kwargs,
                            **({"fused": True} if mode == "fused" else {"foreach": mode == "foreach"}))
    for _ in range(2):
        opt.step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="tiny,small,base", help="comma-separated: tiny, small, base")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per runner")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per runner first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4096, help="token budget of a batch (tiny, small)")
    ap.add_argument("--base-tokens", type=int, default=4096, help="token budget of a batch at the base shape")
    ap.add_argument("--lever-shapes", default="small", help="shapes to measure the levers at ('none': skip)")
    ap.add_argument("--compile", action="store_true",
                    help="also measure the torch.compile levers (each compile takes minutes on 2 cores)")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    shapes = [s for s in args.shapes.split(",") if s]
    precisions = [p for p in args.precisions.split(",") if p]
    lever_shapes = [s for s in args.lever_shapes.split(",") if s and s != "none"]

    print(f"# benchmarks/model.py, {datetime.date.today()}, {common.machine()}, {args.threads} threads")
    print(f"# forward + label-smoothed loss + backward; {args.steps} timed steps after {args.warmup} warm-up, median")
    rows, lever_rows, opt_rows = [], [], []
    for shape in shapes:
        cfg, V = common.model_config(shape), common.vocab_size(shape)
        budget = args.base_tokens if shape == "base" else args.max_tokens
        store = common.synthetic_store(4000, V)
        batches = common.token_batches(store, budget, args.warmup + args.steps)
        naive_bs = common.naive_batch_size(store, batches)
        probes = {p: common.PeakProbe(torch.float32 if p == "fp32" else torch.bfloat16,
                                      common.peak_sizes(cfg, V, budget)) for p in precisions}
        mt, hf = build_mtkit(shape), common.build_marian(shape)
        mt.train(), hf.train()
        runners: list[tuple[str, Runner]] = []
        for p in precisions:
            runners.append((p, make_runner(f"mtkit {p}", mtkit_step(mt, p), batches)))
            runners.append((p, make_runner(f"marian {p}", marian_step(hf, p), batches)))
        levers = shape in lever_shapes
        if levers:
            variants = {name: build_mtkit(shape, k).train() for name, k in
                        (("reference", "reference"), ("dropout", BERNOULLI_DROPOUT), ("attention", SDPA_ATTENTION))}
            naive = common.sentence_batches(store, naive_bs, args.warmup + args.steps)
            for p in precisions:
                runners.append((p, make_runner(f"mtkit {p}, projection fused into the loss",
                                               mtkit_step(mt, p, fuse_projection=True), batches)))
                runners.append((p, make_runner(f"mtkit {p}, logits + reference loss",
                                               mtkit_step(mt, p, reference_label_smoothed_loss), batches)))
                runners.append((p, make_runner(f"mtkit {p}, naive sentence batches ({naive_bs}/batch)",
                                               mtkit_step(mt, p), naive)))
                runners.append((p, make_runner(f"mtkit {p}, kernels=reference",
                                               mtkit_step(variants["reference"], p), batches)))
                runners.append((p, make_runner(f"mtkit {p}, F.dropout (bernoulli_ masks)",
                                               mtkit_step(variants["dropout"], p), batches)))
                runners.append((p, make_runner(f"mtkit {p}, SDPA (flash) attention",
                                               mtkit_step(variants["attention"], p), batches)))
                if p == "bf16":
                    mt16 = common.build_mtkit(shape).to(torch.bfloat16).train()
                    runners.append((p, make_runner(f"mtkit {p}, bf16 weights, no autocast",
                                                   mtkit_step(mt16, p, autocast=False), batches)))
                if args.compile:
                    cm = torch.compile(common.build_mtkit(shape).train(), dynamic=True)
                    runners.append((p, make_runner(f"mtkit {p}, compile(model) + chunked loss",
                                                   mtkit_step(cm, p, label_smoothed_loss), batches)))
                    cm2 = torch.compile(common.build_mtkit(shape).train(), dynamic=True)
                    runners.append((p, make_runner(f"mtkit {p}, compile(model) + compile(reference loss)",
                                                   mtkit_step(cm2, p, compiled_loss(reference_label_smoothed_loss)),
                                                   batches)))
        run = [r for _, r in runners]
        log(f"{shape}: {len(run)} runners, {args.warmup}+{args.steps} steps each")
        common.interleaved(run + [make_runner(f"peak {p}", probes[p], batches) for p in precisions],
                           args.warmup, args.steps, log)
        peaks = {p: probe.peak() for p, probe in probes.items()}
        log(f"{shape}: peaks " + ", ".join(f"{p} {v / 1e9:.0f} GFLOP/s" for p, v in peaks.items()))

        by_name = {r.name: r for r in run}
        for p in precisions:
            m, h = by_name[f"mtkit {p}"], by_name[f"marian {p}"]
            mt_tps, hf_tps = common.tokens_per_s(m), common.tokens_per_s(h)
            rows.append([shape, p, f"{statistics.mean(b.n_tgt_tokens for b in batches):.0f}",
                         f"{mt_tps:,.0f}", f"{hf_tps:,.0f}", f"{mt_tps / hf_tps:.2f}x",
                         f"{common.flops_per_s(cfg, V, m) / peaks[p]:.2f}",
                         f"{common.flops_per_s(cfg, V, h) / peaks[p]:.2f}", f"{peaks[p] / 1e9:.0f}"])
        if levers:
            for p, r in runners:
                if r.name.startswith("marian"):
                    continue
                base = common.tokens_per_s(by_name[f"mtkit {p}"])
                tps = common.tokens_per_s(r)
                lever_rows.append([shape, r.name, f"{tps:,.0f}", f"{tps / base:.2f}x",
                                   f"{common.flops_per_s(cfg, V, r) / peaks[p]:.2f}",
                                   f"{common.padding_fraction(r.batches):.1%}"])
            for mode in ("fused", "foreach", "for-loop"):
                opt_rows.append([shape, mode, f"{optimizer_ms(mt, mode, 5):.1f}"])
        fp32_bf16 = [f"{p} {common.tokens_per_s(by_name[f'mtkit {p}']):,.0f}" for p in precisions]
        log(f"{shape} done: mtkit " + ", ".join(fp32_bf16))

    print()
    print("## mtkit vs MarianMT, forward + loss + backward (target tokens/s)")
    common.print_table(["shape", "precision", "tgt tok/batch", "mtkit tok/s", "MarianMT tok/s", "ratio",
                        "mtkit MFU", "MarianMT MFU", "peak GFLOP/s"], rows)
    if lever_rows:
        print()
        print("## levers, each alone (ratio: against the mtkit default row of the same precision)")
        common.print_table(["shape", "variant", "tok/s", "ratio", "MFU", "padding"], lever_rows)
        print()
        print("## optimizer step alone (AdamW, all parameters)")
        common.print_table(["shape", "AdamW", "ms/step"], opt_rows)


if __name__ == "__main__":
    main()
