"""Text hardening in ``mtkit serve``: an include phrase or glossary term the model cannot write is
unmet with the reason (``unmet_reasons``) and never forced; a phrase holding a reserved piece is a
400 naming the field; a typed tag and trailing pieces leave no trace in the output. The real server
in a subprocess (:class:`test_serve.Server`), on a trained model of the reverse task."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from test_serve import Server  # after the skips: it needs the serve extra

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'


@pytest.fixture(scope="module")
def server(reverse_run, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve-unwritable"), "-m", reverse_run)
    yield s
    assert s.stop() == 0, s.log.read_text()


def test_a_phrase_the_model_cannot_write_is_unmet_with_the_reason(server):
    status, body = server.post_json("/v1/translate", {
        "text": ["alpha bravo", "charlie delta"],
        "constraints": [{"include": ["ALPHA", "kilo"]}, None], "glossary": {"charlie": "1,000"}})
    assert status == 200, body
    first, second = body["translations"]
    assert "⁇" not in first["text"] + second["text"] and "kilo" in first["text"].split()
    assert first["unmet"] == ["ALPHA"] and "'A'" in first["unmet_reasons"]["ALPHA"]
    assert second["unmet"] == ["1,000"] and "','" in second["unmet_reasons"]["1,000"]
    assert all(s["text"] == s["text"].strip() for s in body["translations"])


@pytest.mark.parametrize("request_body,message", [
    ({"text": "a", "constraints": {"include": ["<2de>"]}}, "reserved piece"),
    ({"text": "a", "constraints": {"exclude": ["</s>"]}}, "reserved piece"),
    ({"text": "a", "glossary": {"alpha": "<unk>"}}, "reserved piece"),
])
def test_a_reserved_piece_as_a_phrase_is_a_400(server, request_body, message):
    status, body = server.post_json("/v1/translate", request_body)
    assert status == 400 and message in body["error"], body
