"""Model cards: a ``README.md`` in each model folder that says what the model is, how it was
trained, what it scored and how to use it (after Hugging Face's model cards).

The card is written from what the folder already holds: ``config.json`` (kind, model, data, train,
the ``decode`` settings, ``best`` or ``averaged``), its ``eval_*.json`` scores, the weights' header
(the parameter count, read without loading them) and the run's ``metrics.jsonl`` (training time).
``train`` and ``average`` write it, ``evaluate`` refreshes it after saving new scores. Writing a card
never fails a command: a problem is logged and the folder stays as it was.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from pathlib import Path
from typing import Any

from aiayn.config import to_dict
from aiayn.data.registry import DATASETS
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode.config import DecodeConfig
from aiayn.errors import DataError
from aiayn.folder.checkpoint import WEIGHTS_FILE
from aiayn.folder.config import FolderConfig, read_folder_config
from aiayn.folder.parts import TOKENIZER_FILE
from aiayn.io import write_text
from aiayn.kinds import KINDS, Kind
from aiayn.viz.curves import read_metrics

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
# DecodeConfig's, quoted when a folder sets none
DECODE_DEFAULTS = {"beam": DecodeConfig.beam, "alpha": DecodeConfig.alpha}
FORMATS = {"onnx": "ONNX", "ctranslate2": "CTranslate2"}  # config.json "format" of `aiayn export`


def write_model_card(folder: str | Path, shown_as: str | Path | None = None) -> Path | None:
    """Write ``folder/README.md`` from the folder's own files; return its path, or None (logged)
    when the card could not be written. Never raises: a card is never worth a failed command.

    ``shown_as``: the path the card names the folder by (its final path, when ``folder`` is the
    temporary folder that will be renamed onto it)."""
    folder = Path(folder)
    try:
        text = model_card(folder, shown_as)
        write_text(folder / CARD_FILE, text)
        return folder / CARD_FILE
    except Exception as err:  # noqa: BLE001 - by design: the card must not break train/evaluate
        log.warning("model card not written for %s: %s", folder, err)
        return None


def model_card(folder: str | Path, shown_as: str | Path | None = None) -> str:
    """The Markdown text of the model card of ``folder`` (named ``shown_as`` when given)."""
    folder = Path(folder)
    name = Path(shown_as) if shown_as is not None else folder
    meta = read_folder_config(folder)
    kind = KINDS[meta.kind]  # (read_folder_config checked the name)
    fmt = meta.format
    title = f"# {name.name}: {kind.title} model" + (
        f" ({FORMATS.get(fmt, fmt)} export)" if fmt else ""
    )
    sections = [
        f"{title}\n\n{_summary(meta, kind)}",
        "## Facts\n\n" + _facts_table(folder, meta, kind),
        "## Scores\n\n" + _scores(folder),
        "## Decoding settings\n\n" + _decoding(meta, kind),
        "## Use it\n\n" + _usage(name, meta, kind),
    ]
    footer = (
        "*Written by aiayn from this folder's `config.json`, `eval_*.json` and its run's "
        "`metrics.jsonl`; `aiayn evaluate` refreshes it.*"
    )
    return "\n\n".join(sections) + "\n\n" + footer + "\n"


def _sections(meta: FolderConfig) -> dict[str, dict[str, Any]]:
    """The sections config.json records (a missing one: empty), as plain dicts."""
    return {
        name: to_dict(getattr(meta.config, name)) if name in meta.sections else {}
        for name in ("model", "data", "train")
    }


def _summary(meta: FolderConfig, kind: Kind) -> str:
    data = _sections(meta)["data"]
    what = kind.summary.format(langs=_langs(data), n_classes=meta.config.model.n_classes)
    imported = meta.extra.get("imported_from")
    if isinstance(imported, dict):  # `aiayn import hf`: someone else's model, their licence
        langs = _langs(imported)
        return (
            f"A Transformer that translates {langs}, imported from the Hugging Face Marian "
            f"folder `{imported.get('source')}` (licence: {imported.get('licence')}); not "
            "trained by aiayn. Its decoding settings are that folder's generation settings."
        )
    dataset = data.get("dataset") or "files of your own"
    return f"A Transformer that {what}, trained with aiayn on {dataset}."


def _langs(data: dict[str, Any]) -> str:
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    return f"{src} → {tgt}" if src and tgt else "source → target"


def _facts_table(folder: Path, meta: FolderConfig, kind: Kind) -> str:
    sections = _sections(meta)
    data, train = sections["data"], sections["train"]
    imported = meta.extra.get("imported_from")
    rows = [
        ("task", kind.title + (f" ({_langs(data)})" if kind.does("translate") else "")),
        ("data", _data(data)),
        (
            ("tokenizer", "" if imported else _tokenizer(data, _vocabulary(folder, meta)))
            if kind.tokenized
            else ("input", _image_input(meta))
        ),
        ("architecture", _architecture(to_dict(meta.config.model))),
        ("parameters", _parameters(folder)),
        ("weights", _weights(meta)),
        ("training", _training(folder, meta, train)),
        ("hardware", meta.hardware or "not recorded"),
    ]
    if isinstance(imported, dict):
        rows = _imported_rows(rows, imported)
    if meta.format:
        fmt = FORMATS.get(meta.format, meta.format)
        quantization = f", {meta.quantization}" if meta.quantization else ""
        source = meta.exported_from or "?"
        rows.append(("format", f"{fmt}{quantization}, exported from `{source}`"))
    lines = ["| | |", "|---|---|"] + [f"| {key} | {value} |" for key, value in rows]
    return "\n".join(lines)


def _imported_rows(rows: list[tuple[str, str]], imported: dict[str, Any]) -> list[tuple[str, str]]:
    """The facts of a folder made by `aiayn import hf`: its source, not a run of aiayn's."""
    source = f"`{imported.get('source')}`"
    facts = {
        "task": f"translation ({_langs(imported)})",
        "data": f"see the model card of {source}",
        "tokenizer": "SentencePiece: source and target models over one joint vocabulary",
        "weights": f"imported from {source} (Hugging Face Marian)",
        "training": "not by aiayn",
    }
    return [(key, facts.get(key, value)) for key, value in rows] + [
        ("licence", str(imported.get("licence")))
    ]


def _data(data: dict[str, Any]) -> str:
    if data.get("dataset"):
        return f"`{data['dataset']}`, split `{data.get('train_split', 'train')}` (validation: `{data.get('valid_split', 'val')}`)"
    files = [data.get(k) for k in ("train_src", "train_tgt", "train_file") if data.get(k)]
    return ", ".join(f"`{f}`" for f in files) or "not recorded"


def _vocabulary(folder: Path, meta: FolderConfig) -> int:
    """The tokenizer's real size: its tokenizer.json's (a BPE learnt on small data stops short of
    data.vocab_size), else the model's embedding rows."""
    path = folder / TOKENIZER_FILE
    if path.is_file():
        return Tokenizer.from_file(path).vocab_size
    model = meta.config.model
    return model.src_vocab_size if model.n_encoder_layers else model.tgt_vocab_size


def _tokenizer(data: dict[str, Any], size: int) -> str:
    asked = data.get("vocab_size")
    text = f"{data.get('tokenizer', '?')}, {size:,} tokens"
    if isinstance(asked, int) and asked != size:  # what the run asked for, if it differs
        text += f" (data.vocab_size {asked:,})"
    return text + (", lower-cased input" if data.get("lowercase") else "")


def _image_input(meta: FolderConfig) -> str:
    """What an image model reads: its image size, channels and patches."""
    m = meta.config.model
    grid = m.image_size // m.patch_size
    colour = "grey" if m.channels == 1 else "RGB"
    return (
        f"{m.image_size}x{m.image_size} {colour} images, {grid * grid} patches of "
        f"{m.patch_size}x{m.patch_size}, {m.pooling} pooling"
    )


def _architecture(model: dict[str, Any]) -> str:
    enc, dec = model.get("n_encoder_layers", 0), model.get("n_decoder_layers", 0)
    shape = "encoder–decoder" if enc and dec else "encoder-only" if enc else "decoder-only"
    parts = [
        f"{shape}, {enc}+{dec} layers",
        f"d_model {model.get('d_model', '?')}",
        f"{model.get('n_heads', '?')} heads",
        f"d_ff {model.get('d_ff', '?')}",
        "pre-LN" if model.get("norm_first") else "post-LN (the paper)",
        f"dropout {model.get('dropout', '?')}",
    ]
    return ", ".join(parts)


def _parameters(folder: Path) -> str:
    """Counted from the safetensors header (shapes only; tied weights are stored once), without
    loading the weights; integer and bool tensors (masks, buffers) are not parameters."""
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        return "as in the folder it was exported from"
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    count = sum(
        math.prod(t["shape"])
        for name, t in header.items()
        if name != "__metadata__" and t["dtype"].startswith(("F", "BF"))
    )
    return f"{count:,}"


def _weights(meta: FolderConfig) -> str:
    if meta.averaged is not None:
        steps = meta.averaged.get("steps", [])
        return f"the average of {len(steps)} checkpoints (updates {', '.join(map(str, steps))})"
    if meta.best is not None:
        best = dict(meta.best)
        step = best.pop("step", "?")
        metric = ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in best.items()
        )
        return f"the best checkpoint, update {step} ({metric})"
    return "the latest checkpoint of the run"


def _run_folder(folder: Path, meta: FolderConfig) -> Path:
    """Where the run's metrics.jsonl is: the folder, the averaged run, its parent (best/, avgN/),
    or those of the folder an export was made from."""
    source = Path(meta.exported_from or folder)
    candidates = [folder, Path((meta.averaged or {}).get("run", folder)), folder.parent]
    candidates += [source, source.parent]
    for candidate in candidates:
        if (candidate / "metrics.jsonl").is_file():
            return candidate
    return folder


def _row_of_card(folder: Path, key: str) -> str:
    """The ``key`` row of the card the folder already has (a folder copied away from its run keeps
    what its card said when the run's metrics.jsonl was at hand)."""
    try:
        text = (folder / CARD_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    prefix = f"| {key} | "
    for line in text.splitlines():
        if line.startswith(prefix) and line.endswith(" |"):
            return line[len(prefix) : -2]
    return ""


def _training(folder: Path, meta: FolderConfig, train: dict[str, Any]) -> str:
    """The training row from the run's metrics.jsonl; without one, the row the folder's card
    already has, or else "not recorded here"."""
    path = _run_folder(folder, meta) / "metrics.jsonl"
    limits = ", ".join(
        f"{k} {train[k]}" for k in ("max_steps", "max_epochs", "max_time") if train.get(k)
    )
    if not path.is_file():
        return _row_of_card(folder, "training") or f"not recorded here (limits: {limits or 'none'})"
    try:
        lines = read_metrics(path)  # a last line cut by a kill is skipped
    except DataError as err:  # empty, or a malformed line
        return f"no readable metrics ({err}; limits: {limits or 'none'})"
    last = lines[-1]
    speeds = [m["tokens_per_s"] for m in lines if isinstance(m.get("tokens_per_s"), (int, float))]
    text = f"{last.get('step', '?'):,} updates in {last.get('wall', 0) / 60:.1f} min (validation included)"
    if speeds:
        text += f", median {statistics.median(speeds):,.0f} tokens/s"
    precision = train.get("precision")
    return (
        text
        + (f", precision {precision}" if precision else "")
        + (f"; limits: {limits}" if limits else "")
    )


def _scores(folder: Path) -> str:
    files = sorted(folder.glob("eval_*.json"))
    rows = []
    for path in files:
        try:
            scores = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        rows.append(_score_row(path, scores))
    if not rows:
        return (
            "None measured on this folder yet: `aiayn evaluate` writes `eval_<test set>.json` here "
            "and refreshes this card."
        )
    head = "| file | test set | scores | decoding | speed |\n|---|---|---|---|---|"
    return head + "\n" + "\n".join(rows)


def _score_row(path: Path, s: dict[str, Any]) -> str:
    if "accuracy" in s:
        scores = f"accuracy {100 * s['accuracy']:.2f}% ({s.get('correct', '?')}/{s.get('n', '?')})"
        speed = f"{s['texts_per_s']:.0f} texts/s" if "texts_per_s" in s else ""
        decoding = ""
    else:
        scores = ", ".join(
            f"{label} {s[key]:.2f}"
            for key, label in (("bleu", "BLEU"), ("bleu_lc", "BLEU `-lc`"), ("chrf", "chrF"))
            if isinstance(s.get(key), (int, float))
        )
        d = s.get("decoding", {})
        decoding = f"beam {d.get('beam', '?')}, α {d.get('alpha', '?')}" if d else ""
        if d.get("engine") not in (None, "torch"):
            decoding += f", engine {d['engine']}"
        models = s.get("model")
        if isinstance(models, list) and len(models) > 1:
            decoding += f"; ensemble of {len(models)}"
        speed = f"{s['sentences_per_s']:.1f} sentences/s" if "sentences_per_s" in s else ""
    test_set = str(s.get("test_set", "?"))
    if isinstance(s.get("limit"), int):  # `evaluate --limit N`: part of the set, said as such
        test_set += f" (first {s['limit']} only: not the set's score)"
    return f"| `{path.name}` | {test_set} | {scores} | {decoding} | {speed} |"


def _decoding(meta: FolderConfig, kind: Kind) -> str:
    if not kind.does("translate"):
        return "Not a translation model: no beam search settings."
    decode = meta.decode_set
    if not decode:
        return (
            f"None stored: commands use the defaults (beam {DECODE_DEFAULTS['beam']}, length "
            f"penalty α {DECODE_DEFAULTS['alpha']}); flags such as `--beam` and `--alpha` override them."
        )
    settings = ", ".join(f"`{k}` {v}" for k, v in decode.items())
    return f"Stored in `config.json` (`decode`) and used by every command unless a flag overrides it: {settings}."


def _usage(folder: Path, meta: FolderConfig, kind: Kind) -> str:
    """The commands that fit this folder: its kind's example, scored on its own dataset's test
    splits (or on files, for a model trained on files of its own), served, run by its engine when
    exported."""
    f = str(folder)
    engine = f" --engine {meta.format}" if meta.format else ""  # what the export runs on
    load = f'aiayn.load("{f}"' + (f', engine="{meta.format}")' if meta.format else ")")
    if kind.example is None:
        return kind.note.format(f=f)
    example, call = kind.example
    shell = [example.format(f=f, engine=engine)]
    if kind.does("score"):
        shell += _evaluate_lines(f, meta, kind, engine)
    if kind.routes:
        shell.append(f"aiayn serve {f}{engine}")
    if kind.does("translate") and not meta.format:
        shell.append(f"aiayn export {f} --format onnx -o {f}-onnx")
    python = load + call
    return "```bash\n" + "\n".join(shell) + "\n```\n\n```python\nimport aiayn\n" + python + "\n```"


def _evaluate_lines(model: str, meta: FolderConfig, kind: Kind, engine: str) -> list[str]:
    """`aiayn evaluate` on each test split of the folder's registered dataset (the registry's
    splits other than its training and validation ones), else on files of one's own."""
    dataset = meta.config.data.dataset if meta.has_data else None
    spec = DATASETS.get(dataset) if dataset else None
    own = (meta.config.data.train_split, meta.config.data.valid_split) if meta.has_data else ()
    splits = (
        [s for s in spec.splits if s not in own and not s.startswith(("train", "val"))]
        if spec
        else []
    )
    if splits:
        return [f"aiayn evaluate {model} --split {split}{engine}" for split in splits]
    data = _sections(meta)["data"]
    src, tgt = data.get("src_lang") or "src", data.get("tgt_lang") or "tgt"
    if src == tgt:
        src, tgt = "src", "tgt"
    return [kind.own_files.format(f=model, src=src, tgt=tgt, engine=engine)]
