"""One merge of decoding settings (aiayn.decode.config.merge_decode), called by the command line,
`aiayn.load(...)` and the server: the folder's defaults, then its recipe's [decode], then the
flags, then the request; an unknown Python keyword names the setting meant; a warning that
recommends a setting names one that exists."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest
from serve_helpers import make_folder

from aiayn.cli import build_parser
from aiayn.commands.options import decode_overrides
from aiayn.decode.config import DecodeConfig, merge_decode
from aiayn.errors import ConfigError
from aiayn.folder import load_model_folder
from aiayn.run_config import build_run_config
from aiayn.serve.limits import Limits

# A recipe's [decode], as train writes it into the folder's config.json (over the defaults).
RECIPE = {"decode.beam": 3, "decode.alpha": 0.9, "decode.min_len": 1, "decode.max_len_b": 40}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A model folder whose config.json carries RECIPE's decoding settings."""
    loaded = load_model_folder(make_folder(tmp_path_factory.mktemp("settings") / "m"))
    loaded.config = replace(loaded.config, decode=build_run_config(RECIPE).decode)
    return loaded


def flags(*argv: str) -> dict:
    return decode_overrides(build_parser().parse_args(["translate", "m", *argv]))


def test_the_merge_order_is_folder_then_recipe_then_flags_then_request(folder):
    given = flags("--alpha", "1.2", "--set", "decode.min_len=2", "--set", "decode.max_len_b=30")
    request = {"max_len_b": 20, "beam": None}  # None: not given
    merged = merge_decode(folder.decode, given, request)
    assert merged.length_penalty == DecodeConfig().length_penalty == "gnmt"  # the defaults
    assert merged.beam == 3  # the recipe's, over the default 4
    assert (merged.alpha, merged.min_len) == (1.2, 2)  # the flags', over the recipe's
    assert merged.max_len_b == 20  # the request's, over the flags' and the recipe's
    # the command line and `aiayn.load(...)` call it: the flags over the folder's settings
    assert folder.decode_config(**given) == merge_decode(folder.decode, given)
    assert folder.decode_config(**given).max_len_b == 30


def test_the_server_merges_the_same_way_under_its_own_settings(folder):
    from aiayn.serve.service import ModelService

    service = ModelService(folder, Limits(), worker_thread=False)
    try:
        got = service.checks.decode_config(None, 1.5, None, no_repeat_ngram_size=2)
    finally:
        service.close()
    assert (got.beam, got.min_len, got.max_len_b) == (3, 1, 40)  # the folder's (its recipe's)
    assert (got.alpha, got.no_repeat_ngram_size) == (1.5, 2)  # the request's
    assert (got.nbest, got.workers) == (1, 1)  # the server's own: one best, the batcher's thread


def test_a_typo_in_a_python_decoding_keyword_names_the_setting_meant(folder):
    """`aiayn.load(p).translate(x, beem=4)` (issue 66, finding 9): one line with a did-you-mean."""
    with pytest.raises(
        ConfigError,
        match=r"^unknown decoding setting 'beem' \(did you mean "
        r"'beam'\?\)$",
    ):
        folder.translate(["a cat"], beem=4)
    with pytest.raises(
        ConfigError,
        match=r"'no_repeat_ngram' \(did you mean "
        r"'no_repeat_ngram_size'\?\)",
    ):
        folder.translate(["a cat"], no_repeat_ngram=3)
    with pytest.raises(ConfigError, match=r"^unknown decoding setting 'colour'$"):
        merge_decode(DecodeConfig(), {"colour": 1})
    assert folder.translate(["a cat"], beam=1) == folder.translate(["a cat"], beam=1, alpha=None)


def test_the_ctranslate2_warning_recommends_a_setting_that_exists(caplog):
    """It recommended `--length-penalty average`, a flag no longer read (issue 66, finding 8)."""
    from aiayn.runtime.ct2_backend import _warn_unmapped

    with caplog.at_level(logging.WARNING):
        _warn_unmapped(DecodeConfig(length_penalty="gnmt"))
    (said,) = [r.getMessage() for r in caplog.records]
    assert "--length-penalty" not in said
    cli = re.search(r"--set (\S+)", said)
    python = re.search(r"translate\((\w+)='(\w+)'\)", said)
    assert cli and python, said
    assert flags("--set", cli[1].rstrip(",")) == {"length_penalty": "average"}
    assert merge_decode(DecodeConfig(), {python[1]: python[2]}).length_penalty == "average"


def test_a_setting_has_one_name_as_flag_key_http_field_and_keyword():
    """`beam` is --beam, decode.beam, "beam" and translate(beam=): each decoding flag of translate
    and evaluate is its DecodeConfig field spelt as a flag, and each decoding field of the HTTP
    bodies is a DecodeConfig field (the Python keywords are those fields, merge_decode)."""
    pytest.importorskip("pydantic")
    from dataclasses import fields

    from aiayn.cli import sub_parsers
    from aiayn.serve.schemas import AttentionBody, TranslateBody

    names = {f.name for f in fields(DecodeConfig)}
    flagged = {}
    for command, parser in sub_parsers(build_parser()):
        if command in ("translate", "evaluate"):
            for action in parser._actions:
                if action.dest in names:
                    flagged[action.dest] = action.option_strings
    assert {"beam", "alpha", "batch_tokens", "workers", "bf16", "compile"} <= set(flagged)
    for name, spellings in flagged.items():
        assert "--" + name.replace("_", "-") in spellings, (name, spellings)
    not_settings = {"texts", "text", "prefixes", "prefix", "rank"}
    for body in (TranslateBody, AttentionBody):
        assert set(body.model_fields) - not_settings <= names, body
