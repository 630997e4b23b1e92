"""Render an algorithm's dataflow graph: `python scripts/visualize_dfg.py --algo=APPO --output=appo.png`.

The format follows the output file's extension (.png, .svg, .pdf). Boxes are model calls (colour by
kind, with the model's name), arrows are data dependencies labelled with the keys they carry; the
batch's own keys enter from the left.

With --model_ranks (and --num_learners), the placement instead: a column per learner rank with the models it
trains, rank 0's frozen copies, and the hand-over of each model rank 0 lacks (docs/algorithms.md).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sf_core.algo.graph import build_graph  # noqa: E402
from sf_core.algo.meshes import WHOLE, check_model_ranks, parse_ranks  # noqa: E402
from sf_core.algo.params import LearningParams  # noqa: E402
from sf_core.algo.registry import algorithm_builder, build_algorithm, known_algorithms  # noqa: E402
from sf_core.cli.arguments import add_bool_argument  # noqa: E402
from sf_core.config import Config  # noqa: E402
from sf_core.contracts.sample import BATCH_KEYS  # noqa: E402

COLORS = {"inference": "#9ecae1", "compute": "#e0e0e0", "train_step": "#fdae6b", "batch": "#c7e9c0"}


def render(algo: str, output: str, with_vtrace: bool = True, split_actor_critic: bool = False) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    cfg = Config(env="CartPole-v1", algo=algo, with_vtrace=with_vtrace, split_actor_critic=split_actor_critic)
    nodes = build_algorithm(algorithm_builder(algo), LearningParams.from_config(cfg)).nodes
    graph = build_graph(nodes, BATCH_KEYS).to_networkx()
    used = sorted({key for node in nodes for key in node.input_keys if key in BATCH_KEYS})
    graph.add_node("batch", node=None)
    for node in nodes:
        keys = [k for k in node.input_keys if k in BATCH_KEYS]
        if keys:
            graph.add_edge("batch", node.name, key=", ".join(keys))
    for i, generation in enumerate(nx.topological_generations(graph)):
        for name in generation:
            graph.nodes[name]["layer"] = i
    pos = nx.multipartite_layout(graph, subset_key="layer", align="vertical", scale=2.0)

    fig, ax = plt.subplots(figsize=(14, 6))
    labels, colors = {}, []
    for name in graph.nodes:
        node = graph.nodes[name]["node"]
        if node is None:
            rows = [", ".join(used[i:i + 2]) for i in range(0, len(used), 2)]
            labels[name], colors = "batch\n" + "\n".join(rows), colors + [COLORS["batch"]]
        else:
            labels[name] = f"{name}\n[{node.kind}" + (f" · {node.model}]" if node.model else "]")
            colors.append(COLORS[node.kind])
    nx.draw_networkx_nodes(graph, pos, node_color=colors, node_size=5200, node_shape="s", ax=ax, edgecolors="#555")
    nx.draw_networkx_labels(graph, pos, labels, font_size=7, ax=ax)
    curve = "arc3,rad=0.12"  # curved, so an edge that skips a layer is not hidden behind a box
    nx.draw_networkx_edges(graph, pos, ax=ax, arrows=True, arrowsize=14, node_size=5200, node_shape="s",
                           connectionstyle=curve)
    edge_labels = {}
    for u, v in graph.edges:
        keys = [k for k in graph.nodes[v]["node"].input_keys
                if u != "batch" and k in graph.nodes[u]["node"].output_keys] if u != "batch" else []
        edge_labels[(u, v)] = ", ".join(keys) if keys else ""
    nx.draw_networkx_edge_labels(graph, pos, edge_labels, font_size=6, ax=ax, connectionstyle=curve)
    ax.set_title(f"--algo={algo}" + (" --with_vtrace=True" if algo == "APPO" and with_vtrace else "")
                 + (" --split_actor_critic=True" if split_actor_critic else ""))
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def render_mesh(algo: str, output: str, num_learners: int, model_ranks: str) -> str:
    """The placement of --model_ranks over the ranks of --num_learners (checked as a run would check it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = Config(env="CartPole-v1", algo=algo, split_actor_critic=True, num_learners=num_learners,
                 model_ranks=model_ranks)
    cfg.validate()
    check_model_ranks(cfg, build_algorithm(algorithm_builder(algo), LearningParams.from_config(cfg)).nodes)
    ranks = parse_ranks(model_ranks)
    fig, ax = plt.subplots(figsize=(2.6 * num_learners + 1.5, 4.2))
    box = {"boxstyle": "round,pad=0.4", "ec": "#555"}
    for rank in range(num_learners):
        ax.text(rank, 3.1, f"rank {rank}" + (" (learner)" if rank == 0 else ""), ha="center", weight="bold")
        ax.add_patch(plt.Rectangle((rank - 0.45, -0.4), 0.9, 3.2, fc="#f7f7f7", ec="#999"))
        rows = [(f"{WHOLE}\n(observation statistics)", COLORS["compute"])]
        for name, held in sorted(ranks.items()):  # a model on the same row in every column
            if rank in held:
                k = held.index(rank)
                rows.append((f"{name}: trains\nshare {k + 1}/{len(held)}, Adam", COLORS["train_step"]))
            elif rank == 0:
                rows.append((f"{name}: frozen copy\n(for the publish)", COLORS["inference"]))
            else:
                rows.append((f"{name}: not held\n(no copy)", "white"))
        for i, (label, color) in enumerate(rows):
            ax.text(rank, 2.4 - 0.95 * i, label, ha="center", va="center", fontsize=8, bbox={**box, "fc": color})
    for i, (name, held) in enumerate(sorted(ranks.items())):
        if 0 not in held:  # the hand-over: the model's first rank to rank 0, after every dataset
            y = 2.4 - 0.95 * (i + 1)
            ax.annotate("", xy=(0.3, y - 0.2), xytext=(held[0] - 0.3, y - 0.2),
                        arrowprops={"arrowstyle": "->", "color": "#d62728", "lw": 1.5,
                                    "connectionstyle": "arc3,rad=0.2"})
            ax.text(held[0] / 2, y + 0.5, f"hand-over of {name}: one message per dataset", ha="center",
                    color="#d62728", fontsize=8)
    ax.annotate("inference workers\n(shared-memory publish)", xy=(0, -0.45), xytext=(0, -1.1), ha="center",
                fontsize=8, arrowprops={"arrowstyle": "<-", "color": "#555"})
    ax.set_xlim(-0.7, num_learners - 0.3)
    ax.set_ylim(-1.4, 3.4)
    ax.set_title(f"--num_learners={num_learners} --model_ranks='{model_ranks}' --split_actor_critic=True")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="APPO", help=f"one of {', '.join(known_algorithms())}")
    parser.add_argument("--output", default=None, help="file to write (.png, .svg, .pdf)")
    add_bool_argument(parser, "with_vtrace", True, "for APPO: draw the V-trace variant")
    add_bool_argument(parser, "split_actor_critic", False, "the actor and the critic as two models")
    parser.add_argument("--model_ranks", default="", help="draw this placement of the models on the ranks instead")
    parser.add_argument("--num_learners", type=int, default=4, help="the ranks --model_ranks places models on")
    args = parser.parse_args(argv)
    output = args.output or f"{args.algo.lower()}.png"
    if args.model_ranks:
        print(f"wrote {render_mesh(args.algo, output, args.num_learners, args.model_ranks)}")
        return 0
    print(f"wrote {render(args.algo, output, args.with_vtrace, args.split_actor_critic)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
