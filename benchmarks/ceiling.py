"""Where a training step's time goes, and the ceiling that its matmul kernels put on #4's targets.

For each shape and precision, the same forward + label-smoothed loss + backward as
``model.py`` (mtkit's training objective; MarianMTModel with ``F.cross_entropy``) runs
under ``torch.profiler``. Each ATen operator's own time ("self CPU time", summed over
the profiled steps) is put in one of two classes:

  * **matmul**: ``mm``, ``addmm``, ``bmm``, ``baddbmm`` and the fused attention kernels
    (``_scaled_dot_product_*``): the work that model FLOPs count;
  * **the rest**: everything else (softmax, LayerNorm, dropout, casts, copies, the loss's
    elementwise passes, the optimizer is not in the step).

If the rest took no time at all, a step would last as long as its matmul kernels. That
gives two ceilings, whatever fusion is done around the matmuls:

  * **MFU ceiling** = model FLOPs of the step ÷ (matmul time × the matmul peak measured in
    the same run, as in ``model.py``);
  * **ratio ceiling** = MarianMT's step time ÷ mtkit's matmul time: the most mtkit could be
    faster than MarianMT while its matmuls run at the speed they run now.

Step times (and so MFU and the ratios) come from unprofiled passes, the two models
alternating; the profiler, which adds a little time to every operator, only gives the
matmul kernels' time and the shares.

A ceiling under a target (MFU ≥ 0.65, ≥ 1.3× MarianMT) means the target needs faster
matmuls at the model's own shapes, not less work around them.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ceiling.py                 # tiny, small (~3 min)
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/ceiling.py --shapes base --steps 3
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from model import marian_step, mtkit_step  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION_PREFIX = "aten::_scaled_dot_product"


def is_matmul(name: str) -> bool:
    return name in MATMUL_OPS or name.startswith(ATTENTION_PREFIX)


def profile_steps(step, batches) -> tuple[float, float, list[tuple[str, float]]]:
    """(wall seconds under the profiler, matmul seconds, the rest's operators as (name, seconds)),
    summed over ``batches``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        wall = time.perf_counter() - start
    matmul, rest = 0.0, []
    for event in prof.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        if is_matmul(event.key):
            matmul += seconds
        else:
            rest.append((event.key, seconds))
    rest.sort(key=lambda item: -item[1])
    return wall, matmul, rest


def plain_seconds(step, batches, rounds: int) -> float:
    """Seconds for one pass over ``batches`` without the profiler: the median of ``rounds`` passes."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="tiny,small", help="comma-separated: tiny, small, base")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=6, help="profiled steps per model")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="unprofiled passes over the steps per model (median)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--top", type=int, default=6, help="how many of the rest's operators to name")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    print(f"# benchmarks/ceiling.py, {datetime.date.today()}, {common.machine()}, {args.threads} threads")
    print(f"# {args.steps} profiled steps after {args.warmup} warm-up; self CPU time per operator class")
    rows, tops = [], []
    for shape in args.shapes.split(","):
        cfg, V = common.model_config(shape), common.vocab_size(shape)
        store = common.synthetic_store(4000, V)
        batches = common.token_batches(store, args.max_tokens, args.warmup + args.steps)
        timed = batches[args.warmup:]
        flops = sum(common.step_flops(cfg, V, b) for b in timed)
        mt, hf = common.build_mtkit(shape), common.build_marian(shape)
        mt.train(), hf.train()
        for precision in args.precisions.split(","):
            probe = common.PeakProbe(torch.float32 if precision == "fp32" else torch.bfloat16,
                                     common.peak_sizes(cfg, V, args.max_tokens))
            for _ in range(5):
                probe()
            peak = probe.peak()
            steps = {"mtkit": mtkit_step(mt, precision), "MarianMT": marian_step(hf, precision)}
            for step in steps.values():
                for batch in batches[: args.warmup]:
                    step(batch)
            # Step times without the profiler (which adds time per operator, more to the model with
            # more operators), alternating the two models; then one profiled pass of each.
            plain = {name: [] for name in steps}
            for _ in range(args.rounds):
                for name, step in steps.items():
                    plain[name].append(plain_seconds(step, timed, 1))
            wall, hf_wall = (statistics.median(plain[name]) for name in steps)
            prof_wall, matmul, rest = profile_steps(steps["mtkit"], timed)
            hf_prof_wall, hf_matmul, _ = profile_steps(steps["MarianMT"], timed)
            rows.append([shape, precision, f"{hf_wall / wall:.2f}x", f"{matmul / prof_wall:.0%}",
                         f"{hf_matmul / hf_prof_wall:.0%}", f"{flops / wall / peak:.2f}",
                         f"{flops / matmul / peak:.2f}", f"{hf_wall / matmul:.2f}x", f"{peak / 1e9:.0f}"])
            tops.append([shape, precision,
                         ", ".join(f"{n.removeprefix('aten::')} {s / prof_wall:.0%}" for n, s in rest[: args.top])])
    print()
    common.print_table(["shape", "precision", "mtkit vs MarianMT", "mtkit matmul share", "MarianMT matmul share",
                        "mtkit MFU", "MFU ceiling", "ratio ceiling", "peak GFLOP/s"], rows)
    print("\n## mtkit: the largest of the rest (share of the step)")
    common.print_table(["shape", "precision", "operators"], tops)
    print("\ntargets (#4): MFU >= 0.65 in bf16, >= 1.3x MarianMT at equal precision; a ceiling below a target "
          "cannot be reached by removing work around the matmuls")


if __name__ == "__main__":
    main()
