"""Time the learner's unit of work on this machine: one SGD step of an env preset's model (the learner's
own `_sgd_step`: forward, PPO losses, backward, clipping, Adam) on one minibatch of synthetic samples,
and one inference forward pass, on one torch thread. The step is timed twice, in datasets of
--steps_per_dataset steps: with the check that gradients are finite read on the host at every step, and kept
on the device and read once per dataset (algo/non_finite.py; what a learner on a GPU does).

    python scripts/bench_sgd_step.py --env=atari_pong
    python scripts/bench_sgd_step.py --env=atari_pong --mixed_precision
    python scripts/bench_sgd_step.py --env=atari_pong --default_malloc   # without reuse_freed_memory()
    python scripts/bench_sgd_step.py --env=CartPole-v1 --flags="--encoder_mlp_layers 512 512"
    python scripts/bench_sgd_step.py --env=atari_pong --device=cuda    # the learner's ceiling on a GPU
    python scripts/bench_sgd_step.py --env=Humanoid-v5 --iteration     # and a whole dataset's training
    python scripts/bench_sgd_step.py --env=atari_pong --device=cuda --sgd_cuda_graphs --iteration

With --iteration it also times the learner's whole training iteration on one dataset of the preset's size
(`Trainer.train`, as the learner runs it: the preset's graph, so the values, GAE, every epoch of every model's
update, a split actor and critic's two updates), on synthetic samples, and on the CPU each node of its graph
apart (which of them sampling waits for at lag 0: with a split actor and critic, the nodes up to the actor's update).

Observations are random samples of the env's observation space (stored dtype, e.g. uint8 frames), so
the preprocessing the learner does (conversion, scaling, normalisation) is timed too. Figures are the
best of 3 repeats of thread CPU time on the CPU: what one core can do, whatever else the machine runs;
with --device=cuda, of wall time up to the device's last kernel (the GPU's own rate, fed from its memory).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from sf_core.algo.graph import Context, ModelSlot  # noqa: E402
from sf_core.algo.model import ActorCritic, ModelSpec, autocast, store_weights_in_bfloat16  # noqa: E402
from sf_core.algo.adam import make_adam  # noqa: E402
from sf_core.algo.graphed_sgd import GraphedSGD  # noqa: E402
from sf_core.algo.nodes import _ppo_policy_loss, _sgd_step, step_guard  # noqa: E402
from sf_core.algo.params import LearningParams  # noqa: E402
from sf_core.envs.registry import EnvContext, registry_snapshot  # noqa: E402
from sf_core.cli.arguments import add_bool_argument, parse_args  # noqa: E402
from sf_core.config import Config  # noqa: E402
from sf_core.contracts.component import reuse_freed_memory  # noqa: E402
from sf_core.contracts.sample import SampleSpaces, batch_tensors  # noqa: E402
from sf_core.algo.registry import algorithm_builder  # noqa: E402
from sf_core.learning.learner import Trainer  # noqa: E402


def best_ms(fn, device: str = "cpu", repeats: int = 3, calls: int = 5) -> float:
    cuda = device.startswith("cuda")
    clock = time.perf_counter if cuda else time.thread_time  # a GPU's work is not this thread's CPU time
    fn()  # warm-up: first-call allocations and kernel selection
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(device)
        started = clock()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, (clock() - started) / calls)
    return best * 1e3


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--flags", default="", help="more trainer flags, as one string")
    add_bool_argument(p, "mixed_precision", False, "bf16 autocast, as the trainer's --mixed_precision=True")
    add_bool_argument(p, "default_malloc", False, "leave glibc's allocator settings alone")
    add_bool_argument(p, "unfused_adam", False, "torch's per-parameter Adam instead of the fused one")
    p.add_argument("--inference_batch", type=int, default=64)
    p.add_argument("--steps_per_dataset", type=int, default=16, help="SGD steps between reads of the check")
    p.add_argument("--device", default="cpu", help="where the model and the samples live: cpu, cuda, cuda:N")
    add_bool_argument(p, "iteration", False, "also time a whole training iteration on one dataset")
    add_bool_argument(p, "sgd_cuda_graphs", False, "also time the step replayed as a CUDA graph (and the "
                      "iteration with --sgd_cuda_graphs=True)")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device={args.device}: CUDA is not available here")
    if args.sgd_cuda_graphs and not args.device.startswith("cuda"):
        p.error("--sgd_cuda_graphs: CUDA graphs need --device=cuda")
    return args


def time_sgd_steps(model: ActorCritic, params: LearningParams, lr: float, minibatch: dict[str, torch.Tensor],
                   args: argparse.Namespace) -> tuple[float, float | None, float | None]:
    """ms per SGD step (the learner's own: losses, backward, clipping, Adam) in datasets of
    --steps_per_dataset steps: with the finite check read on the host at each step, kept on the device
    (None with --unfused_adam, which cannot skip a step on the device), and replayed as a CUDA graph (None
    without --sgd_cuda_graphs)."""
    if args.unfused_adam:
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=False)
    else:  # the learner's own
        optimizer = make_adam(model.parameters(), args.device)
        optimizer.param_groups[0]["lr"] = lr

    def dataset_ms(on_device: bool) -> float:
        ctx = Context({"actor_critic": ModelSlot(model, optimizer, args.device)}, params,
                      finite_check_on_device=on_device)

        def dataset() -> None:
            guard = step_guard(ctx, ctx.models["actor_critic"])
            for _ in range(args.steps_per_dataset):
                _sgd_step(ctx, dict(minibatch), _ppo_policy_loss, guard)
            guard.finish()

        return best_ms(dataset, args.device, calls=1) / args.steps_per_dataset

    def graphed_ms() -> float:
        ctx = Context({"actor_critic": ModelSlot(model, optimizer, args.device)}, params, finite_check_on_device=True)
        graphed = GraphedSGD(model, optimizer, args.device)

        def dataset() -> None:
            guard = graphed.begin(params)

            def run(mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, tuple[str, ...]]:
                return _sgd_step(ctx, mb, _ppo_policy_loss, guard)

            for _ in range(args.steps_per_dataset):
                graphed.step(dict(minibatch), run)
            guard.finish()

        return best_ms(dataset, args.device, calls=1) / args.steps_per_dataset

    host_ms = dataset_ms(on_device=False)
    device_ms = None if args.unfused_adam else dataset_ms(on_device=True)
    return host_ms, device_ms, graphed_ms() if args.sgd_cuda_graphs and not args.unfused_adam else None


def time_iteration(cfg: Config, obs_space: gym.Space, action_space: gym.Space, device: str
                   ) -> tuple[float, int]:
    """ms of the learner's training iteration (Trainer.train) on one synthetic dataset of the preset's size, and
    that size in samples."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise SystemExit(f"--iteration: {cfg.env}'s observations are not one array ({obs_space})")
    rollout = cfg.rollout
    trajectories = cfg.batch_size * cfg.num_batches_per_epoch // rollout
    trainer = Trainer(cfg, obs_space, action_space, ModelSpec.from_config(cfg), device, 3,
                      algorithm_builder(cfg.algo))
    trainer.build(None, None)
    data = batch_tensors(SampleSpaces(obs_space, action_space), rollout, trajectories)
    rows = data["obs"].shape[0] * trajectories
    data["obs"].copy_(torch.as_tensor(np.stack([obs_space.sample() for _ in range(rows)])).view_as(data["obs"]))
    data["actions"].copy_(torch.as_tensor(np.stack([action_space.sample() for _ in range(rollout * trajectories)]))
                          .view_as(data["actions"]))
    data["log_prob"].fill_(-1.0)
    data["rewards"].copy_(torch.rand(data["rewards"].shape))
    data["dones"].copy_(torch.rand(data["dones"].shape) < 0.01)
    node_seconds = time_nodes(trainer) if device == "cpu" else None
    iterations = []

    def iteration() -> None:
        trainer.train(data, cfg.learning_rate, 0)
        iterations.append(1)

    total_ms = best_ms(iteration, device, calls=1)
    if node_seconds is not None:  # the warm-up's and every repeat's
        n = len(iterations)
        print(f"the iteration's nodes, ms of thread CPU time each (mean of {n} iterations): " + ", ".join(
            f"{name} {seconds / n * 1e3:.1f}" for name, seconds in node_seconds.items() if seconds >= 5e-4))
    return total_ms, rollout * trajectories


def time_nodes(trainer: Trainer) -> dict[str, float]:
    """Wraps each node of the trainer's graph to add up its thread CPU time, by name (a node that runs on a
    thread of its own, --overlap_graph_nodes, is timed on that thread)."""
    seconds: dict[str, float] = {}
    for node in (trainer.executor.graph.nodes[name]["node"] for name in trainer.executor.graph):
        seconds[node.name] = 0.0

        def timed(ctx, x, fn=node.fn, name=node.name):
            started = time.thread_time()
            try:
                return fn(ctx, x)
            finally:
                seconds[name] += time.thread_time() - started

        object.__setattr__(node, "fn", timed)  # a Node may be frozen
    return seconds


def report_iterations(cfg: Config, obs_space: gym.Space, action_space: gym.Space, device: str, graphs: bool) -> None:
    """Prints a training iteration's time, and with `graphs` its time with --sgd_cuda_graphs=True too."""
    where = "on one core" if device == "cpu" else f"on {device}"
    iteration_ms, samples = time_iteration(cfg, obs_space, action_space, device)
    print(f"training iteration: {iteration_ms:.1f} ms per dataset of {samples:,} samples "
          f"({iteration_ms / samples * 1e3:.0f} µs/sample {where})")
    if graphs:
        graphed_ms, _ = time_iteration(replace(cfg, sgd_cuda_graphs=True), obs_space, action_space, device)
        print(f"training iteration, --sgd_cuda_graphs=True: {graphed_ms:.1f} ms ({iteration_ms / graphed_ms:.2f}x "
              f"the rate)")


def main() -> int:
    args = parse()
    torch.set_num_threads(1)
    if not args.default_malloc:
        reuse_freed_memory()
    cfg, _ = parse_args([f"--env={args.env}", *shlex.split(args.flags)])
    env = registry_snapshot().make(cfg.env, cfg, EnvContext(worker_index=-1, env_index=-1, seed=0))
    obs_space, action_space = env.observation_space, env.action_space
    env.close()

    torch.manual_seed(0)
    cfg = replace(cfg, mixed_precision=args.mixed_precision)
    spec = ModelSpec.from_config(cfg)
    device = args.device
    model = ActorCritic(obs_space, action_space, spec).to(device)
    B = cfg.batch_size
    obs = torch.from_numpy(np.stack([obs_space.sample() for _ in range(B)])).to(device)
    actions = torch.as_tensor(np.stack([action_space.sample() for _ in range(B)])).to(device)
    # one minibatch as the learner's minibatch_sgd hands it over: B sequences of length 1
    minibatch = {"obs": obs[None], "actions": actions[None], "log_prob": torch.full((1, B), -1.0),
                 "advantages": torch.randn(1, B), "targets": torch.randn(1, B), "old_values": torch.zeros(1, B),
                 "mask": torch.ones(1, B), "resets": torch.zeros(1, B, dtype=torch.bool),
                 "initial_states": torch.zeros(B, model.rnn_state_size)}
    minibatch = {key: value.to(device) for key, value in minibatch.items()}
    step_ms, on_device_ms, graphed_ms = time_sgd_steps(model, LearningParams.from_config(cfg), cfg.learning_rate,
                                                       minibatch, args)
    policy = ActorCritic(obs_space, action_space, spec).to(device).eval()
    if args.mixed_precision:
        store_weights_in_bfloat16(policy)
    policy.load_state_dict(model.state_dict())
    batch = obs[:args.inference_batch]
    precision = autocast(device, args.mixed_precision)

    def forward() -> None:
        with torch.no_grad(), precision:
            policy(batch)

    forward_ms = best_ms(forward, device, calls=20)
    print(f"env {cfg.env}: minibatch {B}, {sum(t.numel() for t in model.parameters()):,} parameters, "
          f"{'bf16 autocast' if args.mixed_precision else 'float32'}, "
          f"{'default malloc' if args.default_malloc else 'reuse_freed_memory()'}, "
          f"{'per-parameter' if args.unfused_adam else 'fused'} Adam")
    where = "on one core" if device == "cpu" else f"on {device}"
    print(f"SGD step: {step_ms:.2f} ms ({B / step_ms * 1e3:,.0f} samples/s per epoch {where})")
    if on_device_ms is not None:
        print(f"SGD step, the finite check on the device: {on_device_ms:.2f} ms "
              f"({step_ms / on_device_ms:.2f}x the rate with the check read on the host at every step)")
    if graphed_ms is not None:
        print(f"SGD step replayed as a CUDA graph: {graphed_ms:.2f} ms ({on_device_ms / graphed_ms:.2f}x the rate "
              f"of the eager step with the check on the device)")
    print(f"inference forward, batch {len(batch)}: {forward_ms:.2f} ms "
          f"({forward_ms / len(batch) * 1e3:.0f} µs/sample)")
    if args.iteration:
        report_iterations(cfg, obs_space, action_space, device, args.sgd_cuda_graphs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
