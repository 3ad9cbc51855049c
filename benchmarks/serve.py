"""``mtkit serve`` under load: 1, 8, 32 and 128 concurrent clients, each sending one sentence per request.

For each level of concurrency, ``--requests`` requests go to ``POST /translate`` (LibreTranslate's
API) from that many clients at once (httpx, asyncio), and the script prints the throughput
(requests and sentences per second), the latency percentiles (p50, p95, p99), the failed requests,
the server's resident memory (RSS, from /proc) and how many sentences the server decoded per call
(from ``/metrics``: the dynamic batching at work).

The server is started here (``mtkit serve -m MODEL --port 0``, extra flags after ``--``), or
``--url`` points at a running one (no RSS then).

    .venv/bin/python benchmarks/serve.py -m work/demo/run --input data/test.en
    .venv/bin/python benchmarks/serve.py -m ct2-en-de --requests 50 --clients 1,8 -- --engine ctranslate2
    .venv/bin/python benchmarks/serve.py --url http://127.0.0.1:5000 --source en --target de
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def level(url: str, lines: list[str], clients: int, requests: int, source: str, target: str) -> dict:
    import httpx

    latencies: list[float] = []
    failures = 0
    todo = iter(range(requests))

    async def client(http) -> None:
        nonlocal failures
        for i in todo:
            start = time.perf_counter()
            try:
                r = await http.post("/translate", json={"q": lines[i % len(lines)], "source": source, "target": target})
                ok = r.status_code == 200 and "translatedText" in r.json()
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                failures += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits, trust_env=False) as http:
        before = (await http.get("/metrics")).text
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - start
        after = (await http.get("/metrics")).text
    calls = metric(after, "mtkit_serve_batch_sentences_count") - metric(before, "mtkit_serve_batch_sentences_count")
    sentences = metric(after, "mtkit_serve_batch_sentences_sum") - metric(before, "mtkit_serve_batch_sentences_sum")
    return {"clients": clients, "ok": len(latencies), "failed": failures, "req_s": len(latencies) / elapsed,
            "p50": percentile(latencies, 50) if latencies else float("nan"),
            "p95": percentile(latencies, 95) if latencies else float("nan"),
            "p99": percentile(latencies, 99) if latencies else float("nan"),
            "per_call": sentences / calls if calls else float("nan")}


def start_server(model: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "mtkit", "serve", "-m", model, "--port", "0", *extra],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        m = re.search(r"serving on (http://\S+?)/ ", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", help="Model for the server to start (a run directory, or an exported one).")
    parser.add_argument("--url", help="A running server instead.")
    parser.add_argument("--input", type=Path, help="Sentences, one per line (default: generated word sequences).")
    parser.add_argument("--clients", default="1,8,32,128", help="Levels of concurrency (comma-separated).")
    parser.add_argument("--requests", type=int, default=500, help="Requests per level.")
    parser.add_argument("--source", default="en")
    parser.add_argument("--target", default="de")
    parser.add_argument("extra", nargs="*", help="After --: flags for mtkit serve.")
    args = parser.parse_args()
    if not (args.model or args.url):
        parser.error("give -m MODEL or --url URL")
    if args.input:
        lines = [x for x in args.input.read_text(encoding="utf-8").splitlines() if x.strip()]
    else:
        import random

        rng = random.Random(1)
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for _ in range(1000)]
    proc, url = start_server(args.model, args.extra) if args.url is None else (None, args.url.rstrip("/"))
    pid = proc.pid if proc is not None else None
    try:
        print(f"{'clients':>7} {'ok':>6} {'failed':>6} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
              f"{'sent/call':>9} {'RSS MiB':>8}")
        for clients in (int(c) for c in args.clients.split(",")):
            r = asyncio.run(level(url, lines, clients, args.requests, args.source, args.target))
            rss = rss_mib(pid)
            print(f"{r['clients']:>7} {r['ok']:>6} {r['failed']:>6} {r['req_s']:>8.1f} {1000 * r['p50']:>8.1f} "
                  f"{1000 * r['p95']:>8.1f} {1000 * r['p99']:>8.1f} {r['per_call']:>9.1f} "
                  f"{rss if rss is not None else float('nan'):>8.0f}", flush=True)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
            if code != 0:
                print(f"the server exited {code}", file=sys.stderr)
    print(f"# {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {len(lines)} distinct sentences", flush=True)


if __name__ == "__main__":
    main()
