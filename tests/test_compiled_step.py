"""The decoder step compiled as one call (aiayn/runtime/compiled.py) decodes what the module code
decodes: per-step log-probabilities to 1e-5, the same tokens for greedy and beam search.

The fast tests run :class:`DecoderStep` eagerly behind the same plumbing as the package (cache
buffers in, new keys/values out and appended, the output projection after it); the slow one
compiles it with AOTInductor (about a minute) and loads it back from its cache directory.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trainutil import tiny_model_config

from aiayn.decode import (
    DecodeConfig,
    Rules,
    SearchSettings,
    beam_search,
    greedy_search,
    transformer_step,
)
from aiayn.decode.ensemble import Ensemble
from aiayn.errors import ConfigError
from aiayn.model import Transformer
from aiayn.runtime import compiled as compiled_module
from aiayn.runtime.compiled import (
    FIRST_COMPILED_STEP,
    CompiledDecoding,
    CompiledStep,
    EagerRunner,
    compiled_step,
    package_key,
)
from aiayn.runtime.torch_backend import TorchBackend

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = dict(atol=1e-5, rtol=0)
V = 23


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(tiny_model_config(vocab=V, max_len=64, **kw)).eval()


def sources() -> torch.Tensor:
    src = torch.randint(4, V, (3, 7), generator=torch.Generator().manual_seed(1))
    src[1, 4:] = 0  # padding in the source
    src[2, 2:] = 0
    return src


def search(model, src, beam: int):
    """Greedy (beam 1) or beam search of ``model`` (a Transformer or CompiledDecoding) over src:
    tokens and scores of the 3-best (beam) or the best (greedy)."""
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src)
    step = transformer_step(model, memory)
    if beam == 1:
        hyps = greedy_search(step, cache, src.size(0), 20, SearchSettings(1, 2, Rules(min_len=12)))
        return [(h.tokens, h.score) for h in hyps]
    nbest = beam_search(step, cache.with_beam(beam), src.size(0), 20,
                        SearchSettings(1, 2, beam=beam, nbest=3))
    return [[(h.tokens, h.score) for h in line] for line in nbest]


def assert_same_search(a, b) -> None:
    """Equal tokens everywhere, scores to 1e-5."""
    flat_a = [x for line in a for x in (line if isinstance(line, list) else [line])]
    flat_b = [x for line in b for x in (line if isinstance(line, list) else [line])]
    assert [t for t, _ in flat_a] == [t for t, _ in flat_b]
    torch.testing.assert_close(
        torch.tensor([s for _, s in flat_a]), torch.tensor([s for _, s in flat_b]), **TOL
    )


@pytest.mark.parametrize(
    "kw",
    [{}, {"norm_first": True}, {"positional": "learned"}, {"output_vocab": "targets"}],
)
@pytest.mark.parametrize("beam", [1, 4])
@torch.no_grad()
def test_the_step_function_decodes_what_the_module_code_decodes(kw, beam):
    model = tiny(**kw)
    if model.output_mask is not None:
        model.output_mask[5:9] = False  # tokens the training targets never had
    runner = EagerRunner(model)
    fast = CompiledDecoding(model, CompiledStep(model, runner))
    src = sources()
    assert_same_search(search(fast, src, beam), search(model, src, beam))
    assert runner.calls > 0  # the step function ran, not only the module code


@torch.no_grad()
def test_every_step_s_log_probs_equal_the_module_code_s():
    model = tiny(norm_first=True)
    fast = CompiledDecoding(model, CompiledStep(model, EagerRunner(model)))
    src = sources()
    tgt = torch.randint(4, V, (3 * 4, 10), generator=torch.Generator().manual_seed(2))
    memory = model.encode(src)
    caches = [model.init_cache(memory, src=src).with_beam(4) for _ in range(2)]
    for t in range(tgt.size(1)):
        rows = 3 if t == 0 else 12  # the first step: one row per sentence, then the beams
        a, b = (
            m.log_probs(tgt[:rows, t : t + 1], memory, c) for m, c in zip((model, fast), caches)
        )
        torch.testing.assert_close(b, a, **TOL)
        if t == 0:
            for c in caches:
                c.reorder(torch.arange(3).repeat_interleave(4))
        else:  # beams swap and repeat, as beam search moves them
            index = torch.tensor([1, 1, 0, 3, 4, 6, 6, 5, 11, 8, 9, 9])
            for c in caches:
                c.reorder(index)
    assert caches[1].length == tgt.size(1)


@torch.no_grad()
def test_steps_it_cannot_take_run_the_module_code():
    model = tiny()
    step = CompiledStep(model, EagerRunner(model))
    src = sources()
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src)
    new = torch.full((3, 1), 5)
    for _ in range(FIRST_COMPILED_STEP):
        assert not step.accepts(new, cache)  # the first steps (cross-attention projected there)
        model.log_probs(new, memory, cache)
    assert step.accepts(new, cache)
    assert not step.accepts(torch.full((3, 2), 5), cache)  # several tokens at once
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not step.accepts(new, cache)


def test_the_package_key_follows_the_weights_the_threads_and_the_config():
    a, b = tiny(), tiny()
    assert package_key(a, 1) == package_key(b, 1)
    assert package_key(a, 1) != package_key(a, 2)
    with torch.no_grad():
        b.decoder.layers[0].feed_forward.linear1.bias.add_(1e-3)
    assert package_key(a, 1) != package_key(b, 1)
    assert package_key(a, 1) != package_key(tiny(norm_first=True), 1)


@pytest.mark.parametrize(
    "model, cfg",
    [
        (tiny(), DecodeConfig(compile=True, bf16=True)),
        (Ensemble([tiny(), tiny()]), DecodeConfig(compile=True)),
    ],
    ids=["bf16", "ensemble"],
)
def test_compile_is_refused_in_one_line_where_it_cannot_run(model, cfg):
    backend = TorchBackend(model, torch.device("cpu"))
    with pytest.raises(ConfigError, match="decode.compile runs one float32 translation model"):
        backend.translate_ids([[5, 6, 2]], cfg)


def test_a_cache_it_cannot_write_or_a_damaged_package_is_one_line(tmp_path, monkeypatch):
    model = tiny()
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError, match="compiling the decoder step into .* failed: ") as e:
        compiled_step(model, tmp_path / "file" / "compiled")
    assert "\n" not in str(e.value)
    damaged = tmp_path / f"decoder-step-{package_key(model, 1)}.pt2"
    # a package that its compilation wrote so (its checksum is what was written) and that this
    # torch cannot load: one line, the file left for the user to look at
    monkeypatch.setattr(compiled_module, "_build", lambda m, path: path.write_bytes(b"half a package"))
    with pytest.raises(ConfigError, match="is not a package this torch can load") as e:
        compiled_step(model, tmp_path)
    assert "\n" not in str(e.value) and damaged.read_bytes() == b"half a package"


@pytest.mark.slow
@torch.no_grad()
def test_the_compiled_package_decodes_what_the_module_code_decodes(tmp_path, monkeypatch):
    model = tiny(norm_first=True)
    step = compiled_step(model, tmp_path)  # ~1 minute: export, inductor, g++
    packages = list(tmp_path.glob("decoder-step-*.pt2"))
    assert len(packages) == 1 and not list(tmp_path.glob(".partial-*"))
    fast = CompiledDecoding(model, step)
    src = sources()
    for beam in (1, 4):
        assert_same_search(search(fast, src, beam), search(model, src, beam))
    # A second process loads the package from the directory: nothing is compiled again.
    monkeypatch.setattr(compiled_module, "_build", lambda *a: pytest.fail("compiled again"))
    again = CompiledDecoding(model, compiled_step(model, tmp_path))
    assert_same_search(search(again, src, 4), search(model, src, 4))
    # The backend's decode.compile goes the same way (its cache directory: $AIAYN_CACHE), with
    # two workers calling the package at once (one batch of at most 8 tokens each).
    monkeypatch.setenv("AIAYN_CACHE", str(tmp_path.parent / "cache"))
    monkeypatch.setattr(compiled_module, "_build", _copy_of(packages[0]))
    backend = TorchBackend(model, torch.device("cpu"))
    cfg = DecodeConfig(beam=4, nbest=2, workers=2, batch_tokens=8)
    ids = [s[s != 0].tolist() for s in src]
    plain = backend.translate_ids(ids, cfg)
    compiled = backend.translate_ids(ids, replace(cfg, compile=True))
    assert [[h.tokens for h in line] for line in compiled] == [
        [h.tokens for h in line] for line in plain
    ]


def _copy_of(package):
    """A stand-in for _build that copies an already compiled package (the same model and key)."""

    def build(model, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(package.read_bytes())

    return build


@torch.no_grad()
def test_the_backend_compiles_again_when_the_weights_change(monkeypatch):
    """decode.compile's package holds the weights it was compiled from: the backend keeps one
    while the weights stay as they are, and compiles again (the disk cache is keyed by the
    weights) after load_state_dict changed them, its packed output projection too."""
    model, other = tiny(), tiny()
    torch.nn.init.normal_(other.generator.weight)
    calls = []
    monkeypatch.setattr(
        "aiayn.runtime.torch_backend.compiled_step",
        lambda m, *a: calls.append(m) or CompiledStep(m, EagerRunner(m)),
    )
    backend = TorchBackend(model, torch.device("cpu"))
    cfg = DecodeConfig(compile=True)
    first = backend.compiled(cfg)
    assert backend.compiled(cfg) is first and len(calls) == 1
    model.load_state_dict(other.state_dict())
    again = backend.compiled(cfg)
    assert again is not first and len(calls) == 2
    x = torch.randn(2, model.cfg.d_model)
    torch.testing.assert_close(again.output(x), other.generator(x), **TOL)
