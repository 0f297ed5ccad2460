"""Config validation, presets, overrides, the parameter summary and their CLI errors."""

import pytest
import torch
from trainutil import fails, process_fails

from aiayn import ConfigError, ModelConfig, Transformer
from aiayn.cli import main
from aiayn.config import apply_overrides, from_dict, to_dict
from aiayn.model import EncoderLayer
from aiayn.model.summary import summarize


def test_presets_match_the_papers():
    base = ModelConfig.preset("base")
    assert (base.d_model, base.n_heads, base.d_ff, base.n_encoder_layers, base.dropout) == (512, 8, 2048, 6, 0.1)
    big = ModelConfig.preset("big")
    assert (big.d_model, big.n_heads, big.d_ff) == (1024, 16, 4096)
    small = ModelConfig.preset("small")
    assert (small.d_model, small.n_heads, small.d_ff, small.n_encoder_layers) == (256, 4, 1024, 3)
    tiny = ModelConfig.preset("tiny", src_vocab_size=100, tgt_vocab_size=100)
    assert (tiny.d_model, tiny.n_heads, tiny.d_ff, tiny.n_decoder_layers, tiny.src_vocab_size) == (128, 4, 256, 4, 100)
    assert base.head_dim_k == 64 and base.head_dim_v == 64


@pytest.mark.parametrize("kwargs, field", [
    (dict(d_model=100, n_heads=8), "d_model"),
    (dict(d_model=0), "d_model"),
    (dict(n_heads=-1), "n_heads"),
    (dict(d_ff=0), "d_ff"),
    (dict(d_k=0), "d_k"),
    (dict(dropout=1.5), "dropout"),
    (dict(src_vocab_size=100, tgt_vocab_size=200), "share_embeddings"),
])
def test_invalid_configs_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)


def test_d_k_set_allows_any_d_model():
    cfg = ModelConfig(d_model=100, n_heads=8, d_k=16)
    assert cfg.head_dim_k == 16 and cfg.head_dim_v == 16


def test_unknown_preset_and_field_and_wrong_type():
    with pytest.raises(ConfigError, match="did you mean 'base'"):
        ModelConfig.preset("bsae")
    with pytest.raises(ConfigError, match="unknown config key 'd_modle'.*d_model"):
        apply_overrides(ModelConfig(), {"d_modle": 3})
    with pytest.raises(ConfigError, match="d_model: expected an integer"):
        apply_overrides(ModelConfig(), {"d_model": "wide"})
    with pytest.raises(ConfigError, match="activation"):
        apply_overrides(ModelConfig(), {"activation": "tanh"})
    with pytest.raises(ConfigError, match="unknown config key 'nonsense'"):
        ModelConfig.preset("base", nonsense=1)


def test_overrides_from_strings_and_round_trip():
    cfg = apply_overrides(ModelConfig(), {"d_model": "256", "n_heads": "4", "norm_first": "true",
                                           "d_k": "none", "dropout": "0.3"})
    assert (cfg.d_model, cfg.norm_first, cfg.d_k, cfg.dropout) == (256, True, None, 0.3)
    assert from_dict(ModelConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    "given", ['["crop", "flip"]', "['crop','flip']", "crop,flip", "[crop, flip]", "(crop,flip)"]
)
def test_a_list_from_the_command_line_in_the_recipes_spelling_or_bare(given):
    from aiayn.data.config import DataConfig

    cfg = apply_overrides(DataConfig(kind="image_classification"), {"augment": given})
    assert cfg.augment == ("crop", "flip")
    assert apply_overrides(DataConfig(kind="image_classification"), {"augment": "[]"}).augment == ()


def test_keras_imdb_encoder_block_has_10656_parameters():
    """Chollet's IMDB TransformerEncoder: embed 32, 2 heads with key_dim 32, dense 32; Keras
    reports 10,656 parameters for it."""
    cfg = ModelConfig(d_model=32, n_heads=2, d_k=32, d_v=32, d_ff=32, dropout=0.0)
    layer = EncoderLayer(cfg)
    assert sum(p.numel() for p in layer.parameters()) == 10_656


def test_base_preset_with_37k_vocab_is_within_5_percent_of_65m():
    model = Transformer(ModelConfig.preset("base", src_vocab_size=37000, tgt_vocab_size=37000))
    rows, total = summarize(model, None)
    assert abs(total - 65e6) / 65e6 < 0.05
    shared = {r.name for r in rows if r.shared}
    assert shared == {"tgt_embed", "generator"}
    assert total == sum(r.params for r in rows if not r.shared and "." not in r.name)


def test_summary_builds_the_model_the_config_trains(capsys, tmp_path):
    from aiayn.model import TransformerClassifier

    cfg = tmp_path / "clf.toml"
    cfg.write_text('[model]\nd_model = 32\nn_heads = 2\nd_ff = 64\nn_encoder_layers = 1\n'
                   'bigram_buckets = 100\n[data]\nkind = "classification"\nvocab_size = 500\n')
    assert main(["summary", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("TransformerClassifier: ")
    assert "bigrams (Embedding)" in out and "head (Linear)" in out and "decoder" not in out
    model = TransformerClassifier(ModelConfig(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                                              n_decoder_layers=0, bigram_buckets=100,
                                              src_vocab_size=500, tgt_vocab_size=500))
    assert f"Total params: {sum(p.numel() for p in model.parameters()):,}" in out


def test_summary_cli_prints_table(capsys):
    assert main(["summary", "tiny", "--set", "model.src_vocab_size=1000", "--set",
                 "model.tgt_vocab_size=1000"]) == 0
    out = capsys.readouterr().out
    assert "encoder.layers.3 (EncoderLayer)" in out and "(2, 16, 1000)" in out
    total = sum(p.numel() for p in Transformer(ModelConfig.preset(
        "tiny", src_vocab_size=1000, tgt_vocab_size=1000)).parameters())
    assert f"Total params: {total:,}" in out


def test_summary_names_the_vocabulary_it_counted_and_takes_one(capsys, tmp_path):
    """A preset has no vocabulary of its own: the table counts the default 37,000 and says so
    (issue 66: 6.06 M for tiny, with a vocabulary it did not mention); --vocab gives another,
    a recipe's data.vocab_size is named as its source."""
    def total(cfg):
        return f"Total params: {sum(p.numel() for p in Transformer(cfg).parameters()):,}"

    assert main(["summary", "tiny"]) == 0
    out = capsys.readouterr().out
    assert total(ModelConfig.preset("tiny")) in out
    assert "Vocabulary: 37,000 tokens (the default" in out and "--vocab N" in out
    assert main(["summary", "tiny", "--vocab", "8000"]) == 0
    out = capsys.readouterr().out
    assert total(ModelConfig.preset("tiny", src_vocab_size=8000, tgt_vocab_size=8000)) in out
    assert "Vocabulary: 8,000 tokens (--vocab)" in out
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\npreset = "tiny"\n[data]\nvocab_size = 5000\n')
    assert main(["summary", str(recipe)]) == 0
    assert f"Vocabulary: 5,000 tokens (data.vocab_size of {recipe})" in capsys.readouterr().out
    assert main(["summary", "tiny", "--vocab", "1"]) == 2
    assert "--vocab must be at least 5" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["summary", "bsae"], "unknown preset 'bsae' (did you mean 'base'?)"),
    (["summary", "base", "--set", "model.d_model=100"], "d_model (100) must be divisible by n_heads (8)"),
    (["summary", "base", "--set", "model.d_modle=100"], "unknown config key 'd_modle'"),
    (["summary", "base", "--set", "model.src_vocab_size=10", "--set",
      "model.tgt_vocab_size=20"], "share_embeddings"),
    (["summary", "base", "--set", "model.d_ff=-1"], "d_ff must be positive"),
    (["summary", "missing.toml"], "missing.toml: config file not found"),
])
def test_cli_bad_input_is_one_line_error_no_traceback(args, message, capsys):
    fails(capsys, args, message)


def test_a_bad_config_in_a_real_process_is_one_line_and_exit_2():
    """The same as above through `python -m aiayn`: the exit status and stderr a shell sees."""
    process_fails(["summary", "base", "--set", "model.d_modle=100"], "unknown config key 'd_modle'")


def test_the_warm_up_advice_is_logged_once_per_run_not_per_read(caplog):
    """A config is checked when read and again when its task is built; advice that is not an
    error (warm-up longer than the run) is logged once, when the run starts."""
    from aiayn.run_config import build_run_config
    from aiayn.train.task import build_task

    values = {"train.max_steps": 10, "train.warmup_steps": 20, "train.lr_schedule": "inverse_sqrt"}
    with caplog.at_level("WARNING"):
        cfg = build_run_config(values)
        build_task(cfg)
    assert [r.getMessage() for r in caplog.records].count(
        "train.warmup_steps (20) >= train.max_steps (10): the run ends before its learning rate "
        "has warmed up"
    ) == 1


def test_data_task_still_loads_as_data_kind_with_one_warning_line(tmp_path, caplog):
    """The kind has one name: ``data.kind``. ``data.task`` (its name before) still loads, from a
    recipe, ``--set``, ``aiayn data --set`` and ``aiayn summary``, each with one warning line
    naming where it was met."""
    from argparse import Namespace

    from aiayn.commands.data import data_config
    from aiayn.commands.summary import resolve_model_config
    from aiayn.run_config import load_run_config
    from trainutil import write_toml

    recipe = write_toml(tmp_path / "lm.toml", {"data.task": "lm", "data.dataset": "tiny_shakespeare",
                                               "data.tokenizer": "char"})
    with caplog.at_level("WARNING"):
        cfg, values = load_run_config(recipe)
        assert cfg.data.kind == "lm" and values["data.kind"] == "lm" and "data.task" not in values
        assert load_run_config(None, ["data.task=classification"])[0].data.kind == "classification"
        assert resolve_model_config(str(recipe), [])[1] == "lm"
        assert data_config(Namespace(config=str(recipe), overrides=[])).kind == "lm"
        assert data_config(Namespace(config=None, overrides=["data.task=lm"])).kind == "lm"
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"{where}: 'data.task' is now called 'data.kind'"
                    for where in (recipe, "--set", recipe, recipe, "--set")]


def test_removed_train_keys_still_load_with_one_warning_line_each(tmp_path, caplog):
    """train.bleu_alpha (validation BLEU decodes with decode.alpha) and train.progress (the bar
    shows on a terminal, -q hides it) are no longer read: a recipe or --set giving them still
    loads, each with one warning line saying why."""
    from aiayn.run_config import load_run_config
    from trainutil import write_toml

    recipe = write_toml(tmp_path / "old.toml", {"train.bleu_alpha": 1.0, "train.progress": False,
                                                "decode.alpha": 0.8})
    with caplog.at_level("WARNING"):
        cfg, values = load_run_config(recipe, ["train.progress=true"])
    assert cfg.decode.alpha == 0.8 and not {"train.bleu_alpha", "train.progress"} & set(values)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [
        f"{recipe}: 'train.bleu_alpha' is ignored: validation BLEU decodes with decode.alpha, "
        "the run's own length penalty",
        f"{recipe}: 'train.progress' is ignored: the progress bar shows on a terminal; -q hides it",
    ]


def test_validation_bleu_decodes_with_the_runs_decode_alpha(monkeypatch):
    """train.bleu_alpha merged into decode.alpha: validation decodes with train.bleu_beam and
    the α the model folder is decoded with."""
    import aiayn.train.translation as translation
    from aiayn.run_config import build_run_config

    cfg = build_run_config({"train.bleu_beam": 3, "train.metrics_every": 1, "decode.alpha": 1.3})
    task = translation.TranslationTask.__new__(translation.TranslationTask)
    task.cfg, task.tokenizer, task._bleu_data = cfg, None, (["a b"], ["b a"])
    seen = {}
    monkeypatch.setattr(translation, "translate_texts",
                        lambda model, tokenizer, src, **kw: seen.update(kw) or ["b a"])
    assert task.valid_metrics(None, 1)["valid_chrf"] == 100.0
    assert seen == {"beam": 3, "alpha": 1.3}


def test_data_kind_wins_over_data_task_and_a_bad_kind_names_data_kind(tmp_path):
    from aiayn.run_config import build_run_config

    assert build_run_config({"data.kind": "lm", "data.task": "classification",
                             "data.dataset": "tiny_shakespeare"}).data.kind == "lm"
    with pytest.raises(ConfigError, match=r"data.kind: 'regression' is not one of 'translation'"):
        build_run_config({"data.task": "regression"})
