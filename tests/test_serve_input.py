"""What the HTTP API accepts is checked at the door (issue #55): every string is valid Unicode
and every number finite and in range, on every route, by one set of rules
(aiayn/serve/schemas.py). A lone surrogate (``"\\ud800"``, sent as the raw JSON escape) and
NaN / Infinity / -Infinity (which Python's JSON parser reads) get a one-line 422 naming the
field, never a 500 or a traceback in the log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the 'serve' extra (fastapi) is not installed")
pytest.importorskip("httpx", reason="httpx (FastAPI's TestClient) is not installed")

from fastapi.testclient import TestClient  # noqa: E402
from serve_helpers import make_folder  # noqa: E402
from trainutil import thread_fixture  # noqa: E402

from aiayn.folder import load_model_folder  # noqa: E402
from aiayn.serve import Limits, create_app  # noqa: E402

one_thread_module = thread_fixture(autouse=True, scope="module", name="one_thread_module")

LONE = "\\ud800"  # as it stands in the JSON text: a high surrogate with no low one after it


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """A client per kind: seq2seq (translate, attention), classifier, lm (generate)."""
    root: Path = tmp_path_factory.mktemp("serve-input")
    apps = {k: create_app(load_model_folder([make_folder(root / k, kind=k)]), Limits())
            for k in ("seq2seq", "classifier", "lm")}  # fmt: skip
    with TestClient(apps["seq2seq"]) as s, TestClient(apps["classifier"]) as c:
        with TestClient(apps["lm"]) as g:
            yield {"seq2seq": s, "classifier": c, "lm": g}


def post_raw(client, route: str, raw: str):
    """POST ``raw`` as the JSON body, byte for byte (escapes and NaN as written)."""
    return client.post(route, content=raw.encode(), headers={"content-type": "application/json"})


def assert_one_line_422(r, field: str) -> None:
    assert r.status_code == 422, (r.status_code, r.text)
    error = r.json()["error"]
    assert list(r.json()) == ["error"] and "\n" not in error
    assert field in error, error


# Every route that takes text, the field holding it, and a body around it (TEXT: where it goes).
TEXT_FIELDS = [
    ("seq2seq", "/v1/translate", "texts[0]", '{"texts": ["TEXT"]}'),
    ("seq2seq", "/v1/translate", "texts[1]", '{"texts": ["a cat", "the TEXT mat"]}'),
    ("seq2seq", "/v1/translate", "prefixes[0]", '{"texts": ["a cat"], "prefixes": ["TEXT"]}'),
    ("seq2seq", "/v1/attention", "text", '{"text": "a TEXT"}'),
    ("seq2seq", "/v1/attention", "prefix", '{"text": "a cat", "prefix": "TEXT"}'),
    ("classifier", "/v1/classify", "texts[0]", '{"texts": ["TEXT dog"]}'),
    ("classifier", "/v1/classify", "images[0]", '{"images": ["iVBORw0KGgo=TEXT"]}'),
    ("lm", "/v1/generate", "prompt", '{"prompt": "the TEXT"}'),
]


@pytest.mark.parametrize("kind, route, field, body", TEXT_FIELDS)
def test_a_lone_surrogate_is_a_422_on_every_route_that_takes_text(
    clients, caplog, kind, route, field, body
):
    """It was a 500 and a traceback in the server's log (the tokenizer cannot encode it)."""
    with caplog.at_level(logging.WARNING):
        r = post_raw(clients[kind], route, body.replace("TEXT", LONE))
    assert_one_line_422(r, field)
    assert "surrogate" in r.json()["error"]
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_a_lone_surrogate_in_a_field_name_is_a_422(clients):
    r = post_raw(clients["seq2seq"], "/v1/translate", '{"te\\ud800xts": ["a cat"]}')
    assert_one_line_422(r, "a field name: a lone surrogate is not valid Unicode")


def test_every_string_field_of_the_api_is_tested():
    """A new string field in a request body gets its lone-surrogate case above."""
    from aiayn.serve import schemas

    routes = {
        "/v1/translate": schemas.TranslateBody,
        "/v1/attention": schemas.AttentionBody,
        "/v1/classify": schemas.ClassifyBody,
        "/v1/generate": schemas.GenerateBody,
    }
    text = {
        (route, name)
        for route, body in routes.items()
        for name, f in body.model_fields.items()
        if "str" in str(f.annotation)
    }  # fmt: skip
    assert text == {(route, field.split("[")[0]) for _, route, field, _ in TEXT_FIELDS}


def test_a_surrogate_pair_is_one_character_and_accepted(clients):
    """A pair of surrogate escapes is valid JSON for one character outside the BMP (😀)."""
    r = post_raw(clients["seq2seq"], "/v1/translate", '{"texts": ["a \\ud83d\\ude00 cat"]}')
    assert r.status_code == 200, r.text


# Every numeric field of the API, with a body that is valid without it.
NUMBERS = [
    ("seq2seq", "/v1/translate", {"texts": ["a cat"]}, f)
    for f in ("beam", "alpha", "nbest", "repetition_penalty", "no_repeat_ngram_size")
] + [
    ("seq2seq", "/v1/attention", {"text": "a cat"}, f)
    for f in ("beam", "alpha", "rank", "repetition_penalty", "no_repeat_ngram_size")
] + [
    ("classifier", "/v1/classify", {"texts": ["the cat"]}, "top_k"),
] + [
    ("lm", "/v1/generate", {"prompt": "the cat"}, f)
    for f in ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "repetition_penalty",
              "no_repeat_ngram_size")
]  # fmt: skip


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("kind, route, body, field", NUMBERS)
def test_nan_and_infinity_are_a_422_naming_the_field(clients, kind, route, body, field, value):
    """Refused by the schema's rule, at the door: "finite number" (float fields), "valid
    integer" (int fields), never let through to a later check or to the model."""
    raw = json.dumps(body)[:-1] + f', "{field}": {value}}}'
    r = post_raw(clients[kind], route, raw)
    assert_one_line_422(r, field)
    floats = ("alpha", "repetition_penalty", "temperature", "top_p")
    why = (
        "Input should be a finite number" if field in floats else "Input should be a valid integer"
    )
    assert r.json()["error"] == f"{field}: {why}"


def test_every_numeric_field_of_the_api_is_tested():
    """A new numeric field in a request body gets its NaN / Infinity case above."""
    from aiayn.serve import schemas

    numeric = {
        (body.__name__, name)
        for body in (schemas.TranslateBody, schemas.AttentionBody, schemas.GenerateBody,
                     schemas.ClassifyBody)
        for name, f in body.model_fields.items()
        if any(t in str(f.annotation) for t in ("int", "float"))
    }  # fmt: skip
    routes = {"/v1/translate": "TranslateBody", "/v1/attention": "AttentionBody",
              "/v1/generate": "GenerateBody", "/v1/classify": "ClassifyBody"}  # fmt: skip
    assert numeric == {(routes[route], field) for _, route, _, field in NUMBERS}


@pytest.mark.parametrize(
    "kind, route, body, field",
    [
        ("seq2seq", "/v1/translate", {"texts": ["a cat"], "alpha": 1e308 * 10}, "alpha"),
        ("seq2seq", "/v1/translate", {"texts": ["a cat"], "beam": 10**30}, "beam"),
        ("seq2seq", "/v1/attention", {"text": "a cat", "rank": 10**30}, "rank"),
        ("seq2seq", "/v1/translate", {"texts": ["a cat"], "alpha": -0.5}, "alpha"),
        # They were a 200 whose stream ended in an error event: float32 turned every token's
        # probability into NaN.
        ("lm", "/v1/generate", {"prompt": "the cat", "temperature": 1e-320}, "temperature"),
        ("lm", "/v1/generate", {"prompt": "the cat", "top_p": 1e-320}, "top_p"),
    ],
)
def test_huge_tiny_and_negative_numbers_are_a_422_naming_the_field(
    clients, kind, route, body, field
):
    """1e309 parses as inf; an integer past every limit is refused, not overflowed."""
    raw = json.dumps(body).replace("Infinity", "1e309")
    assert_one_line_422(post_raw(clients[kind], route, raw), field)


def test_the_smallest_temperature_and_top_p_allowed_still_sample(clients):
    body = {"prompt": "the cat", "temperature": 1e-6, "top_p": 1e-6, "max_new_tokens": 2}
    with clients["lm"].stream("POST", "/v1/generate", json=body) as r:
        events = [line for line in r.iter_lines() if line.startswith("event:")]
    assert r.status_code == 200 and events[-1] == "event: done", events


def test_a_library_error_is_a_one_line_422(clients, monkeypatch):
    """An aiayn error raised while a request is served (a ConfigError or DataError from the
    library: a prefix the tokenizer cannot represent, a bad setting) is a 422 with its line."""
    from aiayn.errors import DataError

    service = clients["seq2seq"].app.state.service

    def refuse(*args, **kwargs):
        raise DataError("prefixes[0]: the tokenizer cannot represent 'ß'")

    monkeypatch.setattr(service.folder, "translate_hypotheses", refuse)
    r = clients["seq2seq"].post("/v1/translate", json={"texts": ["a cat"], "prefixes": ["ß"]})
    assert r.status_code == 422 and r.json() == {
        "error": "prefixes[0]: the tokenizer cannot represent 'ß'"
    }


def test_a_library_error_before_queueing_is_a_one_line_422(clients, monkeypatch):
    """The same when the library refuses the request while it is checked, before it is queued
    (the tokenizer refusing a prefix it cannot encode exactly)."""
    from aiayn.errors import ConfigError

    tokenizer = clients["seq2seq"].app.state.service.folder.tokenizer
    encode = tokenizer.encode

    def strict(text, *args, **kwargs):
        if "ß" in text:
            raise ConfigError("the prefix has 'ß', which the tokenizer cannot represent")
        return encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", strict)
    r = clients["seq2seq"].post("/v1/translate", json={"texts": ["a cat"], "prefixes": ["ß"]})
    assert r.status_code == 422 and r.json() == {
        "error": "the prefix has 'ß', which the tokenizer cannot represent"
    }


def test_a_blank_text_is_answered_blank_in_its_place(clients):
    """A blank line (empty or whitespace) stays blank, as `aiayn translate` and `aiayn classify`
    keep it (it was a 422 'texts[1] is empty'); the other texts are answered as alone, prefixes
    staying with their texts; a request of blanks alone is answered at once."""
    s, c = clients["seq2seq"], clients["classifier"]
    alone = s.post("/v1/translate", json={"texts": ["a cat", "the mat"], "beam": 2}).json()
    r = s.post("/v1/translate", json={"texts": ["a cat", "", "  ", "the mat"], "beam": 2})
    assert r.status_code == 200, r.text
    got = r.json()["translations"]
    assert [t["text"] for t in got] == [alone["translations"][0]["text"], "", "",
                                       alone["translations"][1]["text"]]
    assert got[1] == {"text": "", "nbest": []} and got[0]["nbest"]
    first = s.post("/v1/translate", json={"texts": ["the mat"], "prefixes": ["x"]}).json()
    r = s.post("/v1/translate", json={"texts": ["", "the mat"], "prefixes": [None, "x"]})
    assert r.status_code == 200 and r.json()["translations"][1] == first["translations"][0]
    r = s.post("/v1/translate", json={"texts": ["", " "]})
    assert r.status_code == 200 and r.json()["translations"] == [{"text": "", "nbest": []}] * 2
    labelled = c.post("/v1/classify", json={"texts": ["a dog"]}).json()["results"][0]
    r = c.post("/v1/classify", json={"texts": ["", "a dog"]})
    assert r.status_code == 200 and r.json()["results"] == [{"label": "", "probs": {}}, labelled]


@pytest.mark.parametrize("field, value", [("temperature", 1e-300), ("top_p", 0.0), ("top_k", -1),
                                          ("max_new_tokens", 0)])  # fmt: skip
def test_sampling_values_are_refused_in_the_words_of_the_cli(clients, field, value):
    """One rule (SamplingConfig) for `aiayn generate`, Python and the server: the 422 is its
    line, which the command line gives with the flag's name (tests/test_sampling.py)."""
    from aiayn.decode import SamplingConfig
    from aiayn.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        SamplingConfig(**{field: value})
    r = clients["lm"].post("/v1/generate", json={"prompt": "the cat", field: value})
    assert_one_line_422(r, field)
    assert r.json()["error"] == str(err.value)
