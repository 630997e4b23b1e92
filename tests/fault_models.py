"""Model parts whose process dies for real, for runs that name this module with --env_module.

`--encoder_custom=dies_in_sgd`: an MLP encoder whose first forward pass with gradients (the learner's SGD; the
inference workers act without gradients) kills its own process with SIGKILL, as a crash in native code or the
kernel's OOM killer would: no error report, no checkpoint saved on the way down. So every learner dies at its first
training step, after each recovery too.
"""

import os
import signal

import torch

from sf_core.algo.custom_models import register_encoder


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
