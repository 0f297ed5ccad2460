"""An exponential moving average of a model's weights (``train.ema_decay``).

After every applied update, ``ema = decay · ema + (1 - decay) · weights`` for every floating-point
parameter and buffer (other buffers are copied), starting from the initial weights, with no
warm-up of the decay: the semantics of timm's ``ModelEmaV2``. So after N updates, with w_0 the
initial weights and w_k those after update k,

    ema_N = decay^N · w_0 + (1 - decay) · Σ_k decay^(N-k) · w_k

(``tests/test_train_regularisation.py`` checks this closed form). The average is a second copy of the
model, in eval mode and without gradients; the trainer validates it, writes it as the run
folder's and best/'s weights, and saves it in ``trainer_state.pt`` next to the trained weights,
so that a resumed run continues it exactly.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["WeightAverage"]


class WeightAverage:
    """The moving average of ``model``'s weights with ``decay``, held in :attr:`model`."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The average's tensors and ``model``'s, in the same order; a tied weight once."""
        mine = [*self.model.parameters(), *self.model.buffers()]
        theirs = [*model.parameters(), *model.buffers()]
        return mine, theirs

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One step of the average towards ``model``'s weights of now."""
        floats: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        for mine, theirs in zip(*self._pairs(model)):
            if mine.is_floating_point():
                floats[0].append(mine)
                floats[1].append(theirs.detach())
            else:
                mine.copy_(theirs)
        # ema + (1 - decay) · (w - ema) = decay · ema + (1 - decay) · w
        torch._foreach_lerp_(floats[0], floats[1], 1.0 - self.decay)

    @torch.no_grad()
    def reset(self, model: nn.Module) -> None:
        """Start the average again from ``model``'s weights of now."""
        for mine, theirs in zip(*self._pairs(model)):
            mine.copy_(theirs)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.model.state_dict())

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
