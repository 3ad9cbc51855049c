"""The fast paths equal the plain formulas they replace."""

import math
import os
import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mtkit.config import BOS_ID, PAD_ID, ModelConfig
from mtkit.engines.inference import InferenceModel
from mtkit.host_memory import SERVING_CACHE_CAPACITY
from mtkit.kernels import (
    AUTO,
    REFERENCE,
    Dropout,
    choose_attention,
    chunked_top_extensions,
    cross_keys_values,
    fast_dropout,
    fused_encode,
    fused_step,
    keep_mask,
    label_smoothed_loss,
    linear_label_smoothed_loss,
    masked_dropout,
    pack,
    plain_attention,
    reference_attention,
    reference_dropout,
    reference_label_smoothed_loss,
    reference_linear_label_smoothed_loss,
    reference_symmetric_kl,
    reference_top_extensions,
    sdpa_attention,
    select,
    symmetric_kl,
)
from mtkit.kernels.attention import plain_attention_fast_dropout
from mtkit.kernels.topk import chunk_size
from mtkit.model import Transformer
from mtkit.training.loss import TranslationLoss


def test_select_gives_the_two_settings_and_passes_a_kernels_through():
    assert select("auto") is AUTO and select("reference") is REFERENCE and select(AUTO) is AUTO
    with pytest.raises(ValueError, match="auto"):
        select("fast")
    assert REFERENCE.dropout is reference_dropout and REFERENCE.attention is plain_attention
    assert AUTO.fuse_projection("cuda") and not AUTO.fuse_projection("cpu") and not REFERENCE.fuse_projection("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [50, 3000])
def test_chunked_loss_equals_the_reference_formula(dtype, vocab, monkeypatch):
    monkeypatch.setattr("mtkit.kernels.loss.CHUNK_ELEMENTS", 4 * vocab)  # several chunks
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


def _qkv(dtype, d_k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, 6, d_k, generator=g).to(dtype).requires_grad_() for _ in range(3)]


MASKS = {
    "none": (None, False),
    "padding": (torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4], dtype=torch.bool)[:, None, None, :],
                False),
    "causal": (None, True),
}


@pytest.mark.parametrize("grad", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("mask_kind", list(MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_flash_attention_equals_the_reference_formula(dtype, mask_kind, grad):
    """With d_k = 64, SDPA runs its flash kernel (only that backend is allowed here): values and gradients
    equal the formula's, in fp32 and bf16, with and without masks."""
    mask, causal = MASKS[mask_kind]
    q, k, v = _qkv(dtype)
    with torch.set_grad_enabled(grad):
        ref = plain_attention(q, k, v, mask, causal)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            fast = sdpa_attention(q, k, v, mask, causal)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert fast.dtype == ref.dtype == dtype
    assert torch.allclose(fast.float(), ref.float(), atol=tol)
    if grad:
        g_out = torch.randn_like(ref)
        g_ref = torch.autograd.grad(ref, (q, k, v), g_out)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            g_fast = torch.autograd.grad(sdpa_attention(q, k, v, mask, causal), (q, k, v), g_out)
        for a, b in zip(g_fast, g_ref):
            assert torch.allclose(a.float(), b.float(), atol=5 * tol)


@pytest.mark.parametrize("mask_kind", list(MASKS))
def test_attention_with_dropout_is_the_formula_with_dropped_weights(mask_kind):
    """Training dropout on the weights: the reference and auto's plain path drop at rate p and scale by
    1/(1-p); with p = 0 every kernel is the formula."""
    mask, causal = MASKS[mask_kind]
    q, k, v = (t.detach() for t in _qkv(torch.float32, d_k=8))
    for kernel in (plain_attention, plain_attention_fast_dropout, sdpa_attention, AUTO.attention):
        assert torch.allclose(kernel(q, k, v, mask, causal, 0.0), plain_attention(q, k, v, mask, causal), atol=1e-5)
    _, weights = reference_attention(q, k, v, mask, causal)
    for dropout, kernel in ((reference_dropout, plain_attention), (fast_dropout, plain_attention_fast_dropout)):
        torch.manual_seed(3)
        out = kernel(q, k, v, mask, causal, 0.5)
        torch.manual_seed(3)
        assert torch.allclose(out, dropout(weights, 0.5, True) @ v, atol=1e-6)  # the same mask from the same seed
        assert not torch.allclose(out, plain_attention(q, k, v, mask, causal))


def test_auto_attention_follows_its_table():
    """CPU training in bf16, or in fp32 with d_k < 64: the plain formula; otherwise SDPA."""
    def pick(dtype, d_k, grad):
        with torch.set_grad_enabled(grad):
            return choose_attention(torch.zeros(1, 1, 1, d_k, dtype=dtype))

    plain = plain_attention_fast_dropout
    assert pick(torch.bfloat16, 64, True) is plain and pick(torch.bfloat16, 8, True) is plain
    assert pick(torch.float16, 64, True) is plain
    assert pick(torch.float32, 32, True) is plain and pick(torch.float32, 64, True) is sdpa_attention
    for dtype in (torch.float32, torch.bfloat16):
        for d_k in (8, 64):
            assert pick(dtype, d_k, False) is sdpa_attention
    with torch.device("meta"):  # off the CPU: SDPA always
        assert choose_attention(torch.zeros(1, 1, 1, 8, dtype=torch.bfloat16)) is sdpa_attention


@pytest.mark.parametrize("causal", [False, True])
def test_auto_attention_under_bf16_autocast_equals_the_reference(causal):
    """The model's call in bf16 CPU training (auto takes the plain formula): values and gradients."""
    mask, _ = MASKS["padding"]
    mask = None if causal else mask
    q, k, v = _qkv(torch.bfloat16, d_k=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = AUTO.attention(q, k, v, mask, causal, 0.0)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert torch.allclose(out.float(), ref.float(), atol=3e-2)
    g_out = torch.autograd.grad(out.float().sum(), (q, k, v))
    g_ref = torch.autograd.grad(ref.float().sum(), (q, k, v))
    for a, b in zip(g_out, g_ref):
        assert torch.allclose(a.float(), b.float(), atol=5e-2)


def test_chunked_loss_without_gradients_and_a_single_backward():
    logits, target = torch.randn(6, 30), torch.randint(1, 30, (6,))
    with torch.no_grad():
        loss, nll, n = label_smoothed_loss(logits, target, 0.1, 0)
    ref = reference_label_smoothed_loss(logits, target, 0.1, 0)
    assert n == 6 and torch.allclose(loss, ref[0], rtol=1e-5) and torch.allclose(nll, ref[1], rtol=1e-5)
    x = logits.clone().requires_grad_()
    loss = label_smoothed_loss(x, target, 0.1, 0)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.3])
@pytest.mark.parametrize("dropout", [fast_dropout, reference_dropout])
def test_dropout_is_inverted_dropout(dropout, p, dtype):
    """Both kernels: kept entries are x / (1 - p), dropped ones 0, at rate p; the gradient flows through
    the same mask; the same seed gives the same mask."""
    torch.manual_seed(0)
    x = (torch.rand(400, 500) + 0.5).to(dtype).requires_grad_()
    y = dropout(x, p, training=True)
    assert y.dtype == dtype and y.shape == x.shape
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.005
    assert torch.allclose(y[kept].float(), x[kept].float() / (1 - p), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    (g,) = torch.autograd.grad(y.float().sum(), x)
    assert torch.equal(g != 0, kept)
    assert torch.allclose(g[kept].float(), torch.full_like(g[kept].float(), 1 / (1 - p)), rtol=1e-2)
    torch.manual_seed(5)
    a = dropout(x.detach(), p, True)
    torch.manual_seed(5)
    assert torch.equal(a, dropout(x.detach(), p, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_dropout_equals_the_formula_given_the_same_mask(dtype):
    """Given one mask, the fast kernel is exactly x · keep / (1 - p), values and gradients."""
    torch.manual_seed(0)
    p = 0.3
    x = torch.randn(50, 70).to(dtype).requires_grad_()
    keep = keep_mask(x.shape, p, dtype)
    fast = masked_dropout(x, keep, p)
    ref = x * keep * (1.0 / (1.0 - p))
    assert torch.equal(fast, ref)
    g_out = torch.randn_like(x)
    assert torch.equal(torch.autograd.grad(fast, x, g_out)[0], torch.autograd.grad(ref, x, g_out)[0])
    # fast_dropout draws exactly that mask from the same seed.
    torch.manual_seed(7)
    keep = keep_mask(x.shape, p, dtype)
    torch.manual_seed(7)
    assert torch.equal(fast_dropout(x, p, True), x * keep * (1.0 / (1.0 - p)))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_mask_has_no_structure(p):
    """Every one of the four 16-bit lanes of a 64-bit draw keeps at rate 1 - p, independently of its neighbour."""
    torch.manual_seed(1)
    mask = keep_mask(torch.Size([1000, 400]), p, torch.float32)
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    lanes = mask.view(-1, 4).mean(0)
    assert torch.allclose(lanes, torch.full_like(lanes, 1 - p), atol=0.005), lanes
    flat = mask.view(-1)
    both = (flat[1:] * flat[:-1]).mean().item()
    assert abs(both - (1 - p) ** 2) < 0.005  # neighbours independent
    odd = keep_mask(torch.Size([7, 3]), p, torch.bfloat16)  # sizes that are not a multiple of 4
    assert odd.shape == (7, 3) and odd.dtype == torch.bfloat16


@pytest.mark.parametrize("dropout", [fast_dropout, reference_dropout])
def test_dropout_is_the_identity_in_eval_mode_and_at_zero(dropout):
    x = torch.randn(4, 8)
    assert dropout(x, 0.0, True) is x and dropout(x, 0.5, False) is x
    for k in (AUTO, REFERENCE):
        m = Dropout(0.5, k).eval()
        assert m(x) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))


def test_keep_freed_memory_sets_glibc_thresholds_and_can_be_turned_off():
    code = "from mtkit.host_memory import keep_freed_memory; print(keep_freed_memory())"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"MTKIT_KEEP_FREED_MEMORY": "0", "PATH": ""}).stdout.strip()
    assert off == "False"
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert on == "True"


def test_serve_bounds_both_onednn_caches_before_torch_loads_and_keeps_a_users_setting():
    """A server meets new matmul shapes without end: oneDNN's two caches of compiled primitives are
    bounded (issue #22: unbounded, the server's RSS rose ~70 % over 10,000 requests)."""
    code = ("import os, sys\n"
            "from pathlib import Path\n"
            "from mtkit.commands.serve import serve\n"
            "try:\n    serve([Path('no-such-model')])\nexcept Exception:\n    pass\n"
            "print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'), os.environ.get('LRU_CACHE_CAPACITY'))")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == [str(SERVING_CACHE_CAPACITY)] * 2
    env["LRU_CACHE_CAPACITY"] = "7"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == [str(SERVING_CACHE_CAPACITY), "7"]


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("rows", [3, 256])
def test_fused_projection_and_loss_equal_logits_then_the_reference_loss(bf16, rows):
    """Values and gradients (of the hidden states and of W) match; padding rows get no gradient."""
    torch.manual_seed(0)
    hidden = torch.randn(4, 5, 16, requires_grad=True)
    weight = (0.5 * torch.randn(300, 16)).requires_grad_()
    target = torch.randint(1, 300, (4, 5))
    target[2, 3:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        ref = reference_label_smoothed_loss(hidden @ weight.t(), target, 0.1, 0)
        fused = linear_label_smoothed_loss(hidden, weight, target, 0.1, 0, rows=rows)
        twin = reference_linear_label_smoothed_loss(hidden, weight, target, 0.1, 0, rows=rows)
    assert torch.equal(twin[0], ref[0]) and twin[2] == ref[2]
    assert ref[2] == fused[2] == int((target != 0).sum())
    tol = dict(rtol=2e-3) if bf16 else dict(rtol=1e-5)
    assert torch.allclose(fused[0], ref[0], **tol) and torch.allclose(fused[1], ref[1], **tol)
    g_ref = torch.autograd.grad(0.7 * ref[0], (hidden, weight))
    g_fused = torch.autograd.grad(0.7 * fused[0], (hidden, weight))
    for a, b in zip(g_fused, g_ref):
        assert a.dtype == torch.float32
        assert torch.allclose(a, b, atol=2e-2 if bf16 else 1e-5)
    assert (g_fused[0][2, 3:] == 0).all()


@pytest.mark.parametrize("setting", ["auto", "reference"])
@pytest.mark.parametrize("fuse", [True, False, None])
@pytest.mark.parametrize("share", ["all", "none"])
def test_translation_loss_equals_the_model_logits_and_loss(share, fuse, setting):
    """The training objective gives the model's own loss and the same parameter gradients (tied or not)."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0, share_embeddings=share)
    model = Transformer(cfg, 50, 50)
    src, tgt = torch.randint(4, 50, (3, 6)), torch.randint(4, 50, (3, 5))
    tgt_in, tgt_out = tgt.clone(), tgt.clone()
    tgt_out[1, 3:] = 0
    ref = reference_label_smoothed_loss(model(src, tgt_in), tgt_out, 0.1, 0)
    g_ref = torch.autograd.grad(ref[0], list(model.parameters()))
    loss, nll, n = TranslationLoss(model, 0.1, 0, fuse_projection=fuse, kernels=setting)(src, tgt_in, tgt_out)
    g = torch.autograd.grad(loss, list(model.parameters()))
    assert n == ref[2] and torch.allclose(loss, ref[0], rtol=1e-5) and torch.allclose(nll, ref[1], rtol=1e-5)
    for a, b in zip(g, g_ref):
        assert torch.allclose(a, b, atol=1e-5)


def test_symmetric_kl_is_the_sum_of_both_divergences_over_real_tokens():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, 20), torch.randn(3, 4, 20)
    target = torch.randint(4, 20, (3, 4))
    target[2, 1:] = 0
    keep = target != 0
    lp_a, lp_b = F.log_softmax(a, -1)[keep], F.log_softmax(b, -1)[keep]
    expected = (F.kl_div(lp_b, lp_a, log_target=True, reduction="sum")  # KL(P_a || P_b)
                + F.kl_div(lp_a, lp_b, log_target=True, reduction="sum"))
    assert torch.allclose(reference_symmetric_kl(a, b, target, 0), expected, rtol=1e-5)
    assert float(reference_symmetric_kl(a, a, target, 0)) == 0.0
    b2 = b.clone()
    b2[2, 1:] += 5 * torch.randn(3, 20)  # padding positions do not count
    assert torch.allclose(reference_symmetric_kl(a, b2, target, 0), expected, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_symmetric_kl_equals_the_reference_with_its_gradients(dtype, monkeypatch):
    monkeypatch.setattr("mtkit.kernels.loss.CHUNK_ELEMENTS", 4 * 300)  # several chunks
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 5, 7, 300)).to(dtype).requires_grad_()  # two passes as views of one tensor
    target = torch.randint(4, 300, (5, 7))
    target[1, 4:] = 0
    ref = reference_symmetric_kl(logits[0], logits[1], target, 0)
    fast = symmetric_kl(logits[0], logits[1], target, 0)
    assert torch.allclose(fast, ref, rtol=1e-4)
    (g_ref,) = torch.autograd.grad(3 * ref, logits)
    (g_fast,) = torch.autograd.grad(3 * fast, logits)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the gradient is rounded to 8 bits
    assert torch.allclose(g_fast.float(), g_ref.float(), rtol=tol, atol=tol)
    assert (g_fast[:, target == 0] == 0).all()


def _rdrop_case(dropout):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=dropout)
    model = Transformer(cfg, 50, 50)
    src, tgt = torch.randint(4, 50, (3, 6)), torch.randint(4, 50, (3, 5))
    src[2, 4:] = 0
    tgt_out = tgt.clone()
    tgt_out[1, 3:] = 0
    return model, src, tgt, tgt_out


def test_rdrop_without_dropout_is_the_plain_loss_and_gradient():
    """Two passes of a deterministic model agree, so the KL term is 0: R-Drop's halved loss is then
    exactly the plain objective, with the same gradients."""
    model, src, tgt_in, tgt_out = _rdrop_case(dropout=0.0)
    model.train()
    plain = TranslationLoss(model, 0.1, 0)(src, tgt_in, tgt_out)
    g_plain = torch.autograd.grad(plain[0], list(model.parameters()))
    rdrop = TranslationLoss(model, 0.1, 0, rdrop_alpha=5.0)(src, tgt_in, tgt_out)
    g_rdrop = torch.autograd.grad(rdrop[0], list(model.parameters()))
    assert rdrop[2] == plain[2] == int((tgt_out != 0).sum())
    assert torch.allclose(rdrop[0], plain[0], rtol=1e-5) and torch.allclose(rdrop[1], plain[1], rtol=1e-5)
    for a, b in zip(g_rdrop, g_plain):
        assert torch.allclose(a, b, atol=1e-5)


def test_rdrop_adds_the_disagreement_of_two_dropout_passes_in_training_only():
    model, src, tgt_in, tgt_out = _rdrop_case(dropout=0.3)
    criterion = TranslationLoss(model, 0.1, 0, rdrop_alpha=5.0)
    model.train()
    torch.manual_seed(1)
    loss, nll, n = criterion(src, tgt_in, tgt_out)
    # The same two passes by hand: the same dropout masks come from the same seed.
    torch.manual_seed(1)
    memory, mask = model.encode(torch.cat([src, src]))
    logits = model.logits(model.decode(torch.cat([tgt_in, tgt_in]), memory, mask))
    ce = reference_label_smoothed_loss(logits, torch.cat([tgt_out, tgt_out]), 0.1, 0)
    kl = reference_symmetric_kl(logits[:3], logits[3:], tgt_out, 0)
    assert float(kl.detach()) > 0.01  # the two passes differ
    assert torch.allclose(loss, 0.5 * ce[0] + 1.25 * kl, rtol=1e-5) and torch.allclose(nll, 0.5 * ce[1], rtol=1e-5)
    model.eval()  # validation: one deterministic pass, no consistency term
    assert torch.allclose(criterion(src, tgt_in, tgt_out)[0], TranslationLoss(model, 0.1, 0)(src, tgt_in, tgt_out)[0])


@pytest.mark.slow
def test_a_tiny_model_learns_to_copy_with_rdrop():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, h=4, d_ff=128, encoder_layers=2, decoder_layers=2, dropout=0.1)
    model = Transformer(cfg, 16, 16)
    criterion = TranslationLoss(model, 0.1, 0, rdrop_alpha=5.0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(400):
        seqs = torch.randint(4, 14, (32, 6), generator=g)
        src = torch.cat([seqs, torch.full((32, 1), 3)], dim=1)
        loss, _, n = criterion(src, torch.cat([torch.full((32, 1), 2), seqs], 1), src)
        opt.zero_grad()
        (loss / n).backward()
        opt.step()
    model.eval()
    seqs = torch.randint(4, 14, (64, 6), generator=torch.Generator().manual_seed(99))
    src = torch.cat([seqs, torch.full((64, 1), 3)], dim=1)
    tokens = torch.full((64, 1), 2)
    with torch.no_grad():
        for _ in range(6):  # greedy, full forward each step
            tokens = torch.cat([tokens, model(src, tokens)[:, -1].argmax(-1, keepdim=True)], 1)
    assert (tokens[:, 1:] == seqs).float().mean() > 0.98


@pytest.mark.parametrize("V", [640, 8000, 20, 40, 58102, 1001])
def test_chunked_top_extensions_equal_the_full_top_k(V):
    """Bit-identical values and the same indices, also on a first step (one live hypothesis), with
    banned tokens (-inf), when no chunk width divides V (a shorter last chunk, ranked too: the best
    token is put there once), and when V is too small for chunks (the plain ranking)."""
    assert chunk_size(8000) == 160 and chunk_size(32000) == 256 and chunk_size(20) is None and chunk_size(40) == 16
    assert chunk_size(58102) == 256 and chunk_size(1001) == 256 and chunk_size(33) == 16
    g = torch.Generator().manual_seed(5)
    B, K = 6, 4
    lprobs = torch.log_softmax(3 * torch.randn(B * K, V, generator=g), dim=-1)
    lprobs[:, [PAD_ID, BOS_ID]] = -math.inf
    scores = torch.randn(B, K, generator=g)
    scores[0, 1:] = -math.inf
    lprobs[5, V - 1] = 0.0  # the best extension of sentence 1 in the last column (the short chunk, if any)
    scores[1, 1] = scores[1].max() + 1
    for k in (1, 2, 8):
        values, index = chunked_top_extensions(scores, lprobs, k)
        ref_values, ref_index = reference_top_extensions(scores, lprobs, k)
        plain = (scores.view(-1, 1) + lprobs).view(B, K * V).topk(k, dim=1)
        assert torch.equal(ref_values, plain.values) and torch.equal(ref_index, plain.indices)
        assert torch.equal(values, ref_values) and torch.equal(index, ref_index)
        assert index[1, 0] == 1 * V + V - 1
        strided = torch.cat([lprobs, torch.zeros(B * K, 3)], dim=1)[:, :V]  # not contiguous: rows V + 3 apart
        values, index = chunked_top_extensions(scores, strided, k)
        assert torch.equal(values, ref_values) and torch.equal(index, ref_index)
    # Fewer finite sums than k (sentence 0: one live beam with 3 allowed tokens): the same values, and every
    # index names one of the K·V extensions, also a -inf pick from a short last chunk's padding.
    sparse = torch.full_like(lprobs, -math.inf)
    sparse[:, 2:5] = lprobs[:, 2:5]
    values, index = chunked_top_extensions(scores, sparse, 8)
    assert torch.equal(values, reference_top_extensions(scores, sparse, 8)[0])
    assert bool(((index >= 0) & (index < K * V)).all())


DECODER_VARIANTS = [
    {},
    {"norm": "pre"},
    {"activation": "swish", "output_bias": True, "scale_embedding": False, "sinusoid_layout": "concatenated"},
    {"activation": "gelu", "positions": "learned", "share_embeddings": "none"},
]


def replace_kernels(model: Transformer, kernels: str) -> Transformer:
    """The same weights in a model built with other kernels."""
    other = Transformer(model.cfg, model.encoder.embeddings.tokens.num_embeddings, model.output_projection.out_features,
                        kernels=kernels).eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("variant", DECODER_VARIANTS)
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("onednn", [False, True])
def test_fused_decoding_step_equals_the_modules_step(variant, bf16, onednn, monkeypatch):
    """Step by step, with beam rows reordered and sentences dropped between steps, the fused step gives the
    modules' logits and caches, for every model option and under bf16 autocast, with its matmuls through BLAS
    or (every one, whatever its size) through oneDNN; the packed Q/K/V weights are the three matrices stacked,
    and the cache's encoder keys and values are the modules' bit for bit."""
    import mtkit.kernels.linear as linear

    if onednn and not linear.onednn_linear_available():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(linear, "MIN_MACS", 0 if onednn else 1 << 62)
    torch.manual_seed(6)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64,
                      **variant)
    model = Transformer(cfg, 50, 50, kernels="reference").eval()
    with torch.no_grad():
        for p in model.parameters():  # non-zero biases and LayerNorm parameters, so that every term counts
            p.add_(0.1 * torch.randn_like(p))
    beam = 3
    src = torch.randint(4, 50, (4, 9))
    src[2, 5:] = PAD_ID
    packed = pack(model)
    attn = model.decoder.layers[1].self_attn
    assert torch.equal(packed.decoder[1].self_qkv.weight,
                       torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]))
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        memory, src_mask = model.encode(src)
        ref = model.init_cache(memory, src_mask, beam)
        fast = InferenceModel(replace_kernels(model, "auto")).init_cache(memory, src_mask, beam)
        for a, b in zip(fast.layers, ref.layers):
            assert torch.equal(a.cross_k, b.cross_k) and torch.equal(a.cross_v, b.cross_v)
        assert len(cross_keys_values(packed, memory)) == cfg.decoder_layers
        tokens = torch.randint(4, 50, (4 * beam,), generator=g)
        for step in range(5):
            ref_logits, ref = model.decode_step(tokens, ref)
            fast_logits, fast = fused_step(packed, tokens, fast)
            assert fast_logits.shape == ref_logits.shape == (tokens.numel(), 50)
            torch.testing.assert_close(fast_logits, ref_logits, **({"atol": 0.03, "rtol": 0.02} if bf16 else {}))
            for a, b in zip(fast.layers, ref.layers):
                torch.testing.assert_close(a.self_k, b.self_k, **({"atol": 0.03, "rtol": 0.02} if bf16 else {}))
            assert fast.step == ref.step == step + 1
            n = tokens.numel() // beam
            rows = (torch.arange(n).unsqueeze(1) * beam + torch.randint(0, beam, (n, beam), generator=g)).view(-1)
            ref, fast = ref.reorder(rows), fast.reorder(rows)
            if step == 2:  # the second sentence finishes
                keep = torch.tensor([0, 2, 3])
                ref, fast = ref.select_sentences(keep), fast.select_sentences(keep)
                n -= 1
            tokens = torch.randint(4, 50, (n * beam,), generator=g)


@pytest.mark.parametrize("variant", DECODER_VARIANTS)
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("onednn", [False, True])
def test_fused_encoder_equals_the_modules(variant, bf16, onednn, monkeypatch):
    """For decoding, the fused encoder gives the modules' output on padded batches, for every model option,
    under bf16 autocast, with its matmuls through BLAS or oneDNN; the padding positions do not leak into the
    real ones. The model's own ``encode`` is the modules (training): gradients reach the weights."""
    import mtkit.kernels.linear as linear

    if onednn and not linear.onednn_linear_available():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(linear, "MIN_MACS", 0 if onednn else 1 << 62)
    torch.manual_seed(7)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=2, decoder_layers=1, dropout=0.0, max_positions=64,
                      **variant)
    model = Transformer(cfg, 50, 50).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    src = torch.randint(4, 50, (3, 9))
    src[1, 4:] = PAD_ID
    mask = model.source_mask(src)
    tol = {"atol": 0.03, "rtol": 0.02} if bf16 else {}
    packed = pack(model)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        fast, ref = fused_encode(packed, src, mask), model.encoder(src, mask)
        torch.testing.assert_close(fast, ref, **tol)
        alone = fused_encode(packed, src[1:2, :4], mask[1:2, :, :, :4])  # the padded sentence without its padding
        torch.testing.assert_close(fast[1:2, :4], alone, **tol)
        inference_memory, inference_mask = InferenceModel(model).encode(src)
        assert torch.equal(inference_mask, mask) and torch.equal(inference_memory, fast)
    model.train()
    out, _ = model.encode(src)
    out.sum().backward()
    assert model.encoder.layers[0].self_attn.w_q.weight.grad is not None


def test_packed_linear_equals_f_linear_and_falls_back_where_onednn_does_not_serve(monkeypatch):
    """Through oneDNN (float32 on the CPU, from MIN_MACS on) the packed linear is F.linear up to summation order;
    under bf16 autocast, for other dtypes and below MIN_MACS it is F.linear itself, bit for bit."""
    import mtkit.kernels.linear as linear

    if not linear.onednn_linear_available():
        pytest.skip("this torch has no oneDNN linear")
    torch.manual_seed(3)
    weight, bias = torch.randn(300, 96), torch.randn(300)
    packed, unbiased = linear.PackedLinear(weight, bias), linear.PackedLinear(weight, None)
    assert packed.packed is not None
    calls = []
    onednn = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(linear, "MIN_MACS", 300 * 96 * 8)  # 8 rows and more
    monkeypatch.setattr(linear.torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or onednn(*a),
                        raising=False)
    with torch.inference_mode():
        for rows in (1, 7, 8, 64):
            x = torch.randn(rows, 96)
            for layer, b in ((packed, bias), (unbiased, None)):
                before = len(calls)
                y = layer(x)
                assert len(calls) - before == (rows >= 8)
                assert torch.equal(layer.exact(x, rows), y) and len(calls) - before == 2 * (rows >= 8)  # the step's
                if rows >= 8:
                    torch.testing.assert_close(y, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
                else:
                    assert torch.equal(y, F.linear(x, weight, b))
        x = torch.randn(64, 96)
        before = len(calls)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = packed(x)
            assert y.dtype == torch.bfloat16 and torch.equal(y, F.linear(x, weight, bias))
        assert len(calls) == before


def test_pack_maps_every_parameter_once():
    """The one weight map holds every parameter of the model, for every model option: each as itself, or
    (self-attention's W_Q, W_K, W_V) inside the one stacked matrix; nothing of it enters the state_dict."""
    for variant in DECODER_VARIANTS:
        torch.manual_seed(5)
        cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
                          max_positions=64, **variant)
        model = Transformer(cfg, 30, 30).eval()
        w = pack(model)
        held = {id(t) for t in _tensors(w)}
        stacked = [(layer.self_attn, lw.self_qkv) for layer, lw in zip(model.encoder.layers, w.encoder)]
        stacked += [(layer.self_attn, lw.self_qkv) for layer, lw in zip(model.decoder.layers, w.decoder)]
        in_stacks = set()
        for attn, qkv in stacked:
            assert torch.equal(qkv.weight, torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]))
            assert torch.equal(qkv.bias, torch.cat([attn.w_q.bias, attn.w_k.bias, attn.w_v.bias]))
            in_stacks |= {id(p) for m in (attn.w_q, attn.w_k, attn.w_v) for p in (m.weight, m.bias)}
        for name, p in model.named_parameters():
            assert (id(p) in held) != (id(p) in in_stacks), name
        if cfg.positions == "sinusoidal":
            assert w.source.positions is model.encoder.embeddings.positions.table
        assert not any("qkv" in n for n in model.state_dict())


def _tensors(obj):
    """Every tensor in an InferenceWeights (its dataclasses, tuples and PackedLinears)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, tuple):
        for x in obj:
            yield from _tensors(x)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from _tensors(getattr(obj, name))
    elif hasattr(obj, "weight") and hasattr(obj, "bias"):  # a PackedLinear
        yield obj.weight
        if obj.bias is not None:
            yield obj.bias


def test_the_engine_packs_once_and_the_model_keeps_no_packing():
    """The inference object packs at construction and never again: the same weights for every batch, and
    weights changed afterwards are not its (a new one, as validation builds, has them). Nothing is kept on
    the model: a second inference object packs its own."""
    torch.manual_seed(5)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)
    model = Transformer(cfg, 30, 30).eval()
    src = torch.randint(4, 30, (2, 5))
    before = set(vars(model))
    inference = InferenceModel(model)
    weights = inference.weights
    with torch.inference_mode():
        for _ in range(2):
            inference.init_cache(*inference.encode(src))
    assert inference.weights is weights and set(vars(model)) == before
    with torch.no_grad():
        model.decoder.layers[0].feed_forward.w_1.weight.add_(1.0)
    again = InferenceModel(model)
    assert again.weights is not weights
    assert torch.equal(again.weights.decoder[0].ffn_in.weight, model.decoder.layers[0].feed_forward.w_1.weight)


def test_validation_decodes_with_the_weights_of_the_last_optimizer_step(reverse_data, monkeypatch):
    """Validation BLEU after steps of the optimizer mtkit trains with (fused AdamW, which updates the weights
    in place) translates with the updated weights: as a fresh model holding them does, and not as before."""
    import sacrebleu

    from mtkit.config import DecodeConfig, TrainConfig
    from mtkit.data.vocab import Vocab
    from mtkit.training.optim import build_optimizer, set_learning_rate
    from mtkit.training.validation import validation_bleu

    data_dir, _ = reverse_data
    vocab = Vocab.load(data_dir)
    torch.manual_seed(6)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)
    model = Transformer(cfg, vocab.src_size, vocab.tgt_size)
    optimizer = build_optimizer(model.parameters(), TrainConfig(), "cpu")
    set_learning_rate(optimizer, 0.01)
    decoded = []
    corpus_bleu = sacrebleu.corpus_bleu
    monkeypatch.setattr(sacrebleu, "corpus_bleu",
                        lambda hyps, refs, **kw: decoded.append(list(hyps)) or corpus_bleu(hyps, refs, **kw))
    decode = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=8)
    src = torch.randint(4, vocab.src_size, (8, 6))
    tgt = torch.randint(4, vocab.tgt_size, (8, 6))
    tgt[:, 0] = BOS_ID
    validation_bleu(model, vocab, data_dir, decode, "cpu")
    for _ in range(3):
        model.train()
        logits = model(src, tgt[:, :-1])  # (8, 5, V)
        F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad()
    validation_bleu(model, vocab, data_dir, decode, "cpu")
    fresh = Transformer(cfg, vocab.src_size, vocab.tgt_size)
    fresh.load_state_dict(model.state_dict())
    validation_bleu(fresh, vocab, data_dir, decode, "cpu")
    before, after, expected = decoded
    assert after == expected
    assert after != before


def test_the_kernel_settings_choose_the_inference_passes():
    """``auto`` packs the weights and runs the fused passes for inference; ``reference`` the model's modules."""
    assert AUTO.fused_inference and not REFERENCE.fused_inference
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0, max_positions=64)
    for setting, fused in (("auto", True), ("reference", False)):
        inference = InferenceModel(Transformer(cfg, 30, 30, kernels=setting).eval())
        assert inference.fused == fused and (inference.weights is not None) == fused


@pytest.mark.parametrize("setting", ["auto", "reference"])
def test_incremental_decoding_with_either_decoding_step_equals_the_full_pass(setting):
    """The model's decoding step, and the inference object's (fused for ``auto``), give the teacher-forced
    logits."""
    torch.manual_seed(4)
    cfg = ModelConfig(d_model=32, h=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=64)
    model = Transformer(cfg, 30, 30, kernels=setting).eval()
    src = torch.randint(4, 30, (3, 7))
    tgt = torch.randint(4, 30, (3, 6))
    with torch.no_grad():
        full = model(src, tgt)  # (3, 6, V)
        for decoder in (model, InferenceModel(model)):
            memory, src_mask = decoder.encode(src)
            cache = decoder.init_cache(memory, src_mask, beam=1)
            steps = []
            for t in range(tgt.size(1)):
                logits, cache = decoder.decode_step(tgt[:, t], cache)
                steps.append(logits)
            torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)
