"""PBT decisions (sf_core/run/pbt.py): who is replaced, by whom, with which hyperparameters; logged and resumable."""

from __future__ import annotations

import io
import json
import logging

import pytest
import torch

from sf_core.cli.arguments import parse_args
from sf_core.run.pbt import BOUND_MARGIN, PopulationBasedTraining, Replacement, replace_count

PERIOD = 1000
START = 2000
GOOD = [100.0, 90.0, 10.0, 5.0]  # policies 0 and 1 far ahead of 2 and 3


def make_cfg(*extra: str, num_policies: int = 4):
    cfg, _ = parse_args(["--env=CartPole-v1", f"--num_policies={num_policies}", "--with_pbt",
                         f"--pbt_period_env_steps={PERIOD}", f"--pbt_start_mutation={START}",
                         "--pbt_replace_fraction=0.5", "--pbt_mutation_rate=0", *extra])
    return cfg


def make_pbt(*extra: str, seed: int = 0, log_path: str | None = None, num_policies: int = 4):
    return PopulationBasedTraining(make_cfg(*extra, num_policies=num_policies), seed, log_path)


def test_the_worst_policies_take_the_weights_and_hyperparams_of_the_best():
    pbt = make_pbt("--policy_hyperparams", "0:learning_rate=0.001", "1:learning_rate=0.002",
                   "2:learning_rate=0.003", "3:learning_rate=0.004")
    before = [dict(h) for h in pbt.hyperparams]
    made = pbt.update([START] * 4, GOOD)
    assert sorted(r.policy for r in made) == [2, 3]
    for r in made:
        assert r.source in (0, 1)
        assert r.hyperparams == before[r.source]  # mutation rate 0: an exact copy
        assert pbt.hyperparams[r.policy] == before[r.source]
    assert pbt.hyperparams[0] == before[0] and pbt.hyperparams[1] == before[1]
    assert pbt.scalars()["policy_2/pbt/replaced"] == 1.0 and pbt.scalars()["policy_0/pbt/replaced"] == 0.0


def test_each_policy_decides_once_per_period_of_its_own_frames():
    pbt = make_pbt("--pbt_replace_reward_gap=0.5")
    assert pbt.update([START - 1] * 4, GOOD) == []  # all crossed 1000 but are too young
    # policy 1 is close enough to the best to stay (90 against 100): it decides again a period later
    assert [r.policy for r in pbt.update([START, START + 10, START - 1, START - 1], GOOD)] == []
    assert pbt.update([START, START + PERIOD - 1, START - 1, START - 1], [100.0, 10.0, 10.0, 5.0]) == []
    assert [r.policy for r in pbt.update([START, START + PERIOD, START, START - 1], [100.0, 10.0, 10.0, 5.0])] \
        == [1]


def test_a_policy_just_replaced_skips_its_next_decision():
    pbt = make_pbt()
    assert [r.policy for r in pbt.update([START, START, START + 10, START - 1], GOOD)] == [2]
    # its next period's window still holds episodes begun with the weights it lost: it is not judged on it
    assert pbt.update([START, START, START + PERIOD, START - 1], GOOD) == []
    assert pbt.update([START, START, START + 2 * PERIOD - 1, START - 1], GOOD) == []
    assert [r.policy for r in pbt.update([START, START, START + 2 * PERIOD, START - 1], GOOD)] == [2]


def test_a_jump_over_several_periods_decides_once():
    pbt = make_pbt()
    assert len(pbt.update([0, 0, 10 * PERIOD + 5, 0], GOOD)) == 1
    assert pbt.update([0, 0, 12 * PERIOD - 1, 0], GOOD) == []  # 11: the decision a replaced policy skips
    assert len(pbt.update([0, 0, 12 * PERIOD, 0], GOOD)) == 1


def test_no_replacement_before_the_first_period_boundary():
    pbt = make_pbt("--pbt_start_mutation=0")
    assert pbt.update([PERIOD - 1] * 4, GOOD) == []
    assert len(pbt.update([PERIOD] * 4, GOOD)) == 2


def test_no_replacement_while_any_objective_is_unknown():
    pbt = make_pbt()
    assert pbt.update([START] * 4, [100.0, None, 10.0, 5.0]) == []
    assert pbt.update([START + PERIOD] * 4, [100.0, float("nan"), 10.0, 5.0]) == []
    assert len(pbt.update([START + 2 * PERIOD] * 4, GOOD)) == 2


def test_no_replacement_when_the_gap_to_the_best_is_small():
    pbt = make_pbt("--pbt_replace_reward_gap=0.1")
    # best 100: a policy within 10 (0.1 * |100|) of it stays; one just beyond is replaced
    assert [r.policy for r in pbt.update([START] * 4, [100.0, 99.0, 90.5, 89.0])] == [3]
    # negative objectives: the gap is relative to |best|
    pbt = make_pbt("--pbt_replace_reward_gap=0.1")
    assert [r.policy for r in pbt.update([START] * 4, [-100.0, -101.0, -109.0, -111.0])] == [3]


def test_only_the_worst_fraction_is_replaced_and_sources_come_from_the_best():
    pbt = make_pbt("--pbt_replace_fraction=0.3", num_policies=10)
    objectives = [float(10 * k) for k in range(10)]  # policy k's objective is 10k: 0, 1, 2 worst; 7, 8, 9 best
    made = pbt.update([START] * 10, objectives)
    assert sorted(r.policy for r in made) == [0, 1, 2]
    assert {r.source for r in made} <= {7, 8, 9}


@pytest.mark.parametrize("n, fraction, expected", [(2, 0.5, 1), (3, 0.5, 1), (4, 0.3, 2), (10, 0.3, 3),
                                                   (10, 0.05, 1), (5, 0.5, 2)])
def test_replace_count_rounds_up_but_keeps_best_and_worst_apart(n, fraction, expected):
    assert replace_count(n, fraction) == expected


def test_mutation_stays_within_the_perturbation_factors_and_bounded_params_below_one():
    pbt = make_pbt("--pbt_mutation_rate=1", "--pbt_perturb_min=1.1", "--pbt_perturb_max=1.5",
                   "--pbt_hyperparams", "learning_rate", "gamma", "gae_lambda",
                   "--policy_hyperparams", "0:gamma=0.999,gae_lambda=1.0", "1:gamma=0.999,gae_lambda=1.0")
    source_values = dict(pbt.hyperparams[0])
    lr, one_minus_gamma = source_values["learning_rate"], 1 - source_values["gamma"]
    directions = set()
    for step in range(200):
        for r in pbt.update([START + step * PERIOD] * 4, GOOD):
            new = r.hyperparams
            assert lr / 1.5 <= new["learning_rate"] <= lr * 1.5
            assert not lr / 1.1 < new["learning_rate"] < lr * 1.1  # mutated: at least the minimum factor
            directions.add(new["learning_rate"] > lr)
            assert one_minus_gamma / 1.5 - 1e-12 <= 1 - new["gamma"] <= one_minus_gamma * 1.5 + 1e-12
            assert 0 < new["gamma"] < 1 and 0 < new["gae_lambda"] < 1  # gae_lambda 1.0 mutates to just below 1
            assert new["gae_lambda"] == 1 - BOUND_MARGIN
            pbt.hyperparams[r.policy] = dict(source_values)  # keep every draw relative to the same values
    assert directions == {True, False}


def test_bounded_params_stay_above_zero():
    pbt = make_pbt("--pbt_mutation_rate=1", "--pbt_perturb_min=1.5", "--pbt_perturb_max=1.5",
                   "--pbt_hyperparams", "gamma", "--policy_hyperparams", "0:gamma=0.1", "1:gamma=0.1")
    results = {r.hyperparams["gamma"] for step in range(50) for r in pbt.update([START + step * PERIOD] * 4, GOOD)}
    assert BOUND_MARGIN in results  # 1 - 0.9 * 1.5 < 0: kept above 0 (the other direction: 1 - 0.6 = 0.4)
    assert all(0 < g < 1 for g in results)


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_every_replacement_is_one_json_line_and_one_log_line(tmp_path):
    path = tmp_path / "pbt.jsonl"
    pbt = make_pbt("--pbt_mutation_rate=1", log_path=str(path))
    logger, collect = logging.getLogger("sf_core"), Collect()  # its own handler: the entry points stop propagation
    level = logger.level
    logger.addHandler(collect)
    logger.setLevel(logging.INFO)
    try:
        first = pbt.update([START, START, START, START + 7], GOOD)
    finally:
        logger.removeHandler(collect)
        logger.setLevel(level)
    lines = path.read_text().splitlines()
    assert len(lines) == len(first) == 2
    events = [json.loads(line) for line in lines]
    for r, event in zip(first, events):
        assert {"time", "frames", "policy", "source", "objectives", "old_hyperparams", "new_hyperparams",
                "mutated"} <= set(event)
        assert (event["policy"], event["source"], event["new_hyperparams"]) == (r.policy, r.source, r.hyperparams)
        assert event["objectives"] == GOOD
        assert sorted(event["mutated"]) == sorted(make_cfg().pbt_hyperparams)  # rate 1: all of them
    assert events[1]["frames"] == START + 7
    records = [m for m in collect.messages if m.startswith("PBT:")]
    assert len(records) == 2 and all("\n" not in m and "replaced by policy" in m for m in records)
    pbt.update([START + 2 * PERIOD] * 4, GOOD)  # the two replaced decide again two periods on
    assert len(path.read_text().splitlines()) == 4  # appended, not rewritten


def test_no_file_without_a_log_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(make_pbt().update([START] * 4, GOOD)) == 2
    assert list(tmp_path.iterdir()) == []


def run_sequence(pbt: PopulationBasedTraining, steps: range) -> list[Replacement]:
    made = []
    for step in steps:
        objectives = [float((7 * step + 13 * k) % 50) for k in range(4)]  # a varying ranking
        made += pbt.update([START + step * PERIOD + 100 * k for k in range(4)], objectives)
    return made


def test_same_seed_same_decisions_and_a_resumed_instance_continues_identically():
    extra = ("--pbt_mutation_rate=0.5",)
    reference = make_pbt(*extra, seed=7)
    full = run_sequence(reference, range(40))
    assert len(full) > 10 and full == run_sequence(make_pbt(*extra, seed=7), range(40))
    assert full != run_sequence(make_pbt(*extra, seed=8), range(40))

    first = make_pbt(*extra, seed=7)
    head = run_sequence(first, range(20))
    buffer = io.BytesIO()  # through a checkpoint as the runner saves it
    torch.save({"pbt": first.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["pbt"]
    resumed = PopulationBasedTraining(make_cfg(*extra), seed=123, log_path=None, state=state)  # the state's RNG wins
    assert head + run_sequence(resumed, range(20, 40)) == full
    assert resumed.state_dict() == reference.state_dict()
    json.dumps(reference.state_dict())  # plain types only


def test_starting_hyperparams_honour_policy_hyperparams():
    cfg = make_cfg("--learning_rate=0.0005", "--policy_hyperparams", "1:learning_rate=1e-6", "3:gamma=0.9")
    pbt = PopulationBasedTraining(cfg, 0, None)
    assert [h["learning_rate"] for h in pbt.hyperparams] == [0.0005, 1e-6, 0.0005, 0.0005]
    assert [h["gamma"] for h in pbt.hyperparams] == [cfg.gamma, cfg.gamma, cfg.gamma, 0.9]
    assert all(set(h) == set(cfg.pbt_hyperparams) for h in pbt.hyperparams)
    scalars = pbt.scalars()
    assert scalars["policy_1/pbt/learning_rate"] == 1e-6 and scalars["policy_3/pbt/gamma"] == 0.9
    assert scalars["policy_0/pbt/replaced"] == 0.0 and len(scalars) == 4 * (len(cfg.pbt_hyperparams) + 1)


def test_resume_keeps_evolved_values_and_starts_newly_listed_hyperparams_from_the_flags():
    pbt = make_pbt()
    state = pbt.state_dict()
    state["hyperparams"][2]["learning_rate"] = 0.123
    resumed = PopulationBasedTraining(make_cfg("--pbt_hyperparams", "learning_rate", "value_loss_coeff"), 0, None,
                                      state=state)
    assert resumed.hyperparams[2] == {"learning_rate": 0.123, "value_loss_coeff": resumed.cfg.value_loss_coeff}
    with pytest.raises(ValueError, match="num_policies"):
        PopulationBasedTraining(make_cfg(num_policies=2), 0, None, state=state)


def test_update_refuses_lists_of_the_wrong_length():
    with pytest.raises(ValueError, match="one frame count and one objective per policy"):
        make_pbt().update([START] * 3, GOOD[:3])
