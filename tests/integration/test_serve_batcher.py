"""The server's dynamic batcher on a stand-in engine (no model, no HTTP): requests are merged, each gets
exactly its own lines back in order, settings are never mixed in one call, a full queue refuses."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from mtkit.config import DecodeConfig
from mtkit.engines.engine import Engine
from mtkit.serve.batcher import Batcher, BatchPolicy, QueueFull
from mtkit.serve.models import ServedModel


class WordVocab:
    """One id per word: enough of mtkit's Vocab for the pipeline."""

    def __init__(self) -> None:
        self.words: dict[str, int] = {}

    def _id(self, word: str) -> int:
        return self.words.setdefault(word, len(self.words) + 4)

    def encode_src_batch(self, lines):
        return [[self._id(w) for w in line.split()] for line in lines]

    def decode_tgt(self, ids) -> str:
        names = {i: w for w, i in self.words.items()}
        return " ".join(names[i] for i in ids)

    def tgt_pieces(self, ids):
        return [str(i) for i in ids]


class Reverser(Engine):
    """Translates by reversing the words; records each call's sentences and settings; can be held."""

    def __init__(self) -> None:
        super().__init__(WordVocab(), DecodeConfig(beam=2))
        self.calls: list[tuple[int, DecodeConfig]] = []
        self.gate = threading.Event()
        self.gate.set()

    def search_batch(self, batch, call):
        self.gate.wait(30)
        self.calls.append((len(batch), call.decode))
        if any(ids[0] == self.vocab.words.get("boom") for ids in batch):
            raise RuntimeError("boom")
        return [[(list(reversed(ids[:-1])), -1.0, -2.0)] for ids in batch]


def served(engine: Reverser) -> ServedModel:
    return ServedModel("reverse", engine, "en", "de")


@pytest.mark.parametrize("threads", [1, 2])
def test_concurrent_requests_are_merged_and_each_gets_its_own_lines(threads):
    engine = Reverser()
    batcher = Batcher(served(engine), BatchPolicy(max_queue=100, max_wait=0.05, threads=threads))
    batcher.start()
    try:
        requests = [[f"w{i} x{i} y{i}", "", f"z{i}"] for i in range(40)]
        with ThreadPoolExecutor(40) as pool:
            results = list(pool.map(lambda lines: batcher.submit(lines, engine.decode).result(30), requests))
        for lines, got in zip(requests, results):
            assert [t.best.text for t in got] == [" ".join(reversed(line.split())) for line in lines]
            assert [t.source for t in got] == lines
        assert len(engine.calls) < 80  # 40 requests of 2 non-empty lines: some were decoded together
    finally:
        batcher.stop()


def test_decoding_threads_decode_batches_at_the_same_time():
    """With two decoding threads, two batches are in the engine at once (each waits for the other at a
    barrier, which one thread alone would never pass), and each request still gets its own lines."""
    engine = Reverser()
    barrier = threading.Barrier(2, timeout=30)
    search = engine.search_batch
    engine.search_batch = lambda batch, call: (barrier.wait(), search(batch, call))[1]
    engine.gate.clear()  # hold the first batch until the second request has queued
    batcher = Batcher(served(engine), BatchPolicy(max_queue=100, max_wait=0.0, threads=2))
    batcher.start()
    try:
        first = batcher.submit(["a b"], engine.decode)
        while batcher.queue_length():
            time.sleep(0.001)
        second = batcher.submit(["c d"], engine.decode)
        engine.gate.set()
        assert first.result(30)[0].best.text == "b a" and second.result(30)[0].best.text == "d c"
        assert [n for n, _ in engine.calls] == [1, 1]
        assert batcher.alive
    finally:
        batcher.stop()
    assert not batcher.alive


def test_requests_with_other_settings_are_never_decoded_together():
    engine = Reverser()
    engine.gate.clear()  # hold the thread so that all requests queue up
    batcher = Batcher(served(engine), BatchPolicy(max_queue=100, max_wait=0.0))
    batcher.start()
    try:
        wide = replace(engine.decode, beam=4)
        blocker = batcher.submit(["hold"], engine.decode)
        futures = [batcher.submit([f"a{i} b{i}"], wide if i % 2 else engine.decode) for i in range(10)]
        engine.gate.set()
        blocker.result(30)
        for i, f in enumerate(futures):
            assert f.result(30)[0].best.text == f"b{i} a{i}"
        assert {decode.beam for _, decode in engine.calls} == {2, 4}
        assert sum(n for n, d in engine.calls if d.beam == 4) == 5
    finally:
        batcher.stop()


def test_the_token_budget_splits_queued_requests_and_a_lone_request_is_encoded_once():
    """Queued requests are merged up to ``batch_tokens`` source tokens (words + EOS); a request that is
    alone, with no wait, goes to the engine without the batcher encoding it to count its tokens."""
    engine = Reverser()
    encoded: list[list[str]] = []
    encode = engine.vocab.encode_src_batch
    engine.vocab.encode_src_batch = lambda lines: (encoded.append(list(lines)), encode(lines))[1]
    batcher = Batcher(served(engine), BatchPolicy(max_queue=100, max_wait=0.0, batch_tokens=8))
    batcher.start()
    try:
        assert batcher.submit(["a b c"], engine.decode).result(30)[0].best.text == "c b a"
        assert encoded == [["a b c"]]  # by the engine alone
        engine.gate.clear()
        blocker = batcher.submit(["hold"], engine.decode)
        while batcher.queue_length():  # the thread has taken it and waits at the gate
            time.sleep(0.001)
        futures = [batcher.submit([f"a{i} b{i} c{i}"], engine.decode) for i in range(6)]  # 4 tokens each
        engine.gate.set()
        blocker.result(30)
        assert [f.result(30)[0].best.text for f in futures] == [f"c{i} b{i} a{i}" for i in range(6)]
        assert [n for n, _ in engine.calls] == [1, 1, 2, 2, 2]
    finally:
        batcher.stop()


def test_a_full_queue_refuses_and_an_engine_error_reaches_its_requests_only():
    engine = Reverser()
    engine.gate.clear()
    batcher = Batcher(served(engine), BatchPolicy(max_queue=2, max_wait=0.0))
    batcher.start()
    try:
        first = batcher.submit(["one"], engine.decode)
        while batcher.queue_length():  # the thread has taken it and waits at the gate
            time.sleep(0.001)
        queued = [batcher.submit(["two"], engine.decode), batcher.submit(["three"], engine.decode)]
        with pytest.raises(QueueFull):
            batcher.submit(["four"], engine.decode)
        engine.gate.set()
        assert [f.result(30)[0].best.text for f in [first, *queued]] == ["one", "two", "three"]
        broken = batcher.submit(["boom"], engine.decode)
        with pytest.raises(RuntimeError, match="boom"):
            broken.result(30)
        assert batcher.submit(["still going"], engine.decode).result(30)[0].best.text == "going still"
    finally:
        batcher.stop()
    with pytest.raises(QueueFull):
        batcher.submit(["after stop"], engine.decode)


def test_the_server_loads_no_torch_before_an_engine_does():
    """The CTranslate2 engine must run without torch in the process (it runs several times slower with it)."""
    pytest.importorskip("fastapi")
    code = ("import sys, mtkit.cli, mtkit.commands.serve, mtkit.serve.app, mtkit.serve.server, "
            "mtkit.engines.ctranslate2_engine\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_engine_leaves_the_event_loop_a_core_unless_told():
    """--threads 0: the CPUs other work leaves free but one, shared by the decoding threads, at least one each;
    a user's count stays."""
    from mtkit.engines.threads import serving_choice

    for cpus, decoding, threads in ((1, 2, 1), (2, 2, 1), (8, 2, 3), (8, 1, 7), (2, 1, 1)):
        assert serving_choice(decoding)(cpus, 0.0)[0] == threads
    assert serving_choice(2)(8, 3.0)[0] == 2  # 3 CPUs busy with other work: 5 free, 4 for decoding
    assert serving_choice(1)(8, 7.0)[0] == 1
    n, why = serving_choice(2)(8, 0.0)
    assert why == "8 usable CPUs, 0.0 busy with other work; per decoding thread (2), one CPU left to HTTP"
    assert serving_choice(2)(8, 7.0, (4, "set by --threads")) == (4, "set by --threads")


class PoisonVocab(WordVocab):
    """Refuses to encode a line holding ``poison`` (as SentencePiece refuses a lone surrogate)."""

    def encode_src_batch(self, lines):
        if any("poison" in line for line in lines):
            raise UnicodeEncodeError("utf-8", "poison", 0, 1, "surrogates not allowed")
        return super().encode_src_batch(lines)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("max_wait", [0.0, 0.02])
def test_no_failing_job_kills_a_decoding_thread(threads, max_wait):
    """Jobs that fail while their tokens are counted (first in a batch or joining it), while they are
    decoded, or after (the metrics callback) each fail their own request; every thread lives on and
    every other request gets its own translation, however the failures mix with the traffic."""
    engine = Reverser()
    engine.vocab = PoisonVocab()
    calls = [0]

    def on_batch(stats):
        calls[0] += 1
        if calls[0] % 3 == 0:
            raise ZeroDivisionError("the metrics callback failed")

    batcher = Batcher(served(engine), BatchPolicy(max_queue=1000, max_wait=max_wait, threads=threads),
                      on_batch=on_batch)
    batcher.start()
    try:
        for round_ in range(3):
            kinds = ["poison", "boom", "good"] * 8
            engine.gate.clear()  # let a queue build, so that bad jobs are first in, and join, batches
            blocker = batcher.submit([f"hold{round_}"], engine.decode)
            futures = [(kind, i, batcher.submit([f"{kind} w{i}"] if kind != "good" else [f"a{i} b{i}", ""],
                                                engine.decode))
                       for i, kind in enumerate(kinds)]
            engine.gate.set()
            blocker.result(30)
            for kind, i, future in futures:
                if kind == "good":
                    assert [t.best.text for t in future.result(30)] in ([f"b{i} a{i}", ""],), (kind, i)
                else:
                    with pytest.raises((UnicodeEncodeError, RuntimeError)):
                        future.result(30)
            assert batcher.alive and all(t.is_alive() for t in batcher._threads)
        assert batcher.submit(["c d"], engine.decode).result(30)[0].best.text == "d c"
    finally:
        batcher.stop()


def test_an_empty_alternative_is_never_returned():
    """A hypothesis of EOS alone is no alternative: neither in LibreTranslate's ``alternatives`` nor in
    an n-best list (the app in process, on a stand-in engine whose second hypothesis is empty)."""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from mtkit.serve.app import create_app
    from mtkit.serve.service import Limits, Service

    class WithEmpty(Reverser):
        def search_batch(self, batch, call):
            return [[(list(reversed(ids[:-1])), -1.0, -2.0), ([], -2.0, -2.0), (list(ids[:1]), -3.0, -4.0)]
                    for ids in batch]

    engine = WithEmpty()
    engine.decode = replace(engine.decode, beam=3)
    with TestClient(create_app(Service([served(engine)], Limits()))) as client:
        answer = client.post("/translate", json={"q": "a b", "source": "en", "target": "de", "alternatives": 2})
        assert answer.status_code == 200 and answer.json() == {"translatedText": "b a", "alternatives": ["a"]}
        answer = client.post("/v1/translate", json={"text": "a b", "nbest": 3})
        assert [h["text"] for h in answer.json()["translations"][0]["nbest"]] == ["b a", "a"]


# ------------------------------------------------------------------ work nobody waits for, stuck queues


class Stepper(Reverser):
    """A search of ``steps`` steps that asks the call's ``should_stop`` before each one, as mtkit's search
    does; ``step_gate`` holds each step until the test lets it go; ``done`` counts the steps taken."""

    def __init__(self, steps: int = 10) -> None:
        super().__init__()
        self.steps = steps
        self.done = 0
        self.step_gate = threading.Semaphore(0)

    def search_batch(self, batch, call):
        for _ in range(self.steps):
            call.check_stop()
            assert self.step_gate.acquire(timeout=30)
            self.done += 1
        return super().search_batch(batch, call)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_job_past_its_deadline_stops_between_steps_and_an_abandoned_job_leaves_the_queue():
    from mtkit.engines.engine import Stopped

    engine, clock = Stepper(steps=10), Clock()
    batcher = Batcher(served(engine), BatchPolicy(max_queue=10, threads=1, decode_timeout=5.0), clock=clock)
    batcher.start()
    try:
        first = batcher.submit(["a b"], engine.decode)  # deadline: 1005
        while batcher.decoding() == 0:
            time.sleep(0.001)
        queued = batcher.submit(["c d"], engine.decode)
        batcher.abandon(queued)  # its client went away: it leaves the queue, never decoded
        assert batcher.queue_length() == 0 and queued.cancelled()
        for _ in range(3):
            engine.step_gate.release()
        while engine.done < 3:
            time.sleep(0.001)
        clock.now = 1006.0  # past the deadline: the search stops before its next step
        engine.step_gate.release(10)
        with pytest.raises(Stopped):
            first.result(30)
        assert engine.done in (3, 4)  # the step under way when the clock moved, at most, then no other
        engine.steps = 2
        engine.step_gate.release(2)
        assert batcher.submit(["e f"], engine.decode).result(30)[0].best.text == "f e"  # the thread goes on
        assert [n for n, _ in engine.calls] == [1]  # "c d" was never decoded
    finally:
        engine.step_gate.release(100)
        batcher.stop()


def test_a_batch_whose_jobs_are_all_abandoned_stops_and_one_still_wanted_goes_on():
    engine = Stepper(steps=5)
    batcher = Batcher(served(engine), BatchPolicy(max_queue=10, threads=1))
    batcher.start()
    try:
        hold = batcher.submit(["hold"], engine.decode)
        while batcher.queue_length():
            time.sleep(0.001)
        a, b = batcher.submit(["a b"], engine.decode), batcher.submit(["c d"], engine.decode)
        engine.step_gate.release(5)
        assert hold.result(30)[0].best.text == "hold"
        while batcher.decoding() == 0:  # a and b, merged into one batch
            time.sleep(0.001)
        batcher.abandon(a)  # b is still wanted: the batch goes on
        engine.step_gate.release(5)
        assert b.result(30)[0].best.text == "d c" and engine.done == 10
        assert [n for n, _ in engine.calls] == [1, 2]
        c = batcher.submit(["e f"], engine.decode)
        engine.step_gate.release(2)
        while engine.done < 12:
            time.sleep(0.001)
        batcher.abandon(c)  # nobody waits: the search stops before its third step (or its fourth)
        engine.step_gate.release(3)
        while batcher.decoding():
            time.sleep(0.001)
        assert engine.done in (12, 13) and len(engine.calls) == 2
    finally:
        engine.step_gate.release(100)
        batcher.stop()


def test_moving_says_when_a_batch_decodes_too_long_or_the_queue_waits_with_none_finished():
    engine, clock = Stepper(steps=1), Clock()
    batcher = Batcher(served(engine), BatchPolicy(max_queue=10, threads=1, stall_after=10.0), clock=clock)
    batcher.start()
    try:
        assert batcher.moving()
        first = batcher.submit(["a b"], engine.decode)
        while batcher.decoding() == 0:
            time.sleep(0.001)
        batcher.submit(["c d"], engine.decode)
        clock.now += 9
        assert batcher.moving()  # busy, not yet for long
        clock.now += 2
        assert not batcher.moving()  # one batch for 11 s, a job queued behind it
        engine.step_gate.release(2)
        first.result(30)
        while batcher.queue_length() or batcher.decoding():
            time.sleep(0.001)
        assert batcher.moving()
    finally:
        engine.step_gate.release(100)
        batcher.stop()


def test_the_service_refuses_too_many_phrases_and_answers_504_past_its_deadline():
    """The request's own phrases are counted (not the server glossary's), in phrases then pieces; a
    request whose translation outlives --decode-timeout gets a 504 and its job is dropped."""
    pytest.importorskip("prometheus_client")
    import asyncio

    from mtkit.engines.constraints import Constraints
    from mtkit.serve.schemas import ApiError
    from mtkit.serve.service import Limits, Service
    from mtkit.text.glossary import Glossary

    class Pieces(WordVocab):
        def encode_tgt(self, text):
            return [self._id(c) for c in text if not c.isspace()]

    engine = Stepper(steps=50)
    engine.vocab = Pieces()
    glossary = Glossary([(f"w{i}", f"t{i}", "x") for i in range(100)])
    service = Service([served(engine)], Limits(max_phrases=4, max_constraint_pieces=12, decode_timeout=0.5),
                      glossary=glossary)
    model = service.models[0]
    lines = [" ".join(f"w{i}" for i in range(100))]  # the server's glossary matches 100 terms: not counted
    assert len(service.constraints_for(model, lines)[0].include) == 100
    ok = service.constraints_for(model, lines, [Constraints(include=("a", "b"), exclude=("c", "d"))])
    assert len(ok[0].include) == 102
    for requested, message in (([Constraints(include=("a", "b", "c"), exclude=("d", "e"))],
                                "too many constraint phrases: 5 (the limit is 4 per request, --max-phrases)"),
                               ([Constraints(include=("abcdefg", "hijklmn"))],
                                "too many constraint pieces: the phrases make 14 pieces (the limit is 12")):
        with pytest.raises(ApiError) as e:
            service.constraints_for(model, lines, requested)
        assert e.value.status == 400 and message in e.value.message

    service.start()
    try:
        with pytest.raises(ApiError) as e:  # the engine takes no step until the test lets it: past 0.5 s
            asyncio.run(service.translate(model, ["a b"], model.decode))
        assert e.value.status == 504 and "--decode-timeout" in e.value.message
        engine.step_gate.release(100)  # the abandoned job stops at its next step
        batcher = service.batchers[model.name]
        while batcher.decoding():
            time.sleep(0.001)
        assert engine.done <= 2 and engine.calls == []
    finally:
        engine.step_gate.release(100)
        service.stop()


def test_health_answers_503_while_a_queue_is_not_moving():
    """/v1/health (mtkit's: each model's queue, batches decoding, whether it moves) and /health (its status
    code) say 503 while a batch has decoded for over twice --decode-timeout, and 200 once it is over."""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from mtkit.engines.engine import Stopped
    from mtkit.serve.app import create_app
    from mtkit.serve.service import Limits, Service

    engine, clock = Stepper(steps=3), Clock()
    service = Service([served(engine)], Limits(decode_timeout=5.0))
    batcher = service.batchers["reverse"]
    batcher.clock = clock
    try:
        with TestClient(create_app(service)) as client:
            assert client.get("/v1/health").status_code == 200
            job = batcher.submit(["a b"], engine.decode)
            while batcher.decoding() == 0:
                time.sleep(0.001)
            clock.now += 9
            answer = client.get("/v1/health")
            assert answer.status_code == 200 and answer.json()["models"][0]["decoding"] == 1
            clock.now += 2  # one batch for 11 s, over twice the 5 s deadline
            answer = client.get("/v1/health")
            assert answer.status_code == 503 and answer.json()["status"] == "unavailable"
            assert answer.json()["models"][0]["moving"] is False
            assert client.get("/health").status_code == 503
            engine.step_gate.release(3)
            with pytest.raises(Stopped):  # past its deadline: it stopped at its next step
                job.result(30)
            while batcher.decoding():
                time.sleep(0.001)
            assert client.get("/v1/health").status_code == 200 and client.get("/health").status_code == 200
    finally:
        engine.step_gate.release(100)
        service.stop()
