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
from collections.abc import Iterator
from pathlib import Path
from typing import IO, cast

from aiayn.errors import DataError

__all__ = [
    "existing_file",
    "read_bytes",
    "decode_utf8",
    "read_text",
    "read_lines",
    "read_parallel",
    "read_labelled",
    "iter_lines",
    "iter_parallel",
    "iter_labelled",
    "iter_text",
]

# Bytes read at a time by iter_text: a running text is streamed in blocks of about this size.
TEXT_BLOCK = 1 << 20


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes (``.gz`` decompressed); DataError when missing, a folder or unreadable."""
    path = existing_file(path)
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
    return "".join(iter_text(path))


def iter_text(path: str | os.PathLike, block: int | None = None) -> Iterator[str]:
    """:func:`read_text` in consecutive parts, the text of ``block`` bytes each (default
    :data:`TEXT_BLOCK`; ``.gz`` decompressed), read as it goes: the file is never held in memory
    whole. The same errors (missing, unreadable, not UTF-8 with line and column, empty), raised
    when met; a leading byte-order mark is dropped."""
    path = Path(path)
    decoder, seen_text = _Utf8Decoder(path), False
    with _open_binary(path) as f:
        try:
            while raw := f.read(block or TEXT_BLOCK):
                text = decoder.decode(raw)
                seen_text = seen_text or (bool(text) and not text.isspace())
                if text:
                    yield text
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"{path}: cannot read ({err})") from None
    text = decoder.decode(b"", final=True)
    if text:
        seen_text = seen_text or not text.isspace()
        yield text
    if not seen_text:
        raise DataError(f"{path}: file is empty")


class _Utf8Decoder:
    """Strict UTF-8 of a byte stream given in blocks: a character cut by a block's end waits for
    the next; an invalid byte is a DataError naming its line and column in the whole file."""

    def __init__(self, path: Path) -> None:
        self.path, self.carry = path, b""
        self.line, self.column = 1, 0  # where the next byte is: its line, bytes before it there
        self.first = True

    def decode(self, raw: bytes, final: bool = False) -> str:
        data = self.carry + raw
        cut = len(data) if final else _complete(data)
        try:
            text = data[:cut].decode("utf-8")
        except UnicodeDecodeError as err:
            line = self.line + data.count(b"\n", 0, err.start)
            newline = data.rfind(b"\n", 0, err.start)
            column = err.start - newline if newline >= 0 else self.column + err.start + 1
            raise DataError(
                f"{self.path}:{line}: not valid UTF-8 "
                f"(byte 0x{data[err.start]:02x} at column {column})"
            ) from None
        self.carry = data[cut:]
        newline = data.rfind(b"\n", 0, cut)
        self.line += data.count(b"\n", 0, cut)
        self.column = cut - newline - 1 if newline >= 0 else self.column + cut
        if self.first and text:
            self.first = False
            text = text.removeprefix("\ufeff")  # a byte-order mark is not part of the first line
        return text


def _complete(data: bytes) -> int:
    """How many bytes of ``data`` end with a complete UTF-8 character (a lead byte among the last
    three whose sequence runs past the end is held back)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead (or ASCII) byte
            need = 1 if byte < 0xC0 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) - back if need > back else len(data)
    return len(data)


def read_lines(path: str | os.PathLike) -> list[str]:
    """The file's lines without their line terminators; DataError when missing, empty or not UTF-8."""
    return list(iter_lines(path))


def existing_file(path: str | os.PathLike) -> Path:
    """``path``; DataError when it is missing or a folder."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.is_dir():
        raise DataError(f"{path}: is a folder, expected a file")
    return path


def _open_binary(path: Path) -> IO[bytes]:
    existing_file(path)
    try:
        if path.name.endswith(".gz"):
            return cast(IO[bytes], gzip.open(path, "rb"))
        return open(path, "rb")  # noqa: SIM115
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err})") from None


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """:func:`read_lines` one line at a time: the file is never held in memory whole. The same
    errors (missing, unreadable, not UTF-8 with line and column, empty), raised when met."""
    path = Path(path)
    number, seen_text = 0, False
    with _open_binary(path) as f:
        try:
            for raw in f:
                number += 1
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(
                        f"{path}:{number}: not valid UTF-8 "
                        f"(byte 0x{raw[err.start]:02x} at column {err.start + 1})"
                    ) from None
                if number == 1 and line.startswith("\ufeff"):
                    line = line[1:]  # a byte-order mark is not part of the first line
                line = line[:-1] if line.endswith("\n") else line
                line = line[:-1] if line.endswith("\r") else line
                seen_text = seen_text or bool(line.strip())
                yield line
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"{path}: cannot read ({err})") from None
    if not seen_text:
        raise DataError(f"{path}: file is empty")


def read_parallel(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike
) -> tuple[list[str], list[str]]:
    """Two files of translations, line i of one matching line i of the other."""
    src: list[str] = []
    tgt: list[str] = []
    for x, y in iter_parallel(src_path, tgt_path):
        src.append(x)
        tgt.append(y)
    return src, tgt


def iter_parallel(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike
) -> Iterator[tuple[str, str]]:
    """:func:`read_parallel` one pair at a time; DataError naming the first line without a
    partner when the files differ in length."""
    src, tgt = iter_lines(src_path), iter_lines(tgt_path)
    n = 0
    for x in src:
        y = next(tgt, None)
        if y is None:
            n_src = n + 1 + sum(1 for _ in src)
            raise _unpartnered(src_path, tgt_path, n_src, n)
        n += 1
        yield x, y
    n_tgt = n + sum(1 for _ in tgt)
    if n_tgt != n:
        raise _unpartnered(src_path, tgt_path, n, n_tgt)


def _unpartnered(src_path: object, tgt_path: object, n_src: int, n_tgt: int) -> DataError:
    longer, n = (src_path, n_tgt + 1) if n_src > n_tgt else (tgt_path, n_src + 1)
    return DataError(
        f"{longer}:{n}: parallel files differ in length ({src_path} has {n_src} lines, "
        f"{tgt_path} has {n_tgt}); this line has no partner"
    )


def read_labelled(path: str | os.PathLike) -> tuple[list[str], list[int]]:
    """Labelled texts from ``.tsv`` (``label<TAB>text``) or ``.jsonl`` (``{"text", "label"}``).

    Labels are non-negative integers (class ids). ``.gz`` versions of both are accepted.
    """
    texts: list[str] = []
    labels: list[int] = []
    for text, label in iter_labelled(path):
        texts.append(text)
        labels.append(label)
    return texts, labels


def iter_labelled(path: str | os.PathLike) -> Iterator[tuple[str, int]]:
    """:func:`read_labelled` one (text, label) at a time."""
    name = Path(path).name.removesuffix(".gz")
    if name.endswith(".tsv"):
        parse = _parse_tsv_row
    elif name.endswith((".jsonl", ".json")):
        parse = _parse_jsonl_row
    else:
        raise DataError(f"{path}: unknown format; use .tsv (label<TAB>text) or .jsonl")
    for number, line in enumerate(iter_lines(path), start=1):
        if not line.strip() and parse is _parse_jsonl_row:
            raise DataError(f"{path}:{number}: blank line, expected a JSON object")
        yield parse(line, f"{path}:{number}")


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
