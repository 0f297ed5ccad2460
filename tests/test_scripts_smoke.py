"""Every script of benchmarks/ and scripts/ runs, in a smoke mode of seconds: tiny sizes, each of
its code paths (the peers Hugging Face Marian and CTranslate2 included), every option that takes
several items given at least two (two presets, two precisions, two client counts…), and its
outputs written to tmp paths, never into docs/. SMOKE has one entry per script: a script added to
benchmarks/ or scripts/ without one fails test_every_script_has_a_smoke_entry.

Scripts run in this process through their ``main(argv)`` (they start their own subprocesses where
they measure one), on one thread. Those that need real data read the data mirror and skip without
it; those that need trained runs share two tiny Multi30k runs trained here (4 updates each)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import mirror_or_skip
from trainutil import base_values, torch_threads, write_toml

from aiayn.cli import main as aiayn_main

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("benchmarks", "scripts")


def load(script: str):
    """The script as a module, imported once under its own name (bench_scaling and
    same_convergence import bench_train as "bench_train", seed_pairs imports make_results)."""
    path = ROOT / script
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    if path.stem not in sys.modules:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    return sys.modules[path.stem]


def run_main(script: str, *argv: str) -> None:
    """``main(argv)`` of the script on one thread; it must succeed."""
    with torch_threads(1):
        code = load(script).main([str(a) for a in argv])
    assert code in (None, 0), f"{script} returned {code}"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module", autouse=True)
def checkout_untouched():
    """No smoke run writes into the checkout's docs/ (where the published figures live)."""
    def state():
        return {p: p.stat().st_mtime_ns for p in (ROOT / "docs").rglob("*") if p.is_file()}

    before = state()
    yield
    assert state() == before, "a smoke run wrote into docs/"


# ---- two tiny trained Multi30k runs, shared by the scripts that score or serve models ------------

RUN = {
    "data.dataset": "multi30k", "data.tokenizer": "char", "data.vocab_size": 200,
    "data.max_len": 150, "data.max_tokens": 1024, "model.max_len": 160,
    "train.max_steps": 4, "train.save_every": 2, "train.valid_every": 4, "train.log_every": 1,
    "train.keep_last": 5, "decode.max_len_a": 0.0, "decode.max_len_b": 12,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Two runs (seeds 1 and 2) of a d_model-16 model on Multi30k with a character vocabulary:
    checkpoints at updates 2 and 4, a best/ folder, a short output cap in their [decode]."""
    mirror_or_skip()
    root = tmp_path_factory.mktemp("runs")
    values = {k: v for k, v in base_values(root / "unused").items() if not k.startswith("data.")}
    out = []
    for seed in (1, 2):
        cfg = write_toml(root / f"m{seed}.toml", {**values, **RUN, "train.seed": seed})
        with torch_threads(1):
            assert aiayn_main(["train", str(cfg), "--out", str(root / f"m{seed}")]) == 0
        out.append(root / f"m{seed}")
    return out


# ---- one smoke function per script ---------------------------------------------------------------


def smoke_bench_components(tmp: Path) -> None:
    out = tmp / "components.md"
    run_main("benchmarks/bench_components.py", "--smoke", "--repeats", "1", "--out", out)
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "ms" not in line]
    assert len(rows) == 5 and "--smoke" in out.read_text()  # 2 attention, 2 loss, 1 dropout


def smoke_bench_compiled_step(tmp: Path, runs: list[Path]) -> None:
    out = tmp / "compiled.json"
    # --step eager: the step function behind the package's plumbing, uncompiled (compiling takes
    # a minute: tests/test_compiled_step.py does it once)
    run_main("benchmarks/bench_compiled_step.py", "--model", runs[0] / "best", "--step", "eager",
             "--sentences", "2", "--limit", "4", "--rounds", "2", "--beam", "2", "--out", out)
    report = read_json(out)
    assert report["differing_sentences"] == 0
    assert set(report["batch1_sentences_per_s"]) == {"module", "eager"}
    assert len(report["batched_sentences_per_s"]["eager"]) == 2
    assert report["batch1_speedup"]["median"] > 0


def smoke_bench_decode(tmp: Path) -> None:
    pytest.importorskip("transformers", reason="the Hugging Face peer needs transformers")
    out = tmp / "decoding"
    # --skip without names: every system, bf16 too; two batches, so both worker layouts.
    run_main("benchmarks/bench_decode.py", "--preset", "tiny", "--vocab", "64", "--batch", "4",
             "--batches", "2", "--src-len", "6", "--tgt-len", "4", "--beam", "2", "--rounds", "1",
             "--threads", "1", "--workers", "2", "--malloc", "default", "--skip", "--out", out)
    rates = read_json(out.with_suffix(".json"))["sentences_per_s"]
    assert {"aiayn fp32", "aiayn bf16 autocast", "HF transformers fp32", "CTranslate2 float32",
            "CTranslate2 int8"} <= set(rates)
    assert len(rates) == 9 and all(r["median"] > 0 for r in rates.values())
    assert out.with_suffix(".table.md").is_file()


def smoke_bench_engines(tmp: Path, runs: list[Path]) -> None:
    out, doc = tmp / "engines.json", tmp / "decoding.md"
    script = load("benchmarks/bench_engines.py")
    # One engine of each library: native through the script's own int8 quantization, ONNX
    # Runtime, CTranslate2 (the reference of the ratios). The other native precisions differ by a
    # DecodeConfig flag only; the compiled step's compilation takes a minute
    # (tests/test_compiled_step.py).
    names = ["native int8", "onnxruntime fp32", "ctranslate2 float32"]
    run_main("benchmarks/bench_engines.py", "--model", runs[0] / "best", "--limit", "4",
             "--beam", "2", "--threads", "1", "--workers", "2", "--repeats", "1", "--latency",
             "2", "--out", out, "--doc", doc, "--engines", *names)
    engines = read_json(out)["engines"]
    assert list(engines) == names
    assert all(e["sentences"] == 4 and e["size_mb"] >= 0 for e in engines.values())
    assert all(e["latency"]["sentences"] == 2 and e["peak_rss_mb"] >= e["rss_after_import_mb"]
               for e in engines.values())
    assert engines["ctranslate2 float32"]["ratio"] == 1.0
    assert all(f"| {name} |" in doc.read_text() for name in names)
    # --sweep: two engines (two libraries' default workers) over one setting and at their
    # defaults, its own section in the doc
    sweep = tmp / "sweep.json"
    run_main("benchmarks/bench_engines.py", "--sweep", "--model", runs[0] / "best", "--limit", "4",
             "--beam", "2", "--repeats", "1", "--grid", "1x1", "--out", sweep, "--doc", doc,
             "--engines", "native fp32", "ctranslate2 int8")
    report = read_json(sweep)
    assert list(report["engines"]) == ["native fp32", "ctranslate2 int8"]
    for r in report["engines"].values():
        assert set(r["settings"]) == {"1×1"} and r["best"] == "1×1"
        assert all(s["sentences_per_s"] > 0 and len(s["rounds"]) == 1 for s in r["settings"].values())
        assert script.parse_setting(r["default"]["setting"])  # what the default chose: W×T
        assert r["default_vs_best"] > 0
        assert (r["warning"] is None) == (r["default_vs_best"] >= 0.9)
    from aiayn.runtime.ct2_backend import computed_as

    assert report["int8_computed_as"] == computed_as("int8")  # "float32" on a CPU without VNNI
    text = doc.read_text()
    int8_row = f"| {script.engine_label(report, 'ctranslate2 int8')} |"
    assert script.SWEEP_BEGIN in text and int8_row in text.split(script.SWEEP_BEGIN)[1]
    assert "| engine | 1×1 | default | default ÷ best |" in text
    assert "| onnxruntime fp32 |" in text.split(script.BEGIN)[1].split(script.END)[0]  # it stays


def test_a_default_more_than_10_percent_slower_than_the_best_setting_warns():
    """The sweeps' (bench_engines.py --sweep, bench_serve.py) ratio and warning line, with
    made-up sentences/s of three rounds."""
    script = load("benchmarks/bench_engines.py")
    rounds = {"1×1": [100.0, 120.0, 90.0], "1×2": [150.0, 130.0, 140.0], "2×1": [200.0, 240.0, 180.0]}
    # the median of the per-round ratios 160/200, 230/240, 150/180 (not 160/200 of the medians)
    assert script.default_vs_best(rounds, [160.0, 230.0, 150.0]) == ("2×1", 0.83)
    assert script.default_warning("native fp32", "1×2", "2×1", 0.83) == (
        "WARNING: native fp32: the default (1×2) runs at 0.83× the best setting (2×1) measured")
    assert script.default_warning("ctranslate2 int8", "4×1", "2×1", 0.89).startswith("WARNING: ")
    for ratio in (0.9, 0.95, 1.0, 1.2):  # within 10% of the best, or faster: no warning
        assert script.default_warning("native fp32", "2×1", "2×1", ratio) is None
    assert script.default_vs_best(rounds, [210.0, 230.0, 190.0]) == ("2×1", 1.05)
    assert script.grid(2) == [(1, 1), (1, 2), (2, 1)]
    assert script.grid(8) == [(1, 1), (1, 8), (2, 4), (4, 2), (8, 1)]


def test_an_int8_engine_is_named_with_the_type_it_ran_in():
    """On a CPU where aiayn runs CTranslate2's int8 weights in float32 (runtime.md), both
    benchmarks' tables say so; where they ran in int8, and in reports from before, the name
    stays."""
    engines = load("benchmarks/bench_engines.py")
    assert engines.engine_label({"int8_computed_as": "float32"}, "ctranslate2 int8") == (
        "ctranslate2 int8 (in float32)")
    ran_in_int8 = {"int8_computed_as": "int8"}
    assert engines.engine_label(ran_in_int8, "ctranslate2 int8") == "ctranslate2 int8"
    assert engines.engine_label({"int8_computed_as": "float32"}, "native int8") == "native int8"
    assert engines.engine_label({}, "ctranslate2 int8") == "ctranslate2 int8"
    serve = load("benchmarks/bench_serve.py")
    run = {"engine": "ctranslate2", "quantization": "int8", "date": "2026-11-29 17:31 UTC",
           "cpu": "AMD EPYC", "cores": 2, "commit": "bbba1b3",
           "results": {"aiayn translate, one process": {"sentences_per_s_without_loading": 217.5},
                       "serve, 8 clients": {"sentences_per_s": 142.8, "vs_translate": 0.66,
                                            "errors": 0}},
           "targets": {"vs_translate": {"1": 0.18, "8": 0.66}, "p50_vs_lone_request": {"8": 2.3}}}
    assert "| ctranslate2 int8 | 217.5 | 142.8 (0.66×) | 2.30 | 0 |" in serve.engine_table([run])
    run["computed_as"] = "float32"
    assert "| ctranslate2 int8 (in float32) | 217.5 |" in serve.engine_table([run])


def smoke_bench_load(tmp: Path) -> None:
    data = Path(mirror_or_skip()) / "multi30k"
    out, doc = tmp / "load.json", tmp / "reliability.md"
    run_main("benchmarks/bench_load.py", "--smoke", "--data", data, "--steps", "2", "--limit",
             "3", "--busy", "1", "--settings", "default,1", "--json", out, "--doc", doc)
    rows = read_json(out)["rows"]  # with a busy process beside it, both kinds of setting
    assert [(r["busy"], r["setting"]) for r in rows] == [(1, "default"), (1, "1 thread")]
    assert all(r["train_tok_s"] > 0 and r["eval_sent_s"] > 0 for r in rows)
    assert "<!-- bench-load:begin -->" in doc.read_text()


def smoke_bench_scaling(tmp: Path) -> None:
    out, doc = tmp / "scaling.json", tmp / "performance.md"
    run_main("benchmarks/bench_scaling.py", "--preset", "dry", "--precision", "fp32", "--tokens",
             "32", "--length", "4", "--lengths", "4", "8", "--batch-tokens", "16", "32",
             "--warmup", "0", "--steps", "1", "--peak-sizes", "32", "64", "--out", out,
             "--doc", doc)
    report = read_json(out)
    assert [p["length"] for p in report["length"]] == [4, 8]
    assert [p["tokens"] for p in report["batch"]] == [4 * 4 + 4 * 5, 8 * 4 + 8 * 5]
    assert "<!-- bench_scaling:begin -->" in doc.read_text()


def smoke_bench_serve(tmp: Path, runs: list[Path], capsys) -> None:
    out = tmp / "serving.json"
    run_main("benchmarks/bench_serve.py", "--model", runs[0] / "best", "--clients", "1", "2",
             "--seconds", "1", "--warmup", "0.2", "--sentences", "4", "--beam", "1",
             "--per-request", "2", "--ceiling", "1", "2", "--ceiling-steps", "2",
             "--compare=--set serve.join_steps=0", "--grid", "1x1", "--repeats", "1", "--threads", "1",
             "--out", out)  # one thread: a second of load counts answers on a busy machine too
    printed = capsys.readouterr().out
    report = read_json(out)
    assert report["engine"] == "torch" and report["threads"] == 1
    sweep = report["translate_sweep"]  # `aiayn translate` at its default and at --grid's 1×1
    assert set(sweep["settings"]) == {"1×1"} and sweep["best"] == "1×1"
    assert load("benchmarks/bench_engines.py").parse_setting(sweep["default"]["setting"])
    assert sweep["default_vs_best"] > 0 and (sweep["warning"] is None) == (sweep["default_vs_best"] >= 0.9)
    assert "2 clients: served/translate " in printed and ", p50/lone request " in printed
    # a warning line for each default more than 10% slower: translate's, the server's at a count
    compared = report["targets"]["default_vs --set serve.join_steps=0"]
    slower = [c for c, r in compared.items() if r < 0.9] + (["translate"] if sweep["warning"] else [])
    assert len(report["warnings"]) == len(slower)
    assert all(w.startswith("WARNING: ") and w in printed for w in report["warnings"])
    results = report["results"]
    assert set(results) == {"aiayn translate, one process", "decoding alone",
                            "step-level decoding alone", "serve, 1 clients",
                            "serve, 2 clients", "serve, 1 clients, --set serve.join_steps=0",
                            "serve, 2 clients, --set serve.join_steps=0"}
    served = [r for k, r in results.items() if k.startswith("serve")]
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in served)
    assert set(report["targets"]["default_vs --set serve.join_steps=0"]) == {"1", "2"}
    alone = results["step-level decoding alone"]
    assert set(alone) == {"1 clients", "2 clients"}
    for r in alone.values():  # the benchmark's beam, and where the time went
        assert r["beam"] == 1 and r["sentences"] > 0 and r["step_ms"] > 0
        assert r["join_ms"] > 0 and 0 < r["joins_per_step"] <= 1
    # the engine × clients table of the guide, from this run, between a page's markers
    page = tmp / "page.md"
    page.write_text("above\n<!-- serving:begin (benchmarks/bench_serve.py --table) -->\nold\n"
                    "<!-- serving:end -->\nbelow\n", encoding="utf-8")
    run_main("benchmarks/bench_serve.py", "--table", out, "--doc", page)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("above\n") and text.endswith("below\n") and "old" not in text
    row = f"| native (PyTorch fp32) | {results['aiayn translate, one process']['sentences_per_s_without_loading']:.1f} |"
    assert row in text and "| 2 clients |" in text


def smoke_same_convergence(tmp: Path) -> None:
    mirror_or_skip()
    out = tmp / "convergence.json"
    run_main("benchmarks/same_convergence.py", "--preset", "dry", "--precision", "fp32",
             "--steps", "2", "--held-out", "1", "--warmup", "1", "--threads", "1", "--out", out)
    report = read_json(out)
    assert [c["step"] for c in report["curve"]] == [1, 2]
    # fp32 from the same weights on the same batches: the same losses, up to summation order
    assert report["max_abs_diff"] < 1e-3, report["curve"]


def smoke_train_throughput(tmp: Path) -> None:
    config = write_toml(tmp / "reverse.toml", base_values(tmp / "data"))
    run_main("benchmarks/train_throughput.py", "--config", config, "--updates", "1", "--warmup",
             "1", "--threads", "1")


def smoke_imdb_split_overlap(tmp: Path) -> None:
    mirror_or_skip()
    run_main("scripts/imdb_split_overlap.py", "--sample", "10", "--limit", "200")


def smoke_make_figures(tmp: Path, runs: list[Path]) -> None:
    out = tmp / "figures"
    run_main("scripts/make_figures.py", "--run", runs[0], "--limit", "3", "--out", out)
    numbers = read_json(out / "numbers.json")
    assert numbers["run"]["steps"] == 4 and numbers["test_bleu"]["sentences"] == 3
    assert {"pe.png", "lr-schedule.png", "curves.png", "attention-all.png"} <= {
        p.name for p in out.iterdir()}


def smoke_make_results(tmp: Path, runs: list[Path]) -> None:
    """Two runs (their ensemble), two checkpoint counts and two α chosen on val, an ablation run,
    ablation rows copied from the committed report, the bf16 row."""
    out, readme = tmp / "results", tmp / "experiments.md"
    run_main("scripts/make_results.py", "--run", *runs, "--avg", "1", "2", "--alphas", "0.6",
             "1.0", "--beam", "2", "--limit", "3", "--workers", "2", "--bf16-row",
             "--ablation", f"seed 2 alone={runs[1]}", "--ablation-avg", "1",
             "--ablations-from", ROOT / "docs" / "experiments" / "multi30k_en_de.json",
             "--out", out, "--readme", readme)
    report = read_json(out.with_suffix(".json"))
    assert report["avg"] in (1, 2) and len(report["main"]["alpha_tuning"]) == 4
    weights = [r["weights"] for r in report["main"]["rows"]]
    assert weights[0] == "ensemble of 2: last checkpoints" and weights[-1].startswith("model 2 alone")
    assert report["ablations"][-1]["label"] == "seed 2 alone" and len(report["ablations"]) > 1
    assert "<!-- results:begin -->" in readme.read_text()


def smoke_seed_pairs(tmp: Path, runs: list[Path]) -> None:
    out = tmp / "seed_pairs"
    run_main("scripts/seed_pairs.py", "--run", *runs, "--avg", "2", "--alphas", "0.6", "1.0",
             "--recipe-alpha", "1.0", "--beam", "2", "--limit", "3", "--workers", "2", "--out", out)
    report = read_json(out.with_suffix(".json"))
    assert [p["seeds"] for p in report["pairs"]] == [[1, 2]]
    assert [m["seed"] for m in report["models"]] == [1, 2]
    assert "every two-model ensemble" in out.with_suffix(".md").read_text()


def smoke_bench_char_tokenizer(tmp: Path) -> None:
    mirror_or_skip()
    out = tmp / "char.json"
    run_main("benchmarks/bench_char_tokenizer.py", "--smoke", "--json", out)
    results = read_json(out)["results"]
    assert len(results) == 4 and all(r["speedup_median"] > 0 for r in results.values())


def smoke_bench_loss(tmp: Path) -> None:
    out = tmp / "loss.json"
    run_main("benchmarks/bench_loss.py", "--device", "cpu", "--vocab", "300", "--d-model", "16",
             "--rows", "40", "--repeats", "1", "--out", out)
    result = read_json(out)
    assert result["loss_rel_diff"] < 1e-3
    assert all(result[k] > 0 for k in ("ms_device_passes", "ms_cpu_sized_passes",
                                       "ms_plain_cross_entropy"))


def smoke_bench_data_scale(tmp: Path, capsys) -> None:
    """Every code path (corpus, `aiayn data build`, `aiayn train` on the built store, two DDP
    ranks, tokens/s from the store and from lists) at a tiny size, sane figures, and the kept
    store reused by the next run."""
    out = tmp / "smoke.json"
    run_main("benchmarks/bench_data_scale.py", "--smoke", "--sizes", "300", "--work", tmp / "work",
             "--keep-stores", "--json", out)
    results = read_json(out)
    assert [row["pairs"] for row in results["sizes"]] == [300]
    for row in results["sizes"]:
        build, train, speed = row["build"], row["train"], row["speed"]
        assert build["counts"]["read"] == row["pairs"] and 0 < build["counts"]["kept"] <= row["pairs"]
        assert build["seconds_store"] > 0 and build["peak_rss_mib"] > 0 and build["store_mib"] > 0
        assert train["seconds_to_first_update"] > 0 and train["peak_rss_mib"] > 0
        assert speed["tokens_per_s_store"] > 0 and speed["tokens_per_s_in_memory"] > 0
    ddp = results["sizes"][0]["train_ddp"]  # two ranks: the sum over the process tree
    assert ddp["peak_rss_sum_mib"] > ddp["peak_rss_mib"]
    assert "| pairs | build s |" in capsys.readouterr().out
    # --keep-stores: the next run trains on the kept store and says the build was reused
    run_main("benchmarks/bench_data_scale.py", "--smoke", "--sizes", "300", "--work", tmp / "work",
             "--keep-stores", "--json", out)
    again = read_json(out)["sizes"][0]
    assert again["build"]["reused"] and "peak_rss_mib" not in again["build"]
    assert again["build"]["counts"] == results["sizes"][0]["build"]["counts"]
    assert again["train"]["peak_rss_mib"] > 0 and "train_ddp" not in again


TINY_WMT = ["model.d_model=16", "model.n_heads=2", "model.d_k=8", "model.d_v=8", "model.d_ff=32",
            "model.n_encoder_layers=1", "model.n_decoder_layers=1", "data.vocab_size=300",
            "data.max_tokens=256", "train.tokens_per_update=512"]


def smoke_wmt_projection(tmp: Path, capsys) -> None:
    """The projection table, and --measure of both recipes (tiny shapes, on the CPU); --minutes
    with bucket widths and warmed shapes runs in gpu_check's dry run (tests/test_gpu_check.py)."""
    run_main("benchmarks/wmt_projection.py")
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()[1:]]
    assert {r["recipe"] for r in rows} == {"base", "big"} and all(r["hours"] > 0 for r in rows)
    sets = [a for x in TINY_WMT for a in ("--set", x)]
    run_main("benchmarks/wmt_projection.py", "--measure", "base", "big", "--device", "cpu",
             "--steps", "30", "--pairs", "300", "--out", tmp, *sets)
    measured = read_json(tmp / "wmt_measure.json")
    assert [m["recipe"] for m in measured] == ["base", "big"]
    assert all(m["seconds_per_update"] > 0 and m["micro_batches"] == 2 for m in measured)


def smoke_finetune_gain(tmp: Path) -> None:
    """The whole workflow at d_model 16 on 40 pairs (base, export --format hf, import hf,
    fine-tune, from scratch, evaluate), in this process, and its record."""
    mirror_or_skip()
    pytest.importorskip("transformers", reason="the --format hf export is read by transformers")
    out = tmp / "gain.json"
    run_main("benchmarks/finetune_gain.py", "--smoke", "--work", tmp / "work", "--out", out)
    record = read_json(out)
    assert record["smoke"] and record["split"]["held_pairs"] == 40
    assert set(record["test2016"]) == {"base", "base_imported", "finetuned",
                                       "finetuned_short_warmup", "scratch"}
    assert all("bleu" in s for s in record["test2016"].values())
    assert record["steps"]["finetune"]["command"].startswith("aiayn train ")
    assert (tmp / "work" / "data" / "held.en").is_file()


def smoke_finetune_time(tmp: Path) -> None:
    """A d_model-16 model of a padded vocabulary fine-tuned by `aiayn train
    configs/finetune.toml` for 3 updates; the record of seconds per update."""
    mirror_or_skip()
    out = tmp / "time.json"
    run_main("benchmarks/finetune_time.py", "--smoke", "--work", tmp / "work", "--out", out)
    record = read_json(out)
    assert record["smoke"] and record["model"]["vocab"] == 800
    assert len(record["seconds_per_update"]) == 2 and record["median_seconds_per_update"] > 0
    assert record["command"].startswith("python benchmarks/finetune_time.py --smoke")


def smoke_bench_finetune(tmp: Path) -> None:
    """A d_model-16 Marian folder built, imported, and fine-tuned by both systems in their
    own worker processes, steps interleaved; the record."""
    mirror_or_skip()
    pytest.importorskip("transformers", reason="the peer is transformers' MarianMTModel")
    pytest.importorskip("sentencepiece", reason="the Marian folder's tokenizer")
    out = tmp / "speed.json"
    run_main("benchmarks/bench_finetune.py", "--smoke", "--threads", "1", "--work", tmp / "work",
             "--out", out)
    record = read_json(out)
    assert set(record["tokens_per_s"]) == {"aiayn", "transformers"}
    assert all(r["median"] > 0 and len(r["steps"]) == 2 for r in record["tokens_per_s"].values())
    assert record["speedup_median"] > 0
    assert all(v > 0 for v in record["peak_rss_mib"].values())


def test_bench_train_image_preset(tmp_path):
    """bench_train's image preset at its tiny size (issue 67): aiayn's ViT and the
    nn.TransformerEncoder ViT train in the same run, each with its tokens/s, and the loss is the
    same at the same weights. (Its translation presets run in gpu_check's dry run, below.)"""
    out = tmp_path / "perf"
    run_main("benchmarks/bench_train.py", "--presets", "dry-vit", "--precisions", "fp32",
             "--threads", "1", "--peak-sizes", "64", "--out", out)
    run = read_json(out.with_suffix(".json"))["runs"]["threads=1"]
    [group] = run["groups"]
    systems = group["systems"]
    assert set(systems) == {"aiayn", "torch"} and systems["aiayn"]["speedup_vs"] == "torch"
    assert all(r["tokens_per_s"] > 0 for r in systems.values())
    assert systems["aiayn"]["params"] == systems["torch"]["params"]  # the same size
    same = run["same_math"]["dry-vit"]
    assert same["abs_diff"] < 1e-5 and same["images"] == 8
    table = out.with_suffix(".md").read_text(encoding="utf-8")
    assert "| dry-vit | fp32 | aiayn |" in table and "nn.TransformerEncoder ViT loss" in table


# gpu_check's smoke run is its whole dry run, with its own assertions, in tests/test_gpu_check.py;
# it runs bench_train.py and profile_step.py with the arguments of the GPU run made tiny, and
# checks their output there.
ELSEWHERE = "tests/test_gpu_check.py::test_the_whole_dry_run_passes"

SMOKE: dict[str, Callable[..., None] | str] = {
    "benchmarks/bench_char_tokenizer.py": smoke_bench_char_tokenizer,
    "benchmarks/bench_compiled_step.py": smoke_bench_compiled_step,
    "benchmarks/bench_components.py": smoke_bench_components,
    "benchmarks/bench_data_scale.py": smoke_bench_data_scale,
    "benchmarks/bench_decode.py": smoke_bench_decode,
    "benchmarks/bench_engines.py": smoke_bench_engines,
    "benchmarks/bench_finetune.py": smoke_bench_finetune,
    "benchmarks/bench_loss.py": smoke_bench_loss,
    "benchmarks/bench_load.py": smoke_bench_load,
    "benchmarks/bench_scaling.py": smoke_bench_scaling,
    "benchmarks/bench_serve.py": smoke_bench_serve,
    "benchmarks/bench_train.py": ELSEWHERE,
    "benchmarks/finetune_gain.py": smoke_finetune_gain,
    "benchmarks/finetune_time.py": smoke_finetune_time,
    "benchmarks/gpu_check.py": ELSEWHERE,
    "benchmarks/profile_step.py": ELSEWHERE,
    "benchmarks/same_convergence.py": smoke_same_convergence,
    "benchmarks/train_throughput.py": smoke_train_throughput,
    "benchmarks/wmt_projection.py": smoke_wmt_projection,
    "scripts/imdb_split_overlap.py": smoke_imdb_split_overlap,
    "scripts/make_figures.py": smoke_make_figures,
    "scripts/make_results.py": smoke_make_results,
    "scripts/make_reference.py": "tests/test_reference.py::test_the_check_mode_says_whether_the_page_is_current",
    "scripts/api_docs.py": "tests/test_api_docs.py::test_pdoc_renders_the_api_reference",
    "scripts/seed_pairs.py": smoke_seed_pairs,
    "scripts/nb_scale.py": "tests/test_naive_bayes.py::test_nb_scale_script_scores_scales_and_writes_the_best",
}


def test_every_script_has_a_smoke_entry():
    scripts = {p.relative_to(ROOT).as_posix() for d in FOLDERS for p in (ROOT / d).glob("*.py")}
    assert set(SMOKE) == scripts, "add a smoke entry for each new script (and drop removed ones)"
    for elsewhere in (f for f in SMOKE.values() if isinstance(f, str)):  # run by another test
        path, name = elsewhere.split("::")
        test = getattr(load(path), name)
        assert not any(m.name == "slow" for m in getattr(test, "pytestmark", [])), elsewhere


# The longest smoke runs first (seconds on the 2-core machine under `make test`, 2026-11-29:
# bench_serve 47, bench_data_scale 32, bench_engines 28, bench_load 26, make_figures 22,
# bench_finetune 15): `make test` spreads this module's tests over its workers one by one, and a
# long one handed out last would leave the other worker idle at the end.
LONGEST = ["benchmarks/bench_serve.py", "benchmarks/bench_data_scale.py",
           "benchmarks/bench_engines.py", "benchmarks/bench_load.py", "scripts/make_figures.py",
           "benchmarks/bench_finetune.py"]
RUN_HERE = sorted((s for s, f in SMOKE.items() if callable(f)),
                  key=lambda s: LONGEST.index(s) if s in LONGEST else len(LONGEST))


@pytest.mark.parametrize("script", RUN_HERE)
def test_script_runs_in_smoke_mode(script, tmp_path, request, monkeypatch):
    smoke = SMOKE[script]
    monkeypatch.chdir(tmp_path)  # a relative default path lands here, not in the checkout
    wants = smoke.__code__.co_varnames[1 : smoke.__code__.co_argcount]  # fixtures after tmp
    args = tuple(request.getfixturevalue(name) for name in wants)
    smoke(tmp_path, *args)
