"""Label-smoothed cross-entropy (Vaswani et al. 2017, §5.4; Szegedy et al. 2016).

The target distribution puts ``1 - ε`` on the gold token and spreads ``ε`` uniformly over the
whole vocabulary (fairseq's ``label_smoothed_nll_loss``), so per token

    loss = (1 - ε) · (-log p_gold) + ε · mean_v(-log p_v)

Padding positions are neither predicted nor counted. Sums are returned, not means: the trainer
divides by the number of target tokens in the whole (accumulated, all-process) update.

Two entry points: :func:`label_smoothed_nll_loss` takes logits; :func:`projected_label_smoothed_nll_loss`
takes the decoder's last hidden states and the output projection's weight and never builds the
(N, V) logits (what the trainer uses). :func:`rdrop_loss` adds R-Drop's consistency term
(``train.rdrop_alpha``) to the first.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


# Rows of logits handled at a time on the CPU: about 2 MiB of float32, so that every pass over a
# chunk runs in cache and the full (N, V) logits are read from memory once forward and once
# backward. On a GPU a pass is a few kernel launches whatever its size, and 2 MiB is 14 rows at
# V = 37,000: passes that small took many times one pass's time on an H100
# (docs/experiments/gpu_2026-11-26.md#the-losss-pass-sizes-on-a-gpu), so a GPU takes passes of
# up to DEVICE_CHUNK_BYTES.
CHUNK_BYTES = 2 << 20
DEVICE_CHUNK_BYTES = 256 << 20


def rows_per_pass(vocab_size: int, device: torch.device) -> int:
    """Rows of float32 logits (c, V) handled by one pass of the per-row loss terms."""
    budget = CHUNK_BYTES if device.type == "cpu" else DEVICE_CHUNK_BYTES
    return max(1, budget // (4 * vocab_size))


def _row_terms(z: Tensor, gold: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The per-row pieces of the loss from float32 (or wider) logits z (c, V), which become
    exp(z - max) in place: -log p_gold = lse - z_gold, mean_v(-log p_v) = lse - mean(z), and
    exp(z - max) with its row sums (c, 1), so that softmax(z) = e / total."""
    gold_z = z.gather(1, gold[:, None]).squeeze(1)
    mean_z = z.mean(dim=-1)
    top = z.amax(dim=-1, keepdim=True)  # (c, 1)
    e = z.sub_(top).exp_()
    total = e.sum(dim=-1, keepdim=True)
    lse = (top + total.log()).squeeze(1)
    return lse - gold_z, lse - mean_z, e, total


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
        nll = logits.new_empty(N, dtype=wide)
        smooth = logits.new_empty(N, dtype=wide)
        rows = rows_per_pass(V, logits.device)
        for a in range(0, N, rows):
            z = logits[a : a + rows].to(wide, copy=True)  # (C, V)
            nll[a : a + rows], smooth[a : a + rows], e, total = _row_terms(z, gold[a : a + rows])
            probs[a : a + rows] = e.div_(total)
        nll = nll * keep  # (N,)
        smooth = smooth * keep
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


# Rows of hidden states projected to the vocabulary at a time by the projected loss: few enough
# that a chunk of logits is a reused buffer (bf16: 16 MiB at V = 8,000, 64 MiB at V = 32,000),
# many enough that the three matrix multiplies per chunk run at full speed and the weight
# gradient is summed over few chunks. A GPU takes 4× as many (bf16: 290 MiB at V = 37,000), so
# that a micro-batch of the paper's recipes is one or two chunks.
PROJECT_ROWS = 1024
DEVICE_PROJECT_ROWS = 4096


def rows_per_projection(device: torch.device) -> int:
    """Rows of hidden states projected to the vocabulary at a time by the projected loss."""
    return PROJECT_ROWS if device.type == "cpu" else DEVICE_PROJECT_ROWS


def _chunk_terms(
    z: Tensor, gold: Tensor, epsilon: float, stats: Tensor, sub: int, need_grad: bool
) -> None:
    """Add the summed loss and NLL of a chunk of logits ``z`` (C, V) to ``stats`` (in its wide
    dtype), ``sub`` rows per float32 pass; with ``need_grad``, overwrite ``z`` by the gradient of
    the summed loss with respect to it, G = softmax(z) - (1 - ε)·onehot - ε/V."""
    V = z.size(1)
    for b in range(0, z.size(0), sub):
        zs = z[b : b + sub].to(stats.dtype, copy=True)  # (c, V)
        g = gold[b : b + zs.size(0)]
        nll_rows, smooth_rows, e, total = _row_terms(zs, g)
        nll = nll_rows.sum()
        stats[0] += (1.0 - epsilon) * nll + epsilon * smooth_rows.sum()
        stats[1] += nll
        if need_grad:
            e.div_(total).sub_(epsilon / V)
            e[torch.arange(e.size(0), device=e.device), g] += epsilon - 1.0
            z[b : b + sub] = e


class _ProjectedLabelSmoothedCE(torch.autograd.Function):
    """Output projection + label-smoothed cross-entropy, summed over rows, chunk by chunk.

    For each chunk of rows: z = h W^T; the loss terms as in :class:`_LabelSmoothedCE`; the
    gradient of the summed loss with respect to z, G = softmax(z) - (1 - ε)·onehot - ε/V, overwrites
    z; then dh = G W and dW += G^T h right away. The loss is a sum, so its gradient reaches
    backward as one scalar that scales dh and dW. The (N, V) logits never exist: one chunk-sized
    buffer is reused, which saves the page faults of a fresh logits tensor every step and two
    passes over it. Matrix multiplies run in ``dtype`` (bf16 under autocast), everything per row
    in float32, dW accumulates in float32. dh and dW are computed only for the inputs that
    require a gradient (and only with grad mode on); they are held until the graph is freed.
    """

    @staticmethod
    def forward(
        ctx,
        h: Tensor,
        weight: Tensor,
        gold: Tensor,
        epsilon: float,
        dtype: torch.dtype,
        grad_mode: bool,
        bias: Tensor | None,
    ):
        N, V = h.size(0), weight.size(0)
        # needs_input_grad follows requires_grad even under no_grad, hence grad_mode.
        need_dh, need_dw = (
            grad_mode and ctx.needs_input_grad[0],
            grad_mode and ctx.needs_input_grad[1],
        )
        need_grad = need_dh or need_dw
        wide = _wide(dtype)
        hc, w = h.to(dtype), weight.to(dtype)  # (N, D), (V, D)
        wt = w.t()
        b = None if bias is None else bias.to(dtype)  # (V,): a constant (final_logits_bias)
        stats = h.new_zeros(2, dtype=wide)  # summed loss, summed NLL
        dh = torch.empty_like(h) if need_dh else None
        dw = None
        if need_dw:  # summed over the chunks (zero when there are none)
            make = weight.new_empty if N else weight.new_zeros
            dw = make(weight.shape, dtype=_wide(weight.dtype))
        project_rows = rows_per_projection(h.device)
        buffer = h.new_empty(min(N, project_rows), V, dtype=dtype)
        # dW of one chunk, and the same in dW's dtype: reused, so that summing the chunks'
        # contributions allocates nothing (a fresh (V, D) temporary per chunk cost page faults and
        # a mixed-dtype add: docs/experiments/code_notes.md#the-projected-losss-weight-gradient).
        dw_part = dw_wide = None
        if dw is not None:
            dw_part = w.new_empty(w.shape)
            dw_wide = dw_part if dw.dtype == dtype else torch.empty_like(dw)
        sub = rows_per_pass(V, h.device)  # rows per float32 pass (kept in cache on the CPU)
        for a in range(0, N, project_rows):
            rows = hc[a : a + project_rows]
            z = torch.mm(rows, wt, out=buffer[: rows.size(0)])  # (C, V) logits
            if b is not None:
                z.add_(b)
            _chunk_terms(z, gold[a : a + z.size(0)], epsilon, stats, sub, need_grad)
            if dh is not None:
                dh[a : a + z.size(0)] = torch.mm(z, w)
            if dw is not None and dw_part is not None and dw_wide is not None:
                torch.mm(z.t(), rows, out=dw_part)
                if a == 0:
                    dw.copy_(dw_part)
                else:
                    if dw_wide is not dw_part:
                        dw_wide.copy_(dw_part)
                    dw.add_(dw_wide)
        ctx.save_for_backward(dh, dw)
        loss, nll = stats[0].clone(), stats[1].clone()
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        dh, dw = ctx.saved_tensors
        return (
            None if dh is None else dh * grad_loss.to(dh.dtype),
            None if dw is None else dw * grad_loss.to(dw.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def projected_label_smoothed_nll_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    ignore_index: int,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`label_smoothed_nll_loss` of the logits ``hidden @ weight.T + bias``, without
    building them. ``bias`` (V,) is a constant that receives no gradient: Marian's
    ``final_logits_bias``, a buffer in transformers, which fine-tuning there leaves as it is.

    Shape: hidden (B, T, D) or (N, D), weight (V, D), target (B, T) or (N,) -> two scalars. Rows
    whose target is ``ignore_index`` are dropped before the projection. Under bf16 autocast the
    projection runs in bf16 (as ``nn.Linear`` would) and the loss in float32; under fp16 autocast
    everything runs in float32 (the gradient is formed in the forward pass, before any loss
    scaling, and fp16 would flush its small entries to zero).
    """
    hidden = hidden.reshape(-1, hidden.size(-1))  # (N, D)
    keep = (target.reshape(-1) != ignore_index).nonzero().squeeze(1)  # (K,)
    hidden, gold = hidden.index_select(0, keep), target.reshape(-1).index_select(0, keep)
    kind = hidden.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype
    if dtype == torch.float16:
        dtype = torch.float32
    with torch.autocast(kind, enabled=False):
        loss, nll = _ProjectedLabelSmoothedCE.apply(
            hidden,
            weight,
            gold,
            float(epsilon),
            dtype,
            torch.is_grad_enabled(),
            None if bias is None else bias.detach(),
        )
    return loss, nll


def rdrop_loss(
    logits: Tensor, target: Tensor, epsilon: float, ignore_index: int, alpha: float
) -> tuple[Tensor, Tensor]:
    """R-Drop (Liang et al. 2021, Eq. 3), halved: summed loss and summed NLL of two passes.

    ``logits`` (2N, V) are two forward passes of the same N targets (rows :N the first, N: the
    second), which saw other dropout masks. Per non-padding target, with P1, P2 the two passes'
    distributions and CE the label-smoothed cross-entropy::

        loss = ½ [CE(P1) + CE(P2) + α · ½ (KL(P1 ‖ P2) + KL(P2 ‖ P1))]

    the paper's loss over two (as fairseq's ``label_smoothed_cross_entropy_with_rdrop``, whose
    cross-entropy sums both passes, and whose KL term sums the targets), so that the loss stays
    on the scale of one cross-entropy and α keeps the paper's meaning. Gradients flow through
    both distributions of each KL term, as in fairseq. The NLL returned is the two passes' mean.

    Shape: logits (2N, V), target (N,) -> two scalars.
    """
    n = target.numel()
    both = torch.cat([target, target])  # (2N,)
    ce, nll = label_smoothed_nll_loss(logits, both, epsilon, ignore_index)
    keep = target != ignore_index  # (N,)
    log_probs = torch.log_softmax(logits.to(_wide(logits.dtype)), dim=-1)  # (2N, V)
    p1, p2 = log_probs[:n][keep], log_probs[n:][keep]  # (K, V) each
    # kl_div(input=log q, target=log p, log_target) = Σ p (log p - log q) = KL(p ‖ q)
    kl = F.kl_div(p2, p1, reduction="sum", log_target=True) + F.kl_div(
        p1, p2, reduction="sum", log_target=True
    )
    return 0.5 * ce + 0.5 * alpha * (0.5 * kl), 0.5 * nll
