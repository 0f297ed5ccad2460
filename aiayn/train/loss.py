"""Label-smoothed cross-entropy (Vaswani et al. 2017, §5.4; Szegedy et al. 2016).

The target distribution puts ``1 - ε`` on the gold token and spreads ``ε`` uniformly over the
whole vocabulary (fairseq's ``label_smoothed_nll_loss``), so per token

    loss = (1 - ε) · (-log p_gold) + ε · mean_v(-log p_v)

Padding positions are neither predicted nor counted. Sums are returned, not means: the trainer
divides by the number of target tokens in the whole (accumulated, all-process) update.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll_loss(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over the non-padding targets.

    Shape: logits (B, T, V) or (N, V), target (B, T) or (N,) -> two scalars.
    Computed in fp32 whatever the logits' dtype (bf16 log-softmax loses too much).
    """
    log_probs = F.log_softmax(logits.float(), dim=-1).reshape(-1, logits.size(-1))  # (N, V)
    target = target.reshape(-1)  # (N,)
    keep = target != ignore_index  # (N,)
    # Mask instead of indexing the kept rows: a copy of (N, V) fewer each way (~25 % faster).
    gold = torch.where(keep, target, 0)[:, None]  # (N, 1), padding points at any valid id
    nll = -log_probs.gather(1, gold).squeeze(1)  # (N,)
    smooth = -log_probs.mean(dim=-1)  # (N,)
    loss = ((1.0 - epsilon) * nll + epsilon * smooth) * keep
    return loss.sum(), (nll * keep).sum().detach()
