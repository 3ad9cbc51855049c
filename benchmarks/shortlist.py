"""The vocabulary shortlist (``mtkit shortlist``, ``translate --shortlist``): speed and faithfulness.

Builds the shortlist of a run into a temporary copy of it (from the Multi30k training pairs), then translates
test_2016_flickr (1,000 lines, beam 5, 1 thread) in-process with the torch engine without and with the shortlist,
and with CTranslate2 without and with its vocabulary map (``use_vmap``), each engine in its own process; prints
sentences/s without/with, the share of lines identical to the full search, and sacreBLEU both ways.

    python benchmarks/shortlist.py -m ../shared/models/multi30k-en-de [--per-source 64 --frequent 256]
    python benchmarks/shortlist.py -m ../shared/models/multi30k-en-de --settings 32:128,64:256,128:512,256:1024

``--settings`` measures several shortlists (per_source:frequent) one after another: how faithfulness and speed
trade against each other.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time, dataclasses
engine_name, model, src, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import mtkit
lines = open(src, encoding="utf-8").read().splitlines()
m = mtkit.load(model, engine=engine_name, threads=1)
out = {}
for shortlist in (False, True):
    best, texts = None, None
    for _ in range(rounds):
        t = time.perf_counter()
        texts = [r.text for r in m.translate(lines, beam=5, shortlist=shortlist)]
        took = time.perf_counter() - t
        best = took if best is None else min(best, took)
    out[str(shortlist)] = {"seconds": best, "texts": texts}
print(json.dumps(out))
"""


def writable_copy(model: Path, into: Path) -> Path:
    """A copy of a (read-only) run directory that a shortlist can be written into."""
    copy = into / "run"
    shutil.copytree(model, copy)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return copy


def run_engine(engine: str, model: Path, src: Path, rounds: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", WORKER, engine, str(model), str(src), str(rounds)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{engine}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("--multi30k", type=Path, default=Path(os.environ.get(
        "MTKIT_MULTI30K", ROOT.parent / "shared" / "data" / "multi30k")))
    parser.add_argument("--per-source", type=int, default=None)
    parser.add_argument("--frequent", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=1, help="translations of the test set per setting (best kept)")
    parser.add_argument("--engines", default="torch,ctranslate2")
    parser.add_argument("--settings", default=None, help="per_source:frequent,... (several shortlists in turn)")
    args = parser.parse_args()

    import sacrebleu

    from mtkit.commands.shortlist import ShortlistOptions, build_shortlist

    data = args.multi30k
    src, ref = data / "test_2016_flickr.en", data / "test_2016_flickr.de"
    refs = ref.read_text(encoding="utf-8").splitlines()
    settings = ([tuple(int(x) for x in pair.split(":")) for pair in args.settings.split(",")] if args.settings
                else [(args.per_source, args.frequent)])
    rows = []
    with tempfile.TemporaryDirectory(prefix="mtkit-shortlist-bench-") as tmp:
        run = writable_copy(args.model, Path(tmp))
        for per_source, frequent in settings:
            build_shortlist(run, ShortlistOptions(source=data / "train.en", target=data / "train.de",
                                                  per_source=per_source, frequent=frequent, progress=False))
            for engine in args.engines.split(","):
                found = run_engine(engine, run, src, args.rounds)
                full, short = found["False"], found["True"]
                n = len(full["texts"])
                same = sum(a == b for a, b in zip(full["texts"], short["texts"]))
                bleu = [sacrebleu.corpus_bleu(x["texts"], [refs]).score for x in (full, short)]
                label = "defaults" if per_source is None else f"{per_source}:{frequent}"
                rows.append((label, engine, n / full["seconds"], n / short["seconds"], same / n, *bleu))
    print(f"{'setting':<9} {'engine':<12} {'sent/s full':>11} {'sent/s short':>12} {'speed-up':>9} {'identical':>9} "
          f"{'BLEU full':>9} {'BLEU short':>10}")
    for label, engine, full_rate, short_rate, same, b_full, b_short in rows:
        gain = short_rate / full_rate - 1
        print(f"{label:<9} {engine:<12} {full_rate:>11.1f} {short_rate:>12.1f} {gain:>+9.1%} {same:>9.1%} "
              f"{b_full:>9.2f} {b_short:>10.2f}")


if __name__ == "__main__":
    main()
