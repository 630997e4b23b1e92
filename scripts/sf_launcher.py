"""Sample Factory 2 on any gym(nasium) env id: run by scripts/benchmark.py with Sample Factory's interpreter.

Sample Factory's own sf_examples/train_gym_env.py registers only CartPole-v1; this launcher does the same
for whatever --env is, with the gym flavour (gymnasium or gym) that the installed Sample Factory uses.
It is a file (not `python -c`) so that SF's spawned worker processes can import make_env. It runs in
Sample Factory's virtualenv, so it imports nothing of ours.
"""
import sys


def _gym():
    try:
        from importlib.metadata import requires
        wants_gymnasium = any(r.startswith("gymnasium") for r in (requires("sample-factory") or []))
    except Exception:
        wants_gymnasium = False
    if wants_gymnasium:
        import gymnasium as gym
    else:
        try:
            import gym
        except ImportError:
            import gymnasium as gym
    return gym


def make_env(full_env_name, cfg=None, env_config=None, render_mode=None):
    return _gym().make(full_env_name, render_mode=render_mode)


def main():
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl

    env_name = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--env=")][-1]
    register_env(env_name, make_env)
    parser, cfg = parse_sf_args(argv=None, evaluation=False)
    cfg = parse_full_cfg(parser)
    return run_rl(cfg)


if __name__ == "__main__":
    sys.exit(main())
