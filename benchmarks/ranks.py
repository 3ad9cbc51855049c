"""Training throughput of one process with several threads against DDP ranks of fewer threads.

Runs the real ``mtkit train`` (a recipe, default ``recipes/multi30k-en-de.yaml``) for
``--steps`` updates in each layout PxT (P processes through ``train.processes``, that is
torchrun, T threads each), with the same tokens per update (``--tokens``, split evenly
over the ranks as ``train.max_tokens``) and no validation or checkpoints until the end.
Layouts alternate round by round so that a slower minute of a shared machine hits all
of them. Prints updates per minute and target tokens/s (median of the logged windows),
and each layout's ratio against the first.

    .venv/bin/python benchmarks/ranks.py --multi30k ../shared/data/multi30k       # 1x2 vs 2x1
    .venv/bin/python benchmarks/ranks.py --multi30k ../shared/data/multi30k --layouts 1x2,2x1 --steps 500 --rounds 1

The data is prepared once into a temporary directory (or ``--data-dir``, kept) from the
recipe's data section (the hub by default; ``--multi30k DIR``: a local copy of the raw files,
only read).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def run_layout(recipe: Path, data: Path, run: Path, processes: int, threads: int, tokens: int, steps: int) -> dict:
    sets = {"train.processes": processes, "train.max_tokens": tokens // processes, "train.max_steps": steps,
            "train.max_minutes": 0, "train.valid_every": 0, "train.bleu_every": 0, "train.save_every": 0,
            "train.average_last": 0, "train.log_every": 25}
    cmd = [sys.executable, "-m", "mtkit", "train", str(recipe), "-d", str(data), "-r", str(run)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(cmd, env=env, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    windows = [r["tgt_tokens_per_s"] for r in records if "tgt_tokens_per_s" in r][1:]  # the first holds start-up
    minutes = next(r["minutes"] for r in records if r.get("event") == "end")
    return {"updates_per_min": steps / minutes, "tok_s": statistics.median(windows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "multi30k-en-de.yaml")
    ap.add_argument("--layouts", default="1x2,2x1", help="comma-separated PROCESSESxTHREADS")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per update (max_tokens summed over ranks)")
    ap.add_argument("--steps", type=int, default=250, help="updates per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, help="prepared data to reuse (created when missing); default: a temp dir")
    ap.add_argument("--multi30k", type=Path,
                    help="a local copy of Multi30k's raw files instead of the recipe's hub source")
    args = ap.parse_args()
    layouts = [tuple(int(x) for x in item.split("x")) for item in args.layouts.split(",") if item]

    from mtkit.commands.prepare import prepare
    from mtkit.config import load_config

    with tempfile.TemporaryDirectory(prefix="mtkit-ranks-") as tmp:
        data = args.data_dir or Path(tmp) / "data"
        os.chdir(REPO)  # recipes name their corpora relative to the repository root
        local = []
        if args.multi30k:
            root = args.multi30k.resolve()
            local = [f"data.{split}={{kind: files, src: {root / name}.en, tgt: {root / name}.de}}"
                     for split, name in (("train", "train"), ("valid", "val"), ("test", "test_2016_flickr"))]
        prepare(load_config(args.recipe, local), data, progress=False)
        results: dict[tuple[int, int], list[dict]] = {layout: [] for layout in layouts}
        for r in range(args.rounds):
            for p, t in layouts:
                res = run_layout(args.recipe, data, Path(tmp) / f"run-{p}x{t}-{r}", p, t, args.tokens, args.steps)
                results[(p, t)].append(res)
                print(f"  [{time.strftime('%H:%M:%S')}] round {r + 1}: {p}x{t}: "
                      f"{res['updates_per_min']:.1f} updates/min, {res['tok_s']:,.0f} tgt tok/s",
                      file=sys.stderr, flush=True)

    print(f"# benchmarks/ranks.py, {datetime.date.today()}, {common.machine()}; recipe {args.recipe.name}, "
          f"{args.tokens} tokens per update, {args.steps} updates per run, {args.rounds} rounds (median)")
    first = None
    rows = []
    for p, t in layouts:
        upm = statistics.median(r["updates_per_min"] for r in results[(p, t)])
        tps = statistics.median(r["tok_s"] for r in results[(p, t)])
        first = first or upm
        rows.append([f"{p}x{t}", p, t, args.tokens // p, f"{upm:.1f}", f"{tps:,.0f}", f"{upm / first:.2f}x"])
    common.print_table(["layout", "processes", "threads each", "max_tokens each", "updates/min", "tgt tok/s",
                        "updates/min vs first"], rows)


if __name__ == "__main__":
    main()
