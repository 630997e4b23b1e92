"""Two independent inference nodes of equal cost, run one after the other and then with --overlap_graph_nodes.

    python scripts/bench_graph_overlap.py                       # as in a learner process: 1 torch thread
    python scripts/bench_graph_overlap.py --device=cuda         # a CUDA stream per node

Each node is an MLP forward pass over a batch of observations (the shape of an RND target and predictor, or of
a teacher and a critic). Prints the median time of each mode over --repeats runs, their ratio, and whether the
outputs are bit-identical; --output writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from sf_core.algo.executor import GraphExecutor  # noqa: E402
from sf_core.algo.graph import Context, ModelSlot, Node, build_graph  # noqa: E402


def mlp(width: int, depth: int) -> torch.nn.Module:
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(depth)]
    return torch.nn.Sequential(*layers).requires_grad_(False)


def graph_and_context(width: int, depth: int, device: str) -> tuple:
    torch.manual_seed(0)
    slots = {name: ModelSlot(mlp(width, depth).to(device), device=device) for name in ("first", "second")}
    nodes = [Node(name, "inference", ("obs",), (f"{name}_out",),
                  lambda ctx, x, name=name: {f"{name}_out": ctx.models[name].module(x["obs"])}, model=name)
             for name in slots]
    return build_graph(nodes, {"obs"}), Context(slots, None)


def time_runs(executor: GraphExecutor, obs: torch.Tensor, repeats: int, device: str) -> tuple[float, dict]:
    seconds, out = [], {}
    for _ in range(repeats + 1):  # the first run warms up (threads, allocator, kernels)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = executor.run({"obs": obs})
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[1:]), out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (a learner process has --torch_threads=1)")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    obs = torch.randn(args.batch, args.width, device=args.device)
    graph, context = graph_and_context(args.width, args.depth, args.device)
    sequential_s, sequential = time_runs(GraphExecutor(graph, context, home=args.device), obs, args.repeats,
                                         args.device)
    overlapped_executor = GraphExecutor(graph, context, overlap=True, home=args.device)
    try:
        overlapped_s, overlapped = time_runs(overlapped_executor, obs, args.repeats, args.device)
    finally:
        overlapped_executor.close()
    result = {"device": args.device, "threads": args.threads, "cores": os.cpu_count(), "batch": args.batch,
              "width": args.width, "depth": args.depth, "sequential_ms": round(sequential_s * 1e3, 2),
              "overlapped_ms": round(overlapped_s * 1e3, 2), "ratio": round(overlapped_s / sequential_s, 3),
              "bit_identical": all(torch.equal(sequential[k], overlapped[k]) for k in ("first_out", "second_out"))}
    print(f"two nodes one after the other: {result['sequential_ms']} ms; overlapped: {result['overlapped_ms']} ms "
          f"({result['ratio']:.2f}x); outputs bit-identical: {result['bit_identical']}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
