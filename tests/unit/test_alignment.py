"""Word alignments: the Pharaoh format, pieces to words, attention to word pairs, and the model's attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_transformer

from mtkit.data.word_alignment import (
    check_layer,
    default_layer,
    parse_pharaoh,
    pharaoh,
    piece_words,
    word_alignment,
    word_spans,
)
from mtkit.errors import MtkitError


@pytest.fixture(scope="module")
def vocab():
    from mtkit.config import SpmConfig
    from mtkit.data.synthetic import english, german
    from mtkit.data.vocab import Vocab, train_model

    sentences = [english(n) for n in range(0, 1000, 7)] + [german(n) for n in range(0, 1000, 7)]
    return Vocab.from_bytes(train_model(sentences, SpmConfig(vocab_size=80)))


def test_word_spans_are_str_split_in_utf8_bytes_or_characters():
    text = "  Grüße,\u3000Welt\x1c ok\u2028x "
    spans = word_spans(text, "utf-8")
    encoded = text.encode()
    assert [encoded[b:e].decode() for b, e in spans] == text.split() == ["Grüße,", "Welt", "ok", "x"]
    assert [text[b:e] for b, e in word_spans(text)] == text.split()  # in characters


def test_a_piece_belongs_to_the_word_of_its_first_non_space_byte_and_a_lone_space_to_the_next():
    text = "ab  cd"  # pieces "▁a" "b" "▁" "cd" as SentencePiece spans them
    assert piece_words(text, [(0, 1), (1, 2), (2, 4), (4, 6)]) == [0, 0, 1, 1]
    assert piece_words("ab ", [(0, 2), (2, 3)]) == [0, -1]  # a trailing space: no word after it


def test_the_vocabulary_maps_each_piece_to_its_word_through_normalization(vocab):
    for text in ["two hundred five", "  seven   thousand,  one ", "ＴＷＯ hundred", "zwei-hundert fünf", ""]:
        ids, words = vocab.encode_src(text), vocab.src_words(text)
        assert len(words) == len(ids)
        pieces = vocab.src_pieces(ids)
        # every word of the line has a piece, in order, and a piece opening a word starts with ▁
        assert sorted(set(words) - {-1}) == list(range(len(text.split())))
        assert words == sorted(words)
        for k, w in enumerate(words):
            if k == 0 or w != words[k - 1]:
                assert pieces[k].startswith("▁") or k == 0
    ids = vocab.encode_tgt("zweihundert fünf und dreißig")
    words = vocab.tgt_words([*ids, 2])  # EOS: no word
    assert words[-1] == -1 and sorted(set(words[:-1])) == list(range(len(vocab.decode_tgt(ids).split())))


def test_a_tagged_source_gives_its_tag_no_word(vocab):
    from mtkit.data.languages import TaggedVocab

    tagged = TaggedVocab.__new__(TaggedVocab)
    tagged.base, tagged.side, tagged.tag = vocab, "source", 3
    assert tagged.src_words("two hundred") == [-1, *vocab.src_words("two hundred")]
    assert tagged.src_words("") == []


def test_hard_alignment_sums_source_pieces_and_averages_target_pieces():
    # source words: w0 = pieces 0,1; w1 = piece 2; piece 3 is EOS (no word)
    # target words: v0 = piece 0; v1 = pieces 1,2
    attention = np.array([
        [0.30, 0.30, 0.35, 0.05],  # v0: w0 0.60 > w1 0.35 (a single piece would pick w1)
        [0.10, 0.00, 0.80, 0.10],  # v1 piece 1 -> w1
        [0.50, 0.40, 0.00, 0.10],  # v1 piece 2 -> w0; mean over v1: w0 0.5, w1 0.4
        [0.00, 0.00, 0.00, 1.00],  # the EOS row: ignored
    ])
    assert word_alignment(attention, [0, 0, 1, -1], [0, 1, 1], "hard") == [(0, 0), (0, 1)]
    # soft: renormalized without EOS, every pair at or above the threshold
    assert word_alignment(attention, [0, 0, 1, -1], [0, 1, 1], "soft", threshold=0.4) == [(0, 0), (0, 1), (1, 1)]
    assert word_alignment(attention, [0, 0, 1, -1], [0, 1, 1], "soft", threshold=0.6) == [(0, 0)]
    assert word_alignment(attention, [-1, -1, -1, -1], [0, 1, 1]) == []


def test_pharaoh_round_trip_and_errors():
    pairs = [(0, 1), (2, 0), (10, 3)]
    assert pharaoh(pairs) == "0-1 2-0 10-3"
    assert parse_pharaoh("0-1 2-0  10-3\n", 11, 4, "a.txt: line 1") == pairs
    for bad, why in (("0-", "not a Pharaoh pair"), ("a-b", "not a Pharaoh pair"), ("1-²", "not a Pharaoh pair"),
                     ("0-4", "beyond the sentence"), ("11-0", "beyond the sentence"), ("0:1", "not a Pharaoh")):
        with pytest.raises(MtkitError, match=why) as e:
            parse_pharaoh(bad, 11, 4, "a.txt: line 7")
        assert str(e.value).startswith("a.txt: line 7: ")


def test_the_default_layer_is_the_penultimate_and_layers_are_checked():
    assert [default_layer(n) for n in (1, 2, 6)] == [0, 0, 4]
    assert check_layer(-1, 6) == 5 and check_layer(3, 6) == 3
    with pytest.raises(MtkitError, match="--alignment-layer 6: the model has 6 decoder layers"):
        check_layer(6, 6)


def test_the_cross_attention_of_the_first_layers_is_that_of_the_whole_pass():
    model = tiny_transformer(decoder_layers=3).eval()
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt = torch.tensor([[1, 10, 11], [1, 12, 0]])
    full = model.cross_attention(src, tgt)
    assert full.shape == (3, 2, 4, 3, 4)
    torch.testing.assert_close(model.cross_attention(src, tgt, 2), full[:2])
    assert (full[:, 1, :, :, 3] == 0).all()  # the padded source position gets no weight
    torch.testing.assert_close(full.sum(-1), torch.ones(3, 2, 4, 3))


def test_the_head_guided_training_reads_is_the_one_alignments_read():
    """The training path (the layer's reference attention, with its output) and the inference path
    (Transformer.cross_attention) give the same weights, and the same hidden states as the plain pass."""
    model = tiny_transformer(decoder_layers=3).eval()
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt = torch.tensor([[1, 10, 11], [1, 12, 0]])
    memory, mask = model.encode(src)
    with torch.no_grad():
        hidden, attention = model.decoder.forward_with_attention(tgt, memory, mask, 1, 2)
        plain = model.decode(tgt, memory, mask)
    torch.testing.assert_close(hidden, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attention, model.cross_attention(src, tgt)[1][:, 2])


def test_the_guided_loss_reaches_only_the_chosen_heads_queries_and_keys():
    from mtkit.training.loss import TranslationLoss

    model = tiny_transformer(decoder_layers=3)
    layer, head, d_k = 1, 2, 8  # 4 heads of 8 dimensions
    criterion = TranslationLoss(model, 0.0, 0, guided=(layer, head, 1.0), kernels="reference")
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    tgt_in = torch.tensor([[1, 10, 11], [1, 12, 0]])
    tgt_out = torch.tensor([[10, 11, 2], [12, 2, 0]])
    align = torch.zeros(2, 3, 4)
    align[0, 0, 2] = align[0, 1, 0] = align[1, 0, 1] = 1.0
    plain, _, _ = criterion(src, tgt_in, tgt_out)
    guided, _, _ = criterion(src, tgt_in, tgt_out, align)
    # the alignment term alone, through autograd: the difference of the two losses
    (guided - plain).backward()
    attn = model.decoder.layers[layer].cross_attn
    rows = slice(head * d_k, (head + 1) * d_k)
    for name in ("w_q", "w_k"):
        grad = getattr(attn, name).weight.grad
        assert grad[rows].abs().sum() > 0, name
        others = torch.cat([grad[: head * d_k], grad[(head + 1) * d_k :]])
        assert others.abs().sum() == 0, name
    assert attn.w_v.weight.grad.abs().sum() == 0 and attn.w_o.weight.grad.abs().sum() == 0
    for above in model.decoder.layers[layer + 1 :]:
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in above.parameters())
    # and its value: -Σ log attention at the linked cells
    with torch.no_grad():
        weights = model.cross_attention(src, tgt_in)[layer][:, head]
    expected = -(weights[0, 0, 2].log() + weights[0, 1, 0].log() + weights[1, 0, 1].log())
    torch.testing.assert_close((guided - plain).detach(), expected, rtol=1e-4, atol=1e-4)


def test_a_batch_spreads_each_target_pieces_links_evenly():
    from mtkit.training.batching import pad_batch

    batch = pad_batch([np.array([5, 6, 7]), np.array([8])], [np.array([9, 10]), np.array([11, 12, 13])],
                      links=[np.array([[0, 0], [2, 0], [1, 1]]), np.zeros((0, 2), dtype=np.int64)])
    assert batch.align.shape == (2, 4, 4)  # T = 3 + EOS, S = 3 + EOS
    expected = torch.zeros(2, 4, 4)
    expected[0, 0, 0] = expected[0, 0, 2] = 0.5
    expected[0, 1, 1] = 1.0
    torch.testing.assert_close(batch.align, expected)
    assert pad_batch([np.array([5])], [np.array([9])]).align is None
