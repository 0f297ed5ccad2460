"""Fine-tuning speed on a CPU: aiayn's trainer against a plain transformers loop, one BASE Marian.

A BASE-sized ``MarianMTModel`` (d_model 512, 6+6 layers, 8 heads, d_ff 2048, SiLU, sinusoids,
tied embeddings, ``final_logits_bias``; OPUS-MT's shape) with random weights and a SentencePiece
pair trained here on Multi30k (about ``--vocab`` pieces in all) is saved as a Hugging Face folder,
as OPUS-MT folders are, and imported with ``aiayn import hf``. Then two systems fine-tune it on the
same batches (Multi30k En->De training pairs, tokenised with the folder's tokenizer, bucketed by
aiayn's token sampler at ``--max-tokens`` padded tokens; full batches only):

* ``aiayn``        — :class:`aiayn.train.trainer.Trainer` built as ``aiayn train
  configs/finetune.toml --set train.init_from=IMPORTED`` builds it (the recipe's settings: label
  smoothing 0.1, clip norm 1.0, Adam), its ``update`` on each batch;
* ``transformers`` — ``MarianMTModel.from_pretrained(HF_FOLDER)`` in train mode, ``torch.optim.AdamW``
  (the same lr, betas, eps, no weight decay), the label-smoothed loss of ``Seq2SeqTrainer``'s
  ``LabelSmoother`` (ε 0.1), gradient clipping at 1.0.

Both in fp32 (this machine's CPU has no bf16 matmul units: AVX2 only), each in its own worker
process (its peak RSS is its own: ``ru_maxrss``), ``--threads`` threads each. The parent hands the
workers one batch at a time, alternating A/B/B/A…, so that load from other jobs hits both alike.
Warm-up steps are excluded; tokens/s counts source + target tokens without padding; the speed-up
is the median of the per-step ratios.

    python benchmarks/bench_finetune.py --work runs/bench_finetune \
        --out docs/experiments/finetune_speed_2026-11-29.json
    python benchmarks/bench_finetune.py --smoke --work /tmp/bf --out /tmp/bf.json   # seconds
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train  # noqa: E402  (its worker handle and message format)
FT_CONFIG = ROOT / "configs" / "finetune.toml"
SYSTEMS = ("aiayn", "transformers")
BASE = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)
SMOKE = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
             decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32)
EPSILON, CLIP = 0.1, 1.0


def multi30k(lang: str, n: int) -> list[str]:
    path = Path(os.environ.get("AIAYN_DATA_MIRROR", "/nonexistent")) / "multi30k" / f"train.{lang}.gz"
    if not path.is_file():
        raise SystemExit(f"needs the Multi30k mirror ({path}; set AIAYN_DATA_MIRROR)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for _, line in zip(range(n), f)]


# --------------------------------------------------------------------------------------------
# The model folder (transformers' layout, as OPUS-MT's) and its import
# --------------------------------------------------------------------------------------------


def build_marian(folder: Path, shape: dict[str, int], vocab_size: int, lines: int) -> dict:
    """A random MarianMTModel of ``shape`` with a SentencePiece pair trained on Multi30k."""
    import sentencepiece
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"</s>": 0, "<unk>": 1}
    for lang, name in (("en", "source"), ("de", "target")):
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(multi30k(lang, lines)), model_prefix=str(folder / name),
            vocab_size=vocab_size // 2, character_coverage=1.0, minloglevel=2, num_threads=1)
        processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / f"{name}.model"))
        for i in range(processor.get_piece_size()):
            if not processor.is_control(i) and not processor.is_unknown(i):
                vocab.setdefault(processor.id_to_piece(i), len(vocab))
        (folder / f"{name}.model").rename(folder / f"{name}.spm")
        (folder / f"{name}.vocab").unlink()
    vocab["<pad>"] = pad = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(vocab),
                          max_position_embeddings=512, activation_function="swish", dropout=0.1,
                          attention_dropout=0.0, activation_dropout=0.0, scale_embedding=True,
                          pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
                          forced_eos_token_id=0, **shape)
    torch.manual_seed(1)
    model = MarianMTModel(config)
    model.save_pretrained(folder)
    MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                    str(folder / "vocab.json")).save_pretrained(folder)
    generation = {"max_length": 512, "num_beams": 4, "eos_token_id": 0, "forced_eos_token_id": 0,
                  "bad_words_ids": [[pad]], "decoder_start_token_id": pad, "pad_token_id": pad}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    params = sum(p.numel() for p in model.parameters())
    return {"vocab": len(vocab), "parameters": params, **shape}


def make_batches(imported: Path, max_tokens: int, n: int, lines: int) -> dict[str, Any]:
    """Multi30k pairs as the folder's tokenizer encodes them (sources with </s>, targets
    without: the trainer adds the decoder's start and end), and the first ``n`` full batches of
    aiayn's token sampler (padded size at least 90% of ``max_tokens``)."""
    from aiayn.data import TokenBatchSampler, pair_lengths
    from aiayn.folder import load_model_folder

    tok = load_model_folder(imported).tokenizer
    pairs = [(tok.encode(x), tok.encode_target(y))
             for x, y in zip(multi30k("en", lines), multi30k("de", lines))]
    pairs = [(x, y) for x, y in pairs if len(x) <= 128 and len(y) < 128]
    sampler = TokenBatchSampler(*pair_lengths(pairs), max_tokens=max_tokens, seed=1)
    widths = [max(len(x), len(y) + 1) for x, y in pairs]
    chosen = [b for b in sampler.batches(1)
              if len(b) * max(widths[i] for i in b) >= 0.9 * max_tokens][:n]
    if len(chosen) < n:
        raise SystemExit(f"only {len(chosen)} full batches of {max_tokens} tokens; ask for fewer")
    return {"pairs": pairs, "batches": chosen}


# --------------------------------------------------------------------------------------------
# The two systems (each in a worker process)
# --------------------------------------------------------------------------------------------


class Aiayn:
    """aiayn's Trainer as ``aiayn train configs/finetune.toml --set train.init_from=…`` builds it
    (the folder's model section and tokenizer; the recipe's optimizer, loss and clipping), its
    training pairs the benchmark's."""

    def __init__(self, spec: dict[str, Any], pairs: list, folder: str) -> None:
        import torch

        from aiayn.data import pair_store
        from aiayn.run_config import load_run_config
        from aiayn.train.distributed import DistContext
        from aiayn.train.run import _fine_tune
        from aiayn.train.run_folder import RunFolder
        from aiayn.train.task import build_task
        from aiayn.train.trainer import Trainer

        sets = [f"train.init_from={spec['imported']}", "train.precision=fp32",
                f"data.max_tokens={spec['max_tokens']}"]
        cfg, _ = load_run_config(FT_CONFIG, sets)
        dist = DistContext(device=torch.device("cpu"))
        cfg, tokenizer_json = _fine_tune(cfg, dist, None)
        task = build_task(cfg)
        task.stores = {"train": pair_store(pairs), "valid": pair_store([])}
        run = RunFolder(folder)
        run.prepare(resume=False)
        # only Trainer.update is called: no validation, saving or logging in the timed steps
        self.trainer = Trainer(cfg, task, run, dist, {}, tokenizer_json, resume=False)
        self.model = self.trainer.model

    def step(self, batch: list[int]) -> None:
        if not self.trainer.update([batch]):
            raise RuntimeError("aiayn skipped an update (a non-finite gradient)")


class Transformers:
    """A plain transformers fine-tuning loop: MarianMTModel, AdamW, LabelSmoother's loss."""

    def __init__(self, spec: dict[str, Any], pairs: list, folder: str) -> None:
        import torch
        from transformers import MarianMTModel

        self.model = MarianMTModel.from_pretrained(spec["hf"]).train()
        cfg = self.model.config
        self.pad, self.start, self.eos = cfg.pad_token_id, cfg.decoder_start_token_id, 0
        self.pairs = pairs
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=spec["lr"], betas=(0.9, 0.98),
                                     eps=1e-9, weight_decay=0.0)

    def step(self, batch: list[int]) -> None:
        import torch

        pairs = [self.pairs[i] for i in batch]
        width_s = max(len(x) for x, _ in pairs)
        width_t = max(len(y) for _, y in pairs) + 1
        src = torch.full((len(pairs), width_s), self.pad)
        dec = torch.full((len(pairs), width_t), self.pad)
        labels = torch.full((len(pairs), width_t), -100)
        for row, (x, y) in enumerate(pairs):
            src[row, : len(x)] = torch.tensor(x)
            dec[row, : len(y) + 1] = torch.tensor([self.start, *y])
            labels[row, : len(y) + 1] = torch.tensor([*y, self.eos])
        logits = self.model(input_ids=src, attention_mask=(src != self.pad).long(),
                            decoder_input_ids=dec).logits
        # transformers' LabelSmoother (Seq2SeqTrainer's label_smoothing_factor)
        log_probs = -torch.log_softmax(logits, dim=-1)
        pad = labels.eq(-100).unsqueeze(-1)
        nll = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).masked_fill(pad, 0.0)
        smoothed = log_probs.sum(-1, keepdim=True).masked_fill(pad, 0.0)
        active = (~pad).sum()
        loss = ((1 - EPSILON) * nll.sum() / active
                + EPSILON * smoothed.sum() / (active * log_probs.size(-1)))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
        self.opt.step()


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM: since its exec; ``ru_maxrss`` would carry the
    peak of the parent it was forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_main() -> None:
    """In a child: read the spec, build the system, answer step/rss/quit requests."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # library output goes to stderr, not into the protocol
    inp = os.fdopen(0, "rb")
    spec = pickle.load(inp)
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(1)
    data = torch.load(spec["data"], weights_only=True)
    rss_before = peak_rss_mib()
    with tempfile.TemporaryDirectory() as folder:
        system = {"aiayn": Aiayn, "transformers": Transformers}[spec["system"]](
            spec, data["pairs"], folder)
        _send(out, {"loaded_rss_mib": peak_rss_mib(), "start_rss_mib": rss_before})
        while True:
            req = pickle.load(inp)
            if req[0] == "step":
                start = time.perf_counter()
                system.step(data["batches"][req[1]])
                _send(out, {"seconds": time.perf_counter() - start})
            elif req[0] == "rss":
                _send(out, {"peak_rss_mib": peak_rss_mib()})
            else:
                return


_send = bench_train._send  # the workers' pickled messages, as bench_train.py sends them


class Worker(bench_train.Worker):
    """bench_train.py's handle on a worker process, running this script's worker; quitting waits
    for it (its peak memory has been read by then)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec, script=__file__)

    def quit(self) -> None:
        super().quit()
        self.proc.wait(timeout=120)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def cli(args: list[str], smoke: bool) -> None:
    """``aiayn ARGS`` (in this process for the smoke run)."""
    if smoke:
        from aiayn.cli import main as aiayn_main

        code = aiayn_main(args)
    else:
        code = subprocess.run([sys.executable, "-m", "aiayn", *args], cwd=ROOT).returncode
    if code != 0:
        raise SystemExit(f"failed ({code}): aiayn {shlex.join(args)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, help="folder for the model folders (required)")
    parser.add_argument("--out", type=Path, help="the JSON record to write (required)")
    parser.add_argument("--vocab", type=int, default=8000, help="SentencePiece pieces in all")
    parser.add_argument("--max-tokens", type=int, default=2048, help="padded tokens per batch")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per system")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per system")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lines", type=int, default=10000, help="Multi30k lines to use")
    parser.add_argument("--smoke", action="store_true", help="a d_model-16 model, 2 steps")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    if args.work is None or args.out is None:
        parser.error("--work and --out are required")
    if args.smoke:
        args.vocab, args.max_tokens, args.warmup, args.steps, args.lines = 200, 256, 1, 2, 600
    import torch

    work = args.work.resolve()
    hf, imported = work / "marian_hf", work / "imported"
    started = time.perf_counter()
    model = build_marian(hf, SMOKE if args.smoke else BASE, args.vocab, args.lines)
    print(f"built {hf} in {time.perf_counter() - started:.1f} s", flush=True)
    cli(["import", "hf", str(hf), "-o", str(imported), "--overwrite", "-q"], args.smoke)
    data = make_batches(imported, args.max_tokens, args.warmup + args.steps, args.lines)
    print(f"imported, batched: {time.perf_counter() - started:.1f} s", flush=True)
    torch.save(data, work / "batches.pt")
    tokens = [sum(len(data["pairs"][i][0]) + len(data["pairs"][i][1]) + 1 for i in b)
              for b in data["batches"]]  # source + target (with </s>) real tokens
    lr = 5e-5
    spec = {"imported": str(imported), "hf": str(hf), "data": str(work / "batches.pt"),
            "threads": args.threads, "max_tokens": args.max_tokens, "lr": lr}
    workers = [Worker({**spec, "system": name}) for name in SYSTEMS]
    seconds: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    try:
        loaded = {w.name: w.ask() for w in workers}
        print(f"workers ready: {time.perf_counter() - started:.1f} s", flush=True)
        for i in range(args.warmup + args.steps):
            order = workers if i % 2 == 0 else workers[::-1]  # A B, B A, …
            for w in order:
                seconds[w.name].append(w.ask("step", i)["seconds"])
            print(f"step {i + 1}: " + ", ".join(f"{n} {seconds[n][-1]:.2f}s" for n in SYSTEMS),
                  flush=True)
        peak = {w.name: w.ask("rss")["peak_rss_mib"] for w in workers}
    finally:
        for w in workers:
            w.quit()
    timed = slice(args.warmup, None)
    rates = {n: [t / s for t, s in zip(tokens[timed], seconds[n][timed])] for n in SYSTEMS}
    ratios = [a / b for a, b in zip(rates["aiayn"], rates["transformers"])]
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                       if line.startswith("Model name")), platform.processor())
    flags = next((line for line in cpu.splitlines() if line.startswith("Flags")), "")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    import transformers

    record = {
        "what": "fine-tuning one BASE-sized Marian model (random weights, OPUS-MT's shape) on the "
                "same Multi30k batches: aiayn's trainer (configs/finetune.toml) against a plain "
                "transformers loop, fp32, each system in its own process, steps interleaved",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": f"{model_name}, {os.cpu_count()} cores",
        "bf16_matmul": "amx_bf16" in flags or "avx512_bf16" in flags,
        "threads": args.threads,
        "commit": commit,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "smoke": args.smoke,
        "command": "python benchmarks/bench_finetune.py " + shlex.join(argv or sys.argv[1:]),
        "model": model,
        "batches": {"max_tokens": args.max_tokens, "warmup_steps": args.warmup,
                    "timed_steps": args.steps, "tokens_per_step": tokens,
                    "sentences_per_step": [len(b) for b in data["batches"]]},
        "settings": {"lr": lr, "label_smoothing": EPSILON, "clip_norm": CLIP,
                     "precision": "fp32", "dropout": 0.1},
        "tokens_per_s": {n: {"median": round(statistics.median(rates[n]), 1),
                             "steps": [round(r, 1) for r in rates[n]]} for n in SYSTEMS},
        "speedup_median": round(statistics.median(ratios), 3),
        "speedup_steps": [round(r, 3) for r in ratios],
        "peak_rss_mib": {n: round(peak[n], 1) for n in SYSTEMS},
        "peak_rss_after_load_mib": {n: round(loaded[n]["loaded_rss_mib"], 1) for n in SYSTEMS},
        "peak_rss_at_start_mib": {n: round(loaded[n]["start_rss_mib"], 1) for n in SYSTEMS},
        "step_seconds": {n: [round(s, 3) for s in seconds[n]] for n in SYSTEMS},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"tokens_per_s": {n: record["tokens_per_s"][n]["median"] for n in SYSTEMS},
                      "speedup": record["speedup_median"], "peak_rss_mib": record["peak_rss_mib"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
