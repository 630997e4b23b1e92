"""The console's progress bar: on a terminal with a known end only; plain lines everywhere else."""

import io
import logging

import pytest

from sf_core.config import Config
from sf_core.run.progress import FrameRate, Progress, RunEnd


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_end_is_known_only_when_a_limit_is_set():
    assert RunEnd.from_config(Config()) is None  # both limits at their never-reached defaults
    assert RunEnd.from_config(Config(train_for_env_steps=1_000_000)) == RunEnd(1_000_000, None)
    assert RunEnd.from_config(Config(train_for_seconds=60.0)) == RunEnd(None, 60.0)


def test_eta_from_the_frame_rate_the_clock_or_whichever_ends_first():
    frames_only = RunEnd(frames=1_000_000, seconds=None)
    assert frames_only.eta(frames=200_000, elapsed=20.0, fps=10_000.0) == pytest.approx(80.0)
    assert frames_only.eta(frames=200_000, elapsed=20.0, fps=0.0) is None  # no rate yet: unknown
    assert frames_only.fraction(250_000, 20.0) == pytest.approx(0.25)
    seconds_only = RunEnd(frames=None, seconds=60.0)
    assert seconds_only.eta(frames=0, elapsed=45.0, fps=0.0) == pytest.approx(15.0)
    assert seconds_only.fraction(10**9, 15.0) == pytest.approx(0.25)
    both = RunEnd(frames=1_000_000, seconds=60.0)
    assert both.eta(frames=200_000, elapsed=20.0, fps=10_000.0) == pytest.approx(40.0)  # the clock first
    assert both.eta(frames=900_000, elapsed=20.0, fps=10_000.0) == pytest.approx(10.0)  # the frames first
    assert both.fraction(900_000, 20.0) == pytest.approx(0.9)
    assert both.eta(frames=2_000_000, elapsed=70.0, fps=1.0) == 0.0 and both.fraction(2_000_000, 70.0) == 1.0


def test_the_frame_rate_is_recent():
    rate = FrameRate()
    assert rate.update(0.0, 0) == 0.0
    rate.update(5.0, 5_000)
    assert rate.update(10.0, 10_000) == pytest.approx(1_000.0)
    rate.update(20.0, 110_000)  # faster now: the start of the run leaves the window
    assert rate.update(25.0, 160_000) == pytest.approx(10_000.0)


def test_no_bar_when_the_output_is_not_a_terminal():
    out = io.StringIO()
    progress = Progress(Config(train_for_env_steps=1000), started=0.0, stream=out)
    progress.update(500, now=10.0)
    progress.close()
    assert not progress.enabled and out.getvalue() == ""  # the log lines stay as they were


def test_no_bar_on_a_terminal_when_the_run_has_no_known_end():
    out = Terminal()
    progress = Progress(Config(), started=0.0, stream=out)
    progress.update(500, now=10.0)
    progress.close()
    assert not progress.enabled and out.getvalue() == ""


def test_the_bar_shows_progress_and_eta_and_log_lines_pass_above_it():
    out = Terminal()
    handler = logging.StreamHandler(out)
    log = logging.getLogger("sf_core")
    log.addHandler(handler)
    progress = Progress(Config(train_for_env_steps=100_000), started=0.0, stream=out)
    try:
        assert progress.enabled
        progress.update(0, now=1.0)
        progress.update(25_000, now=6.0)
        log.warning("a console line")
        text = out.getvalue()
        assert " 25%|" in text and "25,000/100,000 frames" in text and "5,000 fps" in text
        assert "ETA 00:15" in text  # 75,000 frames left at 5,000 per second
        assert "a console line\n" in text
    finally:
        progress.close()
        log.removeHandler(handler)
    assert all(type(h).__name__ != "_TqdmLoggingHandler" for h in log.handlers)


def test_busy_shares_never_pass_all_of_the_window_and_an_empty_window_gives_no_advice(monkeypatch):
    from sf_core.run import stats as stats_module
    from sf_core.run.stats import TrainingStats

    now = [1000.0]
    monkeypatch.setattr(stats_module.time, "time", lambda: now[0])
    stats = TrainingStats(window=10, started=now[0], component_counts={"env_step": 2, "inference": 1, "learner": 1})
    now[0] += 1.0
    stats.seconds.update(env_step=0.5, inference=1.3, learner=0.2)  # a report also counted work from before
    busy = stats.busy_fractions()
    assert busy == {"env_step": 0.25, "inference": 1.0, "learner": 0.2}
    now[0] += 0.01  # the final line, right after the last: nothing reported in between
    hint = stats.bottleneck_hint()
    assert hint == "busy: no report since the last line"


def test_a_resumed_runs_time_to_target_and_training_seconds_count_its_earlier_sessions(monkeypatch):
    """As --train_for_seconds counts: a target reached 30 s into a session that resumed 100 s of training
    was reached after 130 s of training; the session's own `seconds` stay its own."""
    from sf_core.run import stats as stats_module
    from sf_core.run.stats import TrainingStats

    now = [1000.0]
    monkeypatch.setattr(stats_module.time, "time", lambda: now[0])
    first = TrainingStats(window=2, started=now[0])
    now[0] += 100.0
    saved = first.checkpoint_state(0.0)
    now[0] += 500.0  # the experiment lies idle between its sessions
    resumed = TrainingStats(window=2, started=now[0])
    resumed.restore(saved)
    now[0] += 30.0
    resumed.mark_target_reached(now[0])
    now[0] += 5.0
    summary = resumed.summary(0, None)
    assert summary["time_to_target"] == pytest.approx(130.0)
    assert summary["seconds"] == pytest.approx(35.0) and summary["training_seconds"] == pytest.approx(135.0)
    fresh = TrainingStats(window=2, started=now[0])
    now[0] += 7.0
    fresh.mark_target_reached(now[0])
    assert fresh.summary(0, None)["time_to_target"] == pytest.approx(7.0)
