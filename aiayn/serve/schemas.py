"""The request bodies of the HTTP API (pydantic), and the one set of rules every field obeys.

Checked at the door, before anything is tokenized or queued, with a one-line 422 naming the
field (aiayn/serve/errors.py):

- every body is a JSON object of known fields (an unknown field is an error) and of strict
  types ("4" is not a beam size, true is not a number);
- every number is finite (NaN, Infinity and -Infinity, which Python's JSON parser reads, are
  refused; so is 1e309, which it reads as Infinity) and within the range below;
- every string is valid Unicode: JSON may carry a lone surrogate (``"\\ud800"``), which no
  tokenizer can encode and no UTF-8 answer can hold.

The upper bounds that are the server's settings (serve.max_beam, serve.max_alpha,
serve.max_new_tokens, serve.max_texts; :class:`~aiayn.serve.limits.Limits`) are checked by
:class:`~aiayn.serve.service.ModelService`, with the same one-line 422s.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

__all__ = ["AttentionBody", "Body", "ClassifyBody", "GenerateBody", "Text", "TranslateBody"]


def valid_unicode(text: str) -> str:
    """``text`` unchanged when it is valid Unicode (UTF-8 can encode it: no lone surrogate);
    else a validation error naming the first bad character and where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise PydanticCustomError(
            "unicode",
            "a lone surrogate (U+{code}) at character {at} is not valid Unicode",
            {"code": f"{ord(text[err.start]):04X}", "at": err.start},
        ) from None
    return text


class Body(BaseModel):
    """The rules every request body shares: known fields, strict types, finite numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# Every string field of the API is a Text.
Text = Annotated[str, AfterValidator(valid_unicode)]
Texts = Annotated[
    list[Text], Field(min_length=1, description="one text per item (at most serve.max_texts)")
]
Size = Annotated[int | None, Field(ge=1, description="at most serve.max_beam")]
Alpha = Annotated[float | None, Field(ge=0.0, description="at most serve.max_alpha")]
Penalty = Annotated[float | None, Field(gt=0.0, le=10.0, description="1: off")]
NGram = Annotated[int | None, Field(ge=0, le=64, description="0: off")]
# Sampling: aiayn.decode.config.SamplingConfig checks the values (its words, as a 422); the server
# adds only its own limits (serve.max_new_tokens, a temperature of at most 10).
Temperature = Annotated[float, Field(le=10.0)]


class TranslateBody(Body):
    """Texts to translate; beam and alpha default to the model folder's settings, nbest to 1;
    the controls of docs/decoding.md (repetition, a forced prefix per text, alignments)."""

    texts: Texts
    beam: Size = None
    alpha: Alpha = None
    nbest: Size = None
    repetition_penalty: Penalty = None
    no_repeat_ngram_size: NGram = None
    prefixes: Annotated[
        list[Text | None] | None,
        Field(description="per text the start its translation must have (null: none)"),
    ] = None
    alignments: Annotated[
        bool, Field(description="source-output token index pairs per hypothesis")
    ] = False


class ClassifyBody(Body):
    """Texts to label (a text classifier; a long text is cut as in training), or images to
    classify (an image classifier): ``images`` base64 PNG/JPEG files (a ``data:`` URL's prefix
    allowed), or ``arrays`` of pixel rows ((H, W) grey or (H, W, C), integers 0-255 or floats
    in [0, 1]). Exactly one of the three; checked by :class:`~aiayn.serve.checks.RequestChecks`
    (aiayn/serve/images.py for images)."""

    texts: Annotated[list[Text] | None, Field(min_length=1, description="a text classifier's")] = (
        None
    )
    images: Annotated[
        list[Text] | None,
        Field(min_length=1, description="base64 PNG or JPEG files (an image classifier's)"),
    ] = None
    arrays: Annotated[
        list[Any] | None,
        Field(
            min_length=1,
            description="pixel arrays: (H, W) or (H, W, C) nested lists, 0-255 or floats in [0, 1]",
        ),
    ] = None
    top_k: Annotated[
        int, Field(ge=1, description="images: the likeliest classes per image (at most all)")
    ] = 5
    attention: Annotated[
        bool,
        Field(
            description="images: per image each layer's and head's attention over the patches "
            "(from the class token, or the mean over patches) and the attention rollout"
        ),
    ] = False


class AttentionBody(Body):
    """A sentence; its translation is searched with beam/alpha (default: the folder's) and the
    rank-th hypothesis of the n-best list (1: the best) is the one shown."""

    text: Text
    beam: Size = None
    alpha: Alpha = None
    rank: Annotated[int, Field(ge=1, description="at most the beam size")] = 1
    repetition_penalty: Penalty = None
    no_repeat_ngram_size: NGram = None
    prefix: Annotated[Text | None, Field(description="the start the translation must have")] = None


class GenerateBody(Body):
    """A prompt to continue; sampling settings as `aiayn generate` (SamplingConfig's fields), and
    the repetition controls of /v1/translate."""

    prompt: Text
    max_new_tokens: Annotated[int, Field(description="at most serve.max_new_tokens")] = 100
    temperature: Temperature = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: Penalty = None
    no_repeat_ngram_size: NGram = None
