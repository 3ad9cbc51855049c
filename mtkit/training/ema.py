"""An exponential moving average of the weights (Polyak averaging): fairseq's ``--ema-decay``, eole's
``average_decay``, Marian's ``--exponential-smoothing``.

With ``train.ema_decay`` d > 0, every ``train.ema_every`` updates the shadow weights move toward the model's:

    shadow ← d · shadow + (1 − d) · weights

kept in float32 whatever the training precision. Every rank of a DDP run holds the same weights after each
update, so each keeps the same shadow and rank 0 saves it: in every training checkpoint (``ema``, for exact
resume) and, at the end of training, as ``checkpoints/ema.pt``, a model checkpoint that ``translate``,
``evaluate`` and ``average`` take like ``averaged.pt``.
"""

from __future__ import annotations

import torch

from mtkit.errors import MtkitError


class ExponentialMovingAverage:
    """The shadow weights of a model: float32 copies of its floating-point state, by state_dict name."""

    def __init__(self, model: torch.nn.Module, decay: float, every: int = 1) -> None:
        self.decay = decay
        self.every = every
        self.shadow: dict[str, torch.Tensor] = {}
        self.reset(model)

    def reset(self, model: torch.nn.Module) -> None:
        """Start the average at ``model``'s weights."""
        self.shadow = {name: t.detach().float().clone() for name, t in model.state_dict().items()
                       if t.is_floating_point()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int) -> None:
        """Move the shadow toward ``model``'s weights after update ``step`` (every ``every`` updates)."""
        if step % self.every:
            return
        for name, t in model.state_dict().items():
            if name in self.shadow:
                self.shadow[name].mul_(self.decay).add_(t.detach().float(), alpha=1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a training checkpoint keeps (``ema``): the float32 shadow."""
        return {name: t.clone() for name, t in self.shadow.items()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's ``ema``; one that does not fit the model is a one-line error."""
        if not isinstance(state, dict) or set(state) != set(self.shadow) or any(
                getattr(state[name], "shape", None) != t.shape for name, t in self.shadow.items()):
            raise MtkitError("the checkpoint's ema (moving average of the weights) does not fit this model")
        for name, t in self.shadow.items():
            t.copy_(state[name])

    def weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A state_dict of ``model`` with the shadow weights, each in the model's own dtype (for ``ema.pt``)."""
        return {name: self.shadow[name].to(t.dtype) if name in self.shadow else t.detach().clone()
                for name, t in model.state_dict().items()}
