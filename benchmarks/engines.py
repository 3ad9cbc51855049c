"""Real text through each engine, whole processes and in-process: torch, torch with the vocabulary shortlist,
CTranslate2, CTranslate2 with its vocabulary map (``use_vmap``), each in processes of its own.

    python benchmarks/engines.py                        # the shared Multi30k model, test_2016 (1,000 lines)
    python benchmarks/engines.py -m RUN --lines 500     # another run directory
    python benchmarks/engines.py --shape opus --lines 200 --single 20   # a random model of OPUS-MT's shape

The parent copies the run into a temporary folder, builds its shortlist there (``mtkit shortlist``) and exports
it (``mtkit export ctranslate2``: the export carries the shortlist as ``vmap.txt``). ``--shape opus`` builds a
random MarianMTModel of OPUS-MT's shape instead (benchmarks/translate.py's, imported with ``mtkit import marian``;
its shortlist comes from Multi30k's training text). Random weights give random outputs, so every engine writes the
same number of tokens: EOS is banned before ``--max-len`` tokens (``--min-len``) and its output bias makes it the
model's choice right after them, so every line ends there in every engine, none at the maximum length (which
``--max-len-b`` sets at twice as many; an engine may search again there); the integrity guard is off (it would
repair the loops of random outputs) and the identical-lines share says little there.

Whole process: ``python -m mtkit translate`` from start to exit, wall clock: all ``--lines`` lines (the default
batches), and the first ``--single`` lines one at a time (``--batch-tokens 1``). In-process: a worker process
loads the engine with ``mtkit.load`` and times ``Model.translate`` on all lines at once, then on each of the first
``--single`` lines alone, after one warm-up line. Each engine at its best: every figure is measured with each of
``--threads`` CPU threads (default 1 and 2), under each ``OMP_WAIT_POLICY`` (unset, PASSIVE) and in ``--rounds``
alternating rounds, and the fastest is kept (the report says which thread count it had). Beam as the model's config
decodes (the shared model: 5).

Printed: sentences/s per engine and what, the ratios to CTranslate2 (without a map), the share of lines
identical to the same engine's full-vocabulary output, sacreBLEU where references exist, and whether #65's
targets hold in this run (torch whole process >= 0.8x CTranslate2 batched and >= 0.5x one at a time; the
shortlist >= 1.25x the torch engine's sentences/s in-process batched, >= 99 % identical lines, BLEU within 0.1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DEFAULT_MODEL = Path(os.environ.get("MTKIT_MODELS", SHARED / "models")) / "multi30k-en-de"
DEFAULT_DATA = Path(os.environ.get("MTKIT_MULTI30K", SHARED / "data" / "multi30k"))
POLICIES = {"unset": None, "PASSIVE": "PASSIVE"}
ENGINES = {  # name -> (model folder in the work dir, extra flags / load settings)
    "torch": ("run", {"engine": "torch", "shortlist": False}),
    "torch+shortlist": ("run", {"engine": "torch", "shortlist": True}),
    "ct2": ("ct2", {"engine": "ctranslate2", "shortlist": False}),
    "ct2+vmap": ("ct2", {"engine": "ctranslate2", "shortlist": True}),
}


def mtkit(*args: str, env: dict | None = None, stdin=None, stdout=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtkit", *map(str, args)], env=env, stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, check=False)


def policy_env(policy: str, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("OMP_WAIT_POLICY", None)
    if POLICIES[policy]:
        env["OMP_WAIT_POLICY"] = POLICIES[policy]
    return env


# ------------------------------------------------------------------------- setup


def setup(args, work: Path) -> dict:
    """The run (copied or built), its shortlist and its CTranslate2 export in ``work``; what the engines need."""
    run = work / "run"
    if args.shape == "opus":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from translate import SHAPES, build_opus_marian, build_vocab

        build_opus_marian(SHAPES["opus"]["marian"], build_vocab(args.data, 8000), work / "marian", eos_bias=30.0)
        done = mtkit("import", "marian", work / "marian", "-o", run)
        if done.returncode:
            sys.exit(done.stderr.strip().splitlines()[-1])
    else:
        shutil.copytree(args.model, run, ignore=shutil.ignore_patterns("curves.png", "*.jsonl", "last.pt"))
    plan = {"shortlist": False, "lines": args.lines, "single": args.single}
    built = mtkit("shortlist", run, *(["--source", args.data / "train.en", "--target", args.data / "train.de"]
                                      if args.shape == "opus" else []))
    if built.returncode == 0:
        plan["shortlist"] = True
        print(f"# shortlist: {(built.stderr.strip().splitlines() or [''])[-1]}")
    else:
        print(f"note: no shortlist ({(built.stderr.strip().splitlines() or ['?'])[-1]}): its engines are left out")
    done = mtkit("export", "ctranslate2", run, work / "ct2")
    if done.returncode:
        sys.exit(done.stderr.strip().splitlines()[-1])
    return plan


# ------------------------------------------------------------------------ whole


def whole(name: str, policy: str, threads: int, args, work: Path, src: Path, single: Path) -> dict:
    """Wall seconds of ``mtkit translate`` on all lines and on the first ``--single`` one at a time."""
    folder, settings = ENGINES[name]
    flags = ["-m", work / folder, "--engine", settings["engine"], "--threads", threads]
    flags += ["--shortlist" if settings["shortlist"] else "--no-shortlist"]  # whatever the run's config says
    # a random model's outputs loop: the integrity guard would measure its own repairs, not the engines
    flags += (["--max-len-a", 0, "--max-len-b", 2 * args.max_len, "--min-len", args.max_len, "--no-guard"]
              if args.shape == "opus" else [])
    found = {}
    for what, path, extra in (("batched", src, []), ("single", single, ["--batch-tokens", 1])):
        with open(path, encoding="utf-8") as f:
            start = time.perf_counter()
            done = mtkit("translate", *flags, *extra, env=policy_env(policy, threads), stdin=f,
                         stdout=subprocess.PIPE)
            seconds = time.perf_counter() - start
        if done.returncode:
            print(f"note: {name} ({what}) failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
            return {}
        found[what] = {"seconds": seconds, "outputs": done.stdout.splitlines(), "threads": threads}
    return found


# ---------------------------------------------------------------------- worker


def worker(name: str, work: Path, threads: int, max_len: int | None) -> None:
    """In-process figures of engine ``name``: one JSON line on stdout."""
    import mtkit as api

    folder, settings = ENGINES[name]
    plan = json.loads((work / "plan.json").read_text(encoding="utf-8"))
    lines = (work / "src.txt").read_text(encoding="utf-8").splitlines()
    model = api.load(work / folder, engine=settings["engine"], threads=threads)
    options = {"shortlist": settings["shortlist"]}  # whatever the run's config says
    if max_len is not None:  # --shape opus: a random model (see whole())
        options.update(max_len_a=0.0, max_len_b=2 * max_len, min_len=max_len, guard=False)
    model.translate(lines[:1], **options)  # warm-up
    start = time.perf_counter()
    batched = [r.text for r in model.translate(lines, **options)]
    results = {"batched": {"seconds": time.perf_counter() - start, "outputs": batched, "threads": threads}}
    start = time.perf_counter()
    single = [model.translate(line, **options).text for line in lines[: plan["single"]]]
    results["single"] = {"seconds": time.perf_counter() - start, "outputs": single, "threads": threads}
    print(json.dumps(results), flush=True)


def in_process(name: str, policy: str, threads: int, args, work: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--work", str(work),
           "--threads", str(threads)] + (["--shape", "opus", "--max-len", str(args.max_len)]
                                         if args.shape == "opus" else [])
    done = subprocess.run(cmd, env=policy_env(policy, threads), capture_output=True, text=True, check=False)
    found = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not found:
        print(f"note: worker {name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return {}
    return json.loads(found[-1])


# ------------------------------------------------------------------------ report


def best(runs: list[dict], what: str) -> dict | None:
    timed = [r[what] for r in runs if r and what in r]
    return min(timed, key=lambda r: r["seconds"]) if timed else None


def report(figures: dict, args, refs: list[str] | None) -> None:
    import sacrebleu

    n = {"batched": args.lines, "single": args.single}
    rows, rate = [], {}
    for name, kinds in figures.items():
        for kind in ("whole", "inproc"):
            for what in ("batched", "single"):
                got = best(kinds[kind], what)
                if got is None:
                    continue
                rate[name, kind, what] = n[what] / got["seconds"]
                full = best(figures.get(name.split("+")[0], {}).get(kind, []), what)
                same = (sum(a == b for a, b in zip(got["outputs"], full["outputs"])) / len(got["outputs"])
                        if full and "+" in name else None)
                bleu = (sacrebleu.corpus_bleu(got["outputs"], [refs[: len(got["outputs"])]]).score
                        if refs and what == "batched" else None)
                rows.append([name, kind, what, got["threads"], f"{got['seconds']:.2f}", f"{rate[name, kind, what]:.1f}",
                             "" if same is None else f"{100 * same:.1f} %", "" if bleu is None else f"{bleu:.2f}"])
    header = ["engine", "measured", "lines", "threads", "seconds", "sentences/s", "same as full", "BLEU"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print()
    for name in figures:
        for kind in ("whole", "inproc"):
            for what in ("batched", "single"):
                if (name, kind, what) in rate and ("ct2", kind, what) in rate and name != "ct2":
                    print(f"{name} / ct2, {kind}, {what}: {rate[name, kind, what] / rate['ct2', kind, what]:.2f}x")
    checks = [("torch whole process >= 0.8x CTranslate2, batched", ("torch", "whole", "batched"), 0.8),
              ("torch whole process >= 0.5x CTranslate2, one at a time", ("torch", "whole", "single"), 0.5)]
    print()
    for label, key, goal in checks:
        ct2 = ("ct2", *key[1:])
        if key in rate and ct2 in rate:
            ratio = rate[key] / rate[ct2]
            print(f"#65: {label}: {ratio:.2f}x -> {'holds' if ratio >= goal else 'does not hold'}")
    for name, base in (("torch+shortlist", "torch"), ("ct2+vmap", "ct2")):
        key, full = (name, "inproc", "batched"), (base, "inproc", "batched")
        if key in rate and full in rate:
            print(f"#65: {name} in-process batched: {rate[key] / rate[full]:.2f}x the full vocabulary's sentences/s")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path, default=DEFAULT_MODEL, help="run directory (default: shared model)")
    p.add_argument("--shape", choices=("run", "opus"), default="run", help="opus: a random OPUS-MT-shaped model")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k's folder")
    p.add_argument("--lines", type=int, default=1000, help="lines of test_2016_flickr.en translated")
    p.add_argument("--single", type=int, default=100, help="of them, the first N one at a time")
    p.add_argument("--threads", default="1,2", help="CPU threads tried for every engine, comma-separated")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-len", type=int, default=30, help="--shape opus: output tokens of every line")
    p.add_argument("--policies", default="unset,PASSIVE")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args.worker, args.work, int(args.threads), args.max_len if args.shape == "opus" else None)
        return
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # start-up as a user's: Python's compiled modules cached
    work = Path(tempfile.mkdtemp(prefix="mtkit-bench-engines-"))
    try:
        plan = setup(args, work)
        lines = (args.data / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[: args.lines]
        refs_file = args.data / "test_2016_flickr.de"
        refs = refs_file.read_text(encoding="utf-8").splitlines() if args.shape == "run" else None
        (work / "src.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (work / "single.txt").write_text("\n".join(lines[: args.single]) + "\n", encoding="utf-8")
        (work / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
        names = [e for e in args.engines.split(",") if plan["shortlist"] or not ENGINES[e][1]["shortlist"]]
        figures = {name: {"whole": [], "inproc": []} for name in names}
        threads = [int(t) for t in args.threads.split(",")]
        for name in names:  # untimed: the files each engine reads are in the page cache, its modules compiled
            whole(name, "unset", threads[0], args, work, work / "single.txt", work / "single.txt")
        for _ in range(args.rounds):
            for policy in args.policies.split(","):
                for n in threads:
                    for name in names:
                        figures[name]["whole"].append(whole(name, policy, n, args, work, work / "src.txt",
                                                            work / "single.txt"))
                        figures[name]["inproc"].append(in_process(name, policy, n, args, work))
        print(f"# {args.model if args.shape == 'run' else 'opus shape'}: {args.lines} lines, {args.single} one at "
              f"a time, {args.threads} thread(s), policies {args.policies}, {args.rounds} round(s); "
              f"{time.strftime('%Y-%m-%d')}")
        report(figures, args, refs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
