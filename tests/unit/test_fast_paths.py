"""The training fast paths equal the plain formulas they replace."""

import pytest
import torch
import torch.nn.functional as F

from mtkit.model import MultiHeadAttention, reference_attention
from mtkit.training.loss import label_smoothed_loss, reference_label_smoothed_loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [50, 3000])
def test_chunked_loss_equals_the_reference_formula(dtype, vocab, monkeypatch):
    monkeypatch.setattr("mtkit.training.loss.CHUNK_ELEMENTS", 4 * vocab)  # several chunks
    torch.manual_seed(0)
    logits = (3 * torch.randn(5, 7, vocab)).to(dtype).requires_grad_()
    target = torch.randint(4, vocab, (5, 7))
    target[1, 4:] = 0
    target[3, 2:] = 0
    ref = reference_label_smoothed_loss(logits, target, 0.1, 0)
    fast = label_smoothed_loss(logits, target, 0.1, 0)
    assert ref[2] == fast[2] == int((target != 0).sum())
    assert torch.allclose(fast[0], ref[0], rtol=1e-5) and torch.allclose(fast[1], ref[1], rtol=1e-5)
    (g_ref,) = torch.autograd.grad(ref[0], logits)
    (g_fast,) = torch.autograd.grad(fast[0], logits)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(g_fast.float(), g_ref.float(), atol=tol)
    assert (g_fast[target == 0] == 0).all()


def test_chunked_loss_equals_cross_entropy_with_label_smoothing():
    torch.manual_seed(1)
    logits, target = torch.randn(4, 6, 40), torch.randint(1, 40, (4, 6))
    target[0, 3:] = 0
    expected = F.cross_entropy(logits.reshape(-1, 40), target.reshape(-1), ignore_index=0, label_smoothing=0.1,
                               reduction="sum")
    assert torch.allclose(label_smoothed_loss(logits, target, 0.1, 0)[0], expected, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_cpu_attention_path_equals_sdpa(causal):
    """In bf16 with gradients on CPU, attend() takes the plain formula: it matches SDPA, values and gradients."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4)
    q, k, v = (torch.randn(3, 4, 6, 8, requires_grad=True) for _ in range(3))
    mask = None if causal else torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4], dtype=torch.bool)[:, None, None, :]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert torch.allclose(reference_attention(q, k, v, mask, causal)[0], expected, atol=1e-6)
    qb, kb, vb = (t.detach().bfloat16().requires_grad_() for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha.attend(qb, kb, vb, mask, causal)
        ref = mha.w_o(mha.merge_heads(F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=causal)))
    assert torch.allclose(out.float(), ref.float(), atol=3e-2)
    g_out = torch.autograd.grad(out.float().sum(), (qb, kb, vb))
    g_ref = torch.autograd.grad(ref.float().sum(), (qb, kb, vb))
    for a, b in zip(g_out, g_ref):
        assert torch.allclose(a.float(), b.float(), atol=5e-2)
