"""The run configuration, as training imports it: :mod:`aiayn.run_config` (which lives below
:mod:`aiayn.train`, so that reading a model folder's config.json never imports the trainer)."""

from aiayn.run_config import (
    RENAMED,
    SECTIONS,
    RunConfig,
    TrainConfig,
    build_run_config,
    check_run_config,
    load_run_config,
    micro_batches_per_update,
    parse_sets,
    renamed_keys,
    run_config_from_dict,
    run_config_to_dict,
    run_inputs,
    warn_run_config,
)

__all__ = [
    "RENAMED",
    "SECTIONS",
    "RunConfig",
    "TrainConfig",
    "build_run_config",
    "check_run_config",
    "load_run_config",
    "micro_batches_per_update",
    "parse_sets",
    "renamed_keys",
    "run_config_from_dict",
    "run_config_to_dict",
    "run_inputs",
    "warn_run_config",
]
