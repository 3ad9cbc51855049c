"""The Python API on a tiny untrained checkpoint: typed results in input order, per-call options checked
as the CLI's (errors name keywords), raw log-probabilities that forced decoding agrees with, the engine's
own translations unchanged, and no torch for ``import mtkit``."""

from __future__ import annotations

import logging
import math
import subprocess
import sys

import pytest
from conftest import write_tiny_checkpoint

import mtkit
from mtkit.data.synthetic import english
from mtkit.decoding.penalties import length_penalty
from mtkit.errors import MtkitError

LINES = [english(n) for n in (5, 17, 342, 999, 40, 77)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return mtkit.load(write_tiny_checkpoint(tmp_path_factory.mktemp("api") / "tiny.pt"), device="cpu", threads=1)


def test_import_mtkit_loads_no_torch():
    code = "import sys, mtkit; mtkit.load, mtkit.pipeline; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_string_gives_a_result_and_a_list_a_list_in_order(model):
    one = model.translate(LINES[2], beam=2)
    assert isinstance(one, mtkit.Result) and one.source == LINES[2] and len(one.hypotheses) == 1
    many = model.translate(LINES, beam=2)
    assert [r.source for r in many] == LINES
    assert many[2] == one  # the same line alone or among others
    # what the engine gives, unchanged: text and score of its best candidate
    engine = list(model.engine.translate(LINES, options=model.options(beam=2)))
    assert [r.score for r in many] == [t.best.score for t in engine]
    assert [r.hypotheses[0].tokens for r in many] == [t.best.pieces for t in engine]
    empty = model.translate(["", "  "])
    assert [r.text for r in empty] == ["", ""] and all(len(r.hypotheses) == 1 for r in empty)


def test_nbest_hypotheses_are_best_first_and_carry_their_log_probability(model):
    for alpha in (0.0, 0.6):
        results = model.translate(LINES, beam=4, nbest=3, alpha=alpha)
        for r in results:
            assert len(r.hypotheses) == 3
            scores = [h.score for h in r.hypotheses]
            assert scores == sorted(scores, reverse=True)
            for h in r.hypotheses:
                lp = length_penalty(len(h.tokens) + 1, alpha, "gnmt")
                assert math.isclose(h.logprob, h.score * lp, rel_tol=1e-6)
                assert h.logprob <= 0


def test_alignments_come_with_each_hypothesis_when_asked(model):
    plain = model.translate(LINES, beam=2, nbest=2)
    aligned = model.translate(LINES, beam=2, nbest=2, alignments="hard")
    assert [h.text for r in plain for h in r.hypotheses] == [h.text for r in aligned for h in r.hypotheses]
    assert all(h.alignment is None for r in plain for h in r.hypotheses)
    for r in aligned:
        for h in r.hypotheses:
            assert all(0 <= s < len(r.source.split()) and 0 <= t < len(h.text.split()) for s, t in h.alignment)
    with pytest.raises(MtkitError, match="alignment_threshold: must be in"):
        model.translate(LINES[0], alignments="soft", alignment_threshold=2.0)


def test_the_log_probability_is_what_forced_decoding_gives(model):
    """alpha 0: the search score is the raw log-probability; scoring the best hypothesis's text by forced
    decoding gives it again (where the text encodes back to the same pieces)."""
    results = model.translate(LINES, beam=1, alpha=0.0)
    pieces = [model.engine.vocab.tgt_pieces(model.engine.vocab.encode_tgt(r.text)) for r in results]
    same = [i for i, r in enumerate(results) if pieces[i] == r.hypotheses[0].tokens and r.text]
    assert same, "no hypothesis encodes back to its own pieces"
    scored = model.score([LINES[i] for i in same], [results[i].text for i in same])
    for i, s in zip(same, scored):
        assert math.isclose(s.logprob, results[i].logprob, rel_tol=1e-4, abs_tol=1e-4), (i, s, results[i])
        assert s.tokens == len(results[i].hypotheses[0].tokens) + 1


def test_options_are_checked_and_errors_name_keywords(model):
    before = model.decode
    with pytest.raises(MtkitError, match=r"^nbest: must be between 1 and beam \(2\), got 5$"):
        model.translate("one", beam=2, nbest=5)
    with pytest.raises(MtkitError, match=r"^beam: must be >= 1, got 0$"):
        model.translate("one", beam=0)
    with pytest.raises(MtkitError, match=r"^min_len: must be >= 0 \(0: off\), got -1$"):
        model.translate("one", min_len=-1)
    with pytest.raises(MtkitError, match=r"^top_p needs sampling"):
        model.translate("one", top_p=0.5)
    with pytest.raises(MtkitError, match=r"^unknown option 'beams'"):
        model.translate("one", beams=2)
    with pytest.raises(MtkitError, match="constraints: 1 given for 2 lines"):
        model.translate(["one", "two"], constraints=[{"exclude": ["x"]}])
    with pytest.raises(MtkitError, match=r"constraints\[0\]: unknown key 'includes'"):
        model.translate(["one"], constraints=[{"includes": ["x"]}])
    with pytest.raises(MtkitError, match="lines: expected a string or a list of strings"):
        model.translate([1, 2])
    model.translate("one", beam=3, alpha=0.2, nbest=2)
    assert model.decode is before  # a call never changes the model


def test_an_exclude_constraint_keeps_its_phrase_out(model):
    free = model.translate(LINES, beam=4)
    word = next(w for r in free for w in r.text.split() if len(w) > 3)
    banned = model.translate(LINES, beam=4, constraints=[{"exclude": [word]}] * len(LINES))
    assert all(word not in r.text.split() for r in banned)


def test_load_says_what_it_loaded_to_the_mtkit_logger(tmp_path, caplog):
    path = write_tiny_checkpoint(tmp_path / "tiny.pt")
    with caplog.at_level(logging.INFO, logger="mtkit"):
        m = mtkit.load(path, device="cpu", threads=1)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("mtkit")]
    assert f"loaded {path} (step 1)" in said and "threads: 1 (set by --threads)" in said
    assert m.kind == "torch" and repr(m) == f"mtkit.Model({str(path)!r}, engine='torch')"
    with pytest.raises(MtkitError, match="no such checkpoint"):
        mtkit.load(tmp_path / "missing")
    with pytest.raises(MtkitError, match="^engine 'tensorrt': expected one of torch, ctranslate2, onnx$"):
        mtkit.load(path, engine="tensorrt")
    with pytest.raises(MtkitError, match="^engine onnx takes one folder written by mtkit export onnx$"):
        mtkit.load(path, engine="onnx")  # a checkpoint: the ONNX engine takes an export


def test_evaluate_takes_one_reference_list_or_several_streams():
    hyps = ["the cat sat on the mat", "a dog"]
    one = mtkit.evaluate(hyps, ["the cat sat on the mat", "a dog"], metrics=["bleu"])
    assert one[0].metric == "BLEU" and one[0].score == pytest.approx(100.0) and "nrefs:1" in one[0].signature
    two = mtkit.evaluate(hyps, [["the cat sat on a mat", "one dog"], ["the cat sat on the mat", "a dog"]])
    assert [s.metric for s in two] == ["BLEU", "chrF2", "TER"] and "nrefs:2" in two[0].signature


def test_the_pipeline_answers_as_transformers_did(model):
    pipe = mtkit.api.TranslationPipeline(model)
    one = pipe(LINES[0], num_beams=2)
    assert one == [{"translation_text": model.translate(LINES[0], beam=2).text}]
    many = pipe(LINES, num_beams=2, batch_size=2)
    assert many == [{"translation_text": r.text} for r in model.translate(LINES, beam=2)]
    nested = pipe(LINES[:2], num_beams=3, num_return_sequences=2)
    assert len(nested) == 2 and all(len(n) == 2 for n in nested)
    assert len(pipe(LINES[0], num_beams=3, num_return_sequences=2)) == 2
    short = pipe(LINES, num_beams=2, max_length=3)  # generate's: the start token and 2 more at most
    assert short == [{"translation_text": r.text} for r in model.translate(LINES, beam=2, max_len_a=0, max_len_b=1)]
    with pytest.raises(MtkitError, match="unsupported keyword 'do_sample'"):
        pipe("one", do_sample=True)
    with pytest.raises(MtkitError, match="task 'summarization'"):
        mtkit.pipeline("summarization", model=model.path)


def test_load_leaves_the_process_thread_count_alone_unless_asked(tmp_path):
    """The library owns no process state: mtkit.load with its defaults (threads=None) neither sets torch's
    thread count nor installs a policy that sets it between batches; threads=N asks for N."""
    import torch

    path = write_tiny_checkpoint(tmp_path / "tiny.pt")
    before = torch.get_num_threads()
    odd = 3 if before != 3 else 2
    torch.set_num_threads(odd)
    try:
        loaded = mtkit.load(path, device="cpu")
        assert torch.get_num_threads() == odd
        loaded.translate(LINES, beam=2)
        assert torch.get_num_threads() == odd  # nor does a call
        mtkit.load(path, device="cpu", threads=1)  # asked
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_scoring_model_scores_as_the_translating_one(model, tmp_path):
    """task='score' (the score command's) builds forced decoding's scorer in load and no search engine; a
    translating model derives the same scorer once, whichever thread asks first."""
    import threading

    from mtkit.api import LoadOptions, load_models

    path = write_tiny_checkpoint(tmp_path / "tiny.pt")
    scoring = load_models([path], LoadOptions(engine="torch", device="cpu", task="score", any_target=False))
    assert scoring.engine is None and scoring.scorer is not None
    with pytest.raises(MtkitError, match="loaded to score"):
        scoring.translate("one")
    translating = mtkit.load(path, device="cpu", threads=1)
    seen = []
    workers = [threading.Thread(target=lambda: seen.append(translating.scorer)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len({id(s) for s in seen}) == 1 and translating.scorer is seen[0]
    sources, targets = LINES[:3], [r.text for r in translating.translate(LINES[:3], beam=2)]
    assert ([s.logprob for s in scoring.score(sources, targets)]
            == [s.logprob for s in translating.score(sources, targets)])


def test_a_model_in_memory_translates_as_its_checkpoint(model):
    """from_model (validation's door): training's Transformer and vocabulary behind the torch engine."""
    from mtkit.api import from_model

    checkpoint = model.checkpoints[0]
    wrapped = from_model(checkpoint.model, checkpoint.vocab, model.decode, "cpu")
    assert [r.text for r in wrapped.translate(LINES, beam=2)] == [r.text for r in model.translate(LINES, beam=2)]


def test_load_refuses_an_unknown_setting(tmp_path):
    with pytest.raises(MtkitError, match=r"^unknown setting 'beam'; expected one of engine, device"):
        mtkit.load(tmp_path, beam=2)
