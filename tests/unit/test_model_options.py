"""The model options imported models need (activation, output_bias, scale_embedding, sinusoid_layout):
the paper by default, Marian's sinusoids exactly, and cached decoding equal to full decoding with all on."""

from __future__ import annotations

import pytest
import torch

from mtkit.config import BOS_ID, ModelConfig
from mtkit.model import Transformer, sinusoid_table


def test_the_defaults_are_the_papers():
    cfg = ModelConfig()
    assert (cfg.activation, cfg.output_bias, cfg.scale_embedding, cfg.sinusoid_layout) == \
        ("relu", False, True, "interleaved")
    model = Transformer(ModelConfig(d_model=16, h=2, d_ff=32, encoder_layers=1, decoder_layers=1), 30, 30)
    assert model.output_projection.bias is None and model.encoder.embeddings.scale == 4.0


@pytest.mark.parametrize("d_model", [16, 18])
def test_concatenated_sinusoids_are_huggingface_marians(d_model):
    marian = pytest.importorskip("transformers.models.marian.modeling_marian")
    theirs = marian.MarianSinusoidalPositionalEmbedding(50, d_model).create_weight()
    assert torch.allclose(sinusoid_table(50, d_model, "concatenated"), theirs, atol=1e-6)
    interleaved = sinusoid_table(50, d_model)
    assert torch.equal(interleaved[:, 0::2], sinusoid_table(50, d_model, "concatenated")[:, : (d_model + 1) // 2])


@pytest.mark.parametrize("activation", ["swish", "gelu"])
def test_cached_decoding_equals_full_decoding_with_every_option(activation):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, h=2, d_ff=32, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=32,
                      activation=activation, output_bias=True, scale_embedding=False,
                      sinusoid_layout="concatenated", share_embeddings="decoder")
    model = Transformer(cfg, 40, 50, kernels="reference").eval()
    with torch.no_grad():
        model.output_projection.bias.normal_()
    src = torch.randint(4, 40, (3, 7))
    tgt = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, 50, (3, 5))], dim=1)
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        memory, mask = model.encode(src)
        cache = model.init_cache(memory, mask)
        steps = []
        for t in range(tgt.size(1)):
            logits, cache = model.decode_step(tgt[:, t], cache)
            steps.append(logits)
    assert torch.allclose(full, torch.stack(steps, dim=1), atol=1e-5)
