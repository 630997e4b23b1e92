"""The Python API, for a script or a notebook (docs/python_api.md):

    trainer = Trainer(env="CartPole-v1", experiment="cartpole")  # the preset's budget: 1M frames
    result = trainer.train()                       # the flags of `python -m sf_core.train`, as keywords
    policy = result.load_policy()                  # best.pt, or any checkpoint with load_policy(path)
    action, state = policy.predict(obs, deterministic=True)
    mean, std = evaluate_policy(policy, env, n_eval_episodes=10)

It sits beside the entry modules, at the top of the layers: a run trains exactly as the command line's does.
"""

from sf_core.api.evaluate import evaluate_policy
from sf_core.api.policy import Policy, load_policy
from sf_core.api.trainer import Trainer, TrainingError, TrainingResult

__all__ = ["Policy", "Trainer", "TrainingError", "TrainingResult", "evaluate_policy", "load_policy"]
