"""The bounds of the server: each a key of `aiayn serve --set serve.KEY=VALUE` (the field's name),
with the default below."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from aiayn.errors import ConfigError

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """What one request may ask and how much the server holds at once (docs/serving.md)."""

    # Request body in bytes; larger is 413. 64 KiB holds 32 texts of a few hundred words.
    max_body_bytes: int = 65536
    # Texts (or images) in one /v1/translate or /v1/classify request (at most max_queue: one must fit).
    max_texts: int = 32
    # Pixels (width × height) of one image sent to an image classifier's /v1/classify: a larger
    # picture is 422, refused from its header before it is decoded (a small PNG may unpack to
    # gigabytes). 4 Mpx: a 2048 × 2048 photo.
    max_image_pixels: int = 4_194_304
    # Tokens in one text (never more than the model's positional table): a longer text is 422.
    max_text_tokens: int = 256
    # Beam size and n-best ranges (the folder's own decoding settings are always allowed).
    max_beam: int = 8
    # Length penalty α range is 0 to this.
    max_alpha: float = 5.0
    # Tokens one /v1/generate request may add.
    max_new_tokens: int = 256
    # Inputs waiting for the model; more is 503 with Retry-After.
    max_queue: int = 256
    # Seconds a request may take from arrival to answer; later is 504 (cancelled if not started).
    timeout: float = 30.0
    # Dynamic batching: source tokens of all requests merged into one batch (step-level
    # batching: of all requests in a running translation). Not decode.batch_tokens, the budget
    # of one decoding batch as translate counts it (sentences × longest padded source length).
    batch_tokens: int = 4096
    # Batch-boundary batching (not the PyTorch backend's translations, which requests join
    # between decoder steps): a batch starts once no request has joined it for this long ...
    batch_wait_ms: float = 5.0
    # ... or this long after its window opened (docs/serving.md, "Dynamic batching").
    batch_max_wait_ms: float = 100.0
    # Step-level batching: requests waiting for a running translation join it together once
    # their texts reach an eighth of its own, or the oldest has waited this many decoder steps
    # (each join is an encoder pass; an idle server starts a request at once). 0: at every step.
    join_steps: int = 2
    # False: every request runs alone, in arrival order (the benchmark's baseline; step_batching
    # then cannot apply).
    batching: bool = True
    # False: the PyTorch backend's translations are batched at batch boundaries too (more
    # sentences/s at 64+ one-sentence clients on a 2-core CPU; step-level batching answers a
    # lone or short request sooner: docs/serving.md).
    step_batching: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("batching", "step_batching", "batch_wait_ms", "batch_max_wait_ms"):
                continue
            if f.name == "join_steps":  # 0: join at every step
                if value < 0:
                    raise ConfigError(f"serve.join_steps must be >= 0, got {value}")
            elif not value > 0:
                raise ConfigError(f"serve.{f.name} must be > 0, got {value}")
        if self.max_texts > self.max_queue:
            raise ConfigError(
                f"serve.max_texts ({self.max_texts}) is more than serve.max_queue "
                f"({self.max_queue}): a request of that many texts could never be queued; lower "
                "serve.max_texts or raise serve.max_queue"
            )
        if not 0 <= self.batch_wait_ms <= self.batch_max_wait_ms:
            raise ConfigError(
                "serve.batch_wait_ms must be >= 0 and at most serve.batch_max_wait_ms, got "
                f"{self.batch_wait_ms:g} and {self.batch_max_wait_ms:g}"
            )
