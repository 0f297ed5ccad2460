"""A Keras-style parameter summary: module, output shape, parameters, and totals.

Tied parameters (shared embeddings and output projection, §3.4) are counted once in the totals,
and marked where they reappear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class SummaryRow:
    name: str
    kind: str
    output_shape: str
    params: int
    shared: bool  # every parameter of this row was already counted above


def _shape(out) -> str:
    if isinstance(out, Tensor):
        return str(tuple(out.shape))
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return str(tuple(out[0].shape))
    return "-"


def _modules_to_depth(model: nn.Module, depth: int) -> list[tuple[str, nn.Module]]:
    rows = []
    for name, module in model.named_modules():
        if not name:
            continue
        level = name.count(".") + 1
        is_list = isinstance(module, (nn.ModuleList, nn.ModuleDict))
        if level <= depth + 2 * name.count(".layers.") and not is_list:
            rows.append((name, module))
    return rows


def summarize(model: nn.Module, run_forward, depth: int = 1) -> tuple[list[SummaryRow], int]:
    """Rows for the modules of ``model`` down to ``depth`` (each stack's layers are listed) and
    the total number of distinct parameters. ``run_forward()`` runs one forward pass so that
    output shapes can be recorded (pass ``None`` to skip shapes)."""
    modules = _modules_to_depth(model, depth)
    shapes: dict[str, str] = {}

    def record(name: str):
        def hook(_module, _inputs, out) -> None:  # must return None: a value would replace `out`
            shapes.setdefault(name, _shape(out))

        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in modules]
    try:
        if run_forward is not None:
            with torch.no_grad():
                run_forward()
    finally:
        for h in hooks:
            h.remove()
    seen: set[int] = set()
    rows: list[Any] = []
    for name, module in modules:
        params = list(module.parameters())
        ids = {id(p) for p in params}
        count = sum(p.numel() for p in params)
        # A row is "shared" when all its parameters belong to an earlier row (not an ancestor).
        shared = bool(ids) and ids <= seen and not any(name.startswith(r.name + ".") for r in rows)
        if not any(name.startswith(r.name + ".") for r in rows):
            seen |= ids
        rows.append(SummaryRow(name, type(module).__name__, shapes.get(name, "-"), count, shared))
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return rows, total


def format_summary(rows: list[SummaryRow], total: int, title: str = "") -> str:
    """Render rows as a fixed-width table with totals."""
    header = ("Module (type)", "Output shape", "Param #")
    cells = [
        (
            f"{'  ' * r.name.count('.')}{r.name} ({r.kind})",
            r.output_shape,
            f"{r.params:,}" + (" (shared)" if r.shared else ""),
        )
        for r in rows
    ]
    w = [
        max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(header)
    ]
    line = "=" * (sum(w) + 4)
    fmt = f"{{:<{w[0]}}}  {{:<{w[1]}}}  {{:>{w[2]}}}"
    out = [title] if title else []
    out += [
        line,
        fmt.format(*header),
        line,
        *(fmt.format(*c) for c in cells),
        line,
        f"Total params: {total:,} ({total / 1e6:.2f} M)",
        line,
    ]
    return "\n".join(out)
