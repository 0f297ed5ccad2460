"""config.json has one reader: aiayn/folder/config.py. Every other module gets a typed
FolderConfig (read_folder_config / parse_folder_config) and writes through write_folder_config."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from aiayn.errors import CheckpointError
from aiayn.folder.config import FolderConfig, parse_folder_config, read_folder_config, write_folder_config

ROOT = Path(__file__).resolve().parents[1] / "aiayn"
PARSER = ROOT / "folder" / "config.py"
READS = ("read_text", "read_bytes")


def _mentions_config(node: ast.AST) -> bool:
    """The expression names a config.json: the literal, CONFIG_FILE, or a ``.config`` path."""
    text = ast.unparse(node)
    return "config.json" in text or "CONFIG_FILE" in text or text.endswith(".config")


def raw_config_reads(source: str) -> list[str]:
    """What in ``source`` reads a config.json itself or digs into the raw dict (``meta[...]``,
    ``meta.get(...)``): each as 'line: code'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        bad = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if ast.unparse(func) in ("json.loads", "json.load"):
                bad = any("config" in ast.unparse(a).lower() for a in node.args)
            elif func.attr in READS:
                bad = _mentions_config(func.value)
            elif func.attr == "get" and ast.unparse(func.value) == "meta":
                bad = True
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "open":
            bad = any(_mentions_config(a) for a in node.args[:1])
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "meta":
            bad = True
        if bad:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_checker_finds_raw_reads():
    source = (
        "import json\n"
        "meta = json.loads((folder / 'config.json').read_text())\n"
        "kind = meta['kind']\n"
        "fmt = meta.get('format')\n"
        "with open(folder / CONFIG_FILE) as f:\n    pass\n"
        "x = json.loads(self.config.read_text(encoding='utf-8'))\n"
    )
    assert len(raw_config_reads(source)) >= 6
    assert raw_config_reads("import json\nrow = json.loads(line)\n") == []


def test_no_module_but_the_parser_reads_config_json():
    offenders = {
        str(path.relative_to(ROOT.parent)): found
        for path in sorted(ROOT.rglob("*.py"))
        if path != PARSER and (found := raw_config_reads(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, f"read config.json through aiayn.folder.config: {offenders}"


def test_old_folders_parse_and_write_back_in_the_same_shape(tmp_path, caplog):
    old = {
        "kind": "seq2seq",
        "task": "translation",  # data.task's copy, written before data.kind: left out
        "model": {"d_model": 16, "n_heads": 2},
        "train": {"bleu_every": 7, "bleu_alpha": 1.0, "progress": False},  # keys since removed
        "decode": {"beam": 5, "alpha": 1.4},
        "averaged": {"steps": [4, 5], "run": "runs/x"},
        "preset": "tiny",
        "aiayn_version": "0.1",
        "onnx_opset": 17,
    }
    with caplog.at_level("WARNING"):
        parsed = parse_folder_config(old, tmp_path)
    assert [r.getMessage() for r in caplog.records] == []  # old names map without a warning
    assert isinstance(parsed, FolderConfig) and parsed.kind == "translation"
    assert parsed.config.train.metrics_every == 7 and parsed.config.model.d_model == 16
    assert parsed.decode_set == {"beam": 5, "alpha": 1.4} and not parsed.has_data
    assert parsed.averaged == {"steps": [4, 5], "run": "runs/x"} and parsed.preset == "tiny"
    write_folder_config(tmp_path, parsed)
    written = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert set(written) == {"kind", "model", "train", "decode", "averaged", "preset",
                            "aiayn_version", "onnx_opset"}
    assert written["train"]["metrics_every"] == 7 and written["decode"] == {"beam": 5, "alpha": 1.4}
    assert not {"bleu_alpha", "progress"} & set(written["train"])
    again = read_folder_config(tmp_path)
    assert again == parsed


def test_bad_configs_are_one_line_errors(tmp_path):
    with pytest.raises(CheckpointError, match="model folder not found"):
        read_folder_config(tmp_path / "none")
    (tmp_path / "config.json").write_text("{", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_folder_config(tmp_path)
    (tmp_path / "config.json").write_text('{"kind": "x", "model": {}}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="unknown model kind 'x'"):
        read_folder_config(tmp_path)
    (tmp_path / "config.json").write_text('{"kind": "lm"}', encoding="utf-8")
    with pytest.raises(CheckpointError, match="needs 'kind' and 'model'"):
        read_folder_config(tmp_path)


def test_a_folders_decode_workers_is_not_read_and_a_recipes_warns(tmp_path, caplog):
    """decode.workers is the machine's setting (aiayn.threads.default_workers), not the model's:
    a folder written with it loads silently without it, a recipe that sets it is warned."""
    from aiayn.run_config import build_run_config

    old = {"kind": "translation", "model": {"d_model": 16, "n_heads": 2},
           "decode": {"beam": 5, "workers": 1}}
    with caplog.at_level("WARNING"):
        parsed = parse_folder_config(old, tmp_path)
    assert [r.getMessage() for r in caplog.records] == []
    assert parsed.config.decode.workers == 0  # chosen when the model runs
    write_folder_config(tmp_path, parsed)
    written = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert "workers" not in written["decode"]
    with caplog.at_level("WARNING"):
        cfg = build_run_config({"decode.workers": 2}, "recipe.toml")
    assert cfg.decode.workers == 0
    assert [r.getMessage() for r in caplog.records] == [
        "recipe.toml: 'decode.workers' is ignored: batches decoded at once are chosen for the "
        "machine when the model runs (--workers sets them)"
    ]


def test_decode_max_tokens_of_an_older_folder_loads_as_batch_tokens(tmp_path, caplog):
    """decode.max_tokens is decode.batch_tokens since issue 64 (the flag's name, --batch-tokens):
    a folder written before loads silently under the new name; a recipe gets one line naming
    it."""
    from aiayn.run_config import build_run_config

    old = {"kind": "translation", "model": {"d_model": 16, "n_heads": 2},
           "decode": {"beam": 5, "max_tokens": 300}}
    with caplog.at_level("WARNING"):
        parsed = parse_folder_config(old, tmp_path)
    assert [r.getMessage() for r in caplog.records] == []
    assert parsed.config.decode.batch_tokens == 300
    with caplog.at_level("WARNING"):
        cfg = build_run_config({"decode.max_tokens": 200}, "recipe.toml")
    assert cfg.decode.batch_tokens == 200
    assert [r.getMessage() for r in caplog.records] == [
        "recipe.toml: 'decode.max_tokens' is now called 'decode.batch_tokens'"
    ]
