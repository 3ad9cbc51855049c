"""Where a decoding step's time goes: mtkit's torch beam search under ``torch.profiler``, steady state.

Loads a trained model (``-m RUN``, as ``mtkit translate`` does), encodes the first ``--sentences``
lines of ``--input`` with its vocabulary and runs the torch engine's search (``TorchEngine.search_batch``,
the model's beam and length penalty unless ``--beam``) twice per setting: once to warm up (oneDNN
primitives, packed weights, allocator), once timed and profiled. Two settings: one sentence at a time
(batch 1: a pipe, the server at one client) and batches of ``--batch`` sentences.

Per setting it prints the decoder steps (calls of ``decode_step``), the wall time per step and per
sentence, and the profiled self CPU time split into groups of operators, in µs per step and in % of
the wall time; "outside the operators" is the wall time no operator accounts for: Python (the
search's bookkeeping, the fused step's own lines, tensor creation), dispatch, and the profiler's own
cost (it adds a few µs per operator call; the op counts show how many calls each group makes).

    .venv/bin/python benchmarks/decode_profile.py -m work/multi30k/run \\
        --input ../shared/data/multi30k/test_2016_flickr.en --sentences 100 --batch 64
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

# operator name (without "aten::" / "mkldnn::") -> group; anything else is "other ops"
GROUPS = {
    "matmuls": ("_linear_pointwise", "linear", "addmm", "mm", "bmm", "matmul"),
    "attention": ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_attention_math", "softmax", "_softmax"),
    "layer norms": ("layer_norm", "native_layer_norm"),
    "K/V cache (cat, reorder)": ("cat", "index_select"),
    "log-softmax, top-k": ("log_softmax", "_log_softmax", "topk", "sort"),
    "elementwise": ("add", "add_", "mul", "mul_", "div", "div_", "sub", "relu", "silu", "gelu", "where",
                    "masked_fill", "masked_fill_", "eq", "ne", "lt", "gt", "ge", "le", "fill_", "copy_",
                    "clamp", "clamp_", "remainder", "floor_divide", "bitwise_or", "logical_or", "any", "all",
                    "sum", "max", "min", "neg", "exp", "isin"),
    "views, indexing": ("view", "reshape", "_reshape_alias", "unsqueeze", "squeeze", "transpose", "select",
                        "slice", "unbind", "expand", "as_strided", "t", "permute", "contiguous", "clone",
                        "index", "embedding", "gather", "narrow", "split", "stack", "repeat_interleave",
                        "detach", "alias", "_unsafe_view", "flatten", "arange", "nonzero", "item",
                        "_local_scalar_dense", "to", "_to_copy", "empty", "empty_like", "zeros", "full",
                        "scalar_tensor", "lift_fresh", "resize_", "new_empty", "new_zeros", "new_full",
                        "empty_strided", "zero_", "ones", "tensor"),
}
GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}


def group_of(key: str) -> str:
    return GROUP_OF.get(key.split("::")[-1], "other ops")


def profile(translator, batches: list[list[list[int]]]) -> dict:
    """Run the search on ``batches`` once to warm up and once under the profiler."""
    call = translator.call()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = translator.model
    step = model.decode_step
    steps = [0]

    def counted(*a, **k):
        steps[0] += 1
        return step(*a, **k)

    model.decode_step = counted
    try:
        for batch in batches:
            translator.search_batch(batch, call)
        start = time.perf_counter()
        for batch in batches:
            translator.search_batch(batch, call)
        plain = time.perf_counter() - start
        steps[0] = 0
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for batch in batches:
                translator.search_batch(batch, call)
            wall = time.perf_counter() - start
    finally:
        del model.decode_step
    by_group: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    ops = []
    for event in prof.key_averages():
        by_group[group_of(event.key)] += event.self_cpu_time_total  # µs
        calls[group_of(event.key)] += event.count
        ops.append((event.count, event.self_cpu_time_total, event.key))
    return {"wall": wall, "plain": plain, "steps": steps[0], "groups": by_group, "calls": calls,
            "ops": sorted(ops, reverse=True), "sentences": sum(len(b) for b in batches)}


def report(title: str, r: dict) -> None:
    wall_us = r["wall"] * 1e6
    steps = max(1, r["steps"])
    print(f"\n{title}: {r['sentences']} sentences, {r['steps']} decoder steps; without the profiler "
          f"{r['plain']:.2f} s ({r['sentences'] / r['plain']:.1f} sent/s, {r['plain'] * 1e6 / steps:.0f} µs per "
          f"step), profiled {r['wall']:.2f} s ({wall_us / steps:.0f} µs per step):")
    print(f"{'group':<28}{'µs/step':>9}{'% wall':>8}{'calls/step':>11}")
    inside = 0.0
    for group, us in sorted(r["groups"].items(), key=lambda kv: -kv[1]):
        inside += us
        print(f"{group:<28}{us / steps:>9.1f}{100 * us / wall_us:>8.1f}{r['calls'][group] / steps:>11.1f}")
    outside = wall_us - inside
    print(f"{'outside the operators':<28}{outside / steps:>9.1f}{100 * outside / wall_us:>8.1f}")
    print("most called: " + ", ".join(f"{key.split('::')[-1]} {count / steps:.1f}"
                                      for count, _, key in r["ops"][:12]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True, help="a run directory or checkpoint")
    parser.add_argument("--input", type=Path, required=True, help="source sentences, one per line")
    parser.add_argument("--sentences", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch in the batched setting")
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: the model's)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()

    from mtkit.host_memory import keep_freed_memory

    keep_freed_memory()  # as the mtkit command does
    import torch

    from mtkit.api import LoadOptions, load_models
    from mtkit.config import DecodeOptions

    if args.threads:
        torch.set_num_threads(args.threads)
    translator = load_models([args.model], LoadOptions(engine="torch", device="cpu", threads=args.threads,
                                                       any_target=False,
                                                       decode_options=DecodeOptions(beam=args.beam))).engine
    lines = args.input.read_text(encoding="utf-8").splitlines()[: args.sentences]
    from mtkit.engines.engine import _Warnings

    # with EOS, as translate() gives them to the search
    ids = [s for s in translator._encode(lines, 0, translator.call(), _Warnings()) if s]
    print(f"{args.model}: beam {translator.decode.beam}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    report("one sentence at a time", profile(translator, [[s] for s in ids]))
    ordered = sorted(ids, key=len)
    report(f"batches of {args.batch}", profile(translator, [ordered[i : i + args.batch]
                                                             for i in range(0, len(ordered), args.batch)]))


if __name__ == "__main__":
    main()
