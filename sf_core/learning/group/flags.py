"""What a learner group (--num_learners > 1) needs of the other flags: registered with Config.validate."""

from __future__ import annotations

from sf_core.config import Config, ConfigError, register_check


@register_check
def check_flags(cfg: Config) -> None:
    """What --num_learners > 1 needs of the other flags."""
    n = cfg.num_learners
    if n == 1:
        return
    if cfg.with_pbt:
        raise ConfigError(f"--num_learners={n} cannot run with --with_pbt: a learner group trains one policy, and "
                          f"PBT needs a population of them")
    if cfg.num_policies != 1:
        raise ConfigError(f"--num_learners={n} needs --num_policies=1, got {cfg.num_policies}: a learner group "
                          f"trains one policy")
    if cfg.serial_mode and not cfg.ray_address:  # on a cluster it makes the samplers serial, never the driver
        raise ConfigError(f"--num_learners={n} cannot run with --serial_mode=True: the other learner ranks are "
                          f"processes of their own")
    trajectories = cfg.dataset_size() // cfg.rollout
    if trajectories % n:
        raise ConfigError(f"--num_learners={n} must divide the dataset's {trajectories} trajectories (--batch_size × "
                          f"--num_batches_per_epoch / --rollout = {cfg.batch_size} × {cfg.num_batches_per_epoch} / "
                          f"{cfg.rollout}): each rank trains on an equal share")
    if cfg.batch_size % n:
        raise ConfigError(f"--num_learners={n} must divide --batch_size={cfg.batch_size}: each rank's minibatch is "
                          f"--batch_size / --num_learners samples")
    length = cfg.recurrence_length()
    if (cfg.batch_size // n) % length:
        raise ConfigError(f"each rank's minibatch of --batch_size / --num_learners = {cfg.batch_size} / {n} = "
                          f"{cfg.batch_size // n} samples must be a multiple of --recurrence={length}: ranks train "
                          f"on whole sequences")
