"""Dataflow graphs: validation errors, execution order, parameter versions, built-in algorithms."""

import json
import re

import pytest
import torch

from sf_core.algo.executor import GraphExecutor
from sf_core.algo.graph import Context, GraphError, ModelSlot, Node, build_graph
from sf_core.algo.params import LearningParams
from sf_core.algo.registry import algorithm_builder, known_algorithms
from sf_core.contracts.sample import BATCH_KEYS
from tests import launch
from tests.conftest import REPO


def node(name, inputs, outputs, kind="compute", fn=None, model=None):
    fn = fn or (lambda ctx, x, outs=outputs: {k: 0 for k in outs})
    return Node(name, kind, tuple(inputs), tuple(outputs), fn, model=model)


def test_edges_follow_keys():
    g = build_graph([node("b", ["x"], ["y"]), node("c", ["y", "batch"], ["z"])], inputs={"x", "batch"})
    assert list(g.edges) == [("b", "c")]
    assert g.edges["b", "c"]["key"] == "y"


def test_cycle_is_rejected_with_its_nodes():
    with pytest.raises(GraphError, match=r"cycle: .*(a -> b|b -> a)"):
        build_graph([node("a", ["k2"], ["k1"]), node("b", ["k1"], ["k2"])], inputs=set())


def test_missing_producer_names_node_and_key():
    with pytest.raises(GraphError, match=r"node 'update' needs key 'advantages', which no node produces"):
        build_graph([node("update", ["obs", "advantages"], ["stats"])], inputs={"obs"})


def test_duplicate_producer_names_both_nodes():
    with pytest.raises(GraphError, match=r"key 'targets' is produced by two nodes: 'gae' and 'vtrace'"):
        build_graph([node("gae", ["r"], ["targets"]), node("vtrace", ["r"], ["targets"])], inputs={"r"})


def test_model_calls_must_name_their_model():
    with pytest.raises(GraphError, match="must name the model"):
        Node("fwd", "inference", ("obs",), ("v",), lambda c, x: {})


@pytest.mark.slow
def test_first_call_of_an_iteration_sees_last_train_step():
    """inference reads the weight, train_step changes it: iteration k's read must see k-1's update."""
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    reads = []

    def read(ctx, x):
        reads.append(ctx.models["m"].module.weight.item())
        return {"seen": torch.tensor(reads[-1])}

    def train(ctx, x):
        with torch.no_grad():
            ctx.models["m"].module.weight += 1.0
        return {"stats": {}}

    nodes = [Node("train", "train_step", ("seen",), ("stats",), train, model="m"),
             Node("read", "inference", ("batch",), ("seen",), read, model="m")]
    slot = ModelSlot(model, torch.optim.SGD(model.parameters(), lr=0.1))
    executor = GraphExecutor(build_graph(nodes, {"batch"}), Context({"m": slot}, params=None))
    for _ in range(3):
        executor.run({"batch": torch.zeros(1)})
    assert reads == [0.0, 1.0, 2.0]


def test_independent_nodes_run_concurrently_with_same_results():
    nodes = [node("a", ["x"], ["a"], fn=lambda c, x: {"a": x["x"] * 2}),
             node("b", ["x"], ["b"], fn=lambda c, x: {"b": x["x"] + 1}),
             node("c", ["a", "b"], ["c"], fn=lambda c, x: {"c": x["a"] * x["b"]})]
    g = build_graph(nodes, {"x"})
    serial = GraphExecutor(g, Context({}, None)).run({"x": torch.arange(4.0)})
    parallel_executor = GraphExecutor(g, Context({}, None), overlap=True)
    parallel = parallel_executor.run({"x": torch.arange(4.0)})
    parallel_executor.close()
    assert [sorted(gen) for gen in parallel_executor.generations] == [["a", "b"], ["c"]]
    torch.testing.assert_close(parallel["c"], serial["c"])


def test_two_train_steps_of_one_model_never_run_at_once():
    """Steps of one model with no key between them run in the order they are listed; one that feeds another runs
    first wherever it is listed; a step of another model runs beside them."""
    nodes = [node("fit_b", ["x"], ["b_stats"], kind="train_step", model="m"),
             node("fit_a", ["x"], ["a_stats"], kind="train_step", model="m"),
             node("reads_z", ["z"], ["r_stats"], kind="train_step", model="m"),
             node("makes_z", ["x"], ["z"], kind="train_step", model="m"),
             node("other", ["x"], ["o_stats"], kind="train_step", model="n")]
    g = build_graph(nodes, {"x"})
    assert g.edges["fit_b", "fit_a"]["key"] == "(the weights of m)"
    assert g.generations() == [["fit_b", "other"], ["fit_a"], ["makes_z"], ["reads_z"]]


@pytest.mark.parametrize("algo", ["APPO", "PPO", "REINFORCE"])
def test_builtin_algorithms_are_valid_graphs(algo):
    for vtrace, recompute in ((False, False), (False, True), (True, False)):
        params = LearningParams(with_vtrace=vtrace, recompute_values=recompute)
        g = build_graph(algorithm_builder(algo)(params).nodes, BATCH_KEYS)
        kinds = {g.nodes[n]["node"].kind for n in g}
        # the current model is called for values exactly when asked or when V-trace needs it
        uses_vtrace = vtrace and algo == "APPO"
        assert ("inference" in kinds) == (recompute or uses_vtrace)
        assert "train_step" in kinds and ("vtrace" in g) == uses_vtrace
    assert algo in known_algorithms()


@pytest.mark.slow
def test_unknown_algo_is_a_clear_error(tmp_path):
    
    result = launch.run(["--env=CartPole-v1", "--algo=DQN", f"--train_dir={tmp_path}"], timeout=60)
    assert result.returncode == 2
    assert "unknown --algo='DQN'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["APPO", "PPO", "REINFORCE"])
def test_visualize_writes_a_picture(tmp_path, algo):
    for ext in ("png", "svg") if algo == "APPO" else ("png",):  # the format does not depend on the graph
        out = tmp_path / f"{algo}.{ext}"
        result = launch.run([f"--algo={algo}", f"--output={out}"], timeout=60, script="scripts/visualize_dfg.py")
        assert result.returncode == 0, result.stderr
        head = out.read_bytes()[:200]
        assert head.startswith(b"\x89PNG") if ext == "png" else b"<svg" in out.read_bytes()[:2000]


def extract_doc_example(marker: str = "kl-example") -> str:
    text = open(f"{REPO}/docs/algorithms.md").read()
    match = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", text, re.S)
    assert match, f"docs/algorithms.md lost its example {marker}"
    return match.group(1)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_docs_kl_penalty_example_runs_and_logs_kl(tmp_path):
    
    script = tmp_path / "appo_kl.py"
    script.write_text(extract_doc_example())
    result = launch.run(["--env=CartPole-v1", "--num_workers=2", f"--train_dir={tmp_path}", "--experiment=kl",
                      "--train_for_env_steps=40000", "--experiment_summaries_interval=0.5"],
                     timeout=100, script=str(script), cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "kl" / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    kl = [e.value for e in acc.Scalars("train/kl_ref")]
    assert kl and all(v == v for v in kl)  # logged, and finite numbers
    assert max(abs(v) for v in kl) > 0  # the policy moved away from its frozen initial copy


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_docs_policy_loss_recipe_trains_cartpole_and_logs_its_statistic(tmp_path):
    (tmp_path / "my_loss.py").write_text(extract_doc_example("loss-example"))
    result = launch.run(["--env=CartPole-v1", "--algo=APPO_KLPEN", "--env_module=my_loss", f"--train_dir={tmp_path}",
                         "--experiment=loss", "--target_mean_return=475", "--train_for_env_steps=1000000",
                         "--experiment_summaries_interval=1"], timeout=180, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "loss" / "training_summary.json").read_text())
    assert summary["time_to_target"] is not None, summary["mean_return"]
    assert "kl_penalty" in summary["final_learner_stats"]


def test_with_policy_loss_swaps_only_the_update_loss_and_needs_one_update():
    from sf_core.algo.algorithms import Algorithm, reinforce, with_policy_loss
    from sf_core.algo.nodes import SGDUpdate
    from sf_core.config import Config

    def loss(ctx, dist, log_prob, mb):
        return -log_prob.mean(), {}

    swapped = with_policy_loss(reinforce(LearningParams.from_config(Config(env="x"))), loss)
    updates = [node.fn for node in swapped.nodes if isinstance(node.fn, SGDUpdate)]
    assert updates == [SGDUpdate(loss, one_epoch=True)]  # REINFORCE keeps its single pass
    with pytest.raises(GraphError, match="one minibatch SGD update, it has 0"):
        with_policy_loss(Algorithm([]), loss)
