"""``mtkit serve`` under load: 1, 8, 32 and 128 concurrent clients, each sending one sentence per request.

For each level of concurrency, ``--requests`` requests go to ``POST /translate`` (LibreTranslate's
API) from that many clients at once (asyncio; ``--client raw``, the default: a minimal keep-alive
HTTP/1.1 client, or ``--client httpx``), and the script prints the throughput (requests and
sentences per second), the latency percentiles (p50, p95, p99), the failed requests, the server's
resident memory (RSS, from /proc), how many sentences the server decoded per call (from
``/metrics``: the dynamic batching at work), the CPU the load generator itself used (on a
machine it shares with the server, that CPU is taken from the server), and the server's CPU split
between its event loop (main thread: HTTP, JSON, validation) and its other threads (decoding),
in % of one core over the level.

The server is started here (``mtkit serve -m MODEL --port 0``, extra flags after ``--``), or
``--url`` points at a running one (no RSS then). Issue #22's targets, measured in the same run:

* ``--whole-file``: ``mtkit translate`` (a whole process, the same engine and ``--threads``; without
  ``--threads`` the server leaves a core to its event loop, ``mtkit translate`` takes them all) on the
  sentences that the 32-client level sent, as one file; the 32-client throughput against it (target >= 0.8x);
* ``--rss-requests N``: after the levels (the warm-up), N more requests from 32 clients, and the
  server's RSS before and after them (target: growth < 5 %);
* ``--direct``: with ``--engine ctranslate2``, after the levels, one client's requests to the server
  interleaved with CTranslate2 called directly, each setting in a process of its own (SentencePiece, then
  ``translate_batch`` on one sentence, the model's beam and length penalty; 1 thread and its default
  count, the lower p50 counts), in alternating blocks of 50 of the single client's sentences (so that
  the machine's speed, which moves by a quarter within minutes here, weighs on both alike); the
  server's p50 against the direct p50 (target <= 1.5x); with CTranslate2's own search options (it
  stops at the first finished hypothesis) and with those the server's engine passes (mtkit's beam:
  it stops once ``beam`` hypotheses have finished, the search that gives the server's translations).

    .venv/bin/python benchmarks/serve.py -m work/demo/run --input data/test.en
    .venv/bin/python benchmarks/serve.py -m ct2-en-de --requests 50 --clients 1,8 -- --engine ctranslate2
    .venv/bin/python benchmarks/serve.py --url http://127.0.0.1:5000 --source en --target de
    .venv/bin/python benchmarks/serve.py -m RUN --input test.en --requests 1000 --whole-file --rss-requests 10000
    .venv/bin/python benchmarks/serve.py -m CT2_DIR --input test.en --whole-file --direct -- --engine ctranslate2
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


def thread_cpu(pid: int | None) -> tuple[float, float]:
    """CPU seconds so far of the server's main thread (its event loop: HTTP, JSON, validation) and of all
    its other threads together (the decoding threads and the engine's worker threads), from /proc."""
    if pid is None:
        return float("nan"), float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        if task.name == str(pid):
            main += seconds
        else:
            other += seconds
    return main, other


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


def raw_connections(url: str, clients: int) -> list:
    """A minimal HTTP/1.1 client for the load: one keep-alive connection per client, a request written
    whole, the answer read by its Content-Length (reconnecting when the server closes). It costs the
    shared cores a fraction of httpx's CPU (the ``client CPU`` column), so that the server gets them."""
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80

    class Connection:
        def __init__(self) -> None:
            self.reader = self.writer = None

        async def post(self, payload: dict) -> bool:
            body = json.dumps(payload).encode()
            head = (f"POST /translate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            for attempt in range(2):  # once more on a fresh connection if the kept one was closed
                try:
                    if self.writer is None:
                        self.reader, self.writer = await asyncio.open_connection(host, port)
                    self.writer.write(head + body)
                    status = await self.reader.readline()
                    if not status:  # the server closed the kept connection (idle beyond its keep-alive)
                        raise ConnectionResetError
                    length, close = 0, False
                    while (line := await self.reader.readline()) not in (b"\r\n", b""):
                        name, _, value = line.partition(b":")
                        name = name.strip().lower()
                        if name == b"content-length":
                            length = int(value)
                        elif name == b"connection" and value.strip().lower() == b"close":
                            close = True
                    data = await self.reader.readexactly(length)
                    if close:
                        self.close()
                    return status.split(b" ", 2)[1:2] == [b"200"] and "translatedText" in json.loads(data)
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    self.close()
                    if attempt:
                        return False
            return False

        def close(self) -> None:
            if self.writer is not None:
                self.writer.close()
            self.reader = self.writer = None

    return [Connection() for _ in range(clients)]


async def level(url: str, lines: list[str], clients: int, requests: int, source: str, target: str,
                kind: str = "raw") -> dict:
    import resource

    import httpx

    latencies: list[float] = []
    failures = 0
    todo = iter(range(requests))

    async def client(post) -> None:
        nonlocal failures
        for i in todo:
            start = time.perf_counter()
            ok = await post({"q": lines[i % len(lines)], "source": source, "target": target})
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                failures += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits, trust_env=False) as http:

        async def post_httpx(payload: dict) -> bool:
            try:
                r = await http.post("/translate", json=payload)
                return r.status_code == 200 and "translatedText" in r.json()
            except httpx.HTTPError:
                return False

        connections = raw_connections(url, clients) if kind == "raw" else []
        posts = [c.post for c in connections] or [post_httpx] * clients
        before = (await http.get("/metrics")).text
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        await asyncio.gather(*(client(post) for post in posts))
        elapsed = time.perf_counter() - start
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        for connection in connections:
            connection.close()
        after = (await http.get("/metrics")).text
    calls = metric(after, "mtkit_serve_batch_sentences_count") - metric(before, "mtkit_serve_batch_sentences_count")
    sentences = metric(after, "mtkit_serve_batch_sentences_sum") - metric(before, "mtkit_serve_batch_sentences_sum")
    client_cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
    return {"clients": clients, "ok": len(latencies), "failed": failures, "req_s": len(latencies) / elapsed,
            "p50": percentile(latencies, 50) if latencies else float("nan"),
            "p95": percentile(latencies, 95) if latencies else float("nan"),
            "p99": percentile(latencies, 99) if latencies else float("nan"),
            "per_call": sentences / calls if calls else float("nan"), "client_cpu": 100 * client_cpu / elapsed}


def flag(extra: list[str], name: str) -> str | None:
    """The value of ``name VALUE`` or ``name=VALUE`` among the server's flags."""
    for i, arg in enumerate(extra):
        if arg == name and i + 1 < len(extra):
            return extra[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def whole_file(model: str, extra: list[str], lines: list[str]) -> float:
    """Sentences per second of one whole ``mtkit translate`` process on ``lines`` as one file, with the
    server's engine and threads."""
    import tempfile

    options = [arg for name in ("--engine", "--threads", "--device") if (value := flag(extra, name))
               for arg in (name, value)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "mtkit", "translate", "-m", model, str(path), *options],
                              capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - start
    if done.returncode != 0 or len(done.stdout.splitlines()) != len(lines):
        raise SystemExit(f"mtkit translate failed: {done.stderr.strip()}")
    return len(lines) / seconds


class Direct:
    """CTranslate2 called directly on one sentence at a time: SentencePiece in and out, the exported
    model's beam and length penalty, ``threads`` CPU threads. ``same_search``: the options the server's
    engine passes (mtkit's beam, which ends once it holds ``beam`` finished hypotheses, input length +
    ``max_len_b`` steps at most), so that both find the same translations; otherwise CTranslate2's
    defaults (it ends at the first finished hypothesis, 256 steps at most)."""

    def __init__(self, model_dir: Path, threads: int, same_search: bool) -> None:
        import json

        import ctranslate2
        import sentencepiece

        meta = json.loads((model_dir / "mtkit.json").read_text(encoding="utf-8"))
        names = meta["spm"]
        src = "spm.src.model" if "spm.src.model" in names else "spm.model"
        tgt = "spm.tgt.model" if "spm.tgt.model" in names else "spm.model"
        self.sp_src = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / src))
        self.sp_tgt = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / tgt))
        self.decode = meta.get("decode", {})
        beam = self.decode.get("beam", 4)
        power = self.decode.get("length_penalty", "gnmt") == "power"
        self.translator = ctranslate2.Translator(str(model_dir), intra_threads=threads)
        self.options = {"beam_size": beam, "length_penalty": self.decode.get("alpha", 0.6) if power else 0.0}
        if same_search:
            self.options.update(num_hypotheses=beam, return_scores=True, return_end_token=True,
                                max_input_length=0, length_penalty=self.options["length_penalty"] or 1e-6)
        self.threads, self.same_search = threads, same_search

    def times(self, lines: list[str]) -> list[float]:
        """Seconds per sentence, one call each."""
        out = []
        for line in lines:
            pieces = self.sp_src.encode(line, out_type=str)
            steps = (int(self.decode.get("max_len_a", 0) * (len(pieces) + 1) + self.decode.get("max_len_b", 200))
                     if self.same_search else 256)
            start = time.perf_counter()
            result = self.translator.translate_batch([pieces], max_decoding_length=steps, **self.options)
            self.sp_tgt.decode_pieces(result[0].hypotheses[0])
            out.append(time.perf_counter() - start)
        return out


def direct_worker(argv: list[str]) -> None:
    """``serve.py --direct-worker MODEL_DIR THREADS SAME_SEARCH``: a process of its own for one direct
    arm; each line on stdin is a JSON list of sentences, answered by a JSON list of seconds."""
    import json

    direct = Direct(Path(argv[0]), int(argv[1]), argv[2] == "1")
    for line in sys.stdin:
        print(json.dumps(direct.times(json.loads(line))), flush=True)


class DirectProcess:
    """A :class:`Direct` arm in a process of its own (so that arms with different thread counts do
    not share one OpenMP runtime, and none shares the server's)."""

    def __init__(self, model_dir: Path, threads: int, same_search: bool) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--direct-worker", str(model_dir), str(threads),
                                      "1" if same_search else "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def times(self, lines: list[str]) -> list[float]:
        import json

        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(lines) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise SystemExit(f"the direct CTranslate2 process failed (exit {self.proc.wait()})")
        return json.loads(answer)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(60)


def interleaved(url: str, model_dir: Path, lines: list[str], source: str, target: str,
                block: int = 50) -> tuple[list[float], dict[tuple[bool, int], list[float]]]:
    """Single-client latencies of the server and of CTranslate2 called directly (own and server's search
    options, 1 thread and the default count; each in a process of its own), measured in alternating
    blocks of ``block`` sentences, so that a change in the machine's speed during the measurement hits
    every arm alike. Each arm gets every sentence of ``lines`` once (after 10 of warm-up each); the
    arms' order rotates per block, with a pause between arms (the last one's OpenMP threads may spin
    for up to 200 ms after its last call)."""
    counts = sorted({1, min(4, os.cpu_count() or 1)})
    direct = {(same, t): DirectProcess(model_dir, t, same) for same in (False, True) for t in counts}
    loop = asyncio.new_event_loop()
    connection = raw_connections(url, 1)[0]

    def server_times(chunk: list[str]) -> list[float]:
        async def run() -> list[float]:
            out = []
            for line in chunk:
                start = time.perf_counter()
                if not await connection.post({"q": line, "source": source, "target": target}):
                    raise SystemExit(f"the server failed on {line!r}")
                out.append(time.perf_counter() - start)
            return out

        return loop.run_until_complete(run())

    arms: list = ["server", *direct]
    try:
        server_times(lines[:10])
        for d in direct.values():
            d.times(lines[:10])
        measured: dict = {arm: [] for arm in arms}
        for b, first in enumerate(range(0, len(lines), block)):
            chunk = lines[first:first + block]
            for arm in arms[b % len(arms):] + arms[:b % len(arms)]:
                time.sleep(0.3)
                measured[arm] += server_times(chunk) if arm == "server" else direct[arm].times(chunk)
    finally:
        connection.close()
        loop.close()
        for d in direct.values():
            d.close()
    return measured.pop("server"), measured


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
    parser.add_argument("--whole-file", action="store_true",
                        help="Also time mtkit translate on the 32-client level's sentences as one file.")
    parser.add_argument("--rss-requests", type=int, default=0,
                        help="After the levels, this many more requests (32 clients), with the RSS before and after.")
    parser.add_argument("--direct", action="store_true",
                        help="With --engine ctranslate2: CTranslate2 called directly on one sentence, p50.")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="The load generator: a minimal keep-alive HTTP/1.1 client (raw) or httpx.")
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
    results: dict[int, dict] = {}
    sent = [lines[i % len(lines)] for i in range(args.requests)]  # what each level sent, in order
    try:
        print(f"{'clients':>7} {'ok':>6} {'failed':>6} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
              f"{'sent/call':>9} {'RSS MiB':>8} {'client CPU %':>12} {'loop CPU %':>10} {'engine CPU %':>12}")
        for clients in (int(c) for c in args.clients.split(",")):
            cpu, start = thread_cpu(pid), time.perf_counter()
            r = results[clients] = asyncio.run(level(url, lines, clients, args.requests, args.source, args.target,
                                                     args.client))
            loop, engine = (100 * (b - a) / (time.perf_counter() - start) for a, b in zip(cpu, thread_cpu(pid)))
            rss = rss_mib(pid)
            print(f"{r['clients']:>7} {r['ok']:>6} {r['failed']:>6} {r['req_s']:>8.1f} {1000 * r['p50']:>8.1f} "
                  f"{1000 * r['p95']:>8.1f} {1000 * r['p99']:>8.1f} {r['per_call']:>9.1f} "
                  f"{rss if rss is not None else float('nan'):>8.0f} {r['client_cpu']:>12.0f} {loop:>10.0f} "
                  f"{engine:>12.0f}", flush=True)
        if args.rss_requests:
            before = rss_mib(pid)
            r = asyncio.run(level(url, lines, 32, args.rss_requests, args.source, args.target, args.client))
            after = rss_mib(pid)
            growth = 100 * (after - before) / before if before and after else float("nan")
            print(f"RSS over {args.rss_requests} more requests (32 clients, {r['failed']} failed, {r['req_s']:.1f} "
                  f"req/s): {before:.0f} -> {after:.0f} MiB, {growth:+.1f} % (target < 5 %: "
                  f"{'met' if growth < 5 else 'not met'})", flush=True)
        if args.direct and args.model:
            # CTranslate2 at its best (the faster of one thread and its default count: the lower p50) on the
            # sentences the single client sent, measured interleaved with the server in blocks
            server, direct = interleaved(url, Path(args.model), sent, args.source, args.target)
            p50 = percentile(server, 50)
            arms = ", ".join(f"{'server' if same else 'own'} search {t} thread{'s' * (t > 1)} "
                             f"{1000 * percentile(times, 50):.1f}" for (same, t), times in direct.items())
            print(f"interleaved in blocks of 50, {len(sent)} sentences each: the server's single-client p50 "
                  f"{1000 * p50:.1f} ms; CTranslate2 directly ({arms} ms)", flush=True)
            for same, what in ((False, "CTranslate2's own search"), (True, "the server's search options")):
                best, threads = min((percentile(t, 50), k[1]) for k, t in direct.items() if k[0] == same)
                ratio = p50 / best
                print(f"CTranslate2 directly, one sentence, {what}: p50 {1000 * best:.1f} ms ({threads} threads); the "
                      f"server's single-client p50 is {ratio:.2f}x it (target <= 1.5x: "
                      f"{'met' if ratio <= 1.5 else 'not met'})", flush=True)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
            if code != 0:
                print(f"the server exited {code}", file=sys.stderr)
    if args.whole_file and args.model and 32 in results:
        rate = whole_file(args.model, args.extra, sent)
        ratio = results[32]["req_s"] / rate
        print(f"mtkit translate, the same {len(sent)} sentences as one file (whole process): {rate:.1f} sent/s; "
              f"32 clients reach {ratio:.2f}x it (target >= 0.8x: {'met' if ratio >= 0.8 else 'not met'})", flush=True)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {len(lines)} distinct sentences, "
          f"{args.client} client", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--direct-worker"]:
        direct_worker(sys.argv[2:])
    else:
        main()
