"""Decoding settings: frozen dataclasses, overridable like every other aiayn config, and the one
function that merges translation's (:func:`merge_decode`).

:class:`DecodeConfig` is the only home of translation's decoding defaults: the command-line flags,
:func:`aiayn.decode.translate_texts` and a model folder's config.json ``decode`` section (a
recipe's ``[decode]``) all start from it. A setting has one name everywhere: the field ``beam`` is
the flag ``--beam``, the recipe key ``decode.beam``, the HTTP field ``"beam"`` and the Python
keyword ``translate(beam=)``. :class:`SamplingConfig` is a language model's: `aiayn generate`,
``aiayn.load(...).generate`` and the server's ``/v1/generate`` all build one.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from aiayn.checks import check_integer, check_number
from aiayn.errors import ConfigError


@dataclass(frozen=True)
class DecodeConfig:
    """How to turn a trained model into output text (Vaswani et al. 2017, §6.1).

    Defaults are the paper's: beam 4, length penalty α = 0.6, maximum output length
    input length + 50.
    """

    # Beam size; 1 is greedy search.
    beam: int = 4
    # GNMT length penalty exponent α (Wu et al. 2016, Eq. 14): lp(Y) = ((5 + |Y|) / 6)^α.
    alpha: float = 0.6
    # How a finished hypothesis's log-probability is normalised for ranking: the GNMT penalty
    # above, plain length normalisation (log P / |Y|), none (raw log P, favours short output), or
    # log P / |Y|^α ("power": Hugging Face's length_penalty = α; CTranslate2's too).
    length_penalty: Literal["gnmt", "average", "none", "power"] = "gnmt"
    # Beam search stops a sentence once it has `beam` finished hypotheses (true: fairseq, and
    # Hugging Face's early_stopping=True), or only when no live beam can still beat the worst of
    # them, judged by its score so far over the length penalty of its current length (false:
    # Hugging Face's default heuristic, what imported Marian models decode with).
    early_stopping: bool = True
    # Token ids never output: their log-probability is -inf after the softmax (Hugging Face's
    # bad_words_ids of single tokens; Marian models forbid <pad>, their decoder start).
    bad_ids: tuple[int, ...] = ()
    # Normalise the log-probabilities again after removing tokens (Hugging Face's
    # renormalize_logits); without it the removed tokens' mass is simply lost, as there.
    renormalize: bool = False
    # The last token the output cap allows is EOS, with log-probability 0 (Hugging Face's
    # forced_eos_token_id): a hypothesis cut at the cap ends with EOS instead of one more token.
    forced_eos: bool = False
    # Hugging Face's repetition_penalty (Keskar et al. 2019): the log-probability of a token already
    # in the hypothesis is multiplied by it (it is negative: > 1 makes a repeat less likely);
    # 1 is off. For output that loops on a syllable or word.
    repetition_penalty: float = 1.0
    # Hugging Face's no_repeat_ngram_size: no n-gram of this many tokens occurs twice in an
    # output (0: off). 3 or 4 stop a loop of repeated syllables without touching normal text.
    no_repeat_ngram_size: int = 0
    # Return source–target token alignments with each hypothesis: the cross-attention of the
    # alignment layer (the decoder's second-to-last), averaged over its heads, read by a
    # teacher-forced pass over the output (docs/decoding.md). Needs a PyTorch model.
    alignments: bool = False
    # Output length cap a · src_len + b tokens, EOS included (§6.1: a = 1, b = 50).
    max_len_a: float = 1.0
    max_len_b: int = 50
    # Forbid EOS before this many tokens (benchmarks force a fixed output length with it).
    min_len: int = 0
    # Hypotheses returned per input, best first (at most `beam`).
    nbest: int = 1
    # Token budget of one decoding batch: sentences × longest padded source length (not
    # data.max_tokens, a training batch's B × max(S, T) over both sides, fairseq's --max-tokens;
    # nor serve.batch_tokens, source tokens merged across requests). With beam 5 the
    # decoder then holds ~5 × batch_tokens / source length rows; past ~1,000 tokens a batch decoded
    # no faster on a 2-core CPU and only held more memory (demo model, test2016, 2 workers:
    # docs/experiments/decoding_speed.md#native-decoding-against-ctranslate2-where-the-time-and-the-memory-went-2026-11-26).
    batch_tokens: int = 1024
    # Batches decoded at once, each on its share of torch's intra-op threads (CTranslate2's
    # inter_threads). 0: chosen for the machine and the engine when the model runs
    # (aiayn.threads.default_workers: one per thread, at most 2 for aiayn's search, 4 for
    # CTranslate2; docs/decoding.md). A setting of the machine, not of the model: a model folder
    # does not keep it.
    workers: int = 0
    # Run the matmuls in bfloat16 autocast (faster on CPUs with AVX512-BF16/AMX and on GPUs).
    bf16: bool = False
    # Run the decoder step as one compiled call (AOTInductor, aiayn/runtime/compiled.py): one
    # translation model, float32, on the CPU. Compiled once per model, CPU and thread count into
    # $AIAYN_CACHE/compiled (~1 minute), then loaded in a fraction of a second (docs/decoding.md).
    compile: bool = False

    def __post_init__(self) -> None:
        # one rule set with the CLI, recipes, imported settings and the HTTP API (aiayn.checks):
        # finite numbers, ranges, a minimum at most its maximum
        check_integer("beam", self.beam, minimum=1)
        if not 1 <= self.nbest <= self.beam:
            raise ConfigError(f"nbest must be between 1 and beam ({self.beam}), got {self.nbest}")
        check_number("alpha", self.alpha, minimum=0)
        check_number("max_len_a", self.max_len_a, minimum=0)
        check_integer("max_len_b", self.max_len_b, minimum=0)
        check_integer("min_len", self.min_len, minimum=0)
        if self.max_len_a == 0 and self.max_len_b == 0:
            raise ConfigError("max_len_a and max_len_b are both 0: the output cap is 0 tokens")
        # min_len == max_len_b forbids EOS throughout: exactly max_len_b tokens, the fixed output
        # length the decoding benchmarks force; above the cap, no output could satisfy it.
        if self.max_len_a == 0 and self.min_len > self.max_len_b:
            raise ConfigError(
                f"min_len ({self.min_len}) must not exceed the output cap max_len_b "
                f"({self.max_len_b})"
            )
        for i in self.bad_ids:
            check_integer("bad_ids", i, minimum=0)
        try:
            check_number("repetition_penalty", self.repetition_penalty, above=0)
        except ConfigError:
            raise ConfigError(
                f"repetition_penalty must be a number > 0 (1: off), got {self.repetition_penalty}"
            ) from None
        check_integer("no_repeat_ngram_size", self.no_repeat_ngram_size, minimum=0)
        check_integer("batch_tokens", self.batch_tokens, minimum=1)
        check_integer("workers", self.workers, minimum=0)


def merge_decode(base: DecodeConfig, *layers: Mapping[str, Any] | None) -> DecodeConfig:
    """The one merge of decoding settings, used by the command line, ``aiayn.load(...)`` and the
    server: ``base`` (a model folder's settings: its recipe's ``[decode]`` over DecodeConfig's
    defaults), then each of ``layers`` in order, a later one winning: the command line's flags,
    then a request's fields or Python keywords. A None value is "not given"; an unknown name is
    a ConfigError naming the nearest known one (``beem`` -> did you mean ``beam``?)."""
    names = [f.name for f in dataclasses.fields(DecodeConfig)]
    chosen: dict[str, Any] = {}
    for layer in layers:
        for name, value in (layer or {}).items():
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"unknown decoding setting '{name}'{hint}")
            if value is not None:
                chosen[name] = value
    return dataclasses.replace(base, **chosen)


#: The smallest temperature and top_p: below it float32 rounds a temperature's quotient or a
#: top_p to inf or 0, and every token's probability to NaN.
SAMPLING_MINIMUM = 1e-6

#: the seeds ``torch.Generator.manual_seed`` takes (a 64-bit integer, signed or unsigned)
SEED_RANGE = (-(2**63), 2**64 - 1)


@dataclass(frozen=True)
class SamplingConfig:
    """How a language model continues a prompt: ancestral sampling from a filtered
    distribution (`aiayn generate`, ``aiayn.load(...).generate``, ``POST /v1/generate``).

    One object from the command line, the Python call or the request down to the search; it
    checks itself, so a value is refused in the same words wherever it comes from.
    """

    # Tokens to add after the prompt.
    max_new_tokens: int = 200
    # The logits are divided by it before sampling: < 1 is more conservative.
    temperature: float = 1.0
    # Sample among the k most probable tokens; 0: all.
    top_k: int = 0
    # Sample from the smallest set of tokens with this much probability (nucleus sampling,
    # Holtzman et al. 2020); 1: all.
    top_p: float = 1.0
    # Seed of the draws, for reproducible output; None: torch's global generator.
    seed: int | None = None
    # The rules of search (DecodeConfig documents each), which sampling applies too.
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_integer("max_new_tokens", self.max_new_tokens, minimum=1)
        check_number("temperature", self.temperature, minimum=SAMPLING_MINIMUM)
        check_integer("top_k", self.top_k, minimum=0)
        check_number("top_p", self.top_p, minimum=SAMPLING_MINIMUM, maximum=1)
        check_seed(self.seed)
        check_number("repetition_penalty", self.repetition_penalty, above=0)
        check_integer("no_repeat_ngram_size", self.no_repeat_ngram_size, minimum=0)
        for i in self.bad_ids:
            check_integer("bad_ids", i, minimum=0)

    def replace(self, **overrides: Any) -> SamplingConfig:
        """This config with ``overrides`` (field names); an unknown name is a ConfigError that
        names the nearest field."""
        names = [f.name for f in fields(self)]
        for key in overrides:
            if key not in names:
                near = difflib.get_close_matches(key, names, n=1)
                hint = f" (did you mean {near[0]}?)" if near else ""
                raise ConfigError(f"unknown sampling setting {key!r}{hint}; known: {names}")
        return replace(self, **overrides)


def check_seed(seed: Any) -> None:
    """ConfigError when ``seed`` is outside :data:`SEED_RANGE` or not an integer (None: no
    seed)."""
    if seed is None:
        return
    low, high = SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        raise ConfigError(f"seed must be an integer from -2**63 to 2**64-1, got {seed!r}")
