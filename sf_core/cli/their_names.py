"""Other trainers' flags, answered with what to write here: Stable-Baselines3's argument names, CleanRL's
flags (dashed, `--total-timesteps`) and RL-Zoo's train.py flags (`-n/--n-timesteps`, `--eval-freq`, ...).

Names are kept underscored: a dashed spelling is looked up with its dashes as underscores. Flags these trainers
share with this one (`--seed`, `--device`, `--env`, `--learning-rate`, `--gamma`, ...) parse as they are, so
they are not listed.
"""

from __future__ import annotations

ENVS = "--num_workers and --num_envs_per_worker (envs = workers × envs per worker)"
ONE_FLAG_EACH = ("each hyperparameter is a flag of its own here (--learning_rate=3e-4 --gamma=0.98 ...); per-env "
                 "values are presets, shown by python -m sf_core.train --env=ENV --help")


def _here(flag: str) -> str:
    return f"here it is {flag}"


THEIR_NAMES = {
    # Stable-Baselines3 (PPO's arguments, make_vec_env, learn)
    "n_envs": _here(ENVS), "n_steps": _here("--rollout"), "n_epochs": _here("--num_epochs"),
    "total_timesteps": _here("--train_for_env_steps"), "ent_coef": _here("--exploration_loss_coeff"),
    "vf_coef": _here("--value_loss_coeff"), "clip_range": _here("--ppo_clip_ratio"),
    "clip_range_vf": _here("--ppo_clip_value (in normalized value units; 0 disables it)"),
    "stats_window_size": _here("--stats_window"), "log_interval": _here("--report_interval (in seconds)"),
    "policy_kwargs": _here("--encoder_mlp_layers (net_arch's pi; vf: --critic_mlp_layers), --nonlinearity and "
                           "the other model flags"),
    # CleanRL (ppo.py's flags)
    "num_envs": _here(ENVS), "num_steps": _here("--rollout"), "update_epochs": _here("--num_epochs"),
    "num_minibatches": _here("--num_batches_per_epoch"), "clip_coef": _here("--ppo_clip_ratio"),
    "clip_vloss": _here("--ppo_clip_value (0 disables value clipping)"),
    "norm_adv": _here("--normalize_advantage"), "anneal_lr": _here("--lr_schedule=linear_decay"),
    "env_id": _here("--env"), "exp_name": _here("--experiment"), "cuda": _here("--device"),
    "track": _here("--with_wandb"), "wandb_project_name": _here("--wandb_project"),
    "wandb_entity": _here("--wandb_user"),
    "capture_video": "not a training flag here: python -m sf_core.enjoy --save_video records a trained policy",
    # RL-Zoo (train.py's flags)
    "n_timesteps": _here("--train_for_env_steps"),
    "tensorboard_log": _here("--train_dir: each run writes {train_dir}/{experiment}/, TensorBoard logs in tb/"),
    "log_folder": _here("--train_dir: each run writes {train_dir}/{experiment}/"),
    "save_freq": _here("--save_every_sec (in seconds, not steps)"),
    "eval_freq": _here("--eval_every_env_steps (in env frames; --eval_episodes episodes each time)"),
    "n_eval_envs": "the periodic evaluation (--eval_every_env_steps) plays its --eval_episodes on one env of its own",
    "hyperparams": ONE_FLAG_EACH, "conf_file": ONE_FLAG_EACH,
    "vec_env": _here(ENVS + "; --serial_mode=True steps every env in this process"),
    "trained_agent": _here("--experiment naming the run to continue: it resumes from its latest checkpoint"),
    "num_threads": _here("--torch_threads"),
}
# RL-Zoo's short spellings, by the long name they stand for
THEIR_SHORT_NAMES = {"-n": "n_timesteps", "-f": "log_folder", "-i": "trained_agent", "-tb": "tensorboard_log",
                     "-params": "hyperparams", "-conf": "conf_file"}


def their_name_hint(option: str) -> str | None:
    """What another trainer's flag (`--total-timesteps`, `--n_envs`, `-n`; no value) is called here, or None."""
    name = THEIR_SHORT_NAMES.get(option) or (option[2:].replace("-", "_") if option.startswith("--") else "")
    if name not in THEIR_NAMES:
        return None
    return f"{option} is another trainer's flag: {THEIR_NAMES[name]}"
