"""Cleaning of scraped review text: HTML line breaks and stray control characters (IMDB).

The aclImdb reviews keep the site's ``<br />`` tags (14,665 of the 25,000 training reviews have
one) and about 2,500 C1 control characters (U+0080–U+009F), which are Windows-1252 bytes decoded
as Latin-1: U+0096 was an en dash, U+0085 an ellipsis, U+0091/U+0092 quotes. :func:`clean_text`
turns the tags into spaces, maps those characters back to what the author typed, drops the few
other control, format and private-use characters, and collapses runs of spaces.
"""

from __future__ import annotations

import re

__all__ = ["clean_text"]

_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
# C0 controls except tab/newline, DEL and C1, soft hyphen, zero-width/format marks, private use.
_STRAY = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2060\ufeff\ue000-\uf8ff]")
_SPACES = re.compile(r"[ \t]{2,}")


def _replace(match: re.Match) -> str:
    ch = match.group()
    code = ord(ch)
    if 0x80 <= code <= 0x9F:
        try:
            return bytes([code]).decode("cp1252")  # the character the author typed
        except UnicodeDecodeError:  # 0x81, 0x8D, 0x8F, 0x90, 0x9D have no cp1252 meaning
            return " "
    if ch in "\u00ad\u200b\u200c\u200d\u200e\u200f\u2060\ufeff":
        return ""  # invisible: removing keeps the word whole
    return " "


def clean_text(text: str) -> str:
    """``text`` without ``<br />`` tags and stray control characters, spaces collapsed, stripped."""
    text = _BREAK.sub(" ", text)
    text = _STRAY.sub(_replace, text)
    return _SPACES.sub(" ", text).strip()
