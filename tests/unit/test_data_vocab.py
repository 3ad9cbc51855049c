"""SentencePiece vocabularies: special ids, joint and separate, serialization, refusal of other ids."""

import io

import pytest
import sentencepiece as spm

from mtkit.config import SpmConfig
from mtkit.data.synthetic import demo_pairs
from mtkit.data.vocab import Vocab, train_model
from mtkit.errors import MtkitError

PAIRS = list(demo_pairs(500, seed=5))


def test_joint_vocab_round_trip(tmp_path):
    model = train_model([s for p in PAIRS for s in p], SpmConfig(vocab_size=300))
    vocab = Vocab.from_bytes(model)
    assert vocab.joint and vocab.src_size == vocab.tgt_size
    en, de = PAIRS[0]
    ids = vocab.encode_tgt(de)
    assert 2 not in ids and 3 not in ids  # no bos/eos
    assert vocab.decode_tgt([2] + ids + [3, 0]) == de
    assert vocab.decode_src(vocab.encode_src(en)) == en
    assert "".join(vocab.tgt_pieces(ids)).replace("▁", " ").strip() == de
    assert vocab.src_pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    vocab.save(tmp_path)
    assert Vocab.load(tmp_path).model_bytes() == (model, None)


def test_separate_vocab_and_unigram(tmp_path):
    cfg = SpmConfig(joint=False, model_type="unigram", vocab_size=200)
    vocab = Vocab.from_bytes(train_model([e for e, _ in PAIRS], cfg), train_model([d for _, d in PAIRS], cfg))
    assert not vocab.joint
    assert vocab.decode_tgt(vocab.encode_tgt(PAIRS[1][1])) == PAIRS[1][1]
    assert vocab.save(tmp_path) == ["spm.src.model", "spm.tgt.model"]
    assert not Vocab.load(tmp_path).joint


def test_short_and_long_lists_encode_as_each_sentence_alone():
    """Below BATCH_ENCODE_MIN sentences a list is encoded one sentence at a time, above it in one
    SentencePiece call: the ids are the same either way, on both sides."""
    from mtkit.data.vocab import BATCH_ENCODE_MIN

    cfg = SpmConfig(joint=False, vocab_size=200)
    vocab = Vocab.from_bytes(train_model([e for e, _ in PAIRS], cfg), train_model([d for _, d in PAIRS], cfg))
    for n in (0, 1, BATCH_ENCODE_MIN - 1, BATCH_ENCODE_MIN, 3 * BATCH_ENCODE_MIN):
        src, tgt = [e for e, _ in PAIRS[:n]], [d for _, d in PAIRS[:n]]
        assert vocab.encode_src_batch(src) == [vocab.encode_src(e) for e in src]
        assert vocab.encode_tgt_batch(tgt) == [vocab.encode_tgt(d) for d in tgt]
    assert vocab.encode_src_batch([PAIRS[0][0]]) != vocab.encode_tgt_batch([PAIRS[0][0]])  # two models


def test_other_special_ids_are_refused(tmp_path):
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([s for p in PAIRS for s in p]), model_writer=writer,
                                   vocab_size=100, hard_vocab_limit=False, minloglevel=2)  # unk=0 bos=1 eos=2
    path = tmp_path / "other.model"
    path.write_bytes(writer.getvalue())
    with pytest.raises(MtkitError, match=r"other\.model: special ids .* differ"):
        Vocab.from_files(path)
    with pytest.raises(MtkitError, match="no spm.model"):
        Vocab.load(tmp_path)


def test_lowercase_vocab_case_folds_inside_the_model():
    sentences = [v for p in PAIRS for s in p for v in (s, s.capitalize(), s.upper())]
    cased = Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=300)))
    folded = Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=300, lowercase=True)))
    assert not cased.lowercases("src") and folded.lowercases("src") and folded.lowercases("tgt")
    text = PAIRS[0][1].capitalize().replace(" ", " " + PAIRS[1][1].upper() + " ", 1)
    assert cased.decode_src(cased.encode_src(text)) == text
    # the model itself folds case, so translation input needs no separate lowercasing step
    assert folded.encode_src(text) == folded.encode_src(text.lower())
    assert folded.decode_src(folded.encode_src(text)) == text.lower()
    assert not any(p != p.lower() for i in range(folded.src_size) for p in [folded.src_pieces([i])[0]]
                   if not p.startswith("<"))
