"""Training: one loop for every model kind, the paper's recipe, exact resume, DDP, averaging.

``aiayn train CONFIG.toml`` calls :func:`train_run`; a model kind plugs in as a
:class:`~aiayn.train.task.Task` named by its entry in :data:`aiayn.kinds.KINDS`.
"""

from aiayn.run_config import RunConfig, TrainConfig, load_run_config
from aiayn.train.average import average_checkpoints
from aiayn.train.loss import label_smoothed_nll_loss, projected_label_smoothed_nll_loss
from aiayn.train.run import resume_config, train_run
from aiayn.train.schedule import cosine_lr, inverse_sqrt_lr, make_schedule, noam_lr
from aiayn.train.task import StepStats, Task, build_task
from aiayn.train.trainer import Trainer, TrainingDiverged, TrainResult
from aiayn.train.translation import TranslationTask

__all__ = [
    "RunConfig",
    "TrainConfig",
    "load_run_config",
    "label_smoothed_nll_loss",
    "projected_label_smoothed_nll_loss",
    "noam_lr",
    "cosine_lr",
    "inverse_sqrt_lr",
    "make_schedule",
    "Task",
    "StepStats",
    "TranslationTask",
    "build_task",
    "Trainer",
    "TrainingDiverged",
    "TrainResult",
    "train_run",
    "resume_config",
    "average_checkpoints",
]
