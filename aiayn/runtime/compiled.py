"""The decoder step as one compiled call (AOTInductor): no Python between its ops.

Shape legend: B sentences · g decoder rows per sentence (beams) · N = B·g rows · H heads ·
t tokens decoded so far · R positions a self-attention buffer has room for (R ≥ t) · S source
len · K head dim · D d_model · L decoder layers.

A cached decoder step of the module code makes ~230 torch calls from Python (1,000 aten ops
counting nested ones: the demo model, beam 5); at one sentence at a time that dispatch is most of
the time (docs/experiments/decoding_speed.md#the-decoder-step-compiled-2026-11-26).
:class:`DecoderStep` is the same step written as a function of tensors, the cache's keys and values
going in and the step's new ones coming out, so that ``torch.export`` takes it whole and AOTInductor
compiles it into one shared library: a step is then one C++ call (fused element-wise kernels around
the linear layers' GEMMs). What stays in Python is the cache write (:meth:`LayerCache.append_self`),
the prepacked output projection and the log-softmax (:meth:`CompiledDecoding.log_probs`).

The self-attention of the one new query runs over the past keys and the new key without joining
them (two score blocks, one softmax): the cache is read in place, never copied. Cross-attention
reads the g beams of a sentence as g queries over its one memory row, as the module code does.
Both compute what the module code computes, to float rounding (tested: log-probabilities to
1e-5, the same tokens for greedy and beam search).

A package is compiled for one model's weights, this torch, this CPU's instruction set and a
thread count; :func:`compiled_step` keys it on all of them and keeps it in a directory (the
caller's cache), so the ~1 minute of compilation is paid once. Beside each package,
``NAME.sum.json`` records its key and checksum (:mod:`aiayn.checksum`), checked at the first load
in a process: a package changed since it was written, or one written before checksums were
recorded, is compiled again (one log line says why). Decoding steps that the package
cannot take (the first two, bf16 autocast, another device, shapes beyond its limits) run the
module code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.export import Dim

from aiayn.checksum import seal, seal_problem
from aiayn.decode.packed import pack
from aiayn.errors import ConfigError
from aiayn.model.attention import MultiHeadAttention, scaled_dot_product_attention
from aiayn.model.cache import DecoderCache, whole_buffer
from aiayn.model.layers import DecoderLayer, Residual
from aiayn.model.transformer import Transformer

log = logging.getLogger(__name__)

__all__ = [
    "DecoderStep",
    "EagerRunner",
    "CompiledStep",
    "CompiledDecoding",
    "compiled_step",
    "package_key",
]

# Bump when DecoderStep's inputs, outputs or computation change: cached packages are keyed on it.
STEP_VERSION = 1
# The first step the package runs: t = 0 projects the cross-attention keys/values and t = 1 is a
# size torch.export specialises, so both run the module code (2 of ~16 steps of a sentence).
FIRST_COMPILED_STEP = 2
# The shapes the package accepts (torch.export's ranges; larger ones run the module code).
LIMITS = {"sentences": 4096, "beam": 64, "room": 4096, "source": 1024}


def _self_attention(attn: MultiHeadAttention, h: Tensor, past_k: Tensor, past_v: Tensor) -> tuple:
    """One new query over t past keys and its own key, the cache read in place.

    Shape: h (N, 1, D), past_k/past_v (N, H, t, K) -> out (N, 1, D), k and v (N, H, 1, K).
    """
    q, k, v = attn.project_qkv(h)  # (N, H, 1, K) each
    q = q * q.size(-1) ** -0.5
    t = past_k.size(2)
    scores = torch.cat([q @ past_k.transpose(-2, -1), (q * k).sum(-1, keepdim=True)], -1)
    weights = torch.softmax(scores, dim=-1)  # (N, H, 1, t + 1)
    heads = weights[..., :t] @ past_v + weights[..., t:] * v  # (N, H, 1, K)
    N = heads.size(0)
    return attn.out_proj(heads.transpose(1, 2).reshape(N, 1, -1)), k, v  # (N, 1, H·K)


def _cross_attention(
    attn: MultiHeadAttention, h: Tensor, k: Tensor, v: Tensor, mask: Tensor
) -> Tensor:
    """The g beams of each sentence as g queries over its one memory row.

    Shape: h (N, 1, D), k/v (B, H, S, K), mask (B, 1, 1, S) -> (N, 1, D).
    """
    q = attn.project_q(h)  # (N, H, 1, K)
    B, H, N, K = k.size(0), q.size(1), q.size(0), q.size(3)
    q = q.view(B, N // B, H, K).transpose(1, 2)  # (B, H, g, K)
    heads, _ = scaled_dot_product_attention(q, k, v, mask, fused=False)  # (B, H, g, K)
    return attn.out_proj(heads.transpose(1, 2).reshape(N, 1, -1))  # (N, 1, H·K)


class DecoderStep(nn.Module):
    """One cached decoder step of a :class:`Transformer` as a function of tensors (exportable).

    Shape: tokens (B, g) this step's tokens; positions (t + 1, D) the positional encodings of
    positions 0 … t (their count gives t); memory_mask (B, 1, 1, S) bool, True = real token;
    then, per layer, self-attention keys (B, g, H, R, K) of which the first t positions are
    filled, the same for values, cross-attention keys (B, H, S, K) and values
    -> hidden states (N, D) before the output projection, then per layer the new keys and the
    new values (N, H, 1, K).
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, tokens: Tensor, positions: Tensor, memory_mask: Tensor, *state: Tensor
    ) -> tuple[Tensor, ...]:
        m = self.model
        n = len(m.decoder.layers)
        B, g = tokens.shape
        t = positions.size(0) - 1
        # (B, g, H, R, K) -> (N, H, t, K): the filled positions of each buffer
        self_k = [s.flatten(0, 1)[:, :, :t] for s in state[:n]]
        self_v = [s.flatten(0, 1)[:, :, :t] for s in state[n : 2 * n]]
        cross_k, cross_v = state[2 * n : 3 * n], state[3 * n :]
        x = m.tgt_embed.at(tokens.reshape(B * g, 1), positions[t:])  # (N, 1, D)
        new_k, new_v = [], []
        for i, layer in enumerate(_layers(m)):

            def self_attention(
                h: Tensor, i: int = i, attn: MultiHeadAttention = layer.self_attn
            ) -> Tensor:
                out, k, v = _self_attention(attn, h, self_k[i], self_v[i])
                new_k.append(k)
                new_v.append(v)
                return out

            def cross_attention(h: Tensor, i: int = i, attn: Any = layer.cross_attn) -> Tensor:
                return _cross_attention(attn, h, cross_k[i], cross_v[i], memory_mask)

            x = layer.self_block(x, self_attention)
            x = cast(Residual, layer.cross_block)(x, cross_attention)  # a Transformer has one
            x = layer.ff_block(x, layer.feed_forward)
        if m.decoder.norm is not None:
            x = m.decoder.norm(x)
        return (x[:, 0], *new_k, *new_v)  # (N, D), L × (N, H, 1, K), L × (N, H, 1, K)


def _layers(model: Transformer) -> list[DecoderLayer]:
    return cast(list[DecoderLayer], list(model.decoder.layers))


def _example(model: Transformer) -> tuple[Tensor, ...]:
    """Inputs of the export's trace, every dynamic size above 1 and all distinct."""
    attn = _layers(model)[0].self_attn
    H, K, Kv, n = attn.n_heads, attn.d_k, attn.d_v, len(model.decoder.layers)
    B, g, t, R, S = 2, 3, 4, 6, 5
    return (
        torch.full((B, g), model.cfg.bos_id, dtype=torch.long),
        model.tgt_embed.positional(t + 1),
        torch.ones(B, 1, 1, S, dtype=torch.bool),
        *[torch.zeros(B, g, H, R, K) for _ in range(n)],
        *[torch.zeros(B, g, H, R, Kv) for _ in range(n)],
        *[torch.zeros(B, H, S, K) for _ in range(n)],
        *[torch.zeros(B, H, S, Kv) for _ in range(n)],
    )


def export_step(model: Transformer) -> Any:
    """``torch.export`` of :class:`DecoderStep` with B, g, t, R and S dynamic."""
    n = len(model.decoder.layers)
    B = Dim("sentences", min=1, max=LIMITS["sentences"])
    g = Dim("beam", min=1, max=LIMITS["beam"])
    t1 = Dim("positions", min=FIRST_COMPILED_STEP + 1, max=model.cfg.max_len)
    R = Dim("room", min=1, max=LIMITS["room"])
    S = Dim("source", min=1, max=LIMITS["source"])
    buffers = [{0: B, 1: g, 3: R}] * (2 * n)
    memory = [{0: B, 2: S}] * (2 * n)
    shapes = ({0: B, 1: g}, {0: t1}, {0: B, 3: S}, tuple(buffers + memory))
    with torch.no_grad():
        return torch.export.export(
            DecoderStep(model).eval(), _example(model), dynamic_shapes=shapes
        )


def package_key(model: Transformer, threads: int) -> str:
    """What a compiled package depends on, hashed: the weights and config, this code, torch,
    the CPU it compiles for (``-march=native``) and the thread count it was compiled with."""
    digest = hashlib.sha256()
    for value in (STEP_VERSION, torch.__version__, threads, repr(model.cfg), _cpu()):
        digest.update(repr(value).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(
            tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
        )
    return digest.hexdigest()[:32]


def _cpu() -> str:
    """This CPU's name and flags (what ``-march=native`` compiles for), and torch's ISA level."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    return "|".join([platform.machine(), torch.backends.cpu.get_cpu_capability(), *lines])


def _build(model: Transformer, path: Path) -> None:
    """Export and compile the step of ``model`` into the package ``path``, written atomically
    (a temporary name in the same directory, then a rename): an interrupted compilation leaves
    no package behind, and two processes compiling the same key both leave a whole one."""
    from torch._inductor import aoti_compile_and_package

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".partial-{os.getpid()}-{threading.get_ident()}-{path.name}")
    try:
        program = export_step(model)
        # freezing: the weights become constants of the package (the q/k/v stack folded once)
        aoti_compile_and_package(
            program, package_path=str(partial), inductor_configs={"freezing": True}
        )
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _load(path: Path, runners: int) -> Any:
    """The package's C++ runner, ``runners`` calls at once (one per decoding worker). The loader
    of ``torch._C._aoti`` directly: ``aoti_load_package`` imports all of inductor first (seconds:
    docs/experiments/decoding_speed.md#the-decoder-step-compiled-2026-11-26) and parses the
    call's tree spec again at every call."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, runners, -1)


def compiled_step(
    model: Transformer, directory: Path, threads: int = 1, runners: int = 1
) -> CompiledStep:
    """The compiled step of ``model`` for callers of ``threads`` threads, ``runners`` of them at
    once, from ``directory`` (compiled there first when missing: ~1 minute for the demo model on
    a 2-core CPU). The package's own kernels use ``threads`` threads whatever the caller's."""
    key = package_key(model, threads)
    path = Path(directory) / f"decoder-step-{key}.pt2"
    problem = seal_problem(path, {"package": key}) if path.exists() else ""
    if problem:
        log.warning("compiled package: %s; compiling it again", problem)
    if problem or not path.exists():
        log.info("compiling the decoder step into %s (once for this model and CPU)", path)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)  # inductor's kernels take the thread count compiled in
        try:
            _build(model, path)
        except (OSError, RuntimeError) as e:  # inductor's and the C++ compiler's errors included
            raise ConfigError(f"decode.compile: compiling the decoder step into {path} failed: "
                              f"{_first_line(e)}") from None  # fmt: skip
        finally:
            torch.set_num_threads(before)
        try:  # its key and checksum beside it: checked before the next process loads it
            seal(path, {"package": key})
        except OSError as e:
            raise ConfigError(f"decode.compile: cannot record {path}'s checksum "
                              f"({e.strerror or e})") from None  # fmt: skip
    try:
        return CompiledStep(model, _load(path, runners))
    except RuntimeError as e:
        raise ConfigError(f"decode.compile: {path} is not a package this torch can load "
                          f"(delete it to compile again): {_first_line(e)}") from None  # fmt: skip


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _shape_fits(tgt: Tensor, cache: DecoderCache) -> bool:
    """Whether the package's shape ranges take this step (see :data:`LIMITS`)."""
    B, N = cache.layers[0].cross_k.size(0), tgt.size(0)  # type: ignore[union-attr]
    room = max(whole_buffer(layer.self_k).size(2) for layer in cache.layers)  # type: ignore[arg-type]
    return (
        N % B == 0
        and B <= LIMITS["sentences"]
        and N // B <= LIMITS["beam"]
        and room <= LIMITS["room"]
        and cache.layers[0].cross_k.size(2) <= LIMITS["source"]  # type: ignore[union-attr]
    )


class EagerRunner:
    """:class:`DecoderStep` run eagerly behind the package's calling convention (``run(list of
    tensors) -> list of tensors``): what a package computes, without compiling it (the tests'
    and benchmarks' reference). Refuses what the package would misread: a non-contiguous input."""

    def __init__(self, model: Transformer) -> None:
        self.step = DecoderStep(model)
        self.calls = 0

    def run(self, inputs: list[Tensor]) -> list[Tensor]:
        if not all(t.is_contiguous() for t in inputs):
            raise ValueError("a compiled step reads its inputs as contiguous tensors")
        self.calls += 1
        return list(self.step(*inputs))


class CompiledStep:
    """A loaded package: :class:`DecoderStep` of one model as one C++ call."""

    def __init__(self, model: Transformer, runner: Any) -> None:
        self.model = model
        self.runner = runner

    def accepts(self, tgt: Tensor, cache: DecoderCache) -> bool:
        """Whether this step can run compiled: one new token per row, past the first steps,
        float32 on the CPU, cross-attention state and memory mask in the cache, shapes in range."""
        layers = cache.layers
        return (
            tgt.size(1) == 1
            and cache.length >= FIRST_COMPILED_STEP
            and tgt.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu")
            and cache.memory_mask is not None
            and all(
                layer.self_k is not None
                and layer.self_k.dtype == torch.float32
                and layer.cross_k is not None
                for layer in layers
            )
            and _shape_fits(tgt, cache)
        )

    def __call__(self, tgt: Tensor, cache: DecoderCache) -> Tensor:
        """Run one step (its keys/values appended to ``cache``). Shape: tgt (N, 1) -> (N, D)."""
        layers = cache.layers
        B, N = layers[0].cross_k.size(0), tgt.size(0)  # type: ignore[union-attr]

        def beams(t: Tensor) -> Tensor:  # (N, H, R, K) -> (B, g, H, R, K)
            return t.view(B, N // B, *t.shape[1:])

        inputs = [
            tgt.reshape(B, N // B).contiguous(),
            self.model.tgt_embed.positional(cache.length + 1).contiguous(),
            cache.memory_mask.contiguous(),  # type: ignore[union-attr]
            *[beams(whole_buffer(layer.self_k)) for layer in layers],  # type: ignore[arg-type]
            *[beams(whole_buffer(layer.self_v)) for layer in layers],  # type: ignore[arg-type]
            *[layer.cross_k.contiguous() for layer in layers],  # type: ignore[union-attr]
            *[layer.cross_v.contiguous() for layer in layers],  # type: ignore[union-attr]
        ]
        out = self.runner.run(inputs)  # the package reads its inputs as contiguous
        n = len(layers)
        for layer, k, v in zip(layers, out[1 : n + 1], out[n + 1 :]):
            layer.append_self(k, v)
        cache.length += 1
        return out[0]


class CompiledDecoding:
    """A :class:`Transformer` whose decoder steps run compiled where they can (a Seq2SeqModel
    for search, as the model itself is): encoding, the cache and the other steps are the
    model's own."""

    def __init__(self, model: Transformer, step: CompiledStep) -> None:
        self.model = model
        self.step = step
        self.cfg = model.cfg
        # The output projection packed once, not once per decoding (a small share of a sentence at
        # batch 1: docs/experiments/decoding_speed.md#the-decoder-step-compiled-2026-11-26):
        # like the package, it holds the weights as they were when it was made.
        with torch.no_grad():
            self.output = pack(model.generator.weight, model.generator.bias)

    def encode(self, src: Tensor) -> Tensor:
        return self.model.encode(src)

    def init_cache(self, memory: Tensor, src: Tensor | None = None) -> DecoderCache:
        cache = self.model.init_cache(memory, src=src)
        cache.output = self.output
        return cache

    def log_probs(self, tgt: Tensor, memory: Tensor, cache: DecoderCache) -> Tensor:
        """Shape: tgt (N, T) -> (N, T, V) float32, as :meth:`Transformer.log_probs`."""
        if not self.step.accepts(tgt, cache):
            return self.model.log_probs(tgt, memory, cache)
        h = self.step(tgt, cache)  # (N, D)
        return torch.log_softmax(self.model.logits(h[:, None], cache.output).float(), dim=-1)

    def parameters(self) -> Any:
        return self.model.parameters()
