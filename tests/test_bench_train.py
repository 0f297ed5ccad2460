"""The training benchmark (benchmarks/bench_train.py) at tiny sizes: its three systems build, train
a step each with finite losses, have the parameter count of the shape (an equal-config
comparison), and aiayn computes the same loss as nn.Transformer with the same weights."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from aiayn.data import collate_translation

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_train", ROOT / "benchmarks" / "bench_train.py")
bench = sys.modules.setdefault("bench_train", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)

TINY = bench.Shape(vocab_size=61, d_model=32, n_heads=4, d_ff=48, n_encoder_layers=2,
                   n_decoder_layers=2, max_len=32)


def fixed_batch(s=TINY):
    g = torch.Generator().manual_seed(0)
    lengths = [(7, 9), (3, 2), (5, 6), (1, 4)]
    pairs = [(torch.randint(4, s.vocab_size, (a,), generator=g).tolist(),
              torch.randint(4, s.vocab_size, (b,), generator=g).tolist()) for a, b in lengths]
    c = collate_translation(pairs, s.pad_id, s.bos_id, s.eos_id)
    return pairs, bench.Batch(list(range(len(pairs))), c.src, c.tgt_in, c.tgt_out, c.n_src_tokens,
                              c.n_tgt_tokens)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", bench.SYSTEMS)
def test_each_system_trains_a_step_with_the_shapes_parameter_count(name, precision, tmp_path):
    if name == "marian":
        pytest.importorskip("transformers", reason="the Marian baseline needs the 'bench' extra")
    pairs, batch = fixed_batch()
    system = bench.build_system(name, TINY, precision, pairs, str(tmp_path))
    assert bench.trainable_params(system.model) == bench.expected_params(TINY)
    before = [p.detach().clone() for p in system.model.parameters()]
    losses = [system.step(batch) for _ in range(2)]
    assert all(math.isfinite(x) for x in losses), losses
    assert any(not torch.equal(a, p) for a, p in zip(before, system.model.parameters()))
    # Label-smoothed loss of a near-uniform model is about log V; training lowers it.
    assert abs(losses[0] - math.log(TINY.vocab_size)) < 1.0


def test_expected_params_of_the_papers_base_model():
    # Vaswani et al. 2017 Table 3: base has 65M parameters with a 37k joint vocabulary.
    base = bench.Shape(37000, 512, 8, 2048, 6, 6)
    assert round(bench.expected_params(base) / 1e6) == 63  # tied embeddings; biases included


def test_aiayn_loss_equals_nn_transformer_with_copied_weights(tmp_path):
    pairs, batch = fixed_batch()
    check = bench.same_math(TINY, batch, pairs, str(tmp_path))
    assert check["abs_diff"] < 1e-5, check
    # The reference: nn.Transformer's loss with its seed-1 weights on this batch (torch 2.13). aiayn
    # must keep reproducing it through every optimisation of its model and loss.
    assert check["aiayn_loss"] == pytest.approx(4.412425, abs=1e-5)


def test_train_flops_closed_form():
    s = bench.Shape(100, 8, 2, 16, 1, 1)
    d, f, v = 8, 16, 100
    fwd = (3 * 2 * (4 * d * d + 2 * d * f) + 4 * 9 * d  # encoder, s = 3
           + 2 * 2 * (6 * d * d + 2 * d * f) + 3 * 2 * 2 * d * d + 2 * 4 * d + 4 * 2 * 3 * d  # t = 2
           + 2 * 2 * d * v)
    assert bench.train_flops(s, [3], [2]) == 3 * fwd


@pytest.mark.process
def test_worker_protocol_runs_round_robin(tmp_path):
    pairs, batch = fixed_batch()
    data = tmp_path / "data.pt"
    torch.save({"pairs": pairs, "batches": [vars(batch)] * 2}, data)
    spec = {"shape": vars(TINY), "precision": "fp32", "threads": 1, "data": str(data)}
    raw = bench.run_group(["torch"], spec, 2)
    assert len(raw["torch"]["seconds"]) == 2 and raw["torch"]["max_rss_mib"] > 50
    assert raw["torch"]["params"] == bench.expected_params(TINY)
    summary = bench.summarise(raw, [batch, batch], [1e6, 1e6], 1, peak=100.0)
    assert summary["torch"]["tokens_per_s"] > 0 and 0 < summary["torch"]["mfu"]


def test_report_section_is_rewritten_between_markers(tmp_path):
    out = tmp_path / "performance"
    out.with_suffix(".md").write_text(f"# Perf\n\nprose above\n\n{bench.BEGIN}\nold\n{bench.END}\n\nprose below\n")
    sys_ = {"tokens_per_s": 1234.0, "step_s": 2.0, "mfu": 0.05, "max_rss_mib": 900.0, "params": 1e6}
    run = {"meta": {"threads": 1, "date": "2026-11-21", "command": "c", "hardware": "h",
                    "torch": "t", "transformers": "x", "load_start": [1, 2, 3],
                    "load_end": [1, 2, 3], "peak_gflops": {"bf16": 200.0, "fp32": 90.0}},
           "same_math": {}, "data": {},
           "groups": [{"preset": "small", "precision": "bf16",
                       "systems": {"aiayn": {**sys_, "speedup": 2.5, "speedup_vs": "torch"},
                                   "torch": sys_}}]}
    bench.write_reports(run, out)
    text = out.with_suffix(".md").read_text()
    assert text.startswith("# Perf\n\nprose above") and text.endswith("prose below\n")
    assert "old" not in text and "| small | bf16 | aiayn | 1.23k |" in text and "2.50× vs torch" in text
    assert "small bf16 ≥ 2.0× the faster peer — measured 2.50× (met)" in text
    assert "small peak RSS ≤ 2 GiB — measured 900 MiB (met)" in text


def test_two_presets_in_one_run_each_check_the_same_math_in_a_folder_of_their_own(tmp_path,
                                                                                 monkeypatch):
    """The same-math check trains in a run folder; with one folder for every preset, the second
    preset met the first one's (which the no-overwrite rule refuses) and the run crashed."""
    def batches(s, max_tokens, n):
        pairs, batch = fixed_batch(s)
        return pairs, [batch] * n, {"dataset": "fixed"}

    monkeypatch.setattr(bench, "multi30k_batches", batches)
    monkeypatch.setattr(bench, "run_group", lambda systems, spec, n, *warm: {})
    args = bench.parse_args(["--presets", "dry", "dry-base", "--precisions", "fp32"])
    checks = [bench.bench_preset(p, args, str(tmp_path))[1] for p in args.presets]
    assert [c["abs_diff"] < 1e-5 for c in checks] == [True, True], checks
    assert {"same_math_dry", "same_math_dry-base"} <= {p.name for p in tmp_path.iterdir()}
