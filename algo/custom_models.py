"""Registering your own encoder, core or decoder from Python.

    from sf_core.algo.custom_models import register_encoder

    class MyEncoder(torch.nn.Module):
        def __init__(self, obs_space, spec):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(obs_space.shape[0], 64), torch.nn.Tanh())
            self.out_features = 64          # required: the width of what forward returns

        def forward(self, obs):             # preprocessed: a float tensor for a Box space,
            return self.net(obs)            # {field key: tensor} for a Dict/Tuple space

    register_encoder("my_encoder", MyEncoder)   # then: --encoder_custom=my_encoder

Factories (a class or a function) take:
  encoder  (obs_space, spec)         -> module(inputs) -> [B, out_features]
  core     (input_size, spec)        -> module(x, state) -> (y [B, out_features], new_state [B, state_size]),
                                        with attributes `out_features` and `state_size` (0: stateless)
  decoder  (input_size, spec)        -> module(x) -> [B, out_features]
`spec` is the `sf_core.algo.model.ModelSpec` (all model flags). Selected with `--encoder_custom`,
`--core_custom`, `--decoder_custom`. The trainer resolves the name in the process that parses the
flags and hands the factory itself to every component, so registering at the top of your training
script (or in a notebook cell) is enough in every start method: a lambda, a closure or a class defined
in a notebook travels to the worker processes by value (sf_core/common/user_code.py).
"""

from __future__ import annotations

from typing import Callable

from sf_core.common.user_code import user_code

KINDS = ("encoder", "core", "decoder")
_FACTORIES: dict[str, dict[str, Callable]] = {kind: {} for kind in KINDS}


def register_model_component(kind: str, name: str, factory: Callable) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown model component kind {kind!r}; known: {', '.join(KINDS)}")
    _FACTORIES[kind][name] = user_code(factory, f"the {kind} registered as {name!r}")


def register_encoder(name: str, factory: Callable) -> None:
    register_model_component("encoder", name, factory)


def register_core(name: str, factory: Callable) -> None:
    register_model_component("core", name, factory)


def register_decoder(name: str, factory: Callable) -> None:
    register_model_component("decoder", name, factory)


def resolve(kind: str, name: str) -> Callable | None:
    """The factory registered as `name` ('' means the built-in one: None)."""
    if not name:
        return None
    if name not in _FACTORIES[kind]:
        known = ", ".join(sorted(_FACTORIES[kind])) or "none registered"
        raise ValueError(f"--{kind}_custom={name!r} is not a registered {kind} ({known}); "
                         f"register it with sf_core.algo.custom_models.register_{kind}() before training")
    return _FACTORIES[kind][name]
