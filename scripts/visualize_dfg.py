"""Render an algorithm's dataflow graph: `python scripts/visualize_dfg.py --algo=APPO --output=appo.png`.

The format follows the output file's extension (.png, .svg, .pdf). Boxes are model calls (colour by
kind, with the model's name), arrows are data dependencies labelled with the keys they carry; the
batch's own keys enter from the left.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sf_core.algo.graph import build_graph  # noqa: E402
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="APPO", help=f"one of {', '.join(known_algorithms())}")
    parser.add_argument("--output", default=None, help="file to write (.png, .svg, .pdf)")
    add_bool_argument(parser, "with_vtrace", True, "for APPO: draw the V-trace variant")
    add_bool_argument(parser, "split_actor_critic", False, "the actor and the critic as two models")
    args = parser.parse_args(argv)
    output = args.output or f"{args.algo.lower()}.png"
    print(f"wrote {render(args.algo, output, args.with_vtrace, args.split_actor_critic)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
