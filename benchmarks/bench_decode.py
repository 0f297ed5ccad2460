"""Beam-search decoding speed: aiayn against Hugging Face `generate` and CTranslate2.

Three equivalent models with random weights, same shape (default: aiayn's SMALL preset — d_model
256, 4 heads, d_ff 1024, 3 + 3 layers, vocabulary 8000): aiayn's Transformer, a Hugging Face
``MarianMTModel`` built from a ``MarianConfig``, and that Marian model converted by CTranslate2's
Transformers converter (float32 and int8). Every system decodes the same random sources with the
same beam, and is forced to emit exactly ``--tgt-len`` tokens (EOS suppressed until then), so all
do the same number of decoder steps. Systems are interleaved round by round, so that load from
other processes on the machine hits them alike; the table reports the median and the best round.

    pip install -e '.[bench]'   # transformers, ctranslate2
    python benchmarks/bench_decode.py            # writes docs/experiments/decoding.json and docs/decoding.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Callable

import torch

from aiayn.config import ModelConfig
from aiayn.decode import DecodeConfig, translate_ids
from aiayn.env import cpu_name
from aiayn.model import Transformer
from aiayn.train.distributed import cpu_has_bf16

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=64, help="sentences per batch")
    p.add_argument("--batches", type=int, default=2, help="batches per round")
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--tgt-len", type=int, default=25, help="forced output length (tokens)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--workers", type=int, default=2,
                   help="also run every system with this many batches at once, sharing --threads "
                   "(aiayn DecodeConfig.workers, CTranslate2 inter_threads); 1 = only the default")
    p.add_argument("--skip", nargs="*", default=None,
                   help="systems to leave out (hf, ct2, bf16); default: bf16 on a CPU without "
                   "AVX512-BF16/AMX (a slow fallback there), else none")
    p.add_argument("--malloc", choices=("keep", "default"), default="keep",
                   help="keep: glibc keeps freed memory (aiayn/memory.py), as `aiayn "
                   "translate` does on CPU; it applies to every system here (one process)")
    p.add_argument("--date", default=str(date.today()))
    p.add_argument("--hardware", default=cpu_name())
    p.add_argument("--out", default=str(ROOT / "docs" / "experiments" / "decoding"),
                   help="writes OUT.json and OUT.md")
    args = p.parse_args(argv)
    if args.skip is None:
        args.skip = [] if cpu_has_bf16() else ["bf16"]
        if args.skip:
            print("leaving out aiayn bf16 autocast: this CPU has no AVX512-BF16/AMX "
                  "(--skip without names runs it anyway)", flush=True)
    return args


def aiayn_system(model: Transformer, sources: list[list[int]], args, bf16: bool,
                 workers: int) -> Callable[[], None]:
    dcfg = DecodeConfig(beam=args.beam, alpha=0.6, max_len_a=0.0, max_len_b=args.tgt_len,
                        min_len=args.tgt_len, batch_tokens=args.batch * args.src_len,
                        workers=workers)

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = translate_ids(model, sources, dcfg)
        assert all(len(h[0].tokens) == args.tgt_len for h in out)

    return run


def marian_config(cfg: ModelConfig):
    from transformers import MarianConfig

    # Marian's vocabulary ends with <pad> (the decoder's start token, a zero embedding), which
    # CTranslate2's converter strips again: vocab + 1 rows here, vocab rows in CTranslate2.
    v = cfg.tgt_vocab_size
    return MarianConfig(
        vocab_size=v + 1, decoder_vocab_size=v + 1, d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers, decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function="relu",
        max_position_embeddings=cfg.max_len, pad_token_id=v, decoder_start_token_id=v,
        eos_token_id=2, bos_token_id=1, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def save_marian(cfg: ModelConfig, folder: Path):
    """A random MarianMTModel plus a word-level tokenizer naming its ids, saved for conversion."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel
    from transformers import MarianMTModel, PreTrainedTokenizerFast

    model = MarianMTModel(marian_config(cfg)).eval()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<x3>": 3}
    vocab.update({f"t{i}": i for i in range(4, cfg.tgt_vocab_size)})
    vocab["<pad>"] = cfg.tgt_vocab_size
    tok = PreTrainedTokenizerFast(tokenizer_object=HFTokenizer(WordLevel(vocab, unk_token="<unk>")),
                                  unk_token="<unk>", eos_token="</s>", pad_token="<pad>", bos_token="<s>")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model


def hf_system(model, sources: list[list[int]], args) -> Callable[[], None]:
    batches = [torch.tensor(sources[i : i + args.batch]) for i in range(0, len(sources), args.batch)]

    def run() -> None:
        with torch.inference_mode():
            for src in batches:
                out = model.generate(input_ids=src, attention_mask=torch.ones_like(src),
                                     num_beams=args.beam, min_new_tokens=args.tgt_len,
                                     max_new_tokens=args.tgt_len, do_sample=False)
                assert out.shape[1] == args.tgt_len + 1  # + the decoder start token

    return run


def ct2_system(folder: Path, sources: list[list[int]], args, compute_type: str,
               workers: int) -> Callable[[], None]:
    """CTranslate2 with ``workers`` replicas (inter_threads) sharing ``args.threads``: the
    sub-batches of ``max_batch_size`` sentences of one call run in parallel."""
    import ctranslate2

    translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type,
                                        intra_threads=max(1, args.threads // workers),
                                        inter_threads=workers)
    tokens = [[f"t{i}" for i in s] + ["</s>"] for s in sources]

    def run() -> None:
        out = translator.translate_batch(tokens, beam_size=args.beam, max_batch_size=args.batch,
                                         min_decoding_length=args.tgt_len,
                                         max_decoding_length=args.tgt_len)
        assert all(len(r.hypotheses[0]) == args.tgt_len for r in out)

    return run


def build_systems(args, tmp: Path) -> dict[str, Callable[[], None]]:
    cfg = ModelConfig.preset(args.preset, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab,
                             dropout=0.0, max_len=max(256, args.src_len + args.tgt_len))
    g = torch.Generator().manual_seed(0)
    n = args.batch * args.batches
    sources = torch.randint(4, args.vocab, (n, args.src_len), generator=g).tolist()
    model = Transformer(cfg).eval()
    systems = {}
    for precision, bf16 in (("fp32", False), ("bf16 autocast", True)):
        if bf16 and "bf16" in args.skip:
            continue
        for w in layouts(args):
            systems[f"aiayn {precision}{label(w, args)}"] = aiayn_system(model, sources, args, bf16, w)
    if "hf" not in args.skip or "ct2" not in args.skip:
        marian = save_marian(cfg, tmp / "marian")
    if "hf" not in args.skip:
        systems["HF transformers fp32"] = hf_system(marian, sources, args)
    if "ct2" not in args.skip:
        from ctranslate2.converters import TransformersConverter

        TransformersConverter(str(tmp / "marian")).convert(str(tmp / "ct2"), force=True)
        for compute_type in ("float32", "int8"):
            for w in layouts(args):
                systems[f"CTranslate2 {compute_type}{label(w, args)}"] = ct2_system(
                    tmp / "ct2", sources, args, compute_type, w)
    return systems


def layouts(args) -> list[int]:
    """Worker counts to run each system with: 1 (all threads on one batch), and --workers."""
    return sorted({1, args.workers}) if args.batches > 1 else [1]


def label(workers: int, args) -> str:
    return f", {workers} workers × {max(1, args.threads // workers)} thread" if workers > 1 else ""


def ct2_float32_best(rates: dict[str, list[float]]) -> list[float] | None:
    """Per round, the faster of CTranslate2 float32's thread layouts (the reference)."""
    runs = [v for k, v in rates.items() if k.startswith("CTranslate2 float32")]
    return [max(r) for r in zip(*runs)] if runs else None


def measure(systems: dict[str, Callable[[], None]], args) -> dict[str, list[float]]:
    """Sentences/s of every system, round by round (after one warm-up call each)."""
    n = args.batch * args.batches
    for run in systems.values():
        run()
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for r in range(args.rounds):
        for name, run in systems.items():
            start = time.perf_counter()
            run()
            rates[name].append(n / (time.perf_counter() - start))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()), flush=True)
    return rates


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__}
    for name in ("transformers", "ctranslate2"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def write_report(rates: dict[str, list[float]], args, command: str) -> None:
    rows = {k: {"median": round(statistics.median(v), 1), "best": round(max(v), 1),
                "rounds": [round(x, 1) for x in v]} for k, v in rates.items()}
    meta = {"date": args.date, "hardware": args.hardware, "threads": args.threads,
            "malloc": args.malloc, "command": command, "preset": args.preset, "vocab": args.vocab,
            "batch": args.batch,
            "workers": args.workers, "sentences_per_round": args.batch * args.batches, "src_len": args.src_len,
            "tgt_len": args.tgt_len, "beam": args.beam, "rounds": args.rounds,
            "load_average": os.getloadavg(), "versions": versions(), "sentences_per_s": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    ref = ct2_float32_best(rates)
    for name, v in rates.items():  # per-round ratios cancel most of the load from other jobs
        rows[name]["vs_ct2_float32"] = round(statistics.median(
            a / b for a, b in zip(v, ref)), 2) if ref else None
    lines = ["| system | sentences/s (median) | best round | × CTranslate2 float32, faster layout (median of rounds) |",
             "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['median']} | {v['best']} | {v['vs_ct2_float32']} |" for k, v in rows.items()]
    out.with_suffix(".table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.malloc == "keep":
        from aiayn.memory import keep_freed_memory

        args.malloc = "keep" if keep_freed_memory() else "default (keep not applicable here)"
    command = "python benchmarks/bench_decode.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tmp:
        systems = build_systems(args, Path(tmp))
        rates = measure(systems, args)
    write_report(rates, args, command.strip())


if __name__ == "__main__":
    main()
