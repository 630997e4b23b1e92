"""Does an offloaded frozen model's copy to the GPU hide behind the node before it?

    python scripts/bench_offload.py --device=cuda
    python scripts/bench_offload.py --device=cuda --frozen_first=True   # called first, as APPO_TEACHER's teacher

The graph: `compute` (a trainable model's heavy forward pass) feeds `frozen` (an inference node on a large
frozen model kept in pinned host memory, --offload_models). The executor starts the frozen model's copy when
`compute` starts, on a side stream. With --frozen_first, `frozen` comes first and feeds `compute`: its copy for
each dataset starts while the dataset before computes. Prints the time of each part alone (compute; the copy;
the frozen call on a model already on the device) and of the whole run with offload, the share of the copy that
was hidden: 1 - (offloaded run - compute - frozen call) / copy, and the executor's own accounting over the
timed runs: the copies' time and the exposed part the calls waited for. On a CPU the copy is a plain copy in
host memory: nothing to hide, the share is about 0.
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
from sf_core.cli.arguments import add_bool_argument  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_seconds(fn, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        sync(device)
        started = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def build(device: str, width: int, frozen_layers: int, compute_steps: int, offload: bool,
          frozen_first: bool = False) -> GraphExecutor:
    torch.manual_seed(0)
    heavy = torch.nn.Linear(width, width).to(device)
    frozen = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(frozen_layers)])
    frozen = frozen.requires_grad_(False).to(device)

    def compute(ctx, x):
        h = x["obs"] if "obs" in x else x["y"]
        for _ in range(compute_steps):
            h = torch.tanh(ctx.models["heavy"].module(h))
        return {"h": h}

    def call_frozen(ctx, x):
        return {"y": ctx.models["frozen"].module(x["h"] if "h" in x else x["obs"])}

    # compute -> frozen, or with frozen_first frozen -> compute
    nodes = [Node("compute", "inference", ("y",) if frozen_first else ("obs",), ("h",), compute, model="heavy"),
             Node("frozen", "inference", ("obs",) if frozen_first else ("h",), ("y",), call_frozen, model="frozen")]
    slots = {"heavy": ModelSlot(heavy, device=device),
             "frozen": ModelSlot(frozen, device=device, offload_device="cpu" if offload else None)}
    return GraphExecutor(build_graph(nodes, {"obs"}), Context(slots, None), home=device)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--frozen_layers", type=int, default=8, help="8 layers of 4096x4096 float32: 512 MiB")
    p.add_argument("--compute_steps", type=int, default=64)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=10)
    add_bool_argument(p, "frozen_first", False, "the frozen model called first: its copy hides behind the dataset before")
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    obs = torch.randn(args.batch, args.width, device=args.device)
    shape = (args.device, args.width, args.frozen_layers, args.compute_steps)
    kept = build(*shape, offload=False, frozen_first=args.frozen_first)
    offloaded = build(*shape, offload=True, frozen_first=args.frozen_first)
    compute_node, frozen_node = (kept.graph.nodes[n]["node"] for n in ("compute", "frozen"))
    h = kept._call(compute_node, {"obs": obs})["h"]
    compute_s = median_seconds(lambda: kept._call(compute_node, {"obs": obs}), args.device, args.repeats)
    frozen_s = median_seconds(lambda: kept._call(frozen_node, {"h": h}), args.device, args.repeats)
    model = offloaded.offloaded["frozen"]
    copy_s = median_seconds(lambda: (model.prefetch(), model.acquire(), model.release()), args.device, args.repeats)
    offloaded.run({"obs": obs})  # the first dataset: a model called first has nothing before it to hide behind
    sync(args.device)
    offloaded.take_transfer_seconds()
    whole_s = median_seconds(lambda: offloaded.run({"obs": obs}), args.device, args.repeats)
    copied, exposed = offloaded.take_transfer_seconds()  # the executor's accounting, as the learner reports it
    same = torch.equal(kept.run({"obs": obs})["y"], offloaded.run({"obs": obs})["y"])
    hidden = 1.0 - max(0.0, whole_s - compute_s - frozen_s) / copy_s
    result = {"device": args.device, "compute_ms": round(compute_s * 1e3, 2), "copy_ms": round(copy_s * 1e3, 2),
              "frozen_call_ms": round(frozen_s * 1e3, 2), "offloaded_run_ms": round(whole_s * 1e3, 2),
              "copy_hidden_share": round(hidden, 3), "same_outputs": same, "frozen_first": args.frozen_first,
              "accounted_copy_ms": round(copied * 1e3, 2), "accounted_exposed_ms": round(exposed * 1e3, 2),
              "exposed_share": round(exposed / copied, 3) if copied else None,
              "frozen_mib": round(sum(t.numel() * 4 for t in model.host) / 2**20, 1)}
    print(json.dumps(result))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
