"""Label-smoothed cross-entropy (Vaswani et al. 2017, §5.4; Szegedy et al. 2016).

The target distribution puts ``1 - ε`` on the gold token and spreads ``ε`` uniformly over the
whole vocabulary (fairseq's ``label_smoothed_nll_loss``), so per token

    loss = (1 - ε) · (-log p_gold) + ε · mean_v(-log p_v)

Padding positions are neither predicted nor counted. Sums are returned, not means: the trainer
divides by the number of target tokens in the whole (accumulated, all-process) update.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


# Rows of logits handled at a time: about 2 MiB of float32, so that every pass over a chunk runs
# in cache and the full (N, V) logits are read from memory once forward and once backward.
CHUNK_BYTES = 2 << 20


class _LabelSmoothedCE(torch.autograd.Function):
    """Label-smoothed cross-entropy per row, from logits, without materialising log-probs.

    With lse = logsumexp(z):  -log p_gold = lse - z_gold  and  mean_v(-log p_v) = lse - mean(z),
    and the gradient is softmax(z) - (1 - ε)·onehot(gold) - ε/V. The forward pass works through
    cache-sized chunks of rows in float32 (or wider) and keeps softmax(z) in the logits' dtype;
    the backward pass turns a copy of it into the gradient. On this CPU the
    vocabulary-sized passes were a third of a tiny model's step (log_softmax + gather + mean and
    their backward); see docs/performance.md.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, gold: Tensor, keep: Tensor, epsilon: float):
        N, V = logits.shape
        wide = _wide(logits.dtype)
        probs = torch.empty_like(logits)  # (N, V): softmax(z), in the logits' dtype
        lse = logits.new_empty(N, dtype=wide)
        gold_z = logits.new_empty(N, dtype=wide)
        mean_z = logits.new_empty(N, dtype=wide)
        rows = max(1, CHUNK_BYTES // (4 * V))
        for a in range(0, N, rows):
            z = logits[a : a + rows].to(wide, copy=True)  # (C, V)
            gold_z[a : a + rows] = z.gather(1, gold[a : a + rows, None]).squeeze(1)
            mean_z[a : a + rows] = z.mean(dim=-1)
            top = z.amax(dim=-1, keepdim=True)  # (C, 1)
            e = z.sub_(top).exp_()
            total = e.sum(dim=-1, keepdim=True)
            lse[a : a + rows] = (top + total.log()).squeeze(1)
            probs[a : a + rows] = e.div_(total)
        nll = (lse - gold_z) * keep  # (N,)
        smooth = (lse - mean_z) * keep
        ctx.save_for_backward(probs, gold, keep)
        ctx.epsilon = epsilon
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        probs, gold, keep = ctx.saved_tensors
        eps, V = ctx.epsilon, probs.size(-1)
        grad = probs - eps / V  # a new buffer: the graph may be walked again (retain_graph)
        rows = torch.arange(grad.size(0), device=grad.device)
        grad[rows, gold] += eps - 1.0  # one element a row (scatter_add_ is slow for bf16 on CPU)
        grad.mul_((grad_loss * keep)[:, None].to(grad.dtype))
        return grad, None, None, None


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
