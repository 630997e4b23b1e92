"""Model parts whose process dies for real, for runs that name this module with --env_module.

`--encoder_custom=dies_in_sgd`: an MLP encoder whose first forward pass with gradients (the learner's SGD; the
inference workers act without gradients) kills its own process with SIGKILL, as a crash in native code or the
kernel's OOM killer would: no error report, no checkpoint saved on the way down. So every learner dies at its first
training step, after each recovery too.

`--encoder_custom=dies_in_inference`: an MLP encoder whose forward pass in the inference worker's process `sf:inf0`
kills that process with SIGKILL, once per run, as soon as the folder named by $SF_TEST_INFERENCE_DEATH holds a file
`go` (the test has read the pids before). Inside the model, never inside a queue operation or while holding the
shared weights' lock: an outside kill at a random moment may land in one, and rightly make every component restore.
"""

import os
import signal

import torch

from sf_core.algo.custom_models import register_encoder
from sf_core.algo.mlp import mlp


class DiesInSgd(torch.nn.Module):
    def __init__(self, obs_space, spec):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(obs_space.shape[0], 16), torch.nn.Tanh())
        self.out_features = 16

    def forward(self, obs):
        if torch.is_grad_enabled():
            os.kill(os.getpid(), signal.SIGKILL)
        return self.layers(obs)


register_encoder("dies_in_sgd", DiesInSgd)


class DiesInInference(torch.nn.Module):
    def __init__(self, obs_space, spec):
        super().__init__()
        self.layers = mlp(obs_space.shape[0], spec.encoder_mlp_layers, spec.nonlinearity)  # the built-in one's
        self.out_features = spec.encoder_mlp_layers[-1]

    def forward(self, obs):
        if not torch.is_grad_enabled() and _time_to_die():
            os.kill(os.getpid(), signal.SIGKILL)
        return self.layers(obs)


def _time_to_die() -> bool:
    folder = os.environ.get("SF_TEST_INFERENCE_DEATH")
    if not folder or not os.path.exists(os.path.join(folder, "go")):
        return False
    with open("/proc/self/comm") as comm:
        if comm.read().strip() != "sf:inf0":
            return False
    try:  # once per run: the first process to get here
        os.close(os.open(os.path.join(folder, "died"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


register_encoder("dies_in_inference", DiesInInference)
