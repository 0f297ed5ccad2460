"""aiayn.io: the marked-section rewrite that keeps generated tables inside hand-written docs; what
a folder holds, said in the words of what replacing it would lose; outputs that are inputs."""

import os

import pytest

from aiayn.errors import ConfigError
from aiayn.io import check_not_input, describe_folder, list_steps, write_section

B, E = "<!-- t:begin -->", "<!-- t:end -->"


def test_write_section_replaces_only_between_markers(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n\nintro\n\n{B}\nold table\n{E}\n\noutro\n")
    write_section(doc, B, E, "| new | table |\n")
    assert doc.read_text() == f"# Title\n\nintro\n\n{B}\n| new | table |\n{E}\n\noutro\n"
    write_section(doc, B, E, "again")  # idempotent layout: markers kept, one block
    assert doc.read_text().count(B) == 1 and "again" in doc.read_text() and "new" not in doc.read_text()


def test_write_section_appends_or_creates(tmp_path):
    doc = tmp_path / "doc.md"
    write_section(doc, B, E, "table", new_file="# Head\n")
    assert doc.read_text() == f"# Head\n\n{B}\ntable\n{E}\n"
    other = tmp_path / "other.md"
    other.write_text("text without markers\n")
    write_section(other, B, E, "t2")
    assert other.read_text() == f"text without markers\n\n{B}\nt2\n{E}\n"


def test_describe_folder_says_what_would_be_lost(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for step in range(1000, 11000, 1000):
        (run / "checkpoints" / f"step_{step:08d}.safetensors").write_bytes(b"")
    (run / "checkpoints" / "notes.txt").write_text("not a snapshot")
    assert describe_folder(run) == (
        "a training run with 10 checkpoints (steps 1000, 2000, …, 9000, 10000) and no "
        "trainer_state.pt")
    (run / "trainer_state.pt").write_bytes(b"")
    assert describe_folder(run).endswith("(steps 1000, 2000, …, 9000, 10000)")
    assert list_steps([3]) == "3" and list_steps([]) == ""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "x.txt"):
        (model / name).write_text("{}")
    assert describe_folder(model) == (
        "a model folder (README.md, config.json, model.safetensors, tokenizer.json, …)")
    (tmp_path / "empty").mkdir()
    assert describe_folder(tmp_path / "empty") == "nothing (an empty folder)"


def test_check_not_input(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.src").write_text("a\n")
    check_not_input(tmp_path / "out", [data / "train.src", data])  # beside: fine
    check_not_input(data / "x" / "..", [tmp_path / "other"])
    for out, inputs, words in [
        (data, [data / "train.src"], f"--out {data}: holds {data / 'train.src'}, which"),
        (data / "sub", [data], f"lies inside {data}, which"),
        (data / "sub" / "..", [data], f"is {data} itself, which"),  # the same folder, spelled apart
    ]:
        with pytest.raises(ConfigError, match="which this command reads") as err:
            check_not_input(out, inputs, "--out")
        assert words in str(err.value)


def test_check_not_input_refuses_an_output_file_over_an_input_or_a_model_part(tmp_path):
    """Files: the same file (spelled apart, through a symlink or a hard link), or a part of a
    model folder (what it holds, or a name it is read by); a score file, a new file inside the
    folder or a file beside an input are fine."""
    data = tmp_path / "data"
    data.mkdir()
    src = data / "train.src"
    src.write_text("a\n")
    (tmp_path / "link").symlink_to(src)
    os.link(src, tmp_path / "hard")
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "README.md"):
        (model / name).write_text("{}")
    check_not_input(data / "out.txt", [src, model], file=True)  # beside: fine
    check_not_input(model / "eval_test.json", [model], file=True)  # evaluate's scores
    check_not_input(model / "translations.txt", [model], file=True)  # a new file of the user's
    check_not_input(tmp_path / "notes.txt", ["-"], file=True)  # stdin
    for out, inputs, words in [
        (src, [src], f"is {src} itself, which this command reads; choose another file"),
        (data / "x" / ".." / "train.src", [src], "itself"),
        (tmp_path / "link", [src], "itself"),
        (src, [tmp_path / "link"], "itself"),
        (tmp_path / "hard", [src], "itself"),
        (model / "config.json", [], f"is a part of the model folder {model} (config.json)"),
        (model / "README.md", [], "is a part of the model folder"),
        (model / "tokenizer.json", [], "is a part of the model folder"),  # read by, absent now
    ]:
        with pytest.raises(ConfigError, match="-o ") as err:
            check_not_input(out, inputs, file=True)
        assert words in str(err.value)
