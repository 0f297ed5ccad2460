"""What machine a number was measured on: the line every benchmark and results table records."""

from __future__ import annotations

import os
import platform

import torch


def cpu_name() -> str:
    """The CPU model and whether it has AMX / AVX512-BF16, from /proc/cpuinfo (Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
    except OSError:
        return f"{os.cpu_count()}-core {platform.machine()}"
    lines = info.splitlines()
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln for ln in lines if ln.startswith("flags")), "")
    feats = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    feats += ["no AVX-512"] * ("avx512f" not in feats) + ["no AMX"] * ("amx_bf16" not in feats)
    return f"{os.cpu_count()}-core {name} ({', '.join(feats)})"


def hardware_name(device: str = "auto") -> str:
    """The CPU, and the GPUs when training may use them: what a model card records."""
    name = cpu_name()
    if device != "cpu" and torch.cuda.is_available():
        name += f"; {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    return name
