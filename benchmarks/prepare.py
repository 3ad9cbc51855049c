"""Benchmark ``mtkit prepare`` on a WMT14-sized corpus, against SentencePiece's own encoding.

Synthesizes ``--pairs`` parallel pairs (default 4.5M, WMT14 en-de's size) by
recombining Multi30k sentences (one or two concatenated, about 19 words a side,
close to WMT14's average) into a temporary directory, prepares it, and prints:

  * wall time and pairs/s of the whole preparation, and its phases;
  * peak memory of the process tree (this process, the SentencePiece training
    child and the encoding workers), sampled from /proc (sum of RSS, which
    counts pages shared after fork once per process, and sum of PSS), and the
    rusage maxima;
  * how long SentencePiece alone takes to encode both sides of the same corpus
    with ``encode(list_of_lines, num_threads=workers)``, and the ratio of
    mtkit's encode-and-store phase to it (target: <= 2).

Usage::

  .venv/bin/python benchmarks/prepare.py --pairs 1000000
  .venv/bin/python benchmarks/prepare.py            # 4.5M pairs
  .venv/bin/python benchmarks/prepare.py --alignments eflomal   # with word alignments (guided alignment)
  .venv/bin/python benchmarks/prepare.py --filters rules          # with the rule filters (data.clean.filters)
  .venv/bin/python benchmarks/prepare.py --filters all            # ... and language ID (lingua)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MULTI30K = REPO.parent / "shared/data/multi30k"


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


def tree_memory_mib(root: int) -> tuple[float, float]:
    """(sum of RSS, sum of PSS) over the process tree, MiB.

    RSS counts pages that forked workers share with their parent once per process;
    PSS divides each shared page among its sharers, so its sum is the tree's real footprint.
    """
    rss = pss = 0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


class PeakSampler(threading.Thread):
    """Samples the process tree's memory every ``interval`` seconds; peaks in MiB."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak_rss, self.peak_pss = interval, 0.0, 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss, pss = tree_memory_mib(os.getpid())
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._stop_event.wait(self.interval)

    def stop(self) -> tuple[float, float]:
        self._stop_event.set()
        self.join()
        return self.peak_rss, self.peak_pss


def synthesize(multi30k: Path, pairs: int, out: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``pairs`` recombined Multi30k pairs to ``out/train.{en,de}``."""
    en = (multi30k / "train.en").read_text(encoding="utf-8").splitlines()
    de = (multi30k / "train.de").read_text(encoding="utf-8").splitlines()
    rng = np.random.default_rng(seed)
    src_path, tgt_path = out / "train.en", out / "train.de"
    with open(src_path, "w", encoding="utf-8") as fs, open(tgt_path, "w", encoding="utf-8") as ft:
        for start in range(0, pairs, 100_000):
            n = min(100_000, pairs - start)
            first = rng.integers(0, len(en), n).tolist()
            second = rng.integers(0, len(en), n).tolist()
            double = (rng.random(n) < 0.5).tolist()
            fs.writelines(en[a] + (" " + en[b] if d else "") + "\n" for a, b, d in zip(first, second, double))
            ft.writelines(de[a] + (" " + de[b] if d else "") + "\n" for a, b, d in zip(first, second, double))
    return src_path, tgt_path


def spm_baseline(model: Path, files: list[Path], workers: int, chunk: int = 100_000) -> tuple[float, float]:
    """Seconds SentencePiece spends encoding ``files`` (encode calls only, and with reading)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    encode_s = 0.0
    start = time.perf_counter()
    for path in files:
        with open(path, encoding="utf-8") as f:
            while lines := [line.rstrip("\n") for _, line in zip(range(chunk), f)]:
                t = time.perf_counter()
                sp.encode(lines, num_threads=workers)
                encode_s += time.perf_counter() - t
    return encode_s, time.perf_counter() - start


RULE_FILTERS = {"nonprinting": {}, "alpha": {}, "repeats": {}, "copy": {}, "numbers": {}, "urls": {}}
FILTERS = {"rules": RULE_FILTERS, "all": {**RULE_FILTERS, "langid": {}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--workers", type=int, default=0, help="0 = one per core")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--sample-size", type=int, default=1_000_000, help="SentencePiece training sentences")
    parser.add_argument("--multi30k", type=Path, default=Path(os.environ.get("MTKIT_MULTI30K", DEFAULT_MULTI30K)))
    parser.add_argument("--tmp", type=Path, default=None, help="where to write the corpus (default: system temp)")
    parser.add_argument("--alignments", choices=["eflomal"], default=None,
                        help="also align the pairs with eflomal (data.alignments), stored for guided alignment")
    parser.add_argument("--filters", choices=["rules", "all"], default=None,
                        help="data.clean.filters: the six rule filters (rules), and language ID (all)")
    args = parser.parse_args()
    if not (args.multi30k / "train.en").is_file():
        sys.exit(f"error: Multi30k not found at {args.multi30k} (set --multi30k or MTKIT_MULTI30K)")

    from mtkit.config import config_from_dict
    from mtkit.data.prepare import prepare_data

    workers = args.workers or os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="mtkit-bench-", dir=args.tmp))
    try:
        t = time.perf_counter()
        src, tgt = synthesize(args.multi30k, args.pairs, work)
        size = (src.stat().st_size + tgt.stat().st_size) / 2**20
        print(f"corpus: {args.pairs} pairs, {size:.0f} MiB, synthesized in {time.perf_counter() - t:.1f} s", flush=True)

        config = config_from_dict({"data": {
            "train": {"src": str(src), "tgt": str(tgt)},
            "spm": {"vocab_size": args.vocab_size, "sample_size": args.sample_size},
            "workers": workers,
            "alignments": args.alignments,
            "clean": {"filters": FILTERS[args.filters]} if args.filters else {},
        }})
        sampler = PeakSampler()
        sampler.start()
        t = time.perf_counter()
        manifest = prepare_data(config.data, work / "prepared", progress=False)
        wall = time.perf_counter() - t
        peak_rss, peak_pss = sampler.stop()
        self_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        children_max = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        timings = manifest["timings_s"]
        print(f"prepare: {wall:.1f} s wall, {args.pairs / wall:,.0f} pairs/s, workers {workers}")
        print("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        print(f"kept {manifest['splits']['train']['pairs']} pairs; dropped {manifest['dropped']['train']}")
        if args.alignments:
            print(f"alignments: {manifest['splits']['train']['alignments']}")
        print(f"peak memory of the process tree (sampled every 0.25 s): RSS sum {peak_rss:.0f} MiB, "
              f"PSS sum {peak_pss:.0f} MiB")
        print(f"rusage max RSS: main {self_max:.0f} MiB, largest child {children_max:.0f} MiB")

        encode_s, with_read_s = spm_baseline(work / "prepared" / "spm.model", [src, tgt], workers)
        encode_train = timings["encode_train"]
        print(f"sentencepiece alone: {encode_s:.1f} s encoding both sides ({with_read_s:.1f} s with reading), "
              f"num_threads={workers}")
        print(f"encode-and-store / sentencepiece encode: {encode_train / encode_s:.2f}x "
              f"({encode_train:.1f} s vs {encode_s:.1f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
