"""Readers for text files: strict UTF-8, one example per line, every error naming file and line.

Lines are split on ``\\n`` only (an optional ``\\r`` before it is dropped), never with
``str.splitlines``, which would also split on the C1 control characters found in real data (IMDB
has stray U+0085). ``.gz`` files are read transparently.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path

from aiayn.errors import DataError

__all__ = ["read_bytes", "decode_utf8", "read_text", "read_lines", "read_parallel", "read_labelled"]


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes (``.gz`` decompressed); DataError when missing, a folder or unreadable."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.is_dir():
        raise DataError(f"{path}: is a folder, expected a file")
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path}: cannot read ({err})") from None


def decode_utf8(path: str | os.PathLike, data: bytes) -> str:
    """``data`` as strict UTF-8 (a leading byte-order mark dropped); DataError naming ``path``,
    line and column of the first invalid byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[err.start]:02x} at column {column})"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark is not part of the first line
    return text


def read_text(path: str | os.PathLike) -> str:
    """The whole file as text; DataError when missing, empty or not UTF-8."""
    text = decode_utf8(path, read_bytes(path))
    if not text.strip():
        raise DataError(f"{path}: file is empty")
    return text


def read_lines(path: str | os.PathLike) -> list[str]:
    """The file's lines without their line terminators; DataError when missing, empty or not UTF-8."""
    text = read_text(path)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline ending the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_parallel(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike
) -> tuple[list[str], list[str]]:
    """Two files of translations, line i of one matching line i of the other."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        longer, n = (src_path, len(tgt) + 1) if len(src) > len(tgt) else (tgt_path, len(src) + 1)
        raise DataError(
            f"{longer}:{n}: parallel files differ in length ({src_path} has {len(src)} lines, "
            f"{tgt_path} has {len(tgt)}); this line has no partner"
        )
    return src, tgt


def read_labelled(path: str | os.PathLike) -> tuple[list[str], list[int]]:
    """Labelled texts from ``.tsv`` (``label<TAB>text``) or ``.jsonl`` (``{"text", "label"}``).

    Labels are non-negative integers (class ids). ``.gz`` versions of both are accepted.
    """
    name = Path(path).name.removesuffix(".gz")
    if name.endswith(".tsv"):
        parse = _parse_tsv_row
    elif name.endswith((".jsonl", ".json")):
        parse = _parse_jsonl_row
    else:
        raise DataError(f"{path}: unknown format; use .tsv (label<TAB>text) or .jsonl")
    texts: list[str] = []
    labels: list[int] = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip() and parse is _parse_jsonl_row:
            raise DataError(f"{path}:{number}: blank line, expected a JSON object")
        text, label = parse(line, f"{path}:{number}")
        texts.append(text)
        labels.append(label)
    return texts, labels


def _parse_label(raw: object, where: str) -> int:
    if isinstance(raw, str) and raw.strip().isdigit():
        return int(raw.strip())
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
        return raw
    raise DataError(f"{where}: label {raw!r} is not a class id (a non-negative integer)")


def _parse_tsv_row(line: str, where: str) -> tuple[str, int]:
    label, sep, text = line.partition("\t")
    if not sep:
        raise DataError(f"{where}: expected label<TAB>text, found no TAB")
    return text, _parse_label(label, where)


def _parse_jsonl_row(line: str, where: str) -> tuple[str, int]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: invalid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(row, dict) or "text" not in row or "label" not in row:
        raise DataError(f'{where}: expected an object with keys "text" and "label"')
    if not isinstance(row["text"], str):
        raise DataError(f'{where}: "text" must be a string')
    return row["text"], _parse_label(row["label"], where)
