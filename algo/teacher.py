"""APPO pulled towards a teacher: `--algo=APPO_TEACHER --teacher=PATH`.

The teacher is a policy trained before, by this project, loaded frozen from its checkpoint (which carries its
flags, so its architecture may differ from the student's). Once per dataset it scores the batch's observations
(an inference node on the model "teacher"); each SGD step then adds

    --teacher_kl_coeff · KL(teacher ‖ student)

to the PPO loss, averaged over the samples trained on. KL(teacher ‖ student) is large where the student gives
little probability to what the teacher would do, so the student learns to cover the teacher's actions (policy
distillation) while the PPO term keeps improving it on the env's own rewards. TensorBoard shows the term as
`train/teacher_kl`.

The teacher is feed-forward (a recurrent one would need its own recurrent state for every sample); the
student may be recurrent. As a frozen model it can wait off the GPU between datasets: --offload_models=teacher.
"""

from __future__ import annotations

import os

import torch

from sf_core.algo import nodes as n
from sf_core.algo.algorithms import UPDATE_INPUTS, Algorithm, appo
from sf_core.algo.graph import Context, ModelSlot, Node
from sf_core.algo.model import ActorCritic
from sf_core.algo.model_spec import ModelSpec
from sf_core.algo.params import LearningParams
from sf_core.config import Config, ConfigError, register_check

Inputs = dict[str, torch.Tensor]


def teacher_params(ctx: Context, x: Inputs) -> Inputs:
    """The teacher's action-distribution parameters for every step's observation ([T, N, P])."""
    teacher = ctx.models["teacher"].module
    T, N = x["actions"].shape[:2]
    dist_params, _ = teacher(x["obs"][:-1].flatten(0, 1))
    return {"teacher_params": dist_params.float().view(T, N, -1)}


def _ppo_with_teacher_loss(ctx: Context, dist, log_prob, mb) -> tuple[torch.Tensor, dict]:
    policy_loss, _ = n._ppo_policy_loss(ctx, dist, log_prob, mb)
    teacher = ctx.models["teacher"].module.distribution(mb["teacher_params"])
    kl = n.ppo.weighted_mean(dist.kl_from(teacher), mb["weights"])
    return policy_loss + ctx.params.teacher_kl_coeff * kl, {"teacher_kl": kl}


ppo_teacher_update = n.SGDUpdate(_ppo_with_teacher_loss, extra_keys=("teacher_params",))


def appo_teacher(params: LearningParams, rewards_key: str = "rewards") -> Algorithm:
    algorithm = appo(params, rewards_key)
    algorithm.nodes = [node for node in algorithm.nodes if node.kind != "train_step"] + [
        Node("teacher_policy", "inference", ("obs", "actions"), ("teacher_params",), teacher_params,
             model="teacher"),
        Node("ppo_teacher_update", "train_step", UPDATE_INPUTS + ("teacher_params",), ("train_stats",),
             ppo_teacher_update, model="actor_critic"),
    ]
    algorithm.extra_models = lambda models: {"teacher": load_teacher(params.teacher, models["actor_critic"])}
    algorithm.check_spaces = lambda obs_space, action_space: load_teacher(
        params.teacher, ModelSlot(ActorCritic(obs_space, action_space, ModelSpec())))
    return algorithm


def load_teacher(path: str, student: ModelSlot) -> ModelSlot:
    """The policy in checkpoint `path`, frozen, on the student's device, for the student's env."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    like: ActorCritic = student.module
    spec = ModelSpec.from_config(Config.from_dict(state["config"])) if "config" in state else like.spec
    if spec.use_rnn or spec.core_factory is not None:
        raise ConfigError(f"--teacher={path}: a recurrent teacher is not supported (its policy needs a recurrent "
                          f"state per sample); train the teacher with --use_rnn=False")
    teacher = ActorCritic(like.obs_space, like.action_space, spec)
    try:
        teacher.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise ConfigError(f"--teacher={path}: its policy does not fit this env's observation and action spaces "
                          f"({str(exc).splitlines()[0]})") from None
    teacher.requires_grad_(False).eval().to(student.device)
    return ModelSlot(teacher, optimizer=None, device=student.device)


@register_check
def check_teacher(cfg: Config) -> None:
    if cfg.algo != "APPO_TEACHER":
        return
    if not cfg.teacher:
        raise ConfigError("--algo=APPO_TEACHER needs --teacher=PATH: a checkpoint (.pt) of a policy trained by "
                          "this project on the same env")
    if os.path.isdir(cfg.teacher):
        raise ConfigError(f"--teacher={cfg.teacher} is a folder: name a checkpoint file in it, e.g. "
                          f"{os.path.join(cfg.teacher, 'checkpoint', 'best.pt')}")
    if not os.path.isfile(cfg.teacher):
        raise ConfigError(f"--teacher={cfg.teacher}: no such file")
