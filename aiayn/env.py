"""What machine a number was measured on: the line every benchmark and results table records;
and what the environment sets (an empty value sets nothing)."""

from __future__ import annotations

import os
import platform

import torch


def env_value(name: str) -> str | None:
    """The environment variable ``name``, stripped; None when it is unset or empty (``VAR=""``
    is how a shell clears a setting: it chooses nothing)."""
    value = os.environ.get(name, "").strip()
    return value or None


def cpu_info(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str] | None:
    """The first CPU's fields in /proc/cpuinfo ("vendor_id", "model name", "flags", …); None
    where it cannot be read (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            first = f.read().split("\n\n", 1)[0]
    except OSError:
        return None
    fields = (line.partition(":") for line in first.splitlines())
    return {key.strip(): value.strip() for key, sep, value in fields if sep}


def cpu_flags(info: dict[str, str] | None) -> set[str]:
    """The flags of a :func:`cpu_info` (x86: "avx2", "avx512_vnni", …); empty where none."""
    return set((info or {}).get("flags", "").split())


def cpu_name() -> str:
    """The CPU model and whether it has AMX / AVX512-BF16, from /proc/cpuinfo (Linux)."""
    info = cpu_info()
    if info is None:
        return f"{os.cpu_count()}-core {platform.machine()}"
    name, flags = info.get("model name", ""), cpu_flags(info)
    feats: list[str] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    feats += ["no AVX-512"] * ("avx512f" not in feats) + ["no AMX"] * ("amx_bf16" not in feats)
    return f"{os.cpu_count()}-core {name} ({', '.join(feats)})"


def hardware_name(device: str = "auto") -> str:
    """The CPU, and the GPUs when training may use them: what a model card records."""
    name = cpu_name()
    if device != "cpu" and torch.cuda.is_available():
        name += f"; {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    return name
