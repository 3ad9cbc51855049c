"""``mtkit serve``'s bounded resources, on an untrained tiny model (what is checked holds whatever the
weights): a stream of distinct exclude phrases keeps the server's memory bounded; requests of 2,000
include phrases are refused, and expensive requests under the limit leave plain ones answered; a
client that goes away has its job dropped; --decoding-threads is a bounded flag; "serving on" is
printed once the server serves, and never when its startup fails."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from test_serve import ENV, MTKIT, Server  # after the skips: it needs the serve extra

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def words(seed: int):
    """Distinct three-letter words, in a random order of the seed's."""
    found = ["".join(w) for w in itertools.product(LETTERS, repeat=3)]
    random.Random(seed).shuffle(found)
    return found


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An untrained tiny en-de checkpoint whose vocabulary writes every lowercase letter."""
    import torch

    import mtkit
    from mtkit.config import Config, DataConfig, DecodeConfig, ModelConfig, SpmConfig, config_to_dict
    from mtkit.data.vocab import Vocab, train_model
    from mtkit.model import Transformer

    rng, some = random.Random(0), words(1)[:400]
    corpus = [" ".join(rng.choice(some) for _ in range(6)) for _ in range(2000)]
    vocab = Vocab.from_bytes(train_model(corpus, SpmConfig(vocab_size=200)))
    cfg = ModelConfig(d_model=16, h=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("serve-bounds") / "tiny.pt"
    torch.save({
        "format_version": 1, "mtkit_version": mtkit.__version__, "step": 3,
        "config": config_to_dict(Config(model=cfg, data=DataConfig(src_lang="en", tgt_lang="de"),
                                        decode=DecodeConfig(beam=2, max_len_b=6))),
        "model": Transformer(cfg, vocab.src_size, vocab.tgt_size).state_dict(),
        "vocab": {"src": vocab.model_bytes()[0], "tgt": None},
        "src_vocab_size": vocab.src_size, "tgt_vocab_size": vocab.tgt_size,
    }, path)
    return path


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow  # thousands of requests
def test_a_stream_of_distinct_exclude_phrases_keeps_the_server_memory_bounded(checkpoint, tmp_path):
    """12,000 distinct 3-word exclude phrases, 60 a request: after 3,000 (the piece index's memos are
    full), 9,000 more grow the server's RSS by less than a fixed bound (with memos that never drop an
    entry, the same stream grew it by about 4 KiB a phrase)."""
    s = Server(tmp_path, "-m", checkpoint)
    try:
        vocabulary = words(2)
        n = len(vocabulary)  # more than the phrases sent: each phrase's first word is its own
        phrases = (f"{vocabulary[i]} {vocabulary[(3 * i + 1) % n]} {vocabulary[(5 * i + 2) % n]}" for i in range(n))

        def send(n_phrases: int) -> None:
            for _ in range(n_phrases // 60):
                status, body = s.post_json("/v1/translate", {
                    "text": "abc def", "constraints": {"exclude": [next(phrases) for _ in range(60)]}})
                assert status == 200, body

        send(3000)
        before = rss_kib(s.proc.pid)
        send(9000)
        grown = rss_kib(s.proc.pid) - before
        print(f"RSS {before} KiB after 3,000 phrases, grown by {grown} KiB over 9,000 more")
        assert grown < 12 * 1024, f"RSS grew by {grown} KiB over 9,000 distinct phrases"
        assert s.get("/v1/health")[0] == 200
    finally:
        assert s.stop() == 0, s.log.read_text()


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve-bounds"), "-m", checkpoint, "--max-beam", 8, "--decode-timeout", 120)
    yield s
    assert s.stop() == 0, s.log.read_text()


@pytest.mark.slow  # a real server process (fast: test_serve_libretranslate, test_serve_batcher in process)
def test_too_many_phrases_are_a_400_and_expensive_requests_under_the_limit_leave_plain_ones_answered(server):
    """Two requests of 2,000 include phrases (the probe's 36 KB that held both decoding threads for
    minutes) are refused at once, naming the limit; requests of 64 include phrases each at beam 8, four
    at a time, leave plain requests answered (each within a generous bound, far below what the probe's
    held) and /v1/health saying the queue moves."""
    vocabulary = words(3)
    flood = {"text": "abc def ghi", "constraints": {"include": vocabulary[:2000]}}
    with ThreadPoolExecutor(2) as pool:
        for status, body in pool.map(lambda _: server.post_json("/v1/translate", flood), range(2)):
            assert status == 400 and "too many constraint phrases: 2000" in body["error"], body
            assert "the limit is 64 per request, --max-phrases" in body["error"]
    heavy = [{"text": "abc def ghi jkl", "beam": 8, "constraints": {"include": vocabulary[64 * k: 64 * k + 64]}}
             for k in range(8)]
    plain = {"q": "abc def", "source": "en", "target": "de"}
    with ThreadPoolExecutor(6) as pool:
        expensive = [pool.submit(server.post_json, "/v1/translate", body) for body in heavy]
        timings = []
        for _ in range(10):
            start = time.monotonic()
            status, body = server.post_json("/translate", plain)
            timings.append(time.monotonic() - start)
            assert status == 200 and isinstance(body["translatedText"], str), body
        for future in expensive:
            status, body = future.result()
            assert status == 200, body
    assert max(timings) < 60, timings  # a hang guard, not a speed test
    status, _, body = server.get("/v1/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok", health
    assert [(m["name"], m["step"], m["queue"], m["moving"]) for m in health["models"]] == [("tiny", 3, 0, True)]
    assert server.get("/health")[0] == 200


@pytest.mark.slow  # mtkit serve processes that load the model
def test_decoding_threads_is_a_bounded_flag(checkpoint):
    done = subprocess.run([*MTKIT, "serve", "-m", str(checkpoint), "--port", "0", "--decoding-threads", "100000"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == ["error: --decoding-threads: must be between 1 and 64, got 100000"]
    for flag, value in (("--max-phrases", "0"), ("--decode-timeout", "0"), ("--decode-timeout", "nan")):
        done = subprocess.run([*MTKIT, "serve", "-m", str(checkpoint), "--port", "0", flag, value],
                              capture_output=True, text=True, env=ENV, timeout=300)
        assert done.returncode == 1 and done.stderr.startswith(f"error: {flag}"), done.stderr
        assert "serving on" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow  # a real server process
def test_serving_on_is_printed_once_the_server_serves_and_never_when_its_startup_fails(server, capsys, logged):
    """At the moment "serving on" is in the log, the server answers (no retry); an app whose startup
    fails prints no "serving on" and ends in one error line."""
    assert "serving on" in server.log.read_text()
    from mtkit.errors import MtkitError
    from mtkit.serve.server import run

    async def failing(scope, receive, send):
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no model"})

    with pytest.raises(MtkitError, match="^the server did not start"):
        run(failing, port=0)
    assert "serving on" not in capsys.readouterr().err


def test_a_cancelled_client_has_its_job_dropped():
    """The app in process, on a stand-in engine held between search steps: the client goes away (its
    connection's receive says http.disconnect) while its translation decodes; the request is cancelled,
    its job abandoned, and the search stops before its next step; the metrics count a 499."""
    from test_serve_batcher import Stepper, served

    from mtkit.serve.app import create_app
    from mtkit.serve.server import Guard
    from mtkit.serve.service import Limits, Service

    engine = Stepper(steps=20)
    service = Service([served(engine)], Limits())
    app = Guard(create_app(service), 10_000, service.metrics)
    sent = []

    async def main() -> None:
        service.start()
        gone = asyncio.Event()
        body = [{"type": "http.request", "body": b'{"text": "a b"}', "more_body": False}]

        async def receive():
            if body:
                return body.pop()
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/translate", "raw_path": b"/v1/translate",
                 "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
                 "scheme": "http", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2), "root_path": ""}
        request = asyncio.ensure_future(app(scope, receive, send))
        batcher = service.batchers["reverse"]
        engine.step_gate.release(3)
        while engine.done < 3:
            await asyncio.sleep(0.001)
        gone.set()
        await asyncio.wait_for(request, 30)
        engine.step_gate.release(100)
        while batcher.decoding():
            await asyncio.sleep(0.001)

    try:
        asyncio.run(main())
    finally:
        engine.step_gate.release(100)
        service.stop()
    assert sent == [] and engine.done <= 4 and engine.calls == []
    assert 'status="499"' in service.metrics.render()[0].decode()
