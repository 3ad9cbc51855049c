"""``mtkit serve`` end to end: the real server in a subprocess, on a port the OS picks, talked to over HTTP.

Translations are checked against ``mtkit translate`` on the same lines (torch, and CTranslate2
after ``mtkit export ctranslate2``); concurrent requests each get their own; bad requests get a
JSON error with the right 4xx and the server goes on; SIGTERM lets requests in flight finish and
exits 0.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import WORDS, http_exchange
from inprocess import run_mtkit

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "MTKIT_DEBUG": "", "NO_PROXY": "*"}
MTKIT = [sys.executable, "-m", "mtkit"]


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    found: list[str] = []
    while len(found) < n:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7)))
        if line not in found:
            found.append(line)
    return found


class Server:
    """``mtkit serve`` in a subprocess; ``port`` is the one it printed (it binds port 0)."""

    def __init__(self, tmp_path: Path, *args) -> None:
        self.log = tmp_path / f"serve-{time.monotonic_ns()}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([*MTKIT, "serve", "--port", "0", "--device", "cpu", "--threads", "1",
                                          *map(str, args)], stdout=log, stderr=subprocess.STDOUT, env=ENV)
        self.port = None
        deadline = time.monotonic() + 180  # generous: the model loads first; not a timing assertion
        while self.port is None and time.monotonic() < deadline:
            m = re.search(r"serving on http://127\.0\.0\.1:(\d+)/", self.log.read_text())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                break
            else:
                time.sleep(0.2)
        assert self.port is not None, self.log.read_text()
        while time.monotonic() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("the server never became healthy: " + self.log.read_text())

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                headers: dict | None = None, answer_optional: bool = False) -> tuple[int, Any, bytes]:
        """The server's answer; one it gives before reading the whole body is taken (:func:`http_exchange`).
        A connection closed with no answer is an error, or with ``answer_optional`` ``(None, None, b"")``."""
        found = http_exchange(self.port, method, path, body,
                              {**({"Content-Type": content_type} if content_type else {}), **(headers or {})})
        if found is None:
            if answer_optional:
                return None, None, b""  # type: ignore[return-value]
            raise ConnectionError(f"{method} {path}: the server closed the connection without an answer")
        return found

    def get(self, path: str):
        return self.request("GET", path)

    def post_json(self, path: str, data, headers: dict | None = None) -> tuple[int, dict]:
        status, _, body = self.request("POST", path, json.dumps(data).encode(), "application/json", headers)
        return status, json.loads(body)

    def post_form(self, path: str, fields) -> tuple[int, dict]:
        status, _, body = self.request("POST", path, urllib.parse.urlencode(fields).encode(),
                                       "application/x-www-form-urlencoded")
        return status, json.loads(body)

    def metric(self, name: str, **labels) -> float:
        text = self.get("/metrics")[2].decode()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        total = 0.0
        for line in text.splitlines():
            m = re.match(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", line)
            if m and all(part in (m.group(1) or "") for part in want.split(",") if part):
                total += float(m.group(2))
        return total

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def mtkit_translate(*args, lines: list[str]) -> list[str]:
    """What ``mtkit translate`` writes for ``lines`` (the CLI in this process: the reference the servers'
    answers are compared with)."""
    done = run_mtkit("translate", "--device", "cpu", *args, stdin="\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")[:-1]
    assert len(out) == len(lines)
    return out


LIMITS = ["--max-sentences", 70, "--max-chars", 5000, "--max-body-bytes", 20000]


@pytest.fixture(scope="module")
def server(reverse_run, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve"), "-m", reverse_run, *LIMITS)
    yield s
    assert s.stop() == 0, s.log.read_text()


@pytest.fixture(scope="module")
def expected(reverse_run) -> dict[str, str]:
    """``mtkit translate``'s translation of each test sentence."""
    lines = sentences(64, seed=7) + ["", "alpha bravo charlie"]
    return dict(zip(lines, mtkit_translate("-m", reverse_run, lines=lines)))


# ------------------------------------------------------------------------------------------ answers


def test_translate_a_string_and_a_list_as_json_and_as_a_form_like_mtkit_translate(server, expected):
    lines = list(expected)[:6]
    status, answer = server.post_json("/translate", {"q": lines[0], "source": "en", "target": "de"})
    assert status == 200 and answer == {"translatedText": expected[lines[0]]}
    status, answer = server.post_json("/translate", {"q": lines, "source": "en", "target": "de", "format": "text"})
    assert status == 200 and answer["translatedText"] == [expected[x] for x in lines]
    status, answer = server.post_form("/translate", {"q": lines[1], "source": "en", "target": "de"})
    assert status == 200 and answer == {"translatedText": expected[lines[1]]}
    status, answer = server.post_form("/translate",
                                      [("q", x) for x in lines[:3]] + [("source", "auto"), ("target", "de")])
    assert status == 200 and answer["translatedText"] == [expected[x] for x in lines[:3]]
    assert answer["detectedLanguage"][0]["language"] == "en"
    # Several lines in one q: one output line per input line, an empty line stays empty.
    text = "\n".join([lines[0], "", lines[2]])
    status, answer = server.post_json("/translate", {"q": text, "source": "en", "target": "de"})
    assert status == 200 and answer["translatedText"] == "\n".join([expected[lines[0]], "", expected[lines[2]]])


def test_html_keeps_its_markup_and_translates_its_text(server, expected):
    one, two, three = list(expected)[:3]
    markup = f'<p class="x">{one}</p>\n<ul><li> {two} </li><li>{three}<br/></li></ul><script>var w = "{one}";</script>'
    status, answer = server.post_json("/translate", {"q": markup, "source": "en", "target": "de", "format": "html"})
    assert status == 200, answer
    assert answer["translatedText"] == (f'<p class="x">{expected[one]}</p>\n<ul><li> {expected[two]} </li>'
                                        f'<li>{expected[three]}<br/></li></ul><script>var w = "{one}";</script>')
    status, answer = server.post_form("/translate", {"q": "<b></b>", "source": "en", "target": "de", "format": "html"})
    assert (status, answer) == (200, {"translatedText": "<b></b>"})


def test_inline_tags_follow_the_alignment_in_both_apis(server, expected):
    """A real model's alignments put inline tags back: the markup stays well-formed, the words are the
    plain sentence's translation, and /v1/translate's alignments name words of both sentences."""
    import html
    import re

    from mtkit.text.markup import _tokens

    line = list(expected)[0]
    words = line.split()
    markup = f'{words[0]} <b class="k">{" ".join(words[1:-1])}</b> <x-y/>{words[-1]}'
    status, answer = server.post_json("/translate", {"q": markup, "source": "en", "target": "de", "format": "html"})
    assert status == 200, answer
    result = answer["translatedText"]
    assert [t.text for t in _tokens(result, "html") if t.kind != "text"] in (
        ['<b class="k">', "</b>", "<x-y/>"], ["<x-y/>", '<b class="k">', "</b>"])
    assert html.unescape(re.sub(r"<[^>]*>", "", result)).split() == expected[line].split()
    status, answer = server.post_json("/v1/translate", {"text": [line, ""], "alignments": True})
    assert status == 200, answer
    found = answer["translations"][0]
    assert found["alignment"] and all(0 <= s < len(words) and 0 <= t < len(found["text"].split())
                                      for s, t in found["alignment"])
    assert sorted(t for _, t in found["alignment"]) == list(range(len(found["text"].split())))  # hard
    status, answer = server.post_json("/v1/translate", {"text": markup, "format": "html"})
    assert status == 200 and answer["translations"][0]["text"] == result
    # its quality estimate and n-best list, each hypothesis with its tags placed by its own alignment
    status, answer = server.post_json("/v1/translate", {"text": markup, "format": "html", "beam": 4, "nbest": 3})
    assert status == 200, answer
    found = answer["translations"][0]
    assert found["qe"] == found["confidence"] == found["nbest"][0]["confidence"] is not None
    assert 2 <= len(found["nbest"]) <= 3 and found["text"] == found["nbest"][0]["text"]
    for h in found["nbest"]:
        assert sorted(t.text for t in _tokens(h["text"], "html") if t.kind != "text") == \
            sorted(['<b class="k">', "</b>", "<x-y/>"]), h
        assert h["logprob"] == pytest.approx(h["confidence"] * h["tokens"], rel=1e-6)


def test_alternatives(server, expected):
    line = list(expected)[0]
    status, answer = server.post_json("/translate", {"q": line, "source": "en", "target": "de", "alternatives": 1})
    assert status == 200 and answer["translatedText"] == expected[line]
    assert isinstance(answer["alternatives"], list) and len(answer["alternatives"]) == 1
    status, answer = server.post_json("/translate", {"q": [line, line], "source": "en", "target": "de",
                                                     "alternatives": 2})
    assert status == 200 and [len(a) for a in answer["alternatives"]] == [2, 2]


def test_64_concurrent_requests_each_get_their_own_translation(server, expected):
    lines = list(expected)[:64]
    before = server.metric("mtkit_serve_batch_sentences_count")

    def one(line: str):
        return server.post_json("/translate", {"q": line, "source": "en", "target": "de"})

    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(one, lines))
    assert [status for status, _ in answers] == [200] * 64
    assert [a["translatedText"] for _, a in answers] == [expected[x] for x in lines]
    # Requests were merged: fewer decoding calls than requests (64 threads at once, 5 ms of waiting).
    assert server.metric("mtkit_serve_batch_sentences_count") - before < 64


def test_native_api_nbest_scores_and_confidence(server, expected, reverse_run):
    line = list(expected)[0]
    status, answer = server.post_json("/v1/translate", {"text": [line, ""], "beam": 4, "nbest": 3, "alpha": 1.0,
                                                        "length_penalty": "power"})
    assert status == 200, answer
    # the engine's own numbers, as search found them (no rebuilding in the server)
    import mtkit

    ours = mtkit.load(reverse_run, device="cpu", threads=1).translate(line, beam=4, nbest=3, alpha=1.0,
                                                                       length_penalty="power")
    engine = {h.text: h.logprob for h in reversed(ours.hypotheses)}  # the best of a text when it repeats
    for h in answer["translations"][0]["nbest"]:
        assert h["logprob"] == pytest.approx(engine[h["text"]], abs=1e-5)
    assert (answer["model"], answer["source"], answer["target"]) == ("run", "en", "de")
    first, empty = answer["translations"]
    assert empty == {"text": "", "confidence": None, "qe": None, "nbest": [], "unmet": [], "unmet_reasons": {},
                     "alignment": None, "sentences": []}  # (alignments: only when asked)
    assert first["qe"] == first["confidence"]  # without --qe-model, the quality estimate is the confidence
    assert 1 <= len(first["nbest"]) <= 3 and first["text"] == first["nbest"][0]["text"]
    scores = [h["score"] for h in first["nbest"]]
    assert scores == sorted(scores, reverse=True)
    for h in first["nbest"]:
        # power penalty with alpha 1: the score is the mean log-probability, the confidence itself
        assert h["confidence"] == pytest.approx(h["score"], abs=1e-6)
        assert h["logprob"] == pytest.approx(h["confidence"] * h["tokens"], rel=1e-6)
        assert h["confidence"] <= 0
    assert first["confidence"] == first["nbest"][0]["confidence"]
    # The model's own settings (beam 2, GNMT α 0.6) give mtkit translate's output; GNMT scores are not the mean.
    status, answer = server.post_json("/v1/translate", {"text": line, "model": "run"})
    assert status == 200 and answer["translations"][0]["text"] == expected[line]
    hyp = answer["translations"][0]["nbest"][0]
    lp = ((5 + hyp["tokens"]) / 6) ** 0.6
    assert hyp["logprob"] == pytest.approx(hyp["score"] * lp, rel=1e-6)


def test_libretranslate_answers_a_quality_estimate_only_when_asked(server, expected):
    lines = list(expected)[:3]
    plain = {"q": [lines[0], f"{lines[1]}\n{lines[2]}", ""], "source": "en", "target": "de"}
    status, answer = server.post_json("/translate", plain)
    assert status == 200 and "qe" not in answer  # LibreTranslate's answer, word for word
    status, native = server.post_json("/v1/translate", {"text": lines})
    confidence = [s["confidence"] for s in native["translations"]]
    for asked in ({**plain, "qe": True}, {**plain, "qe": "true"}):
        status, answer = server.post_json("/translate", asked)
        assert status == 200, answer
        assert answer["qe"][0] == pytest.approx(confidence[0]) and answer["qe"][2] is None
        assert answer["qe"][1] == pytest.approx((confidence[1] + confidence[2]) / 2)  # a text's: its lines' mean
    status, form = server.post_form("/translate", {"q": lines[0], "source": "en", "target": "de", "qe": "1"})
    assert status == 200 and form["qe"] == pytest.approx(confidence[0])
    status, bad = server.post_json("/translate", {**plain, "qe": "maybe"})
    assert status == 400 and bad == {"error": "Invalid request: qe must be true or false"}


def test_a_qe_model_scores_each_translation_in_both_apis(reverse_run, tmp_path, expected):
    from tiny_comet import write_tiny_comet

    from mtkit.metrics.comet import CometScorer

    kiwi = write_tiny_comet(tmp_path / "kiwi", "unified_metric")
    import torch

    ckpt = torch.load(kiwi / "checkpoints" / "model.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["input_segments"] = ["mt", "src"]
    torch.save(ckpt, kiwi / "checkpoints" / "model.ckpt")
    s = Server(tmp_path, "-m", reverse_run, "--qe-model", kiwi)
    try:
        lines = list(expected)[:3]
        status, native = s.post_json("/v1/translate", {"text": [*lines, ""]})
        assert status == 200, native
        texts = [t["text"] for t in native["translations"][:3]]
        wanted = CometScorer(str(kiwi), "cpu").score(lines, texts, None, progress=False)
        assert [t["qe"] for t in native["translations"][:3]] == pytest.approx(wanted, abs=1e-5)
        assert native["translations"][3]["qe"] is None
        status, answer = s.post_json("/translate", {"q": lines[:2], "source": "en", "target": "de", "qe": True})
        assert status == 200 and answer["qe"] == pytest.approx(wanted[:2], abs=1e-5)
        status, _, body = s.get("/openapi.json")
        assert "COMET-QE" in body.decode()  # the field, documented in the native API's schema
    finally:
        assert s.stop() == 0, s.log.read_text()


def test_languages_detect_health_metrics_docs_page(server):
    status, _, body = server.get("/languages")
    assert status == 200 and json.loads(body) == [{"code": "en", "name": "English", "targets": ["de"]}]
    status, answer = server.post_form("/detect", {"q": "whatever it is"})
    assert status == 200 and answer[0]["language"] == "en" and 0 < answer[0]["confidence"] <= 100
    assert server.get("/health")[0] == 200 and json.loads(server.get("/health")[2]) == {"status": "ok"}
    status, _, body = server.get("/v1/models")
    assert status == 200 and json.loads(body)["models"][0]["name"] == "run"
    before = server.metric("mtkit_serve_sentences_total", model="run")
    requests = server.metric("mtkit_serve_requests_total", endpoint="/translate", status="200")
    assert server.post_json("/translate", {"q": ["alpha bravo", "charlie"], "source": "en", "target": "de"})[0] == 200
    assert server.metric("mtkit_serve_sentences_total", model="run") == before + 2
    assert server.metric("mtkit_serve_requests_total", endpoint="/translate", status="200") == requests + 1
    for name in ("mtkit_serve_source_tokens_total", "mtkit_serve_target_tokens_total",
                 "mtkit_serve_request_seconds_count", "mtkit_serve_decode_seconds_count"):
        assert server.metric(name) > 0, name
    assert "mtkit_serve_queue_length" in server.get("/metrics")[2].decode()
    status, _, body = server.get("/docs")
    assert status == 200 and b"swagger" in body.lower()
    assert b"http://" not in body and b"https://" not in body  # Swagger UI's files from this server, no CDN
    script = re.search(rb'<script src="(/[^"]+\.js)"', body).group(1).decode()
    status, _, body = server.get(script)
    assert status == 200 and b"SwaggerUIBundle" in body
    status, _, body = server.get("/openapi.json")
    assert status == 200 and "/v1/translate" in json.loads(body)["paths"]
    status, headers, body = server.get("/")
    assert status == 200 and b"<textarea" in body and b'src="js/app.js' in body
    assert b"http://" not in body and b"https://" not in body  # everything from this server, no CDN
    status, headers, body = server.get("/js/app.js")
    assert status == 200 and b"v1/translate" in body and b"http://" not in body and b"https://" not in body


# ------------------------------------------------------------------------------------------ bad input


def error_of(status_body) -> str:
    status, body = status_body
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    return body["error"]


def test_bad_requests_get_a_4xx_json_error_and_the_server_goes_on(server, expected):
    def raw(body: bytes, content_type="application/json", path="/translate"):
        status, _, answer = server.request("POST", path, body, content_type)
        return status, json.loads(answer)

    ok = {"q": "alpha bravo", "source": "en", "target": "de"}
    cases = {
        "malformed JSON": (raw(b'{"q": "alpha'), 400),
        "not an object": (raw(b'["alpha"]'), 400),
        "q a number": (server.post_json("/translate", {**ok, "q": 5}), 400),
        "q a list of numbers": (server.post_json("/translate", {**ok, "q": ["a", 1]}), 400),
        "no q": (server.post_json("/translate", {"source": "en", "target": "de"}), 400),
        "source a list": (server.post_json("/translate", {**ok, "source": ["en"]}), 400),
        "unknown target": (server.post_json("/translate", {**ok, "target": "fr"}), 400),
        "unknown source": (server.post_json("/translate", {**ok, "source": "xx"}), 400),
        "format markdown": (server.post_json("/translate", {**ok, "format": "markdown"}), 400),
        "alternatives a string": (server.post_json("/translate", {**ok, "alternatives": "many"}), 400),
        "too many sentences": (server.post_json("/translate", {**ok, "q": ["alpha"] * 71}), 400),
        "too many lines": (server.post_json("/translate", {**ok, "q": "\n".join(["alpha"] * 71)}), 400),
        "too many characters": (server.post_json("/translate", {**ok, "q": ["alpha " * 400] * 3}), 400),
        "too large a body": (raw(json.dumps({**ok, "q": "alpha " * 5000}).encode()), 413),
        "invalid UTF-8": (raw(b'{"q": "alpha \xff\xfe", "source": "en", "target": "de"}'), 400),
        "invalid UTF-8 in a form": (raw(b"q=alpha%FF&source=en&target=de", "application/x-www-form-urlencoded"), 400),
        "multipart without q": (raw(b"--x--", "multipart/form-data; boundary=x"), 400),
        "v1 text a number": (server.post_json("/v1/translate", {"text": 5}), 400),
        "v1 beam a string": (server.post_json("/v1/translate", {"text": "alpha", "beam": "4"}), 400),
        "v1 beam too large": (server.post_json("/v1/translate", {"text": "alpha", "beam": 1000}), 400),
        "v1 nbest above beam": (server.post_json("/v1/translate", {"text": "alpha", "beam": 2, "nbest": 3}), 400),
        "v1 unknown field": (server.post_json("/v1/translate", {"text": "alpha", "beams": 2}), 400),
        "v1 unknown model": (server.post_json("/v1/translate", {"text": "alpha", "model": "nope"}), 400),
        "v1 a line break": (server.post_json("/v1/translate", {"text": ["alpha\nbravo"]}), 400),
        "v1 malformed": (raw(b"{", path="/v1/translate"), 400),
        "detect without q": (server.post_json("/detect", {}), 400),
        "no such endpoint": (raw(b"{}", path="/nothing"), 404),
    }
    for name, (answer, status) in cases.items():
        assert answer[0] == status, (name, answer)
        error_of(answer)
    line = list(expected)[0]
    assert server.post_json("/translate", {**ok, "q": line}) == (200, {"translatedText": expected[line]})


def test_api_keys(reverse_run, tmp_path, expected):
    keys = tmp_path / "keys.txt"
    keys.write_text("# the keys\nsecret-1\n\nsecret-2\n")
    s = Server(tmp_path, "-m", reverse_run, "--api-keys", keys)
    try:
        ok = {"q": "alpha bravo charlie", "source": "en", "target": "de"}
        assert s.post_json("/translate", ok)[0] == 400
        assert s.post_json("/translate", {**ok, "api_key": "wrong"})[0] == 403
        assert s.post_form("/translate", {**ok, "api_key": ""})[0] == 400  # none given: LibreTranslate's 400
        error_of(s.post_json("/v1/translate", {"text": "alpha"}))
        assert s.post_json("/v1/translate", {"text": "alpha"})[0] == 403
        assert s.post_json("/detect", {"q": "x"})[0] == 400
        assert s.post_json("/translate", {**ok, "api_key": "secret-2"}) == (200, {"translatedText": expected[ok["q"]]})
        assert s.post_form("/translate", {**ok, "api_key": "secret-1"})[0] == 200
        assert s.post_json("/v1/translate", {"text": "alpha"}, {"Authorization": "Bearer secret-1"})[0] == 200
        assert s.get("/languages")[0] == 200 and s.get("/health")[0] == 200
    finally:
        assert s.stop() == 0
    assert "secret" not in s.log.read_text()


def test_a_full_queue_answers_503_with_retry_after(reverse_run, tmp_path):
    s = Server(tmp_path, "-m", reverse_run, "--max-queue", 1, "--max-wait-ms", 0)
    try:
        lines = sentences(60, seed=3)
        body = {"text": lines, "beam": 8}  # slow enough that a burst finds the queue full

        def one(_):
            status, headers, answer = s.request("POST", "/v1/translate", json.dumps(body).encode(), "application/json")
            return status, headers, json.loads(answer)

        statuses = []
        for _ in range(5):  # a burst, until one is refused
            with ThreadPoolExecutor(24) as pool:
                answers = list(pool.map(one, range(24)))
            statuses = [status for status, _, _ in answers]
            if 503 in statuses:
                break
        assert 503 in statuses and 200 in statuses and set(statuses) <= {200, 503}
        for status, headers, answer in answers:
            if status == 503:
                assert int(headers["Retry-After"]) >= 1 and "busy" in answer["error"]
        assert s.metric("mtkit_serve_rejected_total") > 0
        assert one(0)[0] == 200
    finally:
        assert s.stop() == 0


def test_sigterm_lets_requests_in_flight_finish_and_exits_0(reverse_run, tmp_path, expected):
    # Each request waits a long time for others to be decoded with it, so that they are all in flight at SIGTERM.
    s = Server(tmp_path, "-m", reverse_run, "--max-wait-ms", 1500)
    lines = list(expected)[:8]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(s.post_json, "/translate", {"q": x, "source": "en", "target": "de"}) for x in lines]
        deadline = time.monotonic() + 60
        while s.metric("mtkit_serve_requests_in_flight") < 1 + len(lines) and time.monotonic() < deadline:
            time.sleep(0.02)  # the /metrics request counts itself
        s.proc.send_signal(signal.SIGTERM)
        answers = [f.result() for f in futures]
    assert s.proc.wait(timeout=120) == 0, s.log.read_text()
    assert answers == [(200, {"translatedText": expected[x]}) for x in lines]
    with pytest.raises(OSError):
        s.get("/health")


# ------------------------------------------------------------------------------------------ others


def test_the_ctranslate2_engine_serves_like_mtkit_translate(reverse_run, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    done = run_mtkit("export", "ctranslate2", reverse_run, out)
    assert done.returncode == 0, done.stderr
    lines = sentences(20, seed=11) + [""]
    want = mtkit_translate("--engine", "ctranslate2", "-m", out, lines=lines)
    s = Server(tmp_path, "--engine", "ctranslate2", "-m", out)
    try:
        status, answer = s.post_json("/translate", {"q": lines, "source": "en", "target": "de"})
        assert status == 200 and answer["translatedText"] == want
        with ThreadPoolExecutor(16) as pool:  # an empty q alone is LibreTranslate's "missing q parameter"
            got = list(pool.map(lambda x: s.post_form("/translate", {"q": x, "source": "en", "target": "de"}),
                                lines[:-1]))
        assert got == [(200, {"translatedText": w}) for w in want[:-1]]
        status, answer = s.post_json("/v1/translate", {"text": lines[0], "nbest": 2})
        assert status == 200 and len(answer["translations"][0]["nbest"]) <= 2
        assert answer["translations"][0]["confidence"] <= 0
        assert json.loads(s.get("/v1/models")[2])["models"][0]["engine"] == "ctranslate2"
    finally:
        assert s.stop() == 0


def test_libretranslatepy_translates_through_the_server(server, expected):
    libretranslatepy = pytest.importorskip("libretranslatepy")
    api = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{server.port}/")
    line = list(expected)[2]
    assert api.translate(line, "en", "de") == expected[line]
    detected = api.detect("A man is riding his bike down the street.")
    assert detected[0]["language"] == "en" and 50 < detected[0]["confidence"] <= 100
    assert {x["code"] for x in api.languages()} == {"en"}


def test_fuzzed_requests_never_get_a_5xx(server):
    """Property-based: any body (JSON with lone surrogates, NaN, infinities, huge integers, nesting up to
    100,000 deep; forms; query strings; bytes) on any endpoint is answered below 500, and the server is
    healthy after."""
    pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    text = st.text(st.characters(categories=["L", "N", "P", "Zs", "Cs", "Cc", "So"]), max_size=30)
    numbers = (st.integers(-5, 10) | st.integers() | st.sampled_from([10**40, -(10**400), 2**63])
               | st.floats() | st.sampled_from([1e308, -1e308, 5e-324]))
    values = st.recursive(st.none() | st.booleans() | numbers | text
                          | st.sampled_from(["en", "de", "auto", "text", "html", "alpha bravo", "\u00b2", "1e400"]),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=3),
                          max_leaves=8)
    names = st.sampled_from(["q", "source", "target", "format", "alternatives", "api_key", "text", "beam", "nbest",
                             "alpha", "model", "length_penalty", "constraints", "glossary"])
    fields = st.dictionaries(names, values, max_size=6)
    nested = st.tuples(names, st.integers(1, 100_000), st.sampled_from([b"[", b'{"a":'])).map(
        lambda t: b'{"%s": ' % t[0].encode() + t[2] * t[1] + b"1" + (b"]" if t[2] == b"[" else b"}") * t[1] + b"}")

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(path=st.sampled_from(["/translate", "/v1/translate", "/detect"]),
           body=fields | st.binary(max_size=60) | nested, how=st.sampled_from(["json", "form", "query"]))
    def check(path, body, how):
        # A server may answer (or close) before it has read a large body: its answer is taken when it
        # gave one, and a connection closed without one is accepted while the server stays healthy.
        if isinstance(body, bytes):
            status, _, answer = server.request("POST", path, body, "application/json", answer_optional=True)
        elif how == "form":
            flat = [(k, str(v)) for k, v in body.items()]
            status, _, answer = server.request("POST", path,
                                               urllib.parse.urlencode(flat, errors="surrogatepass").encode(),
                                               "application/x-www-form-urlencoded", answer_optional=True)
        elif how == "query":
            flat = [(k, str(v)) for k, v in body.items()]
            status, _, answer = server.request("POST",
                                               path + "?" + urllib.parse.urlencode(flat, errors="surrogatepass"),
                                               answer_optional=True)
        else:
            status, _, answer = server.request("POST", path, json.dumps(body).encode(), "application/json",
                                               answer_optional=True)
        if status is None:
            assert server.get("/health")[0] == 200
            return
        assert status < 500, (status, answer)
        if status != 400 or answer[:1] == b"{":  # uvicorn's own 400 for a request it cannot parse is text
            json.loads(answer)

    check()
    assert server.get("/health")[0] == 200


def test_bad_flags_are_one_error_line_before_anything_loads(reverse_run, tmp_path):
    for args, expected_error in (
        (["-m", tmp_path / "nothing"], "-m "),
        (["-m", reverse_run, "--max-queue", "0"], "--max-queue"),
        (["-m", reverse_run, "--api-keys", tmp_path / "no-keys"], "--api-keys"),
        (["-m", reverse_run, "--beam", "20"], "--max-beam"),
        (["-m", reverse_run, "--max-wait-ms", "nan"], "--max-wait-ms"),
        (["-m", reverse_run, "--graceful-timeout", "inf"], "--graceful-timeout"),
        (["-m", reverse_run, "--header-timeout", "0"], "--header-timeout"),
        (["-m", reverse_run, "--max-connections", "-1"], "--max-connections"),
    ):
        done = subprocess.run([*MTKIT, "serve", *map(str, args)], capture_output=True, text=True, env=ENV, timeout=300,
                              check=False)
        assert done.returncode == 1 and done.stderr.count("\n") == 1, (args, done.stderr)
        assert done.stderr.startswith("error: ") and expected_error in done.stderr, (args, done.stderr)
