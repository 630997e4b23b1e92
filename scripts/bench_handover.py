"""The hand-over of --model_ranks: what it costs rank 0 to receive the actor it does not train, per publish.

    python scripts/bench_handover.py                        # CartPole's preset bodies (64 x 64)
    python scripts/bench_handover.py --hidden 256 256       # larger bodies

Four gloo ranks on this machine, forked, trained as the learner group trains them (sf_core.learning.learner.Trainer,
GroupSpec.join): the critic on ranks 0 and 1, the actor on ranks 2 and 3, on synthetic CartPole-shaped datasets
(the CartPole preset's 2,048 samples). After every dataset rank 2 sends rank 0 the actor's parameters in one
message; rank 0 reports the bytes and the milliseconds of that receive (`handover_bytes`, `handover_ms`, the
learner's statistics). Prints the median hand-over and, for scale, the median training iteration on rank 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

from sf_core.algo.meshes import parse_ranks  # noqa: E402
from sf_core.algo.model import ModelSpec  # noqa: E402
from sf_core.algo.registry import algorithm_builder  # noqa: E402
from sf_core.config import Config  # noqa: E402
from sf_core.contracts.sample import SampleSpaces, batch_tensors  # noqa: E402
from sf_core.learning.group.link import GroupSpec  # noqa: E402
from sf_core.learning.group.network import ADDRESS, free_port  # noqa: E402
from sf_core.learning.learner import Trainer  # noqa: E402

OBS, ACTIONS = gym.spaces.Box(-5.0, 5.0, (4,), dtype=float), gym.spaces.Discrete(2)
PLACEMENT = "critic=0,1; actor=2,3"


def dataset(cfg: Config, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d = batch_tensors(SampleSpaces(OBS, ACTIONS), cfg.rollout, cfg.dataset_size() // cfg.rollout)
    d["obs"].copy_(torch.randn(d["obs"].shape, generator=g))
    d["actions"].copy_(torch.randint(2, d["actions"].shape, generator=g))
    d["log_prob"].copy_(-torch.rand(d["log_prob"].shape, generator=g) - 0.2)
    d["rewards"].copy_(torch.rand(d["rewards"].shape, generator=g))
    return d


def rank_main(rank: int, spec: GroupSpec, cfg: Config, iterations: int, out: str) -> None:
    torch.set_num_threads(1)
    link = spec.join(rank)
    trainer = Trainer(cfg, OBS, ACTIONS, ModelSpec.from_config(cfg), "cpu", 1, algorithm_builder(cfg.algo))
    trainer.build(None, None, link=link)
    data = dataset(cfg, 0)
    rows = []
    for _ in range(iterations):
        if rank == 0:
            link.send_train(0, cfg.learning_rate, 0)
        else:
            link.receive()
        started = time.perf_counter()
        stats = trainer.train(data, cfg.learning_rate, 0)
        rows.append((time.perf_counter() - started, stats.get("handover_ms"), stats.get("handover_bytes")))
    if rank == 0:
        torch.save(rows, out)
    else:
        link.receive()  # the stop
    link.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64], help="--encoder_mlp_layers")
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args(argv)
    cfg = Config(env="CartPole-v1", algo="APPO", split_actor_critic=True, num_learners=4, model_ranks=PLACEMENT,
                 rollout=32, batch_size=1024, num_batches_per_epoch=2, num_epochs=4, encoder_mlp_layers=args.hidden)
    spec = GroupSpec(4, free_port(), 120.0, ("cpu",) * 4, ADDRESS, model_ranks=tuple(parse_ranks(PLACEMENT).items()))
    out = os.path.join(tempfile.mkdtemp(), "rank0.pt")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=rank_main, args=(r, spec, dataclasses.replace(cfg), args.iterations, out))
             for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        print(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        return 1
    rows = torch.load(out)[3:]  # the first iterations warm up
    print(f"bodies {args.hidden}: hand-over {int(rows[0][2]):,} bytes per publish, "
          f"median {statistics.median(r[1] for r in rows):.3f} ms "
          f"(min {min(r[1] for r in rows):.3f}, max {max(r[1] for r in rows):.3f}); "
          f"training iteration on rank 0: median {statistics.median(r[0] for r in rows) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
