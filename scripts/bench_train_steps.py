"""Two train_steps at once: the actor and the critic of --split_actor_critic, one after the other, then at once.

    python scripts/bench_train_steps.py                    # HalfCheetah-shaped, 256x256 bodies, 1 torch thread
    python scripts/bench_train_steps.py --hidden 64 64     # the MuJoCo preset's bodies
    python scripts/bench_train_steps.py --device=cuda      # a CUDA stream each

Two learners' trainers (sf_core.learning.learner.Trainer, as the learner builds it) on one synthetic dataset of
HalfCheetah-v5's shape (17 observations, 6 continuous actions) and its preset's hyperparameters of 2026-11-27
(2,048 samples, 2 minibatches of 1,024, 5 epochs): one with --overlap_graph_nodes=False, whose actor_update and
critic_update run one after the other, and one with it True, whose two run at once on two threads. Each iteration (the whole
graph: targets, the statistics, both updates) is timed in turns, the order alternating; prints the medians,
their ratio, and whether the two ended with bit-identical weights and optimizer states.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from sf_core.algo.model import ModelSpec  # noqa: E402
from sf_core.algo.registry import algorithm_builder  # noqa: E402
from sf_core.config import Config  # noqa: E402
from sf_core.contracts.component import reuse_freed_memory  # noqa: E402
from sf_core.contracts.sample import SampleSpaces, batch_tensors  # noqa: E402
from sf_core.learning.learner import Trainer  # noqa: E402

OBS, ACTIONS = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32), gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def dataset(rollout: int, trajectories: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    d = batch_tensors(SampleSpaces(OBS, ACTIONS), rollout, trajectories)
    d["obs"].copy_(torch.randn(d["obs"].shape, generator=g) * 3)
    d["actions"].copy_(torch.randn(d["actions"].shape, generator=g))
    d["log_prob"].copy_(-torch.rand(d["log_prob"].shape, generator=g) * 2 - 6)
    d["behaviour_values"].copy_(torch.randn(d["behaviour_values"].shape, generator=g))
    d["rewards"].copy_(torch.randn(d["rewards"].shape, generator=g))
    d["dones"].copy_(torch.rand(d["dones"].shape, generator=g) < 0.01)
    return {key: value.to(device) for key, value in d.items()}


def trainer(hidden: list[int], overlap: bool, device: str) -> Trainer:
    cfg = Config(env="HalfCheetah-v5", algo="PPO", split_actor_critic=True, overlap_graph_nodes=overlap,
                 encoder_mlp_layers=hidden, nonlinearity="tanh", rollout=64, batch_size=1024, num_batches_per_epoch=2,
                 num_epochs=5, max_grad_norm=1.0, exploration_loss_coeff=0.0)
    built = Trainer(cfg, OBS, ACTIONS, ModelSpec.from_config(cfg), device, 1, algorithm_builder("PPO"))
    built.build(None, None)
    return built


def state(built: Trainer) -> list[torch.Tensor]:
    found = list(built.models["actor_critic"].module.state_dict().values())
    for name in ("actor", "critic"):
        found += [t for s in built.models[name].optimizer.state.values() for t in s.values()]
    return found


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--threads", type=int, default=1, help="torch threads (a learner process has --torch_threads=1)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    reuse_freed_memory()  # as in a learner process (configure_process): no page faults for each new activation
    data = dataset(64, 32, args.device)
    trainers = {name: trainer(args.hidden, overlap, args.device)
                for name, overlap in (("one_after_the_other", False), ("at_once", True))}
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    for i in range(args.iterations + 1):  # the first iteration warms up (threads, allocator, Adam's state)
        for name in list(trainers) if i % 2 == 0 else list(trainers)[::-1]:
            torch.manual_seed(i)  # each draws its train_steps' generators from the same global state
            started = time.perf_counter()
            trainers[name].train(data, 3e-4, 0)  # its statistics are read: a GPU's work is done
            if i > 0:
                seconds[name].append(time.perf_counter() - started)
    trainers["at_once"].executor.close()
    median = {name: statistics.median(times) for name, times in seconds.items()}
    same = all(torch.equal(a, b) for a, b in zip(*(state(t) for t in trainers.values()), strict=True))
    result = {"device": args.device, "hidden": args.hidden, "threads": args.threads, "cores": os.cpu_count(), "samples": 64 * 32,
              "one_after_the_other_ms": round(median["one_after_the_other"] * 1e3, 1),
              "at_once_ms": round(median["at_once"] * 1e3, 1),
              "ratio": round(median["at_once"] / median["one_after_the_other"], 3), "bit_identical": same}
    print(f"actor and critic {'x'.join(map(str, args.hidden))}, {args.threads} torch thread(s): one after the other "
          f"{result['one_after_the_other_ms']} ms per dataset, at once {result['at_once_ms']} ms "
          f"({result['ratio']:.2f}x); weights and optimizer states bit-identical: {same}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
