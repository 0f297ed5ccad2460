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


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _LabelSmoothedCE(torch.autograd.Function):
    """Label-smoothed cross-entropy per row, from logits, without materialising log-probs.

    With lse = logsumexp(z):  -log p_gold = lse - z_gold  and  mean_v(-log p_v) = lse - mean(z),
    and the gradient is softmax(z) - (1 - ε)·onehot(gold) - ε/V — one buffer, computed in place.
    On this CPU the vocabulary-sized passes are a third of a tiny model's step; this needs three
    (logsumexp, mean, exp) where log_softmax + gather + mean and their backward need about eight.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, gold: Tensor, keep: Tensor, epsilon: float):
        z = logits.to(_wide(logits.dtype))  # (N, V); a no-op for fp32/fp64 logits
        lse = torch.logsumexp(z, dim=-1)  # (N,)
        nll = (lse - z.gather(1, gold[:, None]).squeeze(1)) * keep  # (N,)
        smooth = (lse - z.mean(dim=-1)) * keep
        ctx.save_for_backward(logits, lse, gold, keep)
        ctx.epsilon = epsilon
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        logits, lse, gold, keep = ctx.saved_tensors
        eps, V = ctx.epsilon, logits.size(-1)
        grad = logits.to(lse.dtype).sub(lse[:, None]).exp_()  # softmax, (N, V)
        if eps:
            grad.sub_(eps / V)
        grad.scatter_add_(1, gold[:, None], grad.new_full((grad.size(0), 1), eps - 1.0))
        grad.mul_((grad_loss * keep)[:, None])
        return grad.to(logits.dtype), None, None, None


def label_smoothed_nll_loss(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over the non-padding targets.

    Shape: logits (B, T, V) or (N, V), target (B, T) or (N,) -> two scalars.
    Computed in fp32 whatever the logits' dtype (bf16 log-softmax loses too much).
    """
    logits = logits.reshape(-1, logits.size(-1))  # (N, V)
    target = target.reshape(-1)  # (N,)
    keep = target != ignore_index  # (N,)
    gold = torch.where(keep, target, 0)  # (N,), padding points at any valid id
    loss, nll = _LabelSmoothedCE.apply(logits, gold, keep.to(_wide(logits.dtype)), float(epsilon))
    return loss.sum(), nll.sum().detach()
