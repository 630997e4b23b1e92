"""The code's shape: the contracts declared once, and modules and functions a reader can take in."""

from __future__ import annotations

import ast
import os
import pathlib

import pytest

from sf_core.contracts.sample import BATCH_KEYS
from tests.conftest import REPO

PRODUCT = ("sf_core", "algo", "envs", "scripts")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# signal-slot-mp's internals: routing tables and loop queues (sf_core.contracts.component.Routing only)
INTERNALS = {"send_signals_to", "receiver_queues", "receiver_refcount", "signal_queue", "should_terminate",
             "receivers", "connections"}


def product_modules() -> list[pathlib.Path]:
    root = pathlib.Path(REPO)
    return sorted(p for top in PRODUCT for p in (root / top).rglob("*.py"))


def parsed() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(REPO)), ast.parse(p.read_text(encoding="utf-8"))) for p in product_modules()]


def test_modules_and_functions_fit_a_sitting_and_a_screen():
    too_long = []
    for path in product_modules():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(REPO)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}(): {lines} lines")
    assert not too_long, "\n".join(too_long)


def _string_collections(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            yield node.lineno, strings


def test_no_list_of_sample_fields_outside_the_schema():
    """What a sample is, is written once (sf_core/contracts/sample.py): a literal naming several of its fields
    elsewhere is a second copy that drifts. Graph nodes (algo/) name the keys each one reads, never
    more than half of the fields; the engine names no three together."""
    found = []
    for path, tree in parsed():
        if path == "sf_core/contracts/sample.py":
            continue
        limit = len(BATCH_KEYS) // 2 + 1 if path.startswith("algo/") else 3
        found += [f"{path}:{line} {strings}" for line, strings in _string_collections(tree)
                  if len(set(strings) & set(BATCH_KEYS)) >= limit]
    assert not found, "\n".join(found)


def test_no_signal_name_outside_the_signals_module():
    """Signals are emitted and connected through sf_core.contracts.signals' objects, never by a name written
    at the call (signal-slot's emit(name, ...) / connect(name, slot))."""
    by_name = {"emit": 1, "emit_many": 1, "emit_bounded": 1, "connect": 2, "disconnect": 2}
    found = []
    for path, tree in parsed():
        if path == "sf_core/contracts/signals.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            min_args = by_name.get(node.func.attr)
            if min_args and len(node.args) >= min_args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
                found.append(f"{path}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found, "\n".join(found)


def test_signal_slot_internals_only_behind_the_routing_adapter():
    found = []
    for path, tree in parsed():
        allowed = set()
        if path == "sf_core/contracts/component.py":
            routing = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Routing")
            allowed = {id(n) for n in ast.walk(routing)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in INTERNALS and id(node) not in allowed:
                found.append(f"{path}:{node.lineno} .{node.attr}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module", ["sf_core.evaluation.worker", "sf_core.evaluation.evaluator",
                                    "sf_core.sampling.rollout_worker", "sf_core.sampling.inference_worker",
                                    "sf_core.learning.learner"])
def test_worker_processes_import_no_command_line_tool(module):
    """A component or worker process must not pull in an entry point (and its logging and parsing)."""
    import importlib
    import sys

    before = set(sys.modules)
    importlib.import_module(module)
    cli = sorted(m for m in set(sys.modules) - before if m.startswith("sf_core.cli"))
    tree = ast.parse(pathlib.Path(REPO, *module.split(".")).with_suffix(".py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not cli and not any(m.startswith("sf_core.cli") or m in ("sf_core.train", "sf_core.enjoy")
                               for m in imported), (cli, imported)


def test_every_emit_and_connection_type_checks_against_the_signal_declarations():
    """mypy over every module that uses the signals (and the contract modules): an emit with the wrong
    payload, or a slot that cannot take it, fails here. Other imports are skipped (taken as Any), so
    this checks our code's contracts in seconds, not torch's stubs."""
    from mypy import api

    contracts = [f"sf_core/contracts/{name}.py" for name in ("signals", "sample", "control", "component", "timing")]
    users = [str(p.relative_to(REPO)) for p in product_modules()
             if "sf_core.contracts.signals import" in p.read_text(encoding="utf-8")
             or "from sf_core.contracts import signals" in p.read_text(encoding="utf-8")]
    assert "sf_core/machine/wiring.py" in users and "sf_core/sampling/rollout_worker.py" in users
    files = sorted(set(contracts + users))
    out, err, status = api.run(["--ignore-missing-imports", "--follow-imports=skip", "--cache-dir=/dev/null",
                                "--no-error-summary", *[os.path.join(REPO, f) for f in files]])
    assert status == 0, out + err
