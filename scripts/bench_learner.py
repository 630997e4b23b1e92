"""Cost of running the learner's algorithm as a graph: GraphExecutor vs the same nodes called by hand.

    python scripts/bench_learner.py --algo=APPO --iterations=30

Builds one synthetic dataset (CartPole-shaped unless --obs_dim/--hidden say otherwise), then times
training iterations both ways, interleaved, in this one process, and prints the ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from sf_core.algo.executor import GraphExecutor  # noqa: E402
from sf_core.algo.graph import Context, ModelSlot, build_graph  # noqa: E402
from sf_core.algo.model import ActorCritic, ModelSpec  # noqa: E402
from sf_core.algo.params import LearningParams  # noqa: E402
from sf_core.algo.registry import algorithm_builder  # noqa: E402
from sf_core.config import Config  # noqa: E402
from sf_core.contracts.sample import BATCH_KEYS, SampleSpaces, batch_tensors  # noqa: E402


def synthetic_batch(T: int, N: int, obs_dim: int, n_actions: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    spaces = SampleSpaces(gym.spaces.Box(-1, 1, (obs_dim,), np.float32), gym.spaces.Discrete(n_actions))
    batch = batch_tensors(spaces, T, N)  # every field zeroed; the ones that shape the losses filled in
    batch.update(obs=torch.randn(T + 1, N, obs_dim, generator=g), actions=torch.randint(n_actions, (T, N), generator=g),
                 log_prob=torch.full((T, N), -float(np.log(n_actions))), rewards=torch.ones(T, N),
                 dones=torch.rand(T, N, generator=g) < 0.02)
    return batch


def make_context(cfg: Config, obs_dim: int, n_actions: int) -> Context:
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-1, 1, (obs_dim,), np.float32)
    model = ActorCritic(obs_space, gym.spaces.Discrete(n_actions), ModelSpec.from_config(cfg))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    return Context({"actor_critic": ModelSlot(model, opt)}, LearningParams.from_config(cfg))


def by_hand(nodes, ctx: Context, batch: dict) -> dict:
    """The hand-written path: call each node function directly, in a fixed valid order."""
    data = dict(batch)
    for node in nodes:
        if node.kind == "inference":
            with torch.no_grad():
                out = node.fn(ctx, {k: data[k] for k in node.input_keys})
        else:
            out = node.fn(ctx, {k: data[k] for k in node.input_keys})
        data.update(out)
    return data


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", default="APPO")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--rollout", type=int, default=32)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--obs_dim", type=int, default=4)
    parser.add_argument("--hidden", type=int, nargs="+", default=[512, 512])
    parser.add_argument("--output", default=None, help="optional JSON file for the figures")
    args = parser.parse_args()
    torch.set_num_threads(1)

    cfg = Config(env="CartPole-v1", algo=args.algo, encoder_mlp_layers=args.hidden, rollout=args.rollout,
                 batch_size=args.rollout * args.trajectories // 2, num_batches_per_epoch=2, num_epochs=2)
    nodes = algorithm_builder(args.algo)(LearningParams.from_config(cfg)).nodes
    graph = build_graph(nodes, BATCH_KEYS)
    ordered = [graph.nodes[name]["node"] for gen in GraphExecutor(graph, None).generations for name in gen]
    batch = synthetic_batch(args.rollout, args.trajectories, args.obs_dim, 2)
    ctx_graph, ctx_hand = make_context(cfg, args.obs_dim, 2), make_context(cfg, args.obs_dim, 2)
    executor = GraphExecutor(graph, ctx_graph)

    times = {"graph": [], "by_hand": []}
    for i in range(args.iterations + 3):
        for name in ("graph", "by_hand") if i % 2 == 0 else ("by_hand", "graph"):
            started = time.perf_counter()
            if name == "graph":
                executor.run(copy.copy(batch))
            else:
                by_hand(ordered, ctx_hand, copy.copy(batch))
            if i >= 3:  # warm-up iterations are not timed
                times[name].append(time.perf_counter() - started)
    median = {name: float(np.median(t)) for name, t in times.items()}
    result = {"algo": args.algo, "iterations": args.iterations,
              "samples_per_iteration": args.rollout * args.trajectories,
              "median_seconds": median, "graph_over_by_hand": median["graph"] / median["by_hand"]}
    print(f"{args.algo}: median iteration {median['graph'] * 1e3:.2f} ms with the graph executor, "
          f"{median['by_hand'] * 1e3:.2f} ms calling the nodes by hand: ratio {result['graph_over_by_hand']:.3f}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
