"""Graphs of several models: each call on its device, independent calls at once, a frozen model offloaded."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from sf_core.algo.executor import GraphExecutor
from sf_core.algo.graph import Context, ModelSlot, Node, build_graph
from sf_core.algo.placement import check_placement, parse_devices, place_models
from sf_core.config import Config, ConfigError
from tests.helpers import sf_core_log

TEACHER_NODES = [Node("teacher_policy", "inference", ("obs",), ("p",), lambda c, x: {"p": 0}, model="teacher"),
                 Node("update", "train_step", ("p",), ("stats",), lambda c, x: {"stats": {}}, model="actor_critic")]


@pytest.mark.parametrize("flags, message", [
    ({"model_devices": "critic=cpu"}, "calls no model 'critic' (its other models: teacher)"),
    ({"model_devices": "teacher=cuda:7"}, "device 'cuda:7' is not on this machine"),
    ({"model_devices": "teacher=tpu"}, "unknown device 'tpu'"),
    ({"model_devices": "teacher"}, "'teacher' is not NAME=DEVICE"),
    ({"model_devices": "actor_critic=cpu"}, "actor_critic runs on --device"),
    ({"offload_models": "actor_critic"}, "has no frozen model 'actor_critic'"),
])
def test_a_placement_that_cannot_work_is_one_clear_error(flags, message):
    cfg = Config(env="CartPole-v1", **flags)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_placement(cfg, TEACHER_NODES, {})


def test_a_trained_model_cannot_be_offloaded():
    nodes = TEACHER_NODES + [Node("fit_teacher", "train_step", ("p",), ("t_stats",), lambda c, x: {}, model="teacher")]
    with pytest.raises(ConfigError, match="'teacher' is trained"):
        check_placement(Config(env="CartPole-v1", offload_models="teacher"), nodes, {})


def test_placement_follows_the_flag_over_the_algorithms_default():
    assert parse_devices(" teacher=cpu , rnd_target=cuda:1") == {"teacher": "cpu", "rnd_target": "cuda:1"}
    slots = {"actor_critic": ModelSlot(torch.nn.Linear(2, 2)), "teacher": ModelSlot(torch.nn.Linear(2, 2))}
    check_placement(Config(env="CartPole-v1", model_devices="teacher=cpu"), TEACHER_NODES, {"teacher": "cuda:5"})
    place_models(slots, Config(env="CartPole-v1", model_devices="teacher=cpu"), {"teacher": "cuda:5"})
    assert slots["teacher"].device == "cpu" and slots["actor_critic"].device == "cpu"


def test_a_node_reads_its_inputs_on_its_own_device_once_per_device():
    """'meta' stands in for a second device here: a tensor moved there keeps its shape and loses its data."""
    seen = []

    def look(name):
        def fn(ctx, x):
            seen.append((name, x["obs"].device.type, x["obs"].shape))
            return {f"{name}_out": x["obs"].shape[0]}
        return fn

    nodes = [Node("a", "compute", ("obs",), ("a_out",), look("a"), device="meta"),
             Node("b", "compute", ("obs",), ("b_out",), look("b"), device="meta"),
             Node("c", "compute", ("obs", "a_out"), ("c_out",), look("c"))]
    executor = GraphExecutor(build_graph(nodes, {"obs"}), Context({}, None))
    placed_before = torch.zeros(5, 3)
    out = executor.run({"obs": placed_before})
    assert sorted(seen) == [("a", "meta", (5, 3)), ("b", "meta", (5, 3)), ("c", "cpu", (5, 3))]
    assert out["c_out"] == 5 and out["obs"] is placed_before  # the batch itself is not moved


def _two_heavy_nodes(record: list | None = None):
    torch.manual_seed(0)
    weights = {name: [torch.randn(512, 512) / 23 for _ in range(6)] for name in ("left", "right")}

    def forward(name):
        def fn(ctx, x):
            if record is not None:
                record.append((name, threading.get_ident(), time.perf_counter()))
            h = x["obs"]
            for w in weights[name]:
                h = torch.tanh(h @ w)
            if record is not None:
                record.append((name, threading.get_ident(), time.perf_counter()))
            return {name: h}
        return fn

    nodes = [Node(name, "compute", ("obs",), (name,), forward(name)) for name in ("left", "right")]
    nodes.append(Node("join", "compute", ("left", "right"), ("sum",), lambda c, x: {"sum": x["left"] + x["right"]}))
    return build_graph(nodes, {"obs"})


def test_overlapped_nodes_run_on_threads_at_once_and_give_identical_results():
    obs = torch.randn(2048, 512)
    sequential = GraphExecutor(_two_heavy_nodes(), Context({}, None)).run({"obs": obs})
    record: list = []
    executor = GraphExecutor(_two_heavy_nodes(record), Context({}, None), overlap=True)
    try:
        overlapped = executor.run({"obs": obs})
    finally:
        executor.close()
    for key in ("left", "right", "sum"):
        assert torch.equal(sequential[key], overlapped[key]), key  # bit for bit
    (left_start, left_end), (right_start, right_end) = ([t for n, _, t in record if n == side]
                                                        for side in ("left", "right"))
    assert len({thread for _, thread, _ in record}) == 2
    assert left_start < right_end and right_start < left_end  # their calls overlapped in time


class Scaler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 3.0))

    def forward(self, x):
        return self.linear(x) * self.scale


def _frozen_graph(offload: bool):
    torch.manual_seed(1)
    frozen = Scaler().requires_grad_(False)
    slot = ModelSlot(frozen, device="cpu", offload_device="cpu" if offload else None)
    devices = []

    def call(ctx, x):
        devices.append(ctx.models["teacher"].module.linear.weight.data_ptr())
        return {"y": ctx.models["teacher"].module(x["obs"])}

    nodes = [Node("before", "compute", ("obs",), ("obs2",), lambda c, x: {"obs2": x["obs"] * 2}),
             Node("teacher", "inference", ("obs2",), ("y",), lambda c, x: call(c, {"obs": x["obs2"]}),
                  model="teacher")]
    return GraphExecutor(build_graph(nodes, {"obs"}), Context({"teacher": slot}, None)), frozen, devices


def test_an_offloaded_frozen_model_gives_the_same_outputs_and_its_copy_is_timed():
    obs = torch.randn(16, 8)
    stays, _, _ = _frozen_graph(offload=False)
    offloaded, module, pointers = _frozen_graph(offload=True)
    expected = stays.run({"obs": obs})["y"]
    host = module.linear.weight.data_ptr()
    for _ in range(2):
        assert torch.equal(offloaded.run({"obs": obs})["y"], expected)
    assert all(p != host for p in pointers), "the call must read the device copy, not the host weights"
    assert module.linear.weight.data_ptr() == host  # released: back on the host copy after its last call
    seconds, exposed = offloaded.take_transfer_seconds()
    assert seconds > 0 and exposed == seconds  # a copy in host memory holds the calls up: counted as such
    assert offloaded.take_transfer_seconds() == (0.0, 0.0)  # taken once


def test_a_models_other_calls_come_before_its_train_step_even_without_a_key_between_them():
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    reads = []

    def train(ctx, x):
        with torch.no_grad():
            ctx.models["m"].module.weight += 1.0
        return {"stats": {}}

    nodes = [Node("a_train", "train_step", ("batch",), ("stats",), train, model="m"),
             Node("z_read", "inference", ("batch",), ("seen",),
                  lambda ctx, x: reads.append(ctx.models["m"].module.weight.item()) or {"seen": 0}, model="m")]
    graph = build_graph(nodes, {"batch"})
    assert graph.edges["z_read", "a_train"]["key"] == "(the weights of m)"
    executor = GraphExecutor(graph, Context({"m": ModelSlot(model, torch.optim.SGD(model.parameters(), lr=0.1))},
                                            None))
    for _ in range(3):
        executor.run({"batch": torch.zeros(1)})
    assert reads == [0.0, 1.0, 2.0]  # each read sees the previous iteration's weights, whatever the names


def test_offload_on_a_cpu_leaves_the_model_in_place_and_says_so():
    cfg = Config(env="CartPole-v1", offload_models="teacher")
    with sf_core_log() as messages:
        check_placement(cfg, TEACHER_NODES, {})
    assert len(messages) == 1 and "teacher runs on the CPU" in messages[0] and "nothing to offload" in messages[0]
    slots = {"actor_critic": ModelSlot(torch.nn.Linear(2, 2)), "teacher": ModelSlot(torch.nn.Linear(2, 2))}
    place_models(slots, cfg, {})
    assert slots["teacher"].offload_device is None


def test_a_model_called_first_is_copied_for_the_next_dataset_while_the_current_one_trains():
    """The teacher of APPO_TEACHER is called in the first generation: nothing before it in its own dataset can
    hide its copy, so the copy starts with the last generation of the dataset before."""
    torch.manual_seed(1)
    slot = ModelSlot(Scaler().requires_grad_(False), device="cpu", offload_device="cpu")
    seen = []

    def train(ctx, x):  # the last generation: by now the next dataset's copy is under way
        seen.append(executor.offloaded["teacher"].copies is not None)
        return {"stats": {}}

    nodes = [Node("teacher", "inference", ("obs",), ("y",), lambda c, x: {"y": c.models["teacher"].module(x["obs"])},
                  model="teacher"),
             Node("targets", "compute", ("y",), ("t",), lambda c, x: {"t": x["y"] * 2}),
             Node("update", "train_step", ("t",), ("stats",), train, model="student")]
    models = {"teacher": slot, "student": ModelSlot(torch.nn.Linear(1, 1))}
    executor = GraphExecutor(build_graph(nodes, {"obs"}), Context(models, None))
    for _ in range(2):
        executor.run({"obs": torch.randn(4, 8)})
    assert seen == [True, True]
    copied, exposed = executor.take_transfer_seconds()
    assert copied > 0 and exposed == copied  # a copy in host memory holds the thread up: all of it is exposed


def test_nodes_at_once_share_out_the_threads_of_the_process():
    seen = {}

    def count(name):
        def fn(ctx, x):
            seen[name] = torch.get_num_threads()
            return {name: x["obs"]}
        return fn

    nodes = [Node(name, "compute", ("obs",), (name,), count(name)) for name in ("left", "right")]
    executor = GraphExecutor(build_graph(nodes, {"obs"}), Context({}, None), overlap=True)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        executor.run({"obs": torch.zeros(1)})
        assert torch.get_num_threads() == 2  # this thread's count, and the process's, are as they were
    finally:
        torch.set_num_threads(before)
        executor.close()
    assert seen == {"left": 1, "right": 1}  # two nodes at once on two threads: one each
