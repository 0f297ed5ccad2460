"""``aiayn data``: list, fetch and inspect datasets; train a tokenizer.

    aiayn data list
    [AIAYN_DATA_MIRROR=DIR_OR_URL] [AIAYN_CACHE=DIR] aiayn data prepare multi30k [--force] [-q]
    aiayn data tokenizer -o tokenizer.json [--config run.toml] [--set data.vocab_size=8000 ...]
    aiayn data build [--config run.toml] [--set ...]
    aiayn data stats [--config run.toml] [--set data.dataset= --set data.train_src=a.en ...]

``--set data.KEY=VALUE`` takes the keys of :class:`aiayn.data.DataConfig`;
``--config`` reads the ``[data]`` section of a TOML file.
"""

from __future__ import annotations

import argparse
import logging
import time
import tomllib

from aiayn.commands.options import add_output_file, add_sets, section_sets
from aiayn.config import apply_overrides
from aiayn.data import (
    DATASETS,
    DataConfig,
    TokenBatchSampler,
    Tokenizer,
    TokenStore,
    cache_dir,
    data_source,
    download_dataset,
    is_downloaded,
    padding_fraction,
    split_stores,
    train_tokenizer_for,
)
from aiayn.data.readers import read_text
from aiayn.data.registry import mirror_files
from aiayn.errors import ConfigError
from aiayn.run_config import data_keys

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "data",
        description="Datasets, tokenizers and batching.",
    )
    actions = parser.add_subparsers(dest="data_action", metavar="ACTION", required=True)
    ls = actions.add_parser(
        "list", help="registered datasets, their splits and whether they are cached"
    )
    ls.set_defaults(run=run_list)
    _add_prepare(actions)
    tok = actions.add_parser(
        "tokenizer", help="train a tokenizer on the training split and save it"
    )
    _config_args(tok)
    add_output_file(tok, "where to write the tokenizer", "tokenizer.json")
    tok.set_defaults(run=run_tokenizer)
    build = actions.add_parser(
        "build",
        help="tokenize the training and validation splits once into token stores in the cache",
        description="Train (or reuse) the configured tokenizer and build the token stores of the "
        "training and validation splits in the data cache ($AIAYN_CACHE/stores), which `aiayn "
        "train` on the same data and tokenizer settings then opens without tokenizing again. "
        "Prints each store's folder, size and what cleaning dropped.",
    )
    _config_args(build)
    build.set_defaults(run=run_build)
    stats = actions.add_parser(
        "stats",
        help="read, tokenise and batch the data; print sizes, timings and padding",
        description="Checks the configured data end to end (any bad line is reported with its "
        "file and line) and measures tokenising and batching.",
    )
    _config_args(stats)
    stats.add_argument(
        "--tokenizer", metavar="PATH", help="a tokenizer.json to use (default: train one)"
    )
    stats.set_defaults(run=run_stats)
    return parser


def _add_prepare(actions: argparse._SubParsersAction) -> None:
    prep = actions.add_parser(
        "prepare",
        help="download (or copy from the mirror), verify and cache a dataset",
        description="Fetch NAME into the cache ($AIAYN_CACHE, default ~/.cache/aiayn), checking "
        "sha256; does nothing if already there. $AIAYN_DATA_MIRROR (a folder or base "
        "URL laid out as FOLDER/FILE) replaces the official sources. A progress bar shows on a "
        "terminal, unless -q.",
    )
    prep.add_argument("name", metavar="NAME", help=f"one of: {', '.join(DATASETS)}")
    prep.add_argument("--force", action="store_true", help="fetch again even if cached")
    prep.set_defaults(run=run_prepare)


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="TOML", help="read the [data] section of this recipe")
    add_sets(parser, "data", "data.vocab_size=8000")


def data_config(args: argparse.Namespace) -> DataConfig:
    """DataConfig from ``--config`` then ``--set data.KEY=VALUE`` (a bare KEY: with a warning)."""
    values: dict = {}
    if args.config:
        try:
            table = tomllib.loads(read_text(args.config))
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{args.config}: {err}") from None
        values.update(data_keys(table.get("data", {}), args.config))
    values.update(data_keys(section_sets(args.overrides, "data"), "--set"))
    return apply_overrides(DataConfig(), values, prefix="data.")


def run_list(args: argparse.Namespace) -> int:
    root = cache_dir() / "datasets"
    for spec in DATASETS.values():
        cached = "cached" if is_downloaded(root / spec.name) else "not cached"
        print(f"{spec.name:<17} {spec.task:<15} {cached:<11} {spec.description}")
        print(f"{'':<17} splits: {', '.join(spec.splits)}; terms: {spec.terms}")
        print(f"{'':<17} a mirror (AIAYN_DATA_MIRROR) holds {mirror_files(spec)}")
    return 0


def run_prepare(args: argparse.Namespace) -> int:
    folder = download_dataset(
        args.name,
        force=args.force,
        progress=False if args.quiet else None,
    )
    print(folder)
    return 0


def run_tokenizer(args: argparse.Namespace) -> int:
    from aiayn.io import check_not_input

    cfg = data_config(args)
    check_not_input(args.output, cfg.own_files, "--out", file=True)  # a training file, say
    tokenizer = train_tokenizer_for(cfg)
    tokenizer.save(args.output)
    print(f"{args.output}: {tokenizer.kind} tokenizer, {tokenizer.vocab_size} tokens")
    return 0


def run_build(args: argparse.Namespace) -> int:
    cfg = data_config(args)
    tokenizer = train_tokenizer_for(cfg)
    for store in split_stores(cfg, tokenizer).values():
        print(store_line(store))
    return 0


def store_line(store: TokenStore) -> str:
    """One line about a token store: where, how big, what building kept and dropped."""
    m = store.manifest
    counts = ", ".join(f"{k} {v}" for k, v in m["counts"].items() if v and k != "kept")
    tokens = sum(m["tokens"].values())
    return (
        f"store {store.path}: {len(store)} examples, {tokens} tokens ({m['dtype']}), "
        f"{store.nbytes / 2**20:.1f} MiB, built in {m['build_seconds']:.1f} s; {counts}"
    )


def run_stats(args: argparse.Namespace) -> int:
    cfg = data_config(args)
    start = time.perf_counter()
    tokenizer = Tokenizer.from_file(args.tokenizer) if args.tokenizer else train_tokenizer_for(cfg)
    fitted = time.perf_counter()
    stores = split_stores(cfg, tokenizer)
    train, valid = stores["train"], stores["valid"]
    source = data_source(cfg)
    if source.example_lengths is None:  # one running text
        print(
            f"{cfg.kind}: {int(train.lengths('text')[0])} training and {int(valid.lengths('text')[0])} "
            f"validation tokens ({tokenizer.kind}, vocabulary {tokenizer.vocab_size})"
        )
        print(store_line(train))
        return 0
    lengths = source.example_lengths(train)
    sampler = TokenBatchSampler(
        lengths[0],
        lengths[1],
        max_tokens=cfg.max_tokens,
        seed=cfg.seed,
        pad_to_multiple=cfg.pad_to_multiple,
        bucket_widths=cfg.bucket_widths,
    )
    batches = sampler.batches()
    done = time.perf_counter()
    n_tokens = sum(int(x.sum()) for x in lengths if x is not None)
    print(
        f"{cfg.kind}: {len(train)} training and {len(valid)} validation examples, "
        f"{n_tokens} training tokens ({tokenizer.kind}, vocabulary {tokenizer.vocab_size})"
    )
    print(
        f"batches: {len(batches)} at max_tokens={cfg.max_tokens}, padding "
        f"{100 * padding_fraction(sampler):.1f}% of source+target cells, "
        f"{sampler.distinct_shapes()} distinct batch shapes"
    )
    print(store_line(train))
    print(
        f"time: tokenizer {'loaded' if args.tokenizer else 'trained or read from the cache'} in "
        f"{fitted - start:.2f} s; open (or build) the stores + batch in {done - fitted:.2f} s"
    )
    return 0
