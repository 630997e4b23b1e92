"""`--help` shows the values a command line gets: the env's preset or the defaults fitted to its spaces, the
flags typed with it, and a line naming what applies."""

from __future__ import annotations

import pytest

from sf_core.cli.arguments import parse_args
from sf_core.cli.help_values import WITHOUT_ENV


def help_text(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        parse_args(argv)
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal's width


@pytest.mark.parametrize("argv", [["--env=HalfCheetah-v5", "--help"], ["--help", "--env", "HalfCheetah-v5"],
                                  ["-h", "--algo=PPO", "--env=HalfCheetah-v5"]])
def test_help_with_an_env_shows_its_presets_values_and_where_they_come_from(argv, capsys):
    text = help_text(argv, capsys)
    assert "Adam learning rate. (default: 0.0003, from the HalfCheetah-v5 preset)" in text
    assert "Passes over each dataset. (default: 10, from the HalfCheetah-v5 preset)" in text
    assert "(default: 0.0001)" not in text  # Sample Factory's learning rate is not what this run gets
    line = "--env=HalfCheetah-v5: the HalfCheetah-v5 preset applies"
    assert text.count(line) == 2  # at the top and at the bottom


def test_a_flag_typed_with_help_wins_and_shows_what_it_replaced(capsys):
    text = help_text(["--env=CartPole-v1", "--algo=PPO", "--learning_rate=0.01", "--help"], capsys)
    assert "Adam learning rate. (typed: 0.01; default: 0.003, from the CartPole-v1 preset)" in text
    assert "(default: 256, from the CartPole-v1 preset for vector envs)" in text  # --num_envs_per_worker


def test_help_for_another_version_names_the_preset_it_was_made_for(capsys):
    text = help_text(["--env=HalfCheetah-v4", "--help"], capsys)
    assert "the HalfCheetah-v5 preset applies (made for HalfCheetah-v5: HalfCheetah-v4 has the same spaces)" in text
    assert "(default: 0.0003, from the HalfCheetah-v5 preset)" in text


def test_help_for_an_env_without_a_preset_shows_the_defaults_fitted_to_its_spaces(capsys):
    text = help_text(["--env=sf_core/Corridor-v0", "--help"], capsys)
    assert ("--env=sf_core/Corridor-v0 has no preset; defaults fitted to its spaces (a vector observation of 30 "
            "numbers and 2 actions) apply") in text
    assert "Adam learning rate. (default: 0.001, fitted to the env's spaces)" in text
    assert "(default: [64, 64], fitted to the env's spaces)" in text


def test_help_without_an_env_says_presets_exist_and_how_to_see_them(capsys):
    text = help_text(["--help"], capsys)
    assert " ".join(WITHOUT_ENV.split()) in text
    assert "Adam learning rate. (default: 0.0001)" in text


def test_help_for_an_env_nothing_applies_to_says_so(capsys):
    text = help_text(["--env=NoSuchEnv-v0", "--help"], capsys)
    assert "--env=NoSuchEnv-v0: no preset applies, and no defaults are fitted to its spaces" in text
    text = help_text(["--env=Pendulum-v0", "--help"], capsys)
    assert "no preset for Pendulum-v0; Pendulum-v1 has one, not applied" in text
    text = help_text(["--env=Pusher-v4", "--help"], capsys)
    assert "--env=Pusher-v4: the MuJoCo preset applies" in text  # its family's


def test_help_with_a_bad_value_is_still_the_help_and_says_why_the_values_are_not_shown(capsys):
    text = help_text(["--env=CartPole-v1", "--learning_rate=fast", "--help"], capsys)
    assert "(The values of this command line could not be read: argument --learning_rate: invalid float" in text
    assert "Adam learning rate. (default: 0.0001)" in text
