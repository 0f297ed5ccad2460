import atexit
import fcntl
import multiprocessing.process
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable

import pytest
import torch
from trainutil import thread_fixture

from aiayn.threads import cores

# Token stores and tokenizers are cached in the data cache (aiayn/data/store.py): a test session
# gets its own, removed at exit, so that tests never fill the user's ~/.cache/aiayn. Datasets are
# copied into it from the data mirror when a test needs them.
if not os.environ.get("AIAYN_CACHE"):
    os.environ["AIAYN_CACHE"] = tempfile.mkdtemp(prefix="aiayn-test-cache-")
    atexit.register(shutil.rmtree, os.environ["AIAYN_CACHE"], ignore_errors=True)


def _workers_fill_the_cores() -> bool:
    """This process is one of pytest-xdist's workers, and there are as many as cores (or more)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and workers >= cores()


# One torch thread per xdist worker when the workers already fill the cores (`make test`: -n auto):
# torch's own count (one thread per core in every worker) only adds threads that wait on each
# other's cores, which burns CPU time and, on a loaded machine, minutes. Set once here (before any
# fixture trains) and again after each test, as a test or the trainer may change it.
WORKER_THREADS = 1 if _workers_fill_the_cores() else None
if WORKER_THREADS:
    torch.set_num_threads(WORKER_THREADS)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
    if WORKER_THREADS:
        torch.set_num_threads(WORKER_THREADS)


# Opt-in (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny models, one thread.
one_thread = thread_fixture()


def mirror_or_skip():
    """The data mirror folder, or skip the test with a visible reason."""
    mirror = os.environ.get("AIAYN_DATA_MIRROR")
    if not mirror:
        pytest.skip("AIAYN_DATA_MIRROR is not set (real-data test; `make test` sets it when ../shared/data exists)")
    return mirror


# ---- kinds: every test is marked unit, process, serve or browser ------------------------------
# unit: in-process (no subprocess, no listening socket, no browser): `pytest -m unit` is the inner
# loop. process: spawns the CLI or another process. serve: starts the HTTP app or a server.
# browser: drives Chromium (it also serves and spawns). A test has every kind that applies; unit
# only when none of the others does. The kinds of a module's tests are in MODULE_KINDS; a test
# whose kinds differ from its module's is in TEST_KINDS (they replace the module's). A test with
# no kind stops the run at collection (tests/test_kinds.py checks both tables), and a unit test
# that starts a process or listens on a socket fails, naming what it did.
KINDS = ("unit", "process", "serve", "browser")

UNIT = ("unit",)
MODULE_KINDS: dict[str, tuple[str, ...]] = {
    "test_allocator": ("process",),
    "test_api_docs": ("process",),  # pdoc renders the API reference in a subprocess
    "test_atomic_folders": UNIT,
    "test_bad_input": UNIT,
    "test_bench_train": UNIT,
    "test_cache": UNIT,
    "test_compiled_step": UNIT,
    "test_continuous": UNIT,
    "test_card": UNIT,
    "test_cli_help": UNIT,
    "test_cli_options": UNIT,
    "test_reference": UNIT,
    "test_config": UNIT,
    "test_cuda": UNIT,
    "test_data_batching": UNIT,
    "test_data_download": ("serve",),  # a local HTTP server stands for the dataset sources
    "test_data_files": UNIT,
    "test_data_store": UNIT,
    "test_decode_controls": UNIT,
    "test_decode_settings": UNIT,
    "test_data_wmt": ("serve",),  # WMT14 prepared from a local HTTP server of fake archives
    "test_data_tokenizer": UNIT,
    "test_docs": UNIT,
    "test_ensemble": UNIT,
    "test_export": UNIT,
    "test_folder": UNIT,
    "test_folder_config": UNIT,
    "test_gpu_check": ("process",),
    "test_inference_edges": UNIT,
    "test_hf_export": UNIT,
    "test_hf_import": UNIT,
    "test_finetune": UNIT,
    "test_hf_tokenizer": UNIT,
    "test_hf_tools": ("serve",),
    "test_imports": UNIT,
    "test_io": UNIT,
    "test_io_hosts": UNIT,
    "test_kinds": UNIT,
    "test_kinds_registry": UNIT,
    "test_make_demo": ("process",),  # runs make with a fake aiayn
    "test_make_results": UNIT,
    "test_mlm": UNIT,
    "test_model": UNIT,
    "test_model_options": UNIT,
    "test_model_parity": UNIT,
    "test_model_shapes": UNIT,
    "test_naive_bayes": UNIT,
    "test_output_vocab": UNIT,
    "test_paper_bleu": UNIT,
    "test_recase": UNIT,
    "test_scripts_smoke": ("process",),
    "test_sampling": UNIT,
    "test_search": UNIT,
    "test_seed_pairs": UNIT,
    "test_serve": ("serve",),
    "test_serve_controls": ("serve",),
    "test_serve_input": ("serve",),
    "test_serve_images": ("serve",),
    "test_serve_lanes": ("serve", "process"),
    "test_serve_steps": UNIT,
    "test_serve_page": ("browser", "serve", "process"),
    "test_shapes_cli": UNIT,
    "test_shipped_configs": UNIT,
    "test_syncs": UNIT,
    "test_threads": UNIT,
    "test_toy_kind": ("serve",),
    "test_train_cli": UNIT,
    "test_train_ddp": ("process",),
    "test_train_loop": UNIT,
    "test_train_progress": UNIT,
    "test_train_recipe": UNIT,
    "test_train_regularisation": UNIT,
    "test_train_resume": UNIT,
    "test_translate_cli": UNIT,
    "test_trust": UNIT,
    "test_viz": UNIT,
    "test_vision": UNIT,
    "test_vision_data": UNIT,
    "test_warmup": UNIT,
    "test_walkthrough": UNIT,
}

TEST_KINDS: dict[str, tuple[str, ...]] = {
    "test_vision::test_an_image_model_is_served_with_its_info": ("serve",),
    "test_finetune::test_a_finetuned_folder_is_served": ("serve",),
    "test_compiled_step::test_the_compiled_package_decodes_what_the_module_code_decodes": (
        "process",
    ),  # the compiler (g++) runs
    "test_warmup::test_the_compiled_forward_gives_the_eager_losses": ("process",),  # g++ runs
    "test_data_store::test_two_processes_racing_build_once": ("process",),
    "test_data_store::test_sigkill_mid_build_leaves_no_store_that_looks_complete": ("process",),
    "test_data_store::test_resume_and_a_second_run_reuse_tokenizer_and_store": ("process",),
    "test_data_store::test_data_build_and_stats_commands": ("process",),
    "test_bad_input::test_a_real_safetensors_write_error_is_one_line": ("process",),
    "test_atomic_folders::test_sigkill_between_the_two_renames_keeps_the_old_folder": ("process",),
    "test_bench_train::test_worker_protocol_runs_round_robin": ("process",),
    "test_train_progress::test_train_logs_progress_lines_to_a_redirected_stderr_and_q_silences_them": (
        "process",
    ),
    "test_config::test_a_bad_config_in_a_real_process_is_one_line_and_exit_2": ("process",),
    "test_cli_help::test_help_and_version_import_neither_torch_nor_a_command": ("process",),
    "test_cli_help::test_version_answers_in_a_fraction_of_a_second": ("process",),
    "test_data_download::test_fetch_from_a_local_path": UNIT,
    "test_data_download::test_unknown_dataset_name": UNIT,
    "test_data_download::test_real_mirror_prepares_every_dataset": UNIT,
    "test_data_download::test_real_mirror_missing_a_file": UNIT,
    "test_data_files::test_cli_process_exit_code_without_traceback": ("process",),
    "test_gpu_check::test_the_gpu_settings_make_valid_configs": UNIT,
    "test_imports::test_every_module_imports_in_a_random_order_in_one_interpreter": ("process",),
    "test_kinds::test_a_test_without_a_kind_stops_the_run": ("process",),
    "test_kinds::test_a_unit_test_that_starts_a_process_fails": ("process",),
    "test_kinds_registry::test_loading_and_translating_imports_nothing_from_train": ("process",),
    "test_train_resume::test_sigkill_then_resume_is_bit_identical": ("process",),
    "test_translate_cli::test_errors_exit_nonzero_without_traceback_in_a_real_process": ("process",),
}


def _kinds_of(item: pytest.Item) -> set[str]:
    return {mark.name for mark in item.iter_markers() if mark.name in KINDS}


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups (_order_and_group)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.name.removesuffix(".py")
        name = getattr(item, "originalname", item.name)
        for kind in TEST_KINDS.get(f"{module}::{name}", MODULE_KINDS.get(module, ())):
            item.add_marker(kind)
    unmarked = [item.nodeid for item in items if not _kinds_of(item)]
    if unmarked:
        raise pytest.UsageError(
            f"tests without a kind ({', '.join(KINDS)}): {len(unmarked)}, e.g. {unmarked[0]}: add "
            "the module to MODULE_KINDS in tests/conftest.py (or the test to TEST_KINDS)")
    _keep_slow_out_unless_asked(config, items)
    _order_and_group(items)


# ---- order and distribution over pytest-xdist's workers (`make test`: -n auto --dist loadgroup) ----
# Each module's tests go to one worker (an xdist_group per module), so that a module-scoped
# fixture (a trained model folder…) is built once, not once per worker; but the modules in SPREAD,
# whose tests are long and independent, are spread over the workers test by test. The groups are
# handed out in this order (xdist's own reordering, by test count, is turned off below): the
# longest first, so that the workers finish together instead of one finishing a long module alone.
# LONGEST_FIRST, then MODULE_SECONDS (each module's seconds on one worker, measured with
# `pytest -n 2 --durations=0` on the loaded 2-core machine, 2026-11-29: a stale figure only costs
# balance), then the modules with a test that starts processes, then the rest in file order.
LONGEST_FIRST = ("test_gpu_check", "test_scripts_smoke")
SPREAD = ("test_scripts_smoke",)
MODULE_SECONDS = {
    "test_data_store": 204, "test_finetune": 138, "test_export": 121, "test_allocator": 82,
    "test_train_resume": 73, "test_model": 67, "test_shapes_cli": 63, "test_bad_input": 55,
    "test_viz": 48, "test_train_ddp": 47, "test_atomic_folders": 38, "test_serve_page": 38,
    "test_api_docs": 33, "test_data_files": 33, "test_imports": 30, "test_kinds": 26,
    "test_decode_controls": 26, "test_recase": 24, "test_hf_import": 20, "test_translate_cli": 20,
}


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", None) == "loadgroup" and hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # keep the order of _order_and_group


def _order_and_group(items: list[pytest.Item]) -> None:
    def module(item: pytest.Item) -> str:
        return item.path.name.removesuffix(".py")

    starts_processes = {module(item) for item in items if "process" in _kinds_of(item)}

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = module(item)
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        if name in MODULE_SECONDS:
            return 1, -MODULE_SECONDS[name]
        return (2 if name in starts_processes else 3), 0

    items.sort(key=rank)  # stable: a module's tests stay together and in their order
    for item in items:
        if module(item) not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(module(item)))
            _name_the_group(item, module(item))


def _name_the_group(item: pytest.Item, group: str) -> None:
    """pytest-xdist (3.8) puts an item in its group by appending ``@group`` to ``item._nodeid``,
    which pytest 9 no longer reads (the id is ``item._id``): without this, ``--dist loadgroup``
    hands the tests out one by one, and a module's fixtures are built on both workers."""
    if getattr(item.config.option, "loadgroup", False) and hasattr(item, "_id"):
        if "@" not in item.nodeid:
            item._id = type(item._id).parse(f"{item.nodeid}@{group}")


def _keep_slow_out_unless_asked(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``-m unit`` replaces the default ``-m 'not slow'``: slow tests still run only when ``-m``
    names them (``make test-slow``) or no ``-m`` is given (``-o addopts=``)."""
    markexpr = config.getoption("markexpr", "")
    if not markexpr or "slow" in markexpr:
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


# What the running test did that a unit test must not: "started a process", "listened on a socket".
_seen: list[str] | None = None


def _watch(what: str, original: Callable) -> Callable:
    def watched(*args, **kwargs):
        if _seen is not None:
            _seen.append(what)
        return original(*args, **kwargs)

    return watched


subprocess.Popen.__init__ = _watch("started a process", subprocess.Popen.__init__)
multiprocessing.process.BaseProcess.start = _watch(
    "started a process", multiprocessing.process.BaseProcess.start)
socket.socket.listen = _watch("listened on a socket", socket.socket.listen)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _unit_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _unit_phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    return (yield from _unit_phase(item))


def _unit_phase(item: pytest.Item):
    """Run one phase of ``item`` (a generator for a hook wrapper), watching what it does; a unit
    test that started a process or listened on a socket fails after the phase."""
    global _seen
    _seen = []
    try:
        result = yield
    finally:
        seen, _seen = _seen, None
    if seen and _kinds_of(item) == {"unit"}:
        raise pytest.fail.Exception(
            f"{item.nodeid} is marked unit but {seen[0]}: give it the kind it has in "
            "tests/conftest.py (TEST_KINDS or MODULE_KINDS)", pytrace=False)
    return result


@pytest.fixture(scope="session")
def marian_folder(tmp_path_factory):
    """A tiny Hugging Face Marian folder (tests/hf_helpers.py), built once a run: under
    pytest-xdist the first worker to need it builds it in the run's shared temporary folder and
    the others wait for it (a file lock); skipped, saying why, without transformers,
    sentencepiece or the Multi30k mirror."""
    from hf_helpers import build_marian

    pytest.importorskip("transformers", reason="needs transformers (the test extra)")
    pytest.importorskip("sentencepiece", reason="needs sentencepiece (the test or hf extra)")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' basetemps are its folders popen-gw0, popen-gw1…
    folder, built = root / "marian" / "opus-mt-tiny", root / "marian" / "built"
    folder.parent.mkdir(exist_ok=True)
    with open(root / "marian" / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that died halfway
            build_marian(folder)
            built.touch()
    return folder
