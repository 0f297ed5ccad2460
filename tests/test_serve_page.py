"""The page of `aiayn serve` in a real browser: headless Chromium (Debian's, /usr/bin/chromium)
driven by playwright, against a server on a free 127.0.0.1 port.

Skipped, with the reason, when /usr/bin/chromium or the playwright package is missing
(`.ci/run` installs Chromium). Also a script, for the README screenshot of a real model:

    python tests/test_serve_page.py runs/demo/m1/avg5 docs/figures/serve_page.png
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SENTENCE = "a dog runs in the park"


@contextmanager
def serving(model_dirs: list[Path]):
    """uvicorn in a thread on a free port; yields the base URL."""
    import uvicorn
    from serve_helpers import free_port

    from aiayn.folder import load_model_folder as load_folder
    from aiayn.serve import Limits, create_app

    app = create_app(load_folder(model_dirs), Limits())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def ready_page(p, url: str, before=None):
    """A Chromium page at ``url`` once its run button is enabled, and the list its script errors
    go to; ``before(page)`` runs first (e.g. to route requests). The browser closes after."""
    browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        if before is not None:
            before(page)
        page.goto(url)
        page.wait_for_selector("#run:not([disabled])", timeout=20_000)
        yield page, errors
    finally:
        browser.close()


def drive_page(url: str, sentence: str, screenshot: Path) -> dict:
    """Load the page, translate ``sentence`` by typing and clicking, open the attention view of
    the cross-attention of the last layer; returns what the page showed (and saves a PNG)."""
    import httpx
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, ready_page(p, url) as (page, errors):
        page.fill("#input", sentence)
        page.click("#run")
        page.wait_for_selector("#heatmap tbody tr", timeout=60_000)
        shown = page.text_content("#output")
        nbest = page.locator("#nbest li").count()
        assert page.is_visible("#nbest li")
        page.select_option("#att-kind", "cross")
        layers = page.locator("#att-layer option").count()
        page.select_option("#att-layer", str(layers))
        rows = page.locator("#heatmap tbody tr").count()
        cols = page.locator("#heatmap tbody tr").first.locator("td").count()
        page.hover("#heatmap tbody tr:nth-child(2) td:nth-child(2)")
        hover = page.text_content("#att-value")
        card = page.text_content("#card-facts")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
        page.click("#nbest li:nth-child(2) button")  # the attention of hypothesis 2
        page.wait_for_function("document.getElementById('att-for').textContent.includes('2')")
        second_for = page.text_content("#att-for")
    api = httpx.post(
        url + "v1/translate", json={"texts": [sentence], "nbest": 3}, timeout=60
    ).json()
    att = httpx.post(url + "v1/attention", json={"text": sentence}, timeout=60).json()
    return {
        "shown": shown,
        "nbest": nbest,
        "second_for": second_for,
        "rows": rows,
        "cols": cols,
        "hover": hover,
        "card": card,
        "errors": errors,
        "api": api,
        "attention": att,
    }


def test_page_translates_and_shows_attention(tmp_path, one_thread):
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing (apt-get install chromium): the page was not tested "
            "in a browser"
        )
    pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is missing: the page was not tested"
    )
    pytest.importorskip("uvicorn", reason="the 'serve' extra (uvicorn) is not installed")
    from serve_helpers import make_trained_folder

    folder = make_trained_folder(tmp_path / "model")
    screenshot = tmp_path / "page.png"
    with serving([folder]) as url:
        seen = drive_page(url, SENTENCE, screenshot)
    assert seen["errors"] == []
    assert seen["shown"] == seen["api"]["translations"][0]["text"]  # what the API answers
    assert seen["shown"] == "ein hund rennt im park"  # the pair it learned
    assert seen["nbest"] == 3  # the page asks for 3 of the folder's beam of 4
    att = seen["attention"]
    assert (seen["rows"], seen["cols"]) == (len(att["tgt_tokens"]), len(att["src_tokens"]))
    assert seen["rows"] > 1 and seen["cols"] > 1
    assert "→" in seen["hover"] and ":" in seen["hover"]  # the weight under the pointer
    assert "parameters" in seen["card"]
    assert screenshot.stat().st_size > 10_000
    second = seen["api"]["translations"][0]["nbest"][1]["text"]
    assert seen["second_for"] == f"of hypothesis 2: “{second}”"


if __name__ == "__main__":  # the README screenshot: a real model folder, a PNG path
    if len(sys.argv) < 3:
        sys.exit("usage: python tests/test_serve_page.py MODEL_DIR [MODEL_DIR ...] OUT.png")
    *dirs, out = sys.argv[1:]
    with serving([Path(d) for d in dirs]) as url:
        result = drive_page(
            url, "A man in a blue shirt is riding a bike down the street.", Path(out)
        )
    print(f"{out}: {result['shown']!r}, heat-map {result['rows']} x {result['cols']}")


def test_page_classifies_and_streams_generation(tmp_path, one_thread):
    """The same page for the other model kinds: its button says what it does, and it shows the
    classifier's label with the API's probabilities, and the generated text as it streams."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing (apt-get install chromium): the page was not tested "
            "in a browser"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is missing: the page was not tested"
    )
    import httpx
    from serve_helpers import make_folder

    seen = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for kind in ("classifier", "lm"):
                with serving([make_folder(tmp_path / kind, kind=kind)]) as url:
                    page = browser.new_page()
                    page.goto(url)
                    page.wait_for_selector("#run:not([disabled])", timeout=20_000)
                    button = page.text_content("#run")
                    page.fill("#input", "the cat")
                    if kind == "lm":
                        page.fill("#max-new-tokens", "12")
                    page.click("#run")
                    page.wait_for_function(
                        "document.getElementById('timing').textContent !== ''", timeout=60_000
                    )
                    seen[kind] = (
                        button,
                        page.text_content("#output"),
                        page.locator("#nbest li").count(),
                        page.text_content("#timing"),
                    )
                    if kind == "classifier":
                        seen["api"] = httpx.post(
                            url + "v1/classify", json={"texts": ["the cat"]}
                        ).json()
                    page.close()
        finally:
            browser.close()
    button, label, rows, _ = seen["classifier"]
    assert button == "Classify" and rows == 3  # tiny_cfg's 3 classes, one row each
    assert label == seen["api"]["results"][0]["label"]
    button, text, _, timing = seen["lm"]
    assert button == "Generate" and text.startswith("the cat") and len(text) > len("the cat")
    assert timing.startswith(f"{len(text) - len('the cat')} characters in ")  # as streamed


def test_page_shows_whole_characters_offers_the_controls_and_api_docs_offline(tmp_path, one_thread):
    """Chinese characters and an emoji, cut into byte-level pieces, head the attention axes as
    whole characters; the decoding controls reach the API (prefix, repetition, alignments); the
    API page (Swagger UI) renders with every request to another host refused."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium): the page was not tested")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is missing: the page was not tested"
    )
    import httpx
    from serve_helpers import make_trained_folder

    sentence, prefix = "a cat 北京 🙂 sits", "eine katze"
    folder = make_trained_folder(tmp_path / "model")
    outside: list[str] = []

    def keep_inside(page):
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(url)
                   else (outside.append(route.request.url), route.abort()))

    with serving([folder]) as url, sync_api.sync_playwright() as p:
        with ready_page(p, url, keep_inside) as (page, errors):
            page.fill("#input", sentence)
            page.fill("#no-repeat", "3")
            page.fill("#rep-penalty", "1.2")
            page.fill("#prefix", prefix)
            page.check("#alignments")
            page.click("#run")
            page.wait_for_selector("#heatmap tbody tr", timeout=60_000)
            shown = page.text_content("#output")
            alignment = page.text_content("#alignment")
            page.select_option("#att-kind", "encoder")
            heads = page.eval_on_selector_all(
                "#heatmap thead th", "ths => ths.map(th => [th.textContent, th.colSpan])")
            cols = page.locator("#heatmap tbody tr").first.locator("td").count()
            page.goto(url + "docs")
            page.wait_for_selector(".opblock-summary-path", timeout=30_000)
            swagger = page.locator(".opblock-summary-path").all_text_contents()
        body = {"texts": [sentence], "beam": 4, "alpha": 0.6, "nbest": 3, "prefixes": [prefix],
                "no_repeat_ngram_size": 3, "repetition_penalty": 1.2, "alignments": True}
        api = httpx.post(url + "v1/translate", json=body, timeout=60).json()
    assert errors == [] and outside == []
    best = api["translations"][0]["nbest"][0]
    assert shown == best["text"] and shown.startswith(prefix)
    pairs = [f"{best['src_tokens'][i]}→{best['tokens'][j]}" for i, j in best["alignment"]]
    assert alignment == "alignment: " + " · ".join(pairs)
    labels = dict(heads[1:])  # the corner cell first
    assert labels["北"] == 3 and labels["京"] == 3 and labels["🙂"] == 4  # bytes each
    assert not any("\ufffd" in text for text, _ in heads)
    assert sum(span for _, span in heads[1:]) == cols  # every piece under its character
    assert "/v1/translate" in swagger


def test_page_classifies_an_uploaded_image_and_draws_its_attention(tmp_path, one_thread):
    """An image classifier: the page takes an uploaded PNG instead of a text, shows the top-k
    classes the API answers, and draws the attention over the picture, the rollout first, then
    the map of the layer and head chosen (issue #67)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium): the page was not tested")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is missing: the page was not tested"
    )
    import base64

    import httpx
    import numpy as np
    from PIL import Image
    from serve_helpers import make_image_folder

    png, big = tmp_path / "shirt.png", tmp_path / "big.png"
    noise = np.random.default_rng(0).integers(0, 256, (300, 300), dtype=np.uint8)
    Image.fromarray(noise[:56, :56]).save(png)
    Image.fromarray(noise).save(big)
    assert big.stat().st_size > 65536  # more than the body limit, as base64 all the more
    # the canvas's pixels: their mean over the colour channels (0: nothing drawn)
    painted = """c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let sum = 0; for (let i = 0; i < d.length; i += 4) sum += d[i] + d[i + 1] + d[i + 2];
        return sum / (3 * d.length / 4); }"""
    with serving([make_image_folder(tmp_path / "vit")]) as url, sync_api.sync_playwright() as p:
        with ready_page(p, url) as (page, errors):
            text_box = page.is_visible("#input")
            button = page.text_content("#run")
            page.click("#run")  # no file yet
            no_file = page.text_content("#status")
            page.set_input_files("#image-file", str(png))
            page.fill("#image-top-k", "2")
            page.click("#run")
            page.wait_for_selector("#img-canvas[data-map]", timeout=60_000)
            shown = page.text_content("#output")
            top = page.locator("#nbest li").all_text_contents()
            timing = page.text_content("#timing")
            first = (page.get_attribute("#img-canvas", "data-map"),
                     page.get_attribute("#img-canvas", "data-cells"))
            options = page.locator("#img-map option").count()
            rollout_mean = page.eval_on_selector("#img-canvas", painted)
            page.select_option("#img-map", "1.1")  # layer 2, head 2
            second = page.get_attribute("#img-canvas", "data-map")
            head_mean = page.eval_on_selector("#img-canvas", painted)
            card = page.text_content("#card-facts")
            page.screenshot(path=str(tmp_path / "image_page.png"), full_page=True)
            # a picture whose base64 is over serve.max_body_bytes (64 KiB): scaled down first
            page.set_input_files("#image-file", str(big))
            page.click("#run")
            page.wait_for_function("document.getElementById('img-for').textContent"
                                   ".includes('big.png')", timeout=60_000)
            big_timing = page.text_content("#timing")
            big_status = page.text_content("#status")
        api = httpx.post(url + "v1/classify", timeout=60, json={
            "images": [base64.b64encode(png.read_bytes()).decode()], "top_k": 2}).json()
    assert errors == []
    assert not text_box and button == "Classify" and no_file == "choose an image first"
    best = api["results"][0]["top"]
    assert shown == best[0]["label"]
    assert [t.split()[-1] for t in top] == [b["label"] for b in best]  # names are one word
    assert [t.split()[0] for t in top] == [f"{b['prob']:.3f}" for b in best]
    assert timing.startswith("resized from 56x56 to 28x28 · ")
    assert first == ("rollout", "16") and second == "1.1"  # 4x4 patches of 7
    assert options == 1 + 2 * 2  # the rollout, then 2 layers x 2 heads
    assert rollout_mean > 0 and head_mean > 0 and rollout_mean != head_mean
    assert "patches of 7×7 (4×4)" in card and "vocabulary" not in card
    assert big_status == ""  # no error
    assert big_timing.startswith("scaled down in the browser from 300x300 to 112x112, then "
                                 "converted from RGB to grey, resized from 112x112 to 28x28 · ")
