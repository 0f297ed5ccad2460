"""A model kind defined outside aiayn, in one module: what adding a kind takes.

``reverse`` writes a sequence of letters backwards (``a b c`` -> ``c b a``), the learning check of
The Annotated Transformer. It brings its own model class and its own training Task, and its one
registry entry, :data:`KIND`, says everything else: it reads sentence pairs (translation's data
source), it answers ``translate`` (the server's ``/v1/translate``), it takes none of the
kind-specific settings (no BLEU: its validation metric is exact match) and no format exports it.
``aiayn.kinds.register_kind(KIND)`` plugs it in (tests/test_toy_kind.py).
"""

from __future__ import annotations

from torch import nn

from aiayn.data import load_translation
from aiayn.decode import translate_texts
from aiayn.kinds import TRANSLATION, Kind
from aiayn.model import Transformer
from aiayn.train.translation import TranslationTask


class Reverser(Transformer):
    """The paper's encoder–decoder as the kind's model: it decodes as a translation model does,
    so the server's translate route and the folder's ``translate`` need nothing of their own."""


class ReverseTask(TranslationTask):
    """Teacher-forced training on (letters, letters reversed) pairs; validation counts exact
    reversals."""

    kind = "reverse"

    def valid_metrics(self, model: nn.Module, step: int) -> dict[str, float]:
        """The share of the validation sequences the model writes back exactly reversed
        (greedy)."""
        src, tgt = load_translation(self.cfg.data, self.cfg.data.valid_split)
        hyps = translate_texts(model, self.tokenizer, src, beam=1)
        return {"valid_exact": sum(h == t for h, t in zip(hyps, tgt)) / len(tgt)}


KIND = Kind(
    "reverse",
    Reverser,
    "toy_kind:ReverseTask",
    uses=("translate", "score"),
    routes=("translate",),
    exporters={},
    reads=TRANSLATION,  # the data source: sentence pairs, as translation reads
    stack={},
    title="reverser",
    summary="writes a sequence of letters backwards",
)
