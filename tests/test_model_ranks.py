"""--model_ranks: each model trains on its own learner ranks. The placement parses and is refused with one clear
message; four ranks (critic on 0, 1; actor on 2, 3) train as one learner with the whole batch would, rank 0
ends with every model's new weights, and no rank holds a model it was not given; end to end they solve
CartPole."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sf_core.algo.graph import Context, Node
from sf_core.algo.meshes import ModelHooks, RankMesh, check_model_ranks, parse_ranks
from sf_core.algo.params import LearningParams
from sf_core.algo.registry import algorithm_builder, build_algorithm
from sf_core.cli.arguments import parse_args
from sf_core.config import Config, ConfigError
from sf_core.learning.group.link import SEND_OPTIMIZERS, STOP, TRAIN, GroupSpec
from sf_core.learning.group.network import ADDRESS, free_port
from tests.helpers import read_summary, run_to_the_end
from tests.test_learner_group import (LEARNING_RATE, datasets, fork_ranks, initial_weights, small_config,
                                      trainer)

PLACEMENT = "critic=0,1; actor=2,3"


# ------------------------------------------------------------------------------------------ the placement

def test_the_placement_parses_names_ranks_and_ranges():
    assert parse_ranks("critic=0,1; actor=2-3") == {"critic": (0, 1), "actor": (2, 3)}
    assert parse_ranks("actor=3,0-1") == {"actor": (0, 1, 3)}
    assert parse_ranks("") == {}


@pytest.mark.parametrize("text, message", [
    ("critic", "--model_ranks: 'critic' is not NAME=RANKS (e.g. critic=0,1; actor=2,3)"),
    ("critic=", "--model_ranks: model 'critic' has no rank (give it at least one: critic=0)"),
    ("critic=0,x", "--model_ranks: critic=0,x: 'x' is not a rank (N) or a range of ranks (A-B)"),
    ("critic=0,0-1", "--model_ranks: critic=0,0-1 names a rank twice"),
    ("critic=0; critic=1", "--model_ranks: 'critic' is named twice"),
])
def test_a_malformed_placement_is_one_clear_error(text, message):
    with pytest.raises(ConfigError) as err:
        parse_ranks(text)
    assert str(err.value) == message


@pytest.mark.parametrize("flags, message", [
    (["--num_learners=4", "--model_ranks=critic=0,1; actor=2,4"],
     "--model_ranks: actor is given rank 4, out of range: --num_learners=4 has ranks 0..3"),
    (["--model_ranks=critic=0"], "--model_ranks places models on the ranks of a learner group: it needs "
                                 "--num_learners > 1"),
    (["--num_learners=4", "--model_ranks=critic=0,1; actor=2"], "--model_ranks: rank 3 holds no model"),
    (["--num_learners=4", f"--model_ranks={PLACEMENT}", "--publish_every_sgd_step=True"],
     "--model_ranks hands a model's weights to rank 0 once per dataset; not with --publish_every_sgd_step=True"),
    (["--num_learners=4", "--model_ranks=critic=0-2; actor=3", "--batch_size=32", "--num_batches_per_epoch=4",
      "--rollout=8"], "--model_ranks: critic's 3 ranks must divide the dataset's 16 trajectories"),
])
def test_what_the_placement_needs_of_the_other_flags(flags, message):
    with pytest.raises(ConfigError) as err:
        parse_args(["--env=CartPole-v1", "--split_actor_critic=True", *flags])
    assert message in str(err.value)


def graph_nodes(**flags) -> list[Node]:
    cfg = Config(env="CartPole-v1", algo="APPO", split_actor_critic=True, **flags)
    return build_algorithm(algorithm_builder(cfg.algo), LearningParams.from_config(cfg)).nodes


@pytest.mark.parametrize("placement, flags, message", [
    ("critic=0,1; actr=2,3", {}, "--model_ranks: --algo=APPO trains no model 'actr' (its models besides "
                                 "actor_critic: actor, critic)"),
    ("critic=0,1,2,3", {}, "--model_ranks: model 'actor' has no rank: name every model --algo=APPO trains"),
    ("actor_critic=0,1; critic=2,3", {}, "--model_ranks: actor_critic is trained on every rank"),
    ("critic=0,1; actor=2,3", {"split_actor_critic": False},
     "--model_ranks: --algo=APPO trains no model 'critic' (it trains no model besides actor_critic "
     "(--split_actor_critic=True makes the actor and the critic two))"),
    ("critic=0,1; actor=2,3", {"with_vtrace": True}, "--model_ranks: node 'recompute' calls the whole actor_critic"),
])
def test_a_placement_the_graph_cannot_run_is_refused(placement, flags, message):
    cfg = Config(env="CartPole-v1", algo="APPO", num_learners=4, model_ranks=placement,
                 **{"split_actor_critic": True, **flags})
    nodes = build_algorithm(algorithm_builder(cfg.algo), LearningParams.from_config(cfg)).nodes
    with pytest.raises(ConfigError) as err:
        check_model_ranks(cfg, nodes)
    assert message in str(err.value)
    check_model_ranks(dataclasses.replace(cfg, model_ranks="critic=0,1; actor=2,3", split_actor_critic=True,
                                          with_vtrace=False), graph_nodes())  # the placement it should be


def test_a_train_step_takes_its_models_share_and_collectives():
    def world(parameters):
        return None

    def critics(parameters):
        return None

    mesh = RankMesh(rank=1, size=4, ranks={"critic": (0, 1), "actor": (2, 3)}, batch_size=32,
                    hooks={"actor_critic": ModelHooks(world, list), "critic": ModelHooks(critics, list)})
    assert mesh.holds("critic") and not mesh.holds("actor") and mesh.holds("actor_critic")
    context = Context({}, LearningParams.from_config(Config(env="x", batch_size=8)))
    x = {"obs": torch.arange(3 * 8).view(3, 8), "version": torch.tensor(5), "flag": True}
    node = Node("critic_update", "train_step", ("obs",), ("critic_stats",), lambda c, x: {}, model="critic")
    ctx, share = mesh.prepare(node, context, x)
    assert torch.equal(share["obs"], x["obs"][:, 4:]) and share["version"] is x["version"] and share["flag"]
    assert ctx.params.batch_size == 16 and ctx.average_gradients is critics
    fold = Node("fold", "train_step", ("obs",), ("f",), lambda c, x: {}, model="actor_critic")
    ctx, share = mesh.prepare(fold, context, x)
    assert torch.equal(share["obs"], x["obs"][:, 2:4]) and ctx.params.batch_size == 8
    assert ctx.average_gradients is world


# ------------------------------------------------------------------------------------------ four ranks

def run_mesh_rank(rank: int, spec: GroupSpec, cfg: Config, data: list, weights, out: str) -> None:
    """One rank of the group, as the learner (rank 0) and its followers train (tests/test_learner_group.py's
    `run_rank`); it saves the whole actor-critic's state as this rank holds it, and the models it trains."""
    torch.set_num_threads(1)
    link = spec.join(rank)
    t = trainer(cfg)
    t.build(weights, None, link=link)
    stats = []
    for index in range(len(data)):
        if rank == 0:
            link.send_train(index, LEARNING_RATE, 0)
        else:
            assert link.receive().kind == TRAIN
        torch.manual_seed(11)
        stats.append(t.train(data[index], LEARNING_RATE, 0))
    trains = sorted(name for name, slot in t.models.items() if slot.optimizer is not None)
    optimizers = {name: slot.optimizer.state_dict() for name, slot in t.models.items() if name != "actor_critic"}
    if rank == 0:  # as for a checkpoint: the optimizer states of the models rank 0 does not train
        link.send_optimizers_command()
        optimizers.update(link.mesh.receive_optimizers())
    else:
        assert link.receive().kind == SEND_OPTIMIZERS
        link.mesh.send_optimizers(t.models)
    torch.save({"state": t.models["actor_critic"].module.state_dict(), "stats": stats, "trains": trains,
                "optimizers": optimizers, "overlaps": t.executor.overlap_train_steps}, out)
    if rank > 0:
        assert link.receive().kind == STOP
    link.close()


@pytest.mark.slow  # starts four processes
@pytest.mark.timeout(120)
def test_each_model_trains_on_its_own_ranks_as_one_learner_would_and_rank_0_ends_with_all(tmp_path):
    cfg = small_config(split_actor_critic=True)
    data, weights = datasets(cfg, 0), initial_weights(cfg)
    single = one_learner(cfg, data, weights)
    reference = single.models["actor_critic"].module.state_dict()

    ranks = train_on_ranks(4, PLACEMENT, cfg, data, weights, tmp_path)
    assert [r["trains"] for r in ranks] == [["actor_critic", "critic"]] * 2 + [["actor", "actor_critic"]] * 2
    actor = [k for k in reference if k.startswith(("actor.", "action_head."))]
    critic = [k for k in reference if k.startswith(("critic.", "value_head.", "returns_norm."))]
    assert actor and critic
    # rank 0 publishes: after the hand-over it holds both models' new weights, those one learner trains
    assert max((reference[k].double() - ranks[0]["state"][k].double()).abs().max().item() for k in reference) < 1e-5
    assert max((reference[k] - single_start(weights)[k]).abs().max().item() for k in actor + critic) > 1e-3
    for name, own, others in (("critic", (0, 1), (2, 3)), ("actor", (2, 3), (1,))):
        keys = critic if name == "critic" else actor
        for k in keys:  # a model's ranks agree bit for bit, and rank 0's copy is theirs
            assert all(torch.equal(ranks[own[0]]["state"][k], ranks[r]["state"][k]) for r in own + (0,)), k
            assert all(ranks[r]["state"][k].numel() == 0 for r in others), k  # dropped: no copy kept
    for k in reference:
        if k not in actor + critic:  # the observation normalisation: every rank's, identical
            assert all(torch.equal(ranks[0]["state"][k], r["state"][k]) for r in ranks), k
    assert all(s["handover_bytes"] == 4 * sum(reference[k].numel() for k in actor) for s in ranks[0]["stats"])
    # for its checkpoint rank 0 receives the actor's Adam moments, which only ranks 2 and 3 keep
    moments = [ranks[r]["optimizers"]["actor"]["state"] for r in (0, 2, 3)]
    assert moments[0] and all(torch.equal(moments[0][i]["exp_avg_sq"], m[i]["exp_avg_sq"])
                              for m in moments[1:] for i in moments[0])
    assert "actor" not in ranks[1]["optimizers"] and "critic" not in ranks[2]["optimizers"]


@pytest.mark.slow  # starts two processes
@pytest.mark.timeout(120)
def test_a_critic_handed_over_to_rank_0_brings_its_float64_returns_statistics(tmp_path):
    """The critic on rank 1 alone: rank 0 receives its weights and its returns normalisation in one buffer, the
    float64 statistics after an odd count of float32 weights (each tensor must start where its dtype can be read;
    the hand-over failed on Hopper-v5's preset until it did)."""
    cfg = small_config(split_actor_critic=True, normalize_returns=True)
    data, weights = datasets(cfg, 0), initial_weights(cfg)
    single = one_learner(cfg, data, weights)
    reference = single.models["actor_critic"].module.state_dict()
    critic = [k for k in reference if k.startswith(("critic.", "value_head.", "returns_norm."))]
    assert {reference[k].dtype for k in critic} == {torch.float32, torch.float64}
    assert sum(reference[k].numel() for k in critic if reference[k].dtype == torch.float32) % 2 == 1
    ranks = train_on_ranks(2, "actor=0; critic=1", cfg, data, weights, tmp_path)
    assert max((reference[k].double() - ranks[0]["state"][k].double()).abs().max().item() for k in reference) < 1e-5
    assert reference["returns_norm.count"] > 1  # the statistics moved, and rank 0's are rank 1's
    assert all(torch.equal(ranks[0]["state"][k], ranks[1]["state"][k]) for k in critic)


def one_learner(cfg: Config, data: list, weights):
    """One learner with the whole batch, trained on `data` as the ranks are: run first, so the forked ranks
    find torch warmed up."""
    single = trainer(cfg)
    single.build(weights, None)
    for d in data:
        torch.manual_seed(11)
        single.train(d, LEARNING_RATE, 0)
    return single


def train_on_ranks(n: int, placement: str, cfg: Config, data: list, weights, tmp_path) -> list[dict]:
    """What each of `n` forked ranks, with the models placed by `placement`, holds after training on `data`."""
    spec = GroupSpec(n, free_port(), timeout=60.0, devices=("cpu",) * n, address=ADDRESS,
                     model_ranks=tuple(parse_ranks(placement).items()))
    group_cfg = dataclasses.replace(cfg, num_learners=n, model_ranks=placement)
    return fork_ranks(tmp_path, n, run_mesh_rank, (spec, group_cfg, data, weights))


@pytest.mark.slow  # starts two processes
@pytest.mark.timeout(120)
def test_two_models_on_the_same_ranks_train_at_once_as_one_learner_trains_them_one_by_one(tmp_path):
    """Each rank holds both models, each with its process group: with --overlap_graph_nodes their train_steps
    run at once, each all-reducing on its own group, and end where one learner's sequential steps end."""
    cfg = small_config(split_actor_critic=True)
    data, weights = datasets(cfg, 0), initial_weights(cfg)
    single = one_learner(cfg, data, weights)
    reference = single.models["actor_critic"].module.state_dict()
    overlapping = dataclasses.replace(cfg, overlap_graph_nodes=True)
    ranks = train_on_ranks(2, "critic=0,1; actor=0-1", overlapping, data, weights, tmp_path)
    assert all(r["overlaps"] for r in ranks) and not single.executor.overlap_train_steps
    assert [r["trains"] for r in ranks] == [["actor", "actor_critic", "critic"]] * 2
    assert max((reference[k].double() - ranks[0]["state"][k].double()).abs().max().item() for k in reference) < 1e-5
    assert max((reference[k] - single_start(weights)[k]).abs().max().item() for k in reference) > 1e-3
    assert all(torch.equal(ranks[0]["state"][k], ranks[1]["state"][k]) for k in reference)


def single_start(weights) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in weights.tensors.items()}


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_cartpole_solved_by_a_critic_on_ranks_0_1_and_an_actor_on_ranks_2_3(tmp_path):
    proc, output, _, alive = run_to_the_end(tmp_path, [
        "--env=CartPole-v1", "--num_learners=4", "--split_actor_critic=True", f"--model_ranks={PLACEMENT}",
        "--num_workers=2", "--seed=2", "--target_mean_return=200", "--train_for_seconds=60",
        "--train_for_env_steps=10000000"], 80)
    assert proc.returncode == 0, output[-3000:]
    summary = read_summary(tmp_path)
    assert summary["time_to_target"] is not None and summary["mean_return_at_target"] >= 200.0, summary
    stats = summary["final_learner_stats"]
    assert stats["handover_bytes"] > 0 and "actor_grad_norm" in stats and "critic_grad_norm" in stats
    # each model's ranks agree at stop, rank 0's copy of the actor with them; no rank holds a model not given it
    for line in ("actor_critic (shared state) identical on ranks 0, 1, 2, 3",
                 "actor identical on ranks 2, 3 and rank 0's copy", "critic identical on ranks 0, 1",
                 "rank 0 trains critic; a frozen copy of actor\n", "rank 1 trains critic; nothing of actor\n",
                 "rank 2 trains actor; nothing of critic\n", "rank 3 trains actor; nothing of critic\n"):
        assert f"learner group: {line}" in output, line
    # the checkpoint rank 0 saved holds both models' Adam moments, the actor's fetched from rank 2
    saved = torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=False)["extra_models"]
    assert saved["actor"]["optimizer"]["state"] and saved["critic"]["optimizer"]["state"]
    assert not alive, [p.pid for p in alive]
