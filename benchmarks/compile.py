"""torch.compile against eager mtkit: one training step (forward, label-smoothed loss, backward,
fused AdamW) on mtkit's token batches, target tokens/s.

Variants, each on its own copy of the model (same initialization):
  * eager: what training runs today;
  * layers: each encoder and decoder layer compiled alone, dynamic shapes ("regional"
    compilation: the layer code is compiled once and shared by every layer; the embeddings,
    output projection, chunked loss and optimizer stay eager);
  * model (``--whole``): the whole model compiled, dynamic shapes (slow to compile on 2 cores).

The first step of a compiled variant compiles it and is reported apart (seconds); its timed
steps are interleaved with eager's round by round and the median is kept. A timed step over
5x its variant's median is counted as a recompile (a new batch shape the compiled graph did
not cover).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/compile.py                      # tiny, fp32 and bf16
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/compile.py --shapes small --whole
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import make_runner, precision_context  # noqa: E402

from mtkit.config import PAD_ID  # noqa: E402
from mtkit.training.loss import TranslationLoss  # noqa: E402


def build(shape: str, variant: str):
    model = common.build_mtkit(shape).train()
    if variant == "layers":
        for layer in list(model.encoder.layers) + list(model.decoder.layers):
            layer.compile(dynamic=True)
    elif variant == "model":
        model = torch.compile(model, dynamic=True)
    return model


def train_step(model, precision: str):
    criterion = TranslationLoss(model, 0.1, PAD_ID)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(batch) -> None:
        with precision_context(precision):
            loss, _, n = criterion(batch.src, batch.tgt_in, batch.tgt_out)
        (loss / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="tiny")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--whole", action="store_true", help="also compile the whole model")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    variants = ["eager", "layers"] + (["model"] if args.whole else [])

    print(f"# benchmarks/compile.py, {datetime.date.today()}, {common.machine()}, {args.threads} threads")
    print(f"# training step (forward, loss, backward, fused AdamW), {args.steps} timed steps, median")
    rows = []
    for shape in args.shapes.split(","):
        store = common.synthetic_store(20000, common.vocab_size(shape))
        batches = common.token_batches(store, args.max_tokens, args.steps + 1)
        shapes = len({(tuple(b.src.shape), tuple(b.tgt_in.shape)) for b in batches})
        for precision in args.precisions.split(","):
            runners, first = [], {}
            for variant in variants:
                step = train_step(build(shape, variant), precision)
                start = time.perf_counter()
                step(batches[-1])  # compiles a compiled variant; not timed with the others
                first[variant] = time.perf_counter() - start
                runners.append(make_runner(variant, step, batches[:-1]))
            common.interleaved(runners, 0, args.steps)
            eager = common.tokens_per_s(runners[0])
            for r in runners:
                median = statistics.median(t for t, _ in r.records)
                slow = sum(t > 5 * median for t, _ in r.records)
                tps = common.tokens_per_s(r)
                rows.append([shape, precision, r.name, f"{first[r.name]:.1f}", f"{tps:,.0f}", f"{tps / eager:.2f}x",
                             f"{slow}/{len(r.records)}", shapes])
    common.print_table(["shape", "precision", "variant", "first step s", "tgt tok/s", "vs eager", "recompiles",
                        "batch shapes"], rows)


if __name__ == "__main__":
    main()
