"""What a request may ask of one model folder under the server's limits: its routes, its
decoding and sampling settings, its texts. Each refusal is a one-line
:class:`~aiayn.serve.queue.RequestError` (a 4xx), raised before anything is queued."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiayn.decode import DecodeConfig, SamplingConfig
from aiayn.decode.config import merge_decode
from aiayn.errors import ConfigError
from aiayn.folder.load import ModelFolder
from aiayn.kinds import KINDS
from aiayn.runtime import Unsupported, require
from aiayn.serve.images import ImageInput, read_arrays, read_images
from aiayn.serve.limits import Limits
from aiayn.serve.queue import RequestError

__all__ = ["RequestChecks"]


class RequestChecks:
    """What a request may ask of one model folder under the limits: its routes, its decoding
    and sampling settings, its texts. Each refusal is a :class:`RequestError`."""

    def __init__(self, folder: ModelFolder, limits: Limits) -> None:
        self.folder, self.limits, self.kind = folder, limits, folder.kind
        # The kind's routes that its backend can answer (no attention weights from an export).
        self.routes = [r for r in KINDS[self.kind].routes if r in folder.backend.capabilities]
        self.max_text_tokens = min(limits.max_text_tokens, folder.config.model.max_len)

    def require(self, route: str) -> None:
        """404 with the routes this model does answer when ``route`` is not one of them."""
        if route in self.routes:
            return
        if route in KINDS[self.kind].routes:  # the kind's, but not this backend's
            try:
                require(self.folder.backend, route, "serve its model folder with --engine torch")
            except Unsupported as err:
                raise RequestError(404, f"no /v1/{route}: {err}") from None
        routes = ", ".join(f"/v1/{r}" for r in self.routes) or "none"
        raise RequestError(
            404, f"this server holds a {self.kind} model: no /v1/{route} (it answers {routes})"
        )

    def check_at_most(self, name: str, value: float | None, limit: float) -> None:
        """422 naming ``name`` when ``value`` is above ``limit`` (one of the server's limits)."""
        if value is not None and value > limit:
            raise RequestError(422, f"{name}: at most {limit:g} on this server, got {value:g}")

    def decode_config(
        self, beam: int | None, alpha: float | None, nbest: int | None, **controls: Any
    ) -> DecodeConfig:
        """The folder's own decoding settings, with what the request overrides (workers 1: the
        batcher's one thread decodes); 422 beyond serve.max_beam or serve.max_alpha. ``controls``:
        DecodeConfig fields (repetition_penalty, no_repeat_ngram_size, alignments), None left
        out; alignments a backend without attention weights cannot give are a 422 naming it."""
        self.check_at_most("beam", beam, self.limits.max_beam)
        self.check_at_most("nbest", nbest, self.limits.max_beam)
        self.check_at_most("alpha", alpha, self.limits.max_alpha)
        base = self.folder.decode
        if nbest is not None and nbest > (base.beam if beam is None else beam):
            raise RequestError(422, f"nbest ({nbest}) must be at most beam ({beam or base.beam})")
        if controls.get("alignments"):
            try:
                require(self.folder.backend, "attention", "alignments need a PyTorch model")
            except Unsupported as err:
                raise RequestError(422, f"alignments: {err}") from None
        request = {"beam": beam, "alpha": alpha, "nbest": nbest, **controls}
        try:  # the server's own: 1 best, and the batcher's one thread decodes
            return merge_decode(base, {"nbest": 1, "workers": 1}, request)
        except ConfigError as err:
            raise RequestError(422, str(err)) from None

    def sampling_config(self, fields: dict[str, Any]) -> SamplingConfig:
        """The request's sampling settings as one SamplingConfig; 422 with its line for a
        value it refuses."""
        self.check_at_most(
            "max_new_tokens", fields.get("max_new_tokens"), self.limits.max_new_tokens
        )
        try:
            return SamplingConfig(**fields)
        except ConfigError as err:
            raise RequestError(422, str(err)) from None

    def check_texts(self, texts: Sequence[str], cut: bool = False) -> int:
        """422 for an empty text or one past the token limit (``cut``: no limit, the text is cut
        as in training); returns the tokens of all, as the batch's cost."""
        if len(texts) > self.limits.max_texts:
            raise RequestError(
                422, f"texts: at most {self.limits.max_texts} per request, got {len(texts)}"
            )
        lengths = [len(ids) for ids in self.folder.tokenizer.encode_batch(list(texts))]
        for i, (text, n) in enumerate(zip(texts, lengths)):
            if not text.strip():
                raise RequestError(422, f"texts[{i}] is empty")
            if n > self.max_text_tokens and not cut:
                raise RequestError(
                    422, f"texts[{i}] has {n} tokens; the limit is {self.max_text_tokens}"
                )
        return sum(min(n, self.max_text_tokens) for n in lengths)

    def images(
        self, images: Sequence[str] | None, arrays: Sequence[Any] | None, top_k: int
    ) -> list[ImageInput]:
        """The images of a /v1/classify request (files or arrays, aiayn/serve/images.py) as the
        model reads them; 422 for a model that reads texts, more than serve.max_texts images,
        or an image that cannot be read."""
        if not self.folder.kind_info.does("classify_images"):
            raise RequestError(
                422, f"this server holds a {self.kind} model, which classifies texts: send 'texts'"
            )
        field, given = ("images", images) if images is not None else ("arrays", arrays or [])
        if len(given) > self.limits.max_texts:
            raise RequestError(
                422, f"{field}: at most {self.limits.max_texts} per request, got {len(given)}"
            )
        cfg, most = self.folder.config.model, self.limits.max_image_pixels
        read = read_images if field == "images" else read_arrays
        pixels, notes = read(given, cfg.image_size, cfg.channels, most)
        return [ImageInput(p, top_k, note) for p, note in zip(pixels, notes)]

    def check_prefixes(self, texts: Sequence[str], prefixes: Sequence[str | None] | None) -> None:
        """422 for prefixes that are not one per text, or one past the token limit."""
        if prefixes is None:
            return
        if len(prefixes) != len(texts):
            raise RequestError(422, f"prefixes: one per text ({len(texts)}), got {len(prefixes)}")
        for i, prefix in enumerate(prefixes):
            n = len(self.folder.tokenizer.encode(prefix)) if prefix else 0
            if n > self.max_text_tokens:
                raise RequestError(
                    422, f"prefixes[{i}] has {n} tokens; the limit is {self.max_text_tokens}"
                )
