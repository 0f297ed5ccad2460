"""The one interface of the exporters: an :class:`Exporter` writes a model folder as one format.

:meth:`Exporter.export` is the template every format follows (CTranslate2's converters: load →
validate → write → record): open the model folder with the one loader (its checks and messages),
let the format refuse what it cannot express before the output folder is touched, write into a
temporary folder that replaces ``out`` only when complete, then record config.json (the source's
sections, provenance, the sha256 of every part) and the model card. A format gives its ``name``,
the optional dependency it needs, :meth:`check`, and :meth:`~Exporter.write_output`; a format
aiayn runs again (:class:`FolderExporter`: ONNX, CTranslate2) gives only :meth:`~FolderExporter.write`
and gets the record; one that leaves aiayn (Hugging Face) writes its own layout. The kinds a
format writes are declared in :mod:`aiayn.kinds`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from aiayn.card import write_model_card
from aiayn.errors import CheckpointError, ConfigError, require
from aiayn.folder.config import (
    FolderConfig,
    parse_folder_config,
    read_folder_config,
    write_folder_config,
)
from aiayn.folder.load import load_model_folder
from aiayn.folder.parts import TOKENIZER_FILE, record_parts
from aiayn.io import check_not_input, check_output_folder, new_folder
from aiayn.kinds import KINDS
from aiayn.progress import progress_bar

__all__ = ["ExportOptions", "Exporter", "FolderExporter", "QUANTIZATIONS"]

# CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`) that run on a CPU.
QUANTIZATIONS = ("float32", "int8", "int8_float32", "bfloat16", "int8_bfloat16", "int16")


#: the output bias an export gives tokens outside the model's output_mask (CTranslate2's
#: projection bias, Marian's final_logits_bias): their probability is exactly 0 after softmax
MASKED_BIAS = -1e9


@dataclass(frozen=True)
class ExportOptions:
    """What `aiayn export` takes besides the folders."""

    quantization: str | None = None  # CTranslate2's weight type (default float32)
    overwrite: bool = False  # replace an existing output folder


class Exporter(ABC):
    """One export format (see the module docstring)."""

    name: ClassVar[str]  # `aiayn export --format NAME`, config.json "format"
    dependency: ClassVar[tuple[str, str]]  # (module, the aiayn extra that installs it)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The model kinds this format writes (declared per kind in aiayn.kinds)."""
        return tuple(k.name for k in KINDS.values() if self.name in k.exporters)

    def check_options(self, options: ExportOptions) -> None:
        """ConfigError for an option this format cannot express."""
        if options.quantization is not None:
            raise ConfigError("--quantization applies to --format ctranslate2 only")

    @abstractmethod
    def check(self, model: Any, kind: str, tokenizer: Any) -> None:
        """ConfigError naming what of ``model`` (or its tokenizer) this format cannot express."""

    @abstractmethod
    def write_output(
        self,
        loaded: Any,
        meta: FolderConfig,
        source: Path,
        tmp: Path,
        out: Path,
        options: ExportOptions,
    ) -> None:
        """Write the whole output into ``tmp`` (which becomes ``out`` when complete)."""

    def export(self, folder: str | Path, out: str | Path, options: ExportOptions) -> Path:
        """Export the model folder ``folder`` into ``out`` (see the module docstring)."""
        source, out = Path(folder), Path(out)
        with progress_bar(2, f"export {self.name}", "stage") as bar:
            bar.set_postfix_str(f"loading {source}")
            meta, loaded = self.open_source(source, out, options)
            bar.update()
            bar.set_postfix_str(f"writing {out}")
            with new_folder(out, options.overwrite) as tmp:
                self.write_output(loaded, meta, source, tmp, out, options)
            bar.update()
        return out

    def open_source(
        self, source: Path, out: Path, options: ExportOptions
    ) -> tuple[FolderConfig, Any]:
        """Every check before any work (options, folders, the optional dependency, what the
        format cannot express), then the model folder opened by the one loader: (its parsed
        config.json, the loaded folder)."""
        self.check_options(options)
        check_not_input(out, [source], "-o")  # --overwrite would delete the model being exported
        check_output_folder(out, options.overwrite)  # before any work
        module, extra = self.dependency
        require(module, extra, f"--format {self.name}")
        meta = read_folder_config(source)
        if meta.format is not None:
            raise CheckpointError(
                f"{source}: already an exported '{meta.format}' model; export the model "
                "folder it was written from"
            )
        loaded = load_model_folder(source)  # the one loader: its checks and messages
        # before touching the output
        self.check(loaded.torch_module(), loaded.kind, loaded.text_tokenizer)
        return meta, loaded


class FolderExporter(Exporter):
    """A format that aiayn runs again (ONNX, CTranslate2): its files, then an aiayn model
    folder's record (tokenizer.json, config.json with the sha256 of every part, the card)."""

    @abstractmethod
    def write(
        self, model: Any, kind: str, tokenizer: Any, folder: Path, options: ExportOptions
    ) -> dict:
        """Write the model into ``folder``; the config.json entries that describe what was written."""

    def write_output(
        self,
        loaded: Any,
        meta: FolderConfig,
        source: Path,
        tmp: Path,
        out: Path,
        options: ExportOptions,
    ) -> None:
        kind, tokenizer = loaded.kind, loaded.text_tokenizer  # None: a model that reads no text
        extra_keys = self.write(loaded.torch_module(), kind, tokenizer, tmp, options)
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_FILE)
        # the source's sections as the loader read them (renamed keys under their new names; a
        # section it did not record stays unrecorded), its provenance, what the writer says
        parts = record_parts(tmp, meta.config.model)  # checked whenever the folder is opened
        written = {**meta.to_dict(), **extra_keys, "exported_from": str(source), "parts": parts}
        written = {"format": self.name, **written, "kind": kind}
        if written.get("decode"):  # bf16 autocast and the compiled step are PyTorch's own; an
            # export runs as exported
            written["decode"] = {**written["decode"], "bf16": False, "compile": False}
        write_folder_config(tmp, parse_folder_config(written, tmp))
        write_model_card(tmp, shown_as=out)  # README.md; a failure is logged, not raised
