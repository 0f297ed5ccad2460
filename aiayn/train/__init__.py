"""Training: one loop for every model shape, the paper's recipe, exact resume, DDP, averaging.

``aiayn train CONFIG.toml`` calls :func:`train_run`; a model shape plugs in as a
:class:`~aiayn.train.task.Task` registered with :func:`~aiayn.train.task.register_shape`.
"""

# The built-in model shapes; each registers itself in aiayn.train.task.SHAPES on import.
from aiayn.train import classification, lm, mlm, translation  # noqa: F401
from aiayn.train.average import average_checkpoints
from aiayn.train.config import RunConfig, TrainConfig, load_run_config
from aiayn.train.loss import label_smoothed_nll_loss, projected_label_smoothed_nll_loss
from aiayn.train.run import resume_config, train_run
from aiayn.train.schedule import cosine_lr, inverse_sqrt_lr, make_schedule, noam_lr
from aiayn.train.task import SHAPES, StepStats, Task, build_task, register_shape
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
    "SHAPES",
    "register_shape",
    "build_task",
    "Trainer",
    "TrainingDiverged",
    "TrainResult",
    "train_run",
    "resume_config",
    "average_checkpoints",
]
