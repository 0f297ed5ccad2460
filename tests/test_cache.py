"""Incremental decoding: the cached decoder equals the full forward pass, at every position.

Also: cross-attention keys/values are projected once, beams share their sentence's memory,
``reorder`` follows beams and dropped sentences, and search over the cached step function gives
what search over a full recomputation gives.
"""

from __future__ import annotations

import pytest
import torch
from trainutil import tiny_model_config

from aiayn.decode import (
    DecodeConfig,
    SearchSettings,
    beam_search,
    greedy_search,
    transformer_step,
    translate_ids,
)
from aiayn.decode.translate import in_workers
from aiayn.model import Transformer

TOL = dict(atol=1e-5, rtol=1e-4)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw) -> Transformer:
    return Transformer(tiny_model_config(vocab=23, max_len=64, **kw)).eval()


def batch(B=3, S=7, T=9, vocab=23):
    src = torch.randint(4, vocab, (B, S))
    src[0, 5:] = 0  # padding in the source
    src[1:, 3:] = 0
    tgt = torch.randint(4, vocab, (B, T))
    tgt[:, 0] = 1  # BOS
    return src, tgt


@pytest.mark.parametrize("kw", [{}, {"norm_first": True}, {"positional": "learned"},
                                {"share_embeddings": False, "tgt_vocab_size": 19}])
@torch.no_grad()
def test_cached_steps_equal_the_full_pass_at_every_position(kw):
    model = tiny(**kw)
    src, tgt = batch(vocab=min(19, 23))
    full = model(src, tgt)  # (B, T, V)
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src)
    steps = [model.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    assert cache.length == tgt.size(1)


@torch.no_grad()
def test_several_tokens_at_once_equal_one_at_a_time():
    model = tiny()
    src, tgt = batch()
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src)
    first = model.decode(tgt[:, :4], memory, cache=cache)  # a chunk (e.g. a prompt)
    rest = [model.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(4, tgt.size(1))]
    torch.testing.assert_close(torch.cat([first, *rest], 1), model(src, tgt), **TOL)


@torch.no_grad()
def test_cross_attention_keys_are_projected_once():
    model = tiny()
    src, tgt = batch()
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src)
    model.decode(tgt[:, :1], memory, cache=cache)
    cross = [layer.cross_k for layer in cache.layers]
    model.decode(tgt[:, 1:2], torch.full_like(memory, float("nan")), cache=cache)  # memory unused
    assert all(layer.cross_k is k for layer, k in zip(cache.layers, cross))
    assert cache.layers[0].self_k.shape[2] == 2
    # stored contiguous: the attention matmul of every step reads them without a copy
    assert all(layer.cross_k.is_contiguous() and layer.cross_v.is_contiguous() for layer in cache.layers)


@torch.no_grad()
def test_beams_sharing_memory_equal_copied_memory():
    model, k = tiny(), 3
    src, tgt = batch()
    tgt_k = tgt.repeat_interleave(k, 0)  # (B·k, T)
    tgt_k[1::k, 2:] = torch.randint(4, 23, tgt_k[1::k, 2:].shape)  # beams differ
    memory = model.encode(src)
    shared = model.init_cache(memory, src=src).with_beam(k)
    copied = model.init_cache(memory.repeat_interleave(k, 0), src=src.repeat_interleave(k, 0))
    for t in range(tgt.size(1)):
        a = model.decode(tgt_k[:, t : t + 1], memory, cache=shared)
        b = model.decode(tgt_k[:, t : t + 1], memory.repeat_interleave(k, 0), cache=copied)
        torch.testing.assert_close(a, b, **TOL)
    assert shared.layers[0].cross_k.size(0) == src.size(0)  # B rows, not B·k


@torch.no_grad()
def test_reorder_follows_beams_and_dropped_sentences():
    """After reorder(index), decoding continues exactly as a full pass over the selected rows."""
    model, k = tiny(), 2
    src, tgt = batch(B=3)
    tgt_k = tgt.repeat_interleave(k, 0)
    tgt_k[:, 3:] = torch.randint(4, 23, tgt_k[:, 3:].shape)  # every row its own continuation
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src).with_beam(k)
    for t in range(4):
        model.decode(tgt_k[:, t : t + 1], memory, cache=cache)
    index = torch.tensor([1, 1, 4, 5])  # sentence 0: beam 1 twice; sentence 1 dropped; sentence 2 kept
    cache.reorder(index)
    rows, sent = tgt_k[index], torch.tensor([0, 0, 2, 2])
    steps = [model.decode(rows[:, t : t + 1], memory, cache=cache) for t in range(4, rows.size(1))]
    full = model(src[sent], rows)[:, 4:]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    assert cache.layers[0].cross_k.size(0) == 2 and cache.memory_mask.size(0) == 2


@torch.no_grad()
def test_reorders_keep_room_for_one_step_and_stay_exact():
    """Each reorder copies the kept rows into buffers with room for exactly the next position
    (the cache holds no more than it decoded), and after many reorders (beams swapped,
    duplicated) decoding still equals a full pass."""
    from aiayn.model.cache import _room

    model, k = tiny(), 2
    src, _ = batch(B=2)
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src).with_beam(k)
    hist = torch.ones(4, 0, dtype=torch.long)
    perms = [torch.tensor(p) for p in ([1, 0, 3, 2], [0, 0, 2, 3], [1, 1, 3, 2], [0, 1, 2, 2])]
    for t in range(8):
        x = torch.randint(4, 23, (4, 1)) if t else torch.ones(4, 1, dtype=torch.long)
        hist = torch.cat([hist, x], 1)
        model.decode(x, memory, cache=cache)
        p = perms[t % len(perms)]
        hist, cache = hist[p], cache.reorder(p)
        for layer in cache.layers:
            for kv in (layer.self_k, layer.self_v):
                assert kv.size(2) == t + 1 and _room(kv) == t + 2
    x = torch.randint(4, 23, (4, 1))
    last = model.decode(x, memory, cache=cache)[:, -1]
    full = model(src.repeat_interleave(k, 0), torch.cat([hist, x], 1))[:, -1]
    torch.testing.assert_close(last, full, **TOL)


@torch.no_grad()
def test_a_first_step_of_one_row_per_sentence_expands_to_the_beams():
    """Beam search's first step: B rows, then reorder() repeats each k times. Decoding then goes on
    as if all B·k rows had been fed from the start, and cross-attention state is not copied."""
    model, k = tiny(), 3
    src, tgt = batch(B=2)
    tgt_k = tgt.repeat_interleave(k, 0)
    tgt_k[:, 2:] = torch.randint(4, 23, tgt_k[:, 2:].shape)  # beams differ after the first token
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src).with_beam(k)
    first = model.decode(tgt[:, :1], memory, cache=cache)
    cross = cache.layers[0].cross_k
    cache.reorder(torch.arange(2).repeat_interleave(k))
    assert cache.layers[0].cross_k is cross and cache.layers[0].self_k.size(0) == 2 * k
    steps = [model.decode(tgt_k[:, t : t + 1], memory, cache=cache) for t in range(1, tgt.size(1))]
    full = model(src.repeat_interleave(k, 0), tgt_k)
    torch.testing.assert_close(first.repeat_interleave(k, 0), full[:, :1], **TOL)
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 1:], **TOL)


def test_reorder_rejects_mixing_sentences_and_late_with_beam():
    model, k = tiny(), 2
    src, tgt = batch(B=2)
    memory = model.encode(src)
    cache = model.init_cache(memory, src=src).with_beam(k)
    with torch.no_grad():
        model.decode(tgt.repeat_interleave(k, 0)[:, :1], memory, cache=cache)
    with pytest.raises(ValueError, match="mixes rows"):
        cache.reorder(torch.tensor([0, 2, 1, 3]))
    with pytest.raises(ValueError, match="empty cache"):
        cache.with_beam(3)


def uncached_step(model, memory, src):
    """A step function that recomputes the whole prefix: the reference for the cached one."""
    state = {"src": src}

    def step(tokens, cache):
        n = tokens.size(0) // state["src"].size(0)
        src_rows, mem = state["src"].repeat_interleave(n, 0), memory.repeat_interleave(n, 0)
        logits = model.decode(tokens, mem, src_mask=model.src_mask(src_rows))
        return torch.log_softmax(logits[:, -1], -1), cache

    return step


@torch.no_grad()
def test_search_over_the_cache_equals_search_over_full_recomputation():
    model = tiny()
    src, _ = batch(B=1)
    memory = model.encode(src)
    cached = greedy_search(transformer_step(model, memory), model.init_cache(memory, src=src),
                           1, 12, SearchSettings(1, 2))
    full = greedy_search(uncached_step(model, memory, src), None, 1, 12, SearchSettings(1, 2))
    assert cached[0].tokens == full[0].tokens
    assert cached[0].log_prob == pytest.approx(full[0].log_prob, abs=1e-4)
    k = 4
    cache = model.init_cache(memory, src=src).with_beam(k)
    settings = SearchSettings(1, 2, beam=k, nbest=4)
    cached = beam_search(transformer_step(model, memory), cache, 1, 12, settings)[0]
    full = beam_search(uncached_step(model, memory, src), None, 1, 12, settings)[0]
    assert [h.tokens for h in cached] == [h.tokens for h in full]
    assert [h.score for h in cached] == pytest.approx([h.score for h in full], abs=1e-4)


@torch.no_grad()
def test_translate_ids_is_batch_invariant():
    model = tiny()
    sources = [torch.randint(4, 23, (n,)).tolist() for n in (5, 9, 2, 7, 9, 1)] + [[]]
    cfg = DecodeConfig(beam=3, max_len_b=10, nbest=2)
    together = translate_ids(model, sources, cfg)
    assert together[-1] == []  # an empty source gives no hypothesis
    for src, hyps in zip(sources[:-1], together):
        (alone,) = translate_ids(model, [src], cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-4)


@torch.no_grad()
def test_translate_ids_with_workers_equals_one_worker():
    model = tiny()
    sources = [torch.randint(4, 23, (n,)).tolist() for n in (5, 9, 2, 7, 9, 1, 4, 3)] + [[]]
    cfg = DecodeConfig(beam=3, max_len_b=10, nbest=2, batch_tokens=16)  # several batches
    seen = []
    one = translate_ids(model, sources, cfg)
    two = translate_ids(model, sources, DecodeConfig(**{**vars(cfg), "workers": 3}), seen.append)
    assert sum(seen) == len(sources) - 1 and len(seen) > 2
    assert [[h.tokens for h in hyps] for hyps in one] == [[h.tokens for h in hyps] for hyps in two]


def test_workers_share_the_threads_and_keep_autocast():
    torch.set_num_threads(2)  # restored to one by the one_thread fixture
    seen = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_workers(lambda i: seen.append((i, torch.get_num_threads(),
                                          torch.is_autocast_enabled("cpu"))), [0, 1, 2], 2)
    assert sorted(seen) == [(0, 1, True), (1, 1, True), (2, 1, True)]
    assert torch.get_num_threads() == 2  # the caller's own setting is untouched

    def boom(i):
        if i == 1:
            raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        in_workers(boom, [0, 1, 2], 2)


@torch.no_grad()
def test_the_packed_output_projection_equals_f_linear():
    """aiayn/decode/packed.py: oneDNN's packed weight gives F.linear's values, in fp32 and under
    bf16 autocast (bf16 out, as autocast's linear); no packing where gradients are wanted."""
    from aiayn.decode.packed import available, bf16_packing, pack

    torch.manual_seed(0)
    weight, x = torch.randn(300, 32), torch.randn(7, 1, 32)
    if not available(weight.device):
        pytest.skip("this torch build has no oneDNN linear")
    packed = pack(weight)
    assert packed is not None and packed.dtype == torch.float32
    torch.testing.assert_close(packed(x), torch.nn.functional.linear(x, weight), **TOL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed16 = pack(weight)
        if not bf16_packing():  # e.g. AVX2 only: bf16 runs the projection unpacked
            assert packed16 is None
        else:
            assert packed16 is not None
            out = packed16(x)
            expected = torch.nn.functional.linear(x, weight)
    if bf16_packing():
        assert out.dtype == expected.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
    with torch.enable_grad():
        assert pack(weight.requires_grad_()) is None


@torch.no_grad()
@pytest.mark.parametrize("bias", [False, True])
def test_the_cache_packs_the_output_projection_once_per_decoding(bias):
    """The packed projection (a decoding's, aiayn/decode/packed.py) gives the module's
    log-probabilities, its bias included (final_logits_bias); the model itself packs nothing."""
    from aiayn.decode.packed import Prepacked, available

    torch.manual_seed(0)
    model = tiny(final_logits_bias=bias).eval()
    if bias:
        torch.nn.init.normal_(model.generator.bias)  # zeros would hide a dropped bias
    src, tgt = batch()
    memory = model.encode(src)
    plain = model.init_cache(memory, src=src)
    model.log_probs(tgt[:, :1], memory, plain)
    assert plain.output is None  # the paper's model: no inference-speed state
    decoder = Prepacked(model)
    cache = decoder.init_cache(memory, src=src)
    first = decoder.log_probs(tgt[:, :1], memory, cache)
    packed = cache.output
    assert (packed is not None) == available(src.device)
    decoder.log_probs(tgt[:, 1:2], memory, cache)
    assert cache.output is packed  # made at the first step only
    full = model.decode(tgt[:, :1], memory, src_mask=model.src_mask(src))  # F.linear
    torch.testing.assert_close(first, torch.log_softmax(full, dim=-1), **TOL)


@torch.no_grad()
def test_a_kept_packed_projection_is_made_again_when_the_weights_change():
    """pack_kept (models opened for inference): the same packed copy while the weights stay as
    they are, per precision; a new one after an in-place change (what load_state_dict and an
    optimizer step do), with the new values; its entry leaves with the weight."""
    import gc

    from aiayn.decode import packed as packed_module
    from aiayn.decode.packed import available, bf16_packing, pack_kept

    torch.manual_seed(0)
    weight, bias, x = torch.randn(300, 32), torch.randn(300), torch.randn(7, 32)
    if not available(weight.device):
        pytest.skip("this torch build has no oneDNN linear")
    first = pack_kept(weight, bias)
    assert first is not None and pack_kept(weight, bias) is first
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept16 = pack_kept(weight, bias)  # a copy of its own, where this CPU packs bf16
        assert kept16.dtype == torch.bfloat16 if bf16_packing() else kept16 is None
    assert pack_kept(weight, bias) is first
    weight.mul_(2)
    second = pack_kept(weight, bias)
    assert second is not first
    torch.testing.assert_close(second(x), torch.nn.functional.linear(x, weight, bias), **TOL)
    bias.add_(1)
    third = pack_kept(weight, bias)
    assert third is not second
    torch.testing.assert_close(third(x), torch.nn.functional.linear(x, weight, bias), **TOL)
    with torch.enable_grad():  # gradients wanted: nothing packed, kept or not
        assert pack_kept(weight.requires_grad_(), bias) is None
    weight.requires_grad_(False)
    with torch.inference_mode():  # inference tensors have no version to check: packed each time
        frozen = torch.randn(300, 32)
        once = pack_kept(frozen)
        assert once is not None and pack_kept(frozen) is not once
    key = id(weight)
    del weight, first, second, third
    gc.collect()
    assert key not in packed_module._KEPT


@torch.no_grad()
def test_a_model_opened_for_inference_decodes_its_new_weights(tmp_path):
    """The torch backend keeps the output projection packed across decodings (its decoder's
    ``keep``; the model holds no such state); weights loaded into the same model afterwards are
    the ones used."""
    from aiayn.runtime.torch_backend import TorchBackend

    torch.manual_seed(0)
    model, other = tiny().eval(), tiny().eval()
    torch.nn.init.normal_(other.generator.weight)
    backend = TorchBackend(model, torch.device("cpu"))
    assert backend.decoder.keep and backend.decoder.model is model
    src, _ = batch()
    sources = [row[row != model.cfg.pad_id].tolist() for row in src]
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=6)
    before = backend.translate_ids(sources, cfg)
    assert backend.translate_ids(sources, cfg) == before == translate_ids(model, sources, cfg)
    model.load_state_dict(other.state_dict())
    assert backend.translate_ids(sources, cfg) == translate_ids(other, sources, cfg)


@torch.no_grad()
def test_the_backend_packs_once_across_decodings_and_a_plain_decoding_each_time(monkeypatch):
    """Speed kept with the model pure: the torch backend's decoder packs the output projection
    once for many decodings; translate_ids over the bare model packs it once per decoding."""
    from aiayn.decode import packed as packed_module
    from aiayn.runtime.torch_backend import TorchBackend

    if not packed_module.available(torch.device("cpu")):
        pytest.skip("this torch build has no oneDNN linear")
    calls = []
    real = packed_module.pack

    def counting(weight, bias=None):
        calls.append(1)
        return real(weight, bias)

    monkeypatch.setattr(packed_module, "pack", counting)
    torch.manual_seed(0)
    model = tiny().eval()
    backend = TorchBackend(model, torch.device("cpu"))
    src, _ = batch()
    sources = [row[row != model.cfg.pad_id].tolist() for row in src]
    cfg = DecodeConfig(beam=2, max_len_a=0.0, max_len_b=6)
    for _ in range(3):
        backend.translate_ids(sources, cfg)
    assert len(calls) == 1
    for _ in range(2):
        translate_ids(model, sources, cfg)
    assert len(calls) == 3


@torch.no_grad()
def test_a_prepacked_model_keeps_the_models_mode():
    """Prepacked wraps an eval-mode model as an eval-mode module: a decoding, which puts back the
    mode it found, must not leave the model training (dropout on) for whatever runs next (the
    compiled step, attention plots, exporters)."""
    from aiayn.decode.packed import Prepacked

    model = tiny().eval()
    decoder = Prepacked(model, keep=True)
    assert not decoder.training
    translate_ids(decoder, [[5, 6, 7]], DecodeConfig(beam=2, max_len_b=4))
    assert not model.training and not decoder.training
    assert Prepacked(tiny().train()).training  # a training model's wrapper trains
