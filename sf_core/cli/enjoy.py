"""`python -m sf_core.enjoy --env=... --experiment=... --train_dir=...`: evaluate a trained policy.

Loads the experiment's config.json (so the model is rebuilt exactly as trained) and a checkpoint
(`--checkpoint=latest|best|PATH`), runs `--max_num_episodes` episodes, prints a summary, writes
`eval_results.json` into the experiment folder, and with `--save_video` an MP4 of rendered frames.
A multi-agent env plays in self-play, every agent with the policy; each agent's episode counts.
With `--opponent=random|K` a two-agent game plays the policy against a random player or policy K of
the same experiment instead, for `--max_num_episodes` games (sf_core/evaluation/head_to_head.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

import gymnasium as gym
import numpy as np

from sf_core.envs.multi_agent import is_multi_agent
from sf_core.envs.registry import EnvContext, EnvNotFoundError, UnregisteredEnvError, registry_snapshot
from sf_core.cli import (add_env_module_argument, exit_process, import_experiment_modules,
                         unregistered_env_hint)
from sf_core.cli.arguments import BOOL_EPILOG, _Parser, add_bool_argument
from sf_core.cli.train import setup_logging
from sf_core.config import ConfigError
from sf_core.evaluation.head_to_head import versus_opponent
from sf_core.evaluation.policy import TrainedPolicy, load_checkpoint
from sf_core.machine.device import resolve_device
from sf_core.machine.fit import check_device
from sf_core.records.experiment import write_eval_results
from sf_core.sampling.episodes import play_episodes

log = logging.getLogger("sf_core")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m sf_core.enjoy", description="Evaluate a trained policy.", epilog=BOOL_EPILOG,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument("--env", default=None, help="Env to evaluate on (default: the one the experiment trained on).")
    p.add_argument("--experiment", required=True, help="Experiment name.")
    add_env_module_argument(p)
    p.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    p.add_argument("--checkpoint", default="latest", help="latest, best, or a checkpoint path.")
    p.add_argument("--policy_index", type=int, default=None,
                   help="Which policy of a run with --num_policies > 1 plays (default: the best one).")
    p.add_argument("--max_num_episodes", type=int, default=10, help="Episodes to run.")
    add_bool_argument(p, "eval_deterministic", False, "Take the most likely action.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the first evaluation episode.")
    add_bool_argument(p, "save_video", False, "Write an MP4 of rendered episodes.")
    add_bool_argument(p, "no_render", False, "Accepted so Sample Factory command lines carry over: this command "
                      "never opens a window (frames are rendered only for --save_video).")
    p.add_argument("--video_frames", type=int, default=1000, help="At most this many frames in the video.")
    p.add_argument("--video_name", default="replay.mp4", help="Video file name inside the experiment folder.")
    p.add_argument("--fps", type=int, default=30, help="Frames per second of the video.")
    p.add_argument("--device", default="cpu", help="Device for the policy: cpu, cuda, cuda:N or gpu (without CUDA: "
                   "the CPU, with a warning).")
    p.add_argument("--opponent", default="", help="Two-agent games: play the policy against 'random' (a uniformly "
                   "random player) or K (policy K of this experiment), seats alternating, for --max_num_episodes "
                   "games; eval_results.json gets wins, losses, ties and win_rate. Empty: self-play episodes.")
    add_bool_argument(p, "with_wandb", None,
                      "Log the results and video to the experiment's W&B run (default: if it trained with W&B).")
    return p


def evaluate(args: argparse.Namespace) -> dict:
    path = os.path.join(args.train_dir, args.experiment)
    loaded = load_checkpoint(path, args.checkpoint, args.device, args.policy_index)
    env_name = args.env = args.env or loaded.cfg.env  # the experiment's env, unless another was given
    render_mode = "rgb_array" if args.save_video else None
    env = registry_snapshot().make(env_name, loaded.cfg, EnvContext(worker_index=-1, env_index=0, seed=args.seed,
                                                                    render_mode=render_mode, evaluation=True))
    try:
        policy = loaded.policy(env.observation_space, env.action_space, args.eval_deterministic, args.device)
        if args.opponent:
            return versus_opponent(env, policy, loaded, path, args)
        log.info("evaluating %s (policy v%d) on %s for %d episodes", loaded.path, loaded.version, env_name,
                 args.max_num_episodes)
        returns, lengths, agents, frames = play(env, policy, args)
    finally:
        env.close()

    results = {"episodes": len(returns), "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
               "mean_length": float(np.mean(lengths)), "returns": returns, "lengths": lengths,
               "checkpoint": loaded.path, "policy_version": loaded.version, "env_frames": loaded.env_frames,
               "policy_index": loaded.policy_index,
               "env": env_name,
               "deterministic": bool(args.eval_deterministic)}
    if is_multi_agent(env):
        results["agents"] = agents  # which agent of the env played each episode
    if args.save_video:
        results["video"] = write_video(os.path.join(path, args.video_name), frames, args.fps)
    write_eval_results(path, results, loaded.cfg, args.with_wandb)
    return results


def play(env: gym.Env, policy: TrainedPolicy, args: argparse.Namespace
         ) -> tuple[list[float], list[int], list[int], list]:
    """`--max_num_episodes` episodes from `--seed` on: returns, lengths, the agent of each (a multi-agent env plays
    in self-play, each agent's episode counting) and the video's frames."""
    returns: list[float] = []
    lengths: list[int] = []
    agents: list[int] = []
    frames: list = []

    def take_frame() -> None:
        if len(frames) < args.video_frames:
            frames.append(render(env, args.env))

    for episode in play_episodes(env, policy, args.max_num_episodes, args.seed,
                                 before_step=take_frame if args.save_video else None):
        agent = f" (agent {episode.agent})" if is_multi_agent(env) else ""
        log.info("episode %d%s: return %.2f, length %d", len(returns), agent, episode.ret, episode.length)
        returns.append(episode.ret)
        lengths.append(episode.length)
        agents.append(episode.agent)
    return returns, lengths, agents, frames


def render(env: gym.Env, name: str):
    """One frame for --save_video; an env without render() is a ConfigError naming what to add."""
    try:
        return env.render()
    except NotImplementedError:
        raise ConfigError(f"--save_video: the env {name} cannot render (its render() is not implemented). Give it "
                          "a render() that returns an RGB array (height x width x 3, uint8) when it is made with "
                          "render_mode='rgb_array' (your env factory receives it as the EnvContext's render_mode), "
                          "or leave out --save_video") from None


def write_video(path: str, frames: list, fps: int) -> str:
    if not frames or frames[0] is None:
        raise ConfigError("the env rendered no frames: it must support render_mode='rgb_array' for --save_video")
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise ConfigError("--save_video needs imageio and imageio-ffmpeg: pip install -e '.[video]'") from None
    with imageio.get_writer(path, fps=fps, codec="libx264", macro_block_size=2, quality=7) as writer:
        for frame in frames:
            writer.append_data(np.asarray(frame, dtype=np.uint8))
    log.info("video: %s (%d frames)", path, len(frames))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    setup_logging()
    env_module = ""
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        env_module = import_experiment_modules(args.env_module, os.path.join(args.train_dir, args.experiment))
        check_device(args.device)
        args.device = resolve_device(args.device)  # as training does: without CUDA, the CPU (with a warning)
        results = evaluate(args)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except UnregisteredEnvError as exc:
        print(f"sf_core.enjoy: error: {exc}{unregistered_env_hint(env_module)}", file=sys.stderr)
        return 1
    except (ConfigError, EnvNotFoundError, ValueError) as exc:
        print(f"sf_core.enjoy: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    log.info("%d episodes: mean return %.2f ± %.2f, mean length %.1f", results["episodes"], results["mean_return"],
             results["std_return"], results["mean_length"])
    return 0


if __name__ == "__main__":
    exit_process(main())
