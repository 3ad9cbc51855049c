"""Terminology in ``mtkit serve`` (issue #24): per-request constraints and glossaries in ``/v1/translate``,
a server-wide ``--glossary`` on both APIs, and 400s for malformed ones; the real server in a
subprocess (:class:`test_serve.Server`), on a trained model of the reverse task."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from test_serve import Server  # after the skips: it needs the serve extra

pytestmark = pytest.mark.slow  # real processes and training: the fast tier is pytest -m 'not slow'


@pytest.fixture(scope="module")
def server(reverse_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-glossary")
    (folder / "glossary.tsv").write_text("Echo\tlima lima\n")
    s = Server(folder, "-m", reverse_run, "--glossary", folder / "glossary.tsv")
    yield s
    assert s.stop() == 0, s.log.read_text()


def test_per_request_constraints_and_glossary(server):
    plain = server.post_json("/v1/translate", {"text": ["golf hotel", "india juliet"]})[1]["translations"]
    status, body = server.post_json("/v1/translate", {
        "text": ["alpha bravo", "charlie delta", "golf hotel", "india juliet"],
        "constraints": [{"include": ["kilo"]}, None, {"exclude": ["golf"]}, None],
        "glossary": [{"source": "CHARLIE", "target": "india india"}], "nbest": 2})
    assert status == 200, body
    found = body["translations"]
    assert "kilo" in found[0]["text"].split()
    assert "india india" in found[1]["text"]
    assert "golf" not in found[2]["text"].split() and "golf" in plain[0]["text"].split()
    assert found[3]["text"] == plain[1]["text"]  # no constraints: as without any
    assert all(s["unmet"] == [] and len(s["nbest"]) == 2 for s in found)
    assert all("kilo" in h["text"].split() for h in found[0]["nbest"])

    status, body = server.post_json("/v1/translate", {"text": "alpha", "constraints": {"include": ["kilo lima"]},
                                                      "glossary": {"alpha": "bravo"}})
    assert status == 200 and {"kilo", "lima", "bravo"} <= set(body["translations"][0]["text"].split())


def test_the_server_glossary_applies_to_both_apis(server):
    status, body = server.post_json("/v1/translate", {"text": "echo foxtrot"})
    assert status == 200 and "lima lima" in body["translations"][0]["text"]
    status, body = server.post_json("/translate", {"q": ["echo foxtrot", "golf"], "source": "en", "target": "de"})
    assert status == 200 and "lima lima" in body["translatedText"][0] and "lima" not in body["translatedText"][1]


@pytest.mark.parametrize("request_body,message", [
    ({"text": ["a", "b"], "constraints": [{"include": ["kilo"]}]}, "constraints must be a list of 2 objects"),
    ({"text": "a", "constraints": [{"include": ["kilo"]}]}, "constraints must be one object"),
    ({"text": "a", "constraints": {"include": [" "]}}, "constraints: include holds an empty phrase"),
    ({"text": ["a"], "constraints": [{"include": ["x"], "exclude": ["x"]}]}, "both included and excluded"),
    ({"text": "a", "constraints": {"inclde": ["x"]}}, "inclde"),
    ({"text": "a", "glossary": [{"source": "", "target": "x"}]}, "expected a source term and a target term"),
    ({"text": "a", "glossary": {"a": 1}}, "glossary"),
])
def test_malformed_constraints_are_a_400_naming_the_field(server, request_body, message):
    status, body = server.post_json("/v1/translate", request_body)
    assert status == 400 and message in body["error"], body
