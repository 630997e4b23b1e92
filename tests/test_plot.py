"""`sf_core.plot` on TensorBoard logs written as the runner writes them: a line per experiment, and a
line per policy for a run of several (its policy_{K}/ scalars), in both panels."""

from __future__ import annotations

import os

import pytest

from sf_core.cli.plot import draw, main
from sf_core.config import Config
from tests.conftest import extra

extra("matplotlib", "plot")


def fake_run(train_dir, name: str, num_policies: int, policies_logged: int | None = None) -> None:
    """config.json and TensorBoard scalars: the overall return, and each logged policy's return
    (policy K's curve is 100 * (K + 1) at every point, so the lines can be told apart)."""
    from torch.utils.tensorboard import SummaryWriter

    path = os.path.join(str(train_dir), name)
    os.makedirs(path)
    cfg = Config(env="CartPole-v1", experiment=name, train_dir=str(train_dir), num_policies=num_policies)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(cfg.to_json())
    logged = num_policies if policies_logged is None else policies_logged
    with SummaryWriter(os.path.join(path, "tb")) as writer:
        for i in range(4):
            step = (i + 1) * 1000
            writer.add_scalar("episode/return", 7.0, step)
            writer.add_scalar("perf/training_hours", (i + 1) / 3600, step)
            for k in range(logged if num_policies > 1 else 0):
                writer.add_scalar(f"policy_{k}/episode/return", 100.0 * (k + 1), step)


def lines(figure) -> list[list[tuple[str, tuple]]]:
    """Each panel's lines as (label, y values)."""
    return [[(line.get_label(), tuple(line.get_ydata())) for line in ax.get_lines()] for ax in figure.axes]


def test_a_run_of_several_policies_draws_a_line_per_policy_in_both_panels(tmp_path):
    import matplotlib.pyplot as plt

    fake_run(tmp_path, "pop", num_policies=3)
    fake_run(tmp_path, "solo", num_policies=1)
    figure = draw(str(tmp_path), ["pop", "solo"])
    try:
        expected = [("pop policy 0", (100.0,) * 4), ("pop policy 1", (200.0,) * 4), ("pop policy 2", (300.0,) * 4),
                    ("solo", (7.0,) * 4)]
        assert lines(figure) == [expected, expected]
        assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()] == [label for label, _ in expected]
        assert list(figure.axes[1].get_lines()[0].get_xdata()) == pytest.approx([1.0, 2.0, 3.0, 4.0])  # seconds
    finally:
        plt.close(figure)


def test_policies_without_a_curve_yet_are_left_out_and_other_tags_stay_one_line(tmp_path):
    import matplotlib.pyplot as plt

    fake_run(tmp_path, "pop", num_policies=3, policies_logged=2)  # policy 2 has finished no episode
    figure = draw(str(tmp_path), ["pop"])
    try:
        assert [label for label, _ in lines(figure)[0]] == ["pop policy 0", "pop policy 1"]
    finally:
        plt.close(figure)
    figure = draw(str(tmp_path), ["pop"], tag="perf/training_hours")  # not logged per policy: the run's line
    try:
        assert [label for label, _ in lines(figure)[1]] == ["pop"]
    finally:
        plt.close(figure)


def test_the_command_writes_the_image(tmp_path, capsys):
    fake_run(tmp_path, "pop", num_policies=2)
    out = tmp_path / "curves.png"
    assert main([f"--train_dir={tmp_path}", "--experiments", "pop", f"--output={out}"]) == 0
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert main([f"--train_dir={tmp_path}", "--experiments", "missing", f"--output={out}"]) == 2
    assert "no TensorBoard logs" in capsys.readouterr().err
