"""Per-env defaults (RL-Zoo style): applied under the user's flags, never over them.

A preset is keyed by env id, or by a prefix ending in `*` (`atari_*` matches every `atari_` name); an
exact id wins over a prefix. The console says which preset was applied. Values here come from
tuning runs listed in docs/flags.md (results in docs/results.md) or, where marked, from published
hyperparameters not yet tuned here.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import gymnasium as gym

# Classic-control envs: tiny observations, fast steps. Short rollouts and small datasets give many
# quick updates, which is what solves these envs sooner in wall-clock time.
_CLASSIC_DISCRETE: dict[str, Any] = {
    "num_envs_per_worker": 64,  # big env groups: fewer, larger inference batches (docs/performance.md)
    "rollout": 32,
    "batch_size": 1024,
    "num_batches_per_epoch": 2,
    "num_epochs": 2,
    "learning_rate": 3e-4,
    "gamma": 0.99,
    "exploration_loss_coeff": 0.003,
    "encoder_mlp_layers": [64, 64],
    "ppo_clip_ratio": 0.2,
    "train_for_env_steps": 1_000_000,  # solved by ~350k; the rest settles it at 500 (docs/results.md)
}
# CartPole with the PPO update (APPO, PPO, and APPO with a teacher) learns faster with a learning rate of 3e-3:
# 118k-132k frames to 475 instead of 290k-355k, and it held 500 to 1M frames; REINFORCE's plain policy gradient
# collapsed with it to a deterministic policy in one CI run of three, so REINFORCE keeps 3e-4
# (docs/performance.md, "Time to solve CartPole").
# In the per-env layout solved by ~130k frames, and at 500 from ~250k on: half the budget of the slower
# REINFORCE settles it.
_PPO_CARTPOLE: dict[str, Any] = {"learning_rate": 3e-3, "train_for_env_steps": 500_000}

# Acrobot needs longer rollouts and more, smaller minibatches than CartPole: with CartPole's values the return
# stays at -500 for 1M frames, as its reward comes only at the goal. Until a random episode first reaches the
# goal, every step's reward is -1 and the advantages are noise; with one trunk for actor and critic, the value
# loss's updates moved the policy too, and in 3 runs of 12 on a loaded machine it drifted to one that never
# reached the goal (-500 for 1M frames; an entropy bonus of 0.01 still lost 1 of 12). With an actor and a critic
# of their own, as CleanRL's and SB3's MLP policies have, 24 of 24 passed -100 (docs/results.md).
_ACROBOT: dict[str, Any] = {**_CLASSIC_DISCRETE, "num_envs_per_worker": 16, "rollout": 128, "batch_size": 256,
                            "num_batches_per_epoch": 16, "num_epochs": 4, "gae_lambda": 0.94,
                            "actor_critic_share_weights": False}

_PENDULUM: dict[str, Any] = {
    "num_envs_per_worker": 16,
    "rollout": 64,
    "batch_size": 1024,
    "num_batches_per_epoch": 4,
    "num_epochs": 6,
    "learning_rate": 1e-3,
    "gamma": 0.95,
    "gae_lambda": 0.95,
    "exploration_loss_coeff": 0.0,
    "encoder_mlp_layers": [64, 64],
    "nonlinearity": "tanh",
    "ppo_clip_ratio": 0.2,
    "reward_scale": 0.1,
    "train_for_env_steps": 500_000,
}

# Atari (envs/atari.py): PPO-Atari values (Schulman et al. 2017; CleanRL's ppo_atari and Sample Factory's
# atari_params: lr 2.5e-4, clip 0.1, entropy 0.01, grad norm 0.5, adam eps 1e-5, ReLU Nature CNN) with their
# updates per sample, 16 SGD steps of 256 per 1,024 samples; --num_workers fits the machine. A quarter of those
# steps (2 epochs of 512) trained twice as fast on a CPU but did not move Pong's policy; these learn Pong on a
# GPU and on 2 CPU cores, and Breakout faster on 2 CPU cores by frames and by wall clock alike (docs/results.md).
# The budget is the published scores' (CleanRL's and RL-Zoo's 10M agent steps), and the rate decays over it as
# theirs does: a run stopped sooner by --target_mean_return or --train_for_seconds trains at their rate meanwhile
# (a smaller --train_for_env_steps decays it sooner).
_ATARI: dict[str, Any] = {
    "env_frameskip": 4,
    "num_envs_per_worker": 8,
    "worker_num_splits": 2,
    "rollout": 64,
    "batch_size": 256,
    "num_batches_per_epoch": 4,
    "num_epochs": 4,
    "learning_rate": 2.5e-4,
    "lr_schedule": "linear_decay",
    "adam_eps": 1e-5,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "ppo_clip_ratio": 0.1,
    "value_loss_coeff": 0.5,
    "exploration_loss_coeff": 0.01,
    "max_grad_norm": 0.5,
    "nonlinearity": "relu",
    "encoder_conv_architecture": "convnet_atari",
    "encoder_conv_mlp_layers": [512],
    "train_for_env_steps": 40_000_000,
}

# MuJoCo (gymnasium[mujoco]): every id gymnasium makes from gymnasium.envs.mujoco gets these (FAMILIES), sized
# for a 2-core CPU. Adapted from CleanRL's ppo_continuous_action (separate 64x64 tanh actor and critic,
# orthogonal init, normalized observations and returns, 10 epochs, clip 0.2, lr 3e-4 decayed to 0, grad norm
# 0.5, no entropy bonus, initial std 1), with 256-sample minibatches (CleanRL's 64 would cost 4x the SGD steps:
# a step's cost here is nearly all fixed overhead). 2 workers x 32 envs x rollout 32 fill one 2048-sample
# dataset, and sampling waits for the new weights (policy lag 0): on Hopper-v5 and Walker2d-v5, seed 1, sampling
# on while the learner trained (lag 1-3) was 1.4-1.7x faster per frame but ended lower in training return,
# and with 512-sample minibatches (lag 1) lower still (docs/results.md).
_MUJOCO: dict[str, Any] = {
    "num_workers": 2,
    "num_envs_per_worker": 32,
    "worker_num_splits": 2,
    "rollout": 32,
    "batch_size": 256,
    "num_batches_per_epoch": 8,
    "num_epochs": 10,
    "async_rl": False,
    "learning_rate": 3e-4,
    "lr_schedule": "linear_decay",
    "adam_eps": 1e-5,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "ppo_clip_ratio": 0.2,
    "value_loss_coeff": 0.5,
    "exploration_loss_coeff": 0.0,
    "max_grad_norm": 0.5,
    "encoder_mlp_layers": [64, 64],
    "nonlinearity": "tanh",
    "actor_critic_share_weights": False,
    "normalize_input": True,
    "normalize_returns": True,
    "initial_log_std": 0.0,
    "train_for_env_steps": 1_000_000,
}

# HalfCheetah-v5 keeps the learning values it was first run with (RL-Zoo's PPO MuJoCo entries and Sample
# Factory's mujoco_params: one 256x256 tanh body, initial std e^-1, 1024-sample minibatches, lag 0), with 10
# epochs where it had 5: over seeds 1-5 they evaluated at 6,481 against 5,869 (RL-Zoo: 5,819), at 0.76-0.82x
# the frames/s (docs/results.md, "HalfCheetah: ten epochs"). 16 envs a worker with rollouts of 32 (the same
# 1,024 samples a round as 8 x 64) halve the inference worker's calls per frame, its largest cost. Each
# rollout worker runs the policy itself (its env is cheap, so a round trip to an inference worker cost as much as
# the forward pass): seeds 1-3 ran 1M frames in 110-114 s against 123-127 s, evaluations 6,790 against 6,636
# (docs/performance.md, "Acting in the rollout workers"). At lag 0 the rollout workers wait while the learner
# trains, so the learner takes two torch threads: seeds 1-6 ran in 86-100 s (one thread: 106-107 s), evaluating
# as high (docs/performance.md, "A learner on the cores sampling leaves idle").
_HALF_CHEETAH: dict[str, Any] = {
    **_MUJOCO, "num_envs_per_worker": 16, "rollout": 32, "batch_size": 1024, "num_batches_per_epoch": 2,
    "num_epochs": 10, "async_rl": False, "max_grad_norm": 1.0, "encoder_mlp_layers": [256, 256],
    "actor_critic_share_weights": True, "initial_log_std": -1.0, "inference_in_rollout_workers": True,
    "learner_torch_threads": 2,
}

# Hopper and Walker2d: the family's values with one dataset collected while the learner trains on the one
# before (--num_batches_to_accumulate=1: a policy lag of 1). At lag 0 sampling waits out every update, and
# their 1M frames took 182-195 s on 2 cores; at lag 1, 138-166 s. Over seeds 1-5 Walker2d evaluated better
# (3,450 against lag 0's 2,436 on seeds 1-3), Hopper lower (2,550 against 3,054), both above CleanRL's scores.
# Unbounded async (lag 2-4) was as fast, with final training returns 25-30 % lower (docs/results.md, "Hopper
# and Walker2d: one dataset collected while the learner trains"). Ant and Humanoid are bound by env stepping
# and keep lag 0 (their presets train the critic while the next dataset is collected instead, below).
_MUJOCO_ONE_AHEAD: dict[str, Any] = {**_MUJOCO, "async_rl": True, "num_batches_to_accumulate": 1}

# Ant and Humanoid: the family's values with the actor and the critic as two models of the graph and the values
# computed by the learner (--split_actor_critic --recompute_values). Inference then runs the actor alone, and the
# learner publishes the actor's weights as soon as it is trained: the critic trains while the next dataset is
# collected, and the actor stays at lag 0. Their env stepping is the bottleneck, so one dataset ahead did little
# for them and learned worse; this took 1.02-1.12x the frames/s of the family's preset in one benchmark each, and
# seeds 1-3 evaluated at 2,153 on Ant (the family's preset: 1,569) and 1,020 on Humanoid (928) (docs/results.md,
# "Ant and Humanoid: the critic trained while the next dataset is collected").
_MUJOCO_CRITIC_WHILE_SAMPLING: dict[str, Any] = {**_MUJOCO, "split_actor_critic": True, "recompute_values": True}

# Ant: the same with minibatches of 512 at twice the learning rate. Half the SGD steps halve the actor's update
# that sampling waits for at lag 0 (a 64x64 step costs its per-operation overhead, whatever the minibatch), and
# Adam moves a parameter by about the learning rate a step, so twice the rate trains as far (at 3e-4 the policies
# kept a wide std, final training returns 348 against 725). Seeds 1-6 ran 1M frames in 161-169 s against
# 186-188 s, evaluations 1,718 and 1,750 against 1,664 (docs/results.md, "Ant in under 3 minutes"). Humanoid's
# seeds 1-3 the same way ran 240-255 s (the morning's, with its preset: 258-274 s) and evaluated lower (836
# against 905): it keeps its preset, whose share of the env's raw rate already meets its mark.
_ANT: dict[str, Any] = {**_MUJOCO_CRITIC_WHILE_SAMPLING, "batch_size": 512, "num_batches_per_epoch": 4,
                        "learning_rate": 6e-4}

# Swimmer's reward comes from moving forward over a whole 1,000-step episode, each step's share small: with the
# family's gamma of 0.99 (a horizon of ~100 steps) seed 1 evaluated at 36 after 1M frames, with RL-Zoo's 0.9999
# (its Swimmer-v3 entry: gamma 0.9999, otherwise its PPO defaults) at 342. Seeds 2 and 3 stayed in the slow gait
# (34 and 88; RL-Zoo's one agent: 282), so the preset is not verified (docs/results.md, "Other MuJoCo ids").
_SWIMMER: dict[str, Any] = {**_MUJOCO, "gamma": 0.9999}

# InvertedDoublePendulum: the family's values with a third of its learning rate. With 3e-4 the seeds peaked by
# 400k frames and fell back (one to 0.62 of its best), and their final agents evaluated at 5,643-8,432 (each
# ± 2,770-4,540); with 2e-4 at 4,741-8,435. With 1e-4 every seed's final agent balanced all its evaluation
# episodes to the step limit (9,345-9,360, above gymnasium's threshold of 9,100), while the sampled policy's
# training return was still climbing (6,770-6,956) (docs/results.md, "Other MuJoCo ids").
_INVERTED_DOUBLE_PENDULUM: dict[str, Any] = {**_MUJOCO, "learning_rate": 1e-4}

# Race to 21 (envs/nim.py), a two-player game learned by self-play: a multi-agent env, so non-batched
# sampling. A tiny tabular-like problem: a small net and a high learning rate reach perfect play in
# about 150k frames (docs/environments.md); the preset's 500k leaves margin.
_NIM: dict[str, Any] = {
    "batched_sampling": False,
    "num_envs_per_worker": 32,
    "worker_num_splits": 1,
    "rollout": 16,
    "batch_size": 1024,
    "num_epochs": 4,
    "learning_rate": 3e-3,
    "encoder_mlp_layers": [64],
    "train_for_env_steps": 500_000,
}

# values that depend on --algo too, applied over the env's preset: env key -> algorithm -> values
ALGORITHM_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "CartPole-v1": {"APPO": _PPO_CARTPOLE, "PPO": _PPO_CARTPOLE, "APPO_TEACHER": _PPO_CARTPOLE},
}

PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": _CLASSIC_DISCRETE,
    "Acrobot-v1": _ACROBOT,
    "Pendulum-v1": _PENDULUM,
    "nim21": _NIM,
    "HalfCheetah-v5": _HALF_CHEETAH,
    "Swimmer-v5": _SWIMMER,
    "InvertedDoublePendulum-v5": _INVERTED_DOUBLE_PENDULUM,
    "Hopper-v5": _MUJOCO_ONE_AHEAD,
    "Walker2d-v5": _MUJOCO_ONE_AHEAD,
    "Ant-v5": _ANT,
    "Humanoid-v5": _MUJOCO_CRITIC_WHILE_SAMPLING,
    "MuJoCo": _MUJOCO,  # Ant, Humanoid, InvertedPendulum, Pusher, ...: every id without its own
    "atari_*": _ATARI,
    "ALE/*": _ATARI,
}

# values over an env's preset where a native vector env builds its splits (--env_vectorization,
# envs/vector_backends.py): one call steps a split, so bigger splits cost little more per step, and fewer,
# larger inference batches serve them. CartPole: 256 envs a worker, with one worker per 2 cores (the machine
# fit), trained faster than the per-env layout and solved sooner (docs/performance.md, "Natively vectorized envs").
# With a constant learning rate that layout passed 475 but did not always stay there: 1 seed in 6 ended 500k
# frames at 324. With the rate decayed to 0 over 1M frames, seeds 1-20 all ended at 500 (docs/results.md).
VECTOR_PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"num_envs_per_worker": 256, "lr_schedule": "linear_decay", "train_for_env_steps": 1_000_000},
}


# envs whose preset, with no other flag, reaches the env's usual score, measured here (docs/results.md): for the
# MuJoCo ids CleanRL's published score (Ant-v5: RL-Zoo's, CleanRL publishes none; InvertedDoublePendulum-v5:
# gymnasium's threshold, nobody publishes one), as the mean over seeds 1-3 of the final evaluation (Pusher-v5
# with the MuJoCo family's preset, Swimmer-v5 and Reacher-v5 not: docs/results.md).
# Any other env's preset holds published values (RL-Zoo, Sample Factory, CleanRL), and the console says so when
# it applies one.
VERIFIED = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "nim21", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5",
            "InvertedPendulum-v5", "Humanoid-v5", "Ant-v5", "Pusher-v5", "InvertedDoublePendulum-v5")

# Other versions of an env with a preset that get its values: the same task with the same observation and action
# spaces (tests/test_presets.py makes both and compares), so values tuned for one fit the other. CartPole-v0 ends
# episodes at 200 steps (475 is not reachable there; 195 is its solved mark). The other MuJoCo ids get the
# family's preset.
OTHER_VERSIONS = {"CartPole-v0": "CartPole-v1", "HalfCheetah-v4": "HalfCheetah-v5",
                  "Swimmer-v4": "Swimmer-v5", "Hopper-v4": "Hopper-v5", "Walker2d-v4": "Walker2d-v5"}
VERSIONED = re.compile(r"(.+)-v(\d+)")

# Families of envs that share a preset whatever their id: the PRESETS key of each, and the module prefix of the
# gymnasium entry point its ids are made by. An id with no preset of its own gets its family's (how="family"):
# the values a family's preset holds suit every member (no observation or action size is in them).
FAMILIES = {"MuJoCo": "gymnasium.envs.mujoco"}


class PresetMatch(NamedTuple):
    """What `preset_for` found. `how`: "exact" (the env's own key), "prefix" (a key ending in `*`), "version"
    (the preset of another version of the env, in OTHER_VERSIONS), "family" (the preset of its family, in
    FAMILIES), "none"; or "elsewhere": another version of the env has a preset (`key`) whose values were not
    applied (`values` is empty)."""

    key: str | None
    values: dict[str, Any]
    how: str
    vectorized: bool = False  # VECTOR_PRESETS' values for the key are among `values`

    def describe(self, env: str) -> str | None:
        """The console's line about it for `env` (None when no preset is near)."""
        if self.how == "none":
            return None
        if self.how == "elsewhere":
            return (f"no preset for {env}; {self.key} has one, not applied: {env}'s spaces are not known to match "
                    f"its (python -m sf_core.train --env={self.key} --help shows its values)")
        line = f"applied preset for {self.key} (flags you pass override it)"
        if self.how == "version":
            line = f"applied the preset of {self.key}, made for that version: {env} has the same spaces (flags " \
                   f"you pass override it)"
        if self.how == "family":
            line = f"applied the {self.key} preset, made for every id of that family ({env} has no preset of its " \
                   f"own; flags you pass override it)"
        if self.vectorized:
            line += ", with its values for vector envs"
        if env not in VERIFIED:
            line += ": published values, not yet verified here to reach the env's usual score (docs/results.md)"
        return line


def preset_for(env: str, algo: str = "APPO", vectorized: bool = False) -> PresetMatch:
    """The preset for `env` and `algo`: an exact key first, then the longest matching prefix key (`atari_*`),
    then the key OTHER_VERSIONS names for it, then its family's; the algorithm's own values for that key over
    the env's, and with `vectorized` (a native vector env builds the splits) VECTOR_PRESETS' over those. An env
    whose other version has a preset, but not one known to be safe to apply to it, gets how="elsewhere"."""
    key: str | None = env if env in PRESETS else None
    prefixes = [k for k in PRESETS if k.endswith("*") and env.startswith(k[:-1])]
    how = "exact" if key else "prefix"
    if key is None and prefixes:
        key = max(prefixes, key=len)
    if key is None and env in OTHER_VERSIONS:
        key, how = OTHER_VERSIONS[env], "version"
    if key is None:
        key, how = family_of(env), "family"
    if key is None:
        versions = [k for k in PRESETS if _unversioned(k) is not None and _unversioned(k) == _unversioned(env)]
        return PresetMatch(versions[0], {}, "elsewhere") if versions else PresetMatch(None, {}, "none")
    vector = VECTOR_PRESETS.get(key, {}) if vectorized else {}
    return PresetMatch(key, {**PRESETS[key], **ALGORITHM_PRESETS.get(key, {}).get(algo, {}), **vector}, how,
                       bool(vector))


def family_of(env: str) -> str | None:
    """The FAMILIES key whose entry-point module makes `env` in gymnasium's registry (None: no family)."""
    spec = gym.envs.registry.get(env)
    entry_point = spec.entry_point if spec is not None else None
    if not isinstance(entry_point, str):
        return None
    return next((key for key, module in FAMILIES.items() if entry_point.startswith(module + ".")), None)


def _unversioned(env: str) -> str | None:
    """An env id's name without its version (`HalfCheetah` of `HalfCheetah-v4`); None for an unversioned name."""
    versioned = VERSIONED.fullmatch(env)
    return versioned[1] if versioned else None
