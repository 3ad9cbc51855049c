"""Speed that holds on a busy machine: mtkit's work quiet and beside 1 and 2 CPU-bound processes, each
as a ratio to its own quiet figure, in one run.

A user's machine is never idle. Each busy process is ``python3 -c 'while True: pass'`` started with
``setsid`` (its own session and scheduling group, as a program in another terminal is). Every figure is
a whole ``mtkit`` process (start-up included, as a user sees it), the best of ``--rounds``:

* ``train``: ``mtkit train recipes/demo.yaml`` for ``--train-steps`` steps (no validation);
* ``translate``: the torch engine on ``--lines`` lines at beam 5, and on ``--latency-n`` lines one at a
  time (``--batch-tokens 1``) at beam 4; the same with ``--engine ctranslate2`` on the export (when
  ctranslate2 is installed);
* ``serve``: requests per second of ``mtkit serve`` answering ``--requests`` one-line requests from 8
  client threads (the server started once per condition; its start is not timed).

The model is the demo recipe trained here for ``--model-steps`` steps (quiet, before any timing), its
inputs the demo test split, repeated. ``OMP_WAIT_POLICY`` is left as it is in the environment (run the
script both ways to compare). Nothing is written outside ``--work`` (a temporary folder by default).

    python benchmarks/busy.py                      # everything, 3 rounds, quiet / 1 busy / 2 busy
    python benchmarks/busy.py --rounds 1 --skip serve ctranslate2   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MTKIT = [sys.executable, "-m", "mtkit"]
BUSY = [sys.executable, "-c", "while True: pass"]


def run(args: list, stdin: Path | None = None, quiet: bool = True) -> float:
    """Wall seconds of one whole mtkit process (an error stops the benchmark)."""
    start = time.perf_counter()
    with open(stdin or os.devnull, "rb") as source:
        done = subprocess.run([*MTKIT, *map(str, args)], stdin=source, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE if quiet else None, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"mtkit {' '.join(map(str, args))} failed:\n{(done.stderr or b'').decode()[-2000:]}")
    return seconds


class Busy:
    """``n`` CPU-bound processes, each in a session of its own, for the length of a ``with`` block."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Busy:
        self.procs = [subprocess.Popen(BUSY, start_new_session=True) for _ in range(self.n)]
        time.sleep(1.0)  # let the scheduler and the load readings see them
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def serve_rate(model: Path, lines: list[str], requests: int, clients: int = 8) -> float:
    """Requests per second of one ``mtkit serve`` (its start-up not timed)."""
    proc = subprocess.Popen([*MTKIT, "serve", "-m", str(model), "--port", "0", "--device", "cpu"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        url = None
        assert proc.stderr is not None
        for line in proc.stderr:
            m = re.search(r"serving on (http://\S+?)/ ", line)
            if m:
                url = m.group(1)
                break
        if url is None:
            raise SystemExit(f"the server did not start (exit {proc.wait()})")
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep it drained
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def ask(k: int) -> None:
            body = json.dumps({"q": lines[k % len(lines)], "source": "en", "target": "de"}).encode()
            req = urllib.request.Request(f"{url}/translate", data=body, headers={"Content-Type": "application/json"})
            with opener.open(req, timeout=600) as response:
                response.read()

        ask(0)  # warm-up
        counter = iter(range(requests))
        lock = threading.Lock()

        def client() -> None:
            while True:
                with lock:
                    k = next(counter, None)
                if k is None:
                    return
                ask(k)

        start = time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(clients)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return requests / (time.perf_counter() - start)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="Folder for the data, model and inputs (default: a temporary one).")
    parser.add_argument("--busy", default="0,1,2", help="Numbers of busy processes (0 = quiet, first).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--model-steps", type=int, default=600)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--latency-n", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--skip", nargs="*", default=[], choices=["train", "torch", "ctranslate2", "serve"])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mtkit-busy-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        recipe = REPO / "recipes" / "demo.yaml"
        data, model = work / "data", work / "model"
        if not (data / "manifest.json").is_file():
            run(["prepare", recipe, "-o", data])
        if not (model / "checkpoints" / "last.pt").is_file():
            run(["train", recipe, "-d", data, "-r", model, "--set", f"train.max_steps={args.model_steps}"])
        sources = (data / "test.src.txt").read_text(encoding="utf-8").splitlines()
        batched, single = work / "batched.txt", work / "single.txt"
        batched.write_text("".join(sources[k % len(sources)] + "\n" for k in range(args.lines)), encoding="utf-8")
        single.write_text("".join(s + "\n" for s in sources[: args.latency_n]), encoding="utf-8")
        ct2 = work / "ct2"
        if "ctranslate2" not in args.skip and not ct2.is_dir():
            try:
                run(["export", "ctranslate2", model, ct2])
            except SystemExit as e:
                print(f"# ctranslate2 left out: {str(e).splitlines()[-1]}", flush=True)
                args.skip.append("ctranslate2")

        work_items: dict[str, tuple[str, object]] = {}  # name -> (unit, callable returning a figure)
        if "train" not in args.skip:
            def train() -> float:
                run_dir = work / "train"  # a fresh run each time (one left by an earlier round would resume)
                shutil.rmtree(run_dir, ignore_errors=True)
                return run(["train", recipe, "-d", data, "-r", run_dir, "--set", f"train.max_steps={args.train_steps}",
                            "--set", "train.valid_every=0"])

            work_items[f"train, {args.train_steps} demo steps"] = ("s", train)
        if "torch" not in args.skip:
            work_items[f"translate, torch, {args.lines} lines, beam 5"] = (
                "s", lambda: run(["translate", "-m", model, "--beam", "5"], batched))
            work_items[f"translate, torch, {args.latency_n} lines one at a time, beam 4"] = (
                "s", lambda: run(["translate", "-m", model, "--beam", "4", "--batch-tokens", "1"], single))
        if "ctranslate2" not in args.skip:
            work_items[f"translate, ctranslate2, {args.lines} lines, beam 5"] = (
                "s", lambda: run(["translate", "--engine", "ctranslate2", "-m", ct2, "--beam", "5"], batched))
            work_items[f"translate, ctranslate2, {args.latency_n} lines one at a time, beam 4"] = (
                "s", lambda: run(["translate", "--engine", "ctranslate2", "-m", ct2, "--beam", "4",
                                  "--batch-tokens", "1"], single))
        if "serve" not in args.skip:
            work_items[f"serve, {args.requests} requests, 8 clients"] = (
                "req/s", lambda: serve_rate(model, sources, args.requests))

        levels = [int(x) for x in args.busy.split(",")]
        print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, OMP_WAIT_POLICY="
              f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', '(unset)')}, best of {args.rounds}", flush=True)
        best: dict[tuple[str, int], float] = {}
        for level in levels:
            with Busy(level):
                for name, (unit, measure) in work_items.items():
                    figures = [measure() for _ in range(args.rounds)]
                    best[name, level] = min(figures) if unit == "s" else max(figures)
                    print(f"# {level} busy: {name}: {', '.join(f'{f:.2f}' for f in figures)} {unit}", flush=True)

        head = "| | " + " | ".join("quiet" if n == 0 else f"beside {n} busy" for n in levels)
        head += " | " + " | ".join(f"kept ({n})" for n in levels if n) + " |"
        print("\n" + head)
        print("|---" * (1 + len(levels) + sum(1 for n in levels if n)) + "|")
        for name, (unit, _) in work_items.items():
            quiet = best[name, levels[0]]
            cells = [f"{best[name, n]:,.2f} {unit}" for n in levels]
            kept = [(quiet / best[name, n]) if unit == "s" else (best[name, n] / quiet) for n in levels if n]
            print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(f"{k:.2f}×" for k in kept) + " |")


if __name__ == "__main__":
    main()
