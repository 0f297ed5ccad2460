"""What training says while it trains (a line every train.log_every updates and at each
validation, on stderr whether or not it is a terminal; -q silences it), the shared progress bar,
and budgets that mean what they say: the schedule decays over the budget that ends the run, or a
line says it will not (issue 66, findings 1 and 2)."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest
from trainutil import base_values, one_thread, run_aiayn, write_toml  # noqa: F401

from aiayn.progress import progress_bar
from aiayn.run_config import TrainConfig, build_run_config
from aiayn.train.average import average_checkpoints
from aiayn.train.report import TrainReport, clock, remaining
from aiayn.train.run import train_run
from aiayn.train.schedule import make_schedule
from aiayn.train.trainer import Trainer

LINE = re.compile(
    r"^step (\d+)(/\d+)? \| loss [\d.]+ \| lr [\d.e+-]+ \| [\d,]+ tok/s \| [\d:]+ elapsed \| "
    r"ETA [\d:]+ \((max_steps|max_time|max_epochs)\)$"
)


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ---- finding 2: a step budget given to a recipe on the clock ------------------------------------


def _own_data(**over) -> TrainConfig:
    """configs/own_data.toml's [train] schedule, with ``over``."""
    values = dict(lr_schedule="cosine", schedule_clock="time", lr=3e-3, min_lr=1e-4,
                  warmup_steps=400, max_steps=50000, max_time=1800)
    return TrainConfig(**{**values, **over})


def test_a_step_budget_on_the_time_clock_decays_to_min_lr():
    # The finding: --set train.max_steps=400 --set train.warmup_steps=50 on own_data.toml ended
    # at lr 2.89e-3 against a 3e-3 peak, 400 updates being a sliver of the 1,800 s budget.
    cfg = _own_data(max_steps=400, warmup_steps=50)
    schedule = make_schedule(cfg, 128)
    assert schedule(400, 0.05) == pytest.approx(1e-4)
    assert schedule(225, 0.05) == pytest.approx((3e-3 + 1e-4) / 2)  # halfway from 50 to 400
    assert schedule(50, 0.0) == pytest.approx(3e-3)
    # the time budget still governs when it runs out first
    assert schedule(100, 1.0) == pytest.approx(1e-4)
    # the recipe as shipped: 50,000 updates are a safety net, the clock decays the rate
    shipped = make_schedule(_own_data(), 128)
    assert shipped(2000, 0.5) == pytest.approx((3e-3 + 1e-4) / 2, rel=1e-3)


def test_a_clock_run_given_a_step_budget_ends_at_min_lr(tmp_path):
    cfg = build_run_config(base_values(tmp_path / "data", lr_schedule="cosine", lr=1e-3,
                                       min_lr=1e-5, warmup_steps=2, schedule_clock="time",
                                       max_time=3600.0, max_steps=8, log_every=1))
    result = train_run(cfg, tmp_path / "run")
    assert result.stop_reason == "max_steps" and result.step == 8
    lrs = [r["lr"] for r in _metrics(tmp_path / "run")]
    assert lrs[1] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-5)
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))


# ---- the other way round: a schedule over updates cut short by the time budget ------------------


def test_a_time_budget_that_cuts_a_cosine_over_updates_short_says_so(tmp_path, monkeypatch, caplog):
    # Every update takes 10 s: max_time = 100 s ends the run at update 10 of the cosine's 40.
    monkeypatch.setattr(Trainer, "_wall", lambda self: 10.0 * (self.progress.step + 1))
    cfg = build_run_config(base_values(tmp_path / "data", lr_schedule="cosine", lr=1e-3,
                                       min_lr=1e-5, warmup_steps=2, max_steps=40, max_time=100.0,
                                       log_every=2, valid_every=0))
    with caplog.at_level(logging.INFO, logger="aiayn"):
        result = train_run(cfg, tmp_path / "run")
    assert result.stop_reason == "max_time" and result.step == 10
    warnings = [r.getMessage() for r in caplog.records if r.name == "aiayn.train.report"
                and r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "max_time = 100 s ends the run near update 10" in warnings[0]
    assert "set train.max_steps=10" in warnings[0] and "schedule_clock=time" in warnings[0]
    # and no such line when the updates run out first
    caplog.clear()
    cfg = build_run_config(base_values(tmp_path / "data", lr_schedule="cosine", lr=1e-3,
                                       min_lr=1e-5, warmup_steps=2, max_steps=8, max_time=1000.0,
                                       log_every=2, valid_every=0))
    with caplog.at_level(logging.INFO, logger="aiayn"):
        train_run(cfg, tmp_path / "run2")  # the same data: no warning of a store built again
    assert not [r for r in caplog.records if r.name == "aiayn.train.report"
                and r.levelno == logging.WARNING]


def test_the_eta_is_against_the_budget_that_ends_first():
    cfg = TrainConfig(max_steps=1500, max_time=900, warmup_steps=10)
    # 0.5 s per update: 1,000 updates left take 500 s, before the 800 s left of max_time
    b = remaining(cfg, 500, 100.0, 0.5, None)
    assert (b.name, b.seconds, b.last_step) == ("max_steps", 500.0, 1500)
    # 1 s per update: max_time ends it, at update 500 + 800
    b = remaining(cfg, 500, 100.0, 1.0, None)
    assert (b.name, b.seconds, b.last_step) == ("max_time", 800.0, 1300)
    b = remaining(TrainConfig(max_steps=0, max_epochs=3), 10, 5.0, 0.5, 40)
    assert (b.name, b.seconds, b.last_step) == ("max_epochs", 20.0, 50)
    assert remaining(TrainConfig(max_steps=0), 10, 5.0, 0.5, None) is None
    assert clock(59.6) == "1:00" and clock(3725) == "1:02:05"


def test_lines_at_log_every_and_at_each_validation(tmp_path, caplog):
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=8, log_every=2, valid_every=4,
                                       metrics_every=4, bleu_max_sentences=4))
    with caplog.at_level(logging.INFO, logger="aiayn"):
        train_run(cfg, tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records if r.name == "aiayn.train.report"]
    steps = [m for m in lines if m.startswith("step ")]
    assert [int(LINE.match(m).group(1)) for m in steps] == [2, 4, 6, 8], steps
    assert all(m.split("ETA")[1].endswith("(max_steps)") and "/8 |" in m for m in steps)
    valid = [m for m in lines if m.startswith("valid ")]
    assert len(valid) == 2 and all(re.match(r"valid step [48] \| loss [\d.]+ \| ppl [\d.]+ \| "
                                            r"bleu [\d.]+ \| chrf [\d.]+", m) for m in valid)


def test_a_report_off_rank_0_or_under_q_says_nothing(caplog):
    cfg = TrainConfig(max_steps=10)
    record = {"step": 2, "wall": 1.0, "loss": 1.0, "lr": 1e-3, "tokens_per_s": 10.0}
    with caplog.at_level(logging.WARNING, logger="aiayn"):  # -q
        TrainReport(cfg, 0, 0.0, shown=True).train_line(record, None)
    with caplog.at_level(logging.INFO, logger="aiayn"):
        TrainReport(cfg, 0, 0.0, shown=False).train_line(record, None)  # rank > 0
    assert caplog.records == []


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (of no known size, as `script`'s pseudo-terminal)."""

    def isatty(self) -> bool:
        return True


def test_the_bar_is_off_when_stderr_is_no_terminal(caplog):
    caplog.set_level(logging.INFO, logger="aiayn")
    bar = progress_bar(3, "x")
    assert bar.disable
    bar.close()


def test_a_terminal_gets_the_bars_of_train_and_average_and_q_hides_them(tmp_path, monkeypatch,
                                                                       caplog):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    caplog.set_level(logging.INFO, logger="aiayn")
    cfg = build_run_config(base_values(tmp_path / "data", max_steps=4, save_every=2, valid_every=2,
                                       warmup_steps=2))
    train_run(cfg, tmp_path / "run")
    average_checkpoints(tmp_path / "run", 2, tmp_path / "avg")
    drawn = terminal.getvalue()
    assert re.search(r"train: +\d+%\|.*\| 4/4", drawn), drawn  # drawn at 80 columns
    assert re.search(r"average: +\d+%\|.*\| [02]/2", drawn), drawn
    caplog.set_level(logging.WARNING, logger="aiayn")  # -q
    terminal.seek(0)
    terminal.truncate()
    train_run(cfg, tmp_path / "quiet")
    average_checkpoints(tmp_path / "quiet", 2, tmp_path / "quiet_avg")
    assert terminal.getvalue() == ""


# ---- the command line: stderr is a pipe here, as in a log file ----------------------------------


def test_train_logs_progress_lines_to_a_redirected_stderr_and_q_silences_them(tmp_path):
    values = base_values(tmp_path / "data", max_steps=4, log_every=2, valid_every=4,
                         warmup_steps=2)
    config = write_toml(tmp_path / "run.toml", values)
    done = run_aiayn("train", str(config), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stderr.splitlines() if LINE.match(line)]
    assert [LINE.match(line).group(1) for line in steps] == ["2", "4"], done.stderr
    assert re.search(r"^valid step 4 \| loss [\d.]+ \| ppl [\d.]+ \| best$", done.stderr, re.M)
    assert "\r" not in done.stderr  # no bar drawn into a pipe
    quiet = run_aiayn("-q", "train", str(config), "--out", str(tmp_path / "quiet"),
                      "--set", "train.max_steps=2", "--set", "train.warmup_steps=1")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", quiet.stderr
