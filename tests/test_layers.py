"""The house's shape: the layers of .importlinter hold, no module imports in a circle, and config imports no
feature (each registers its own flag checks). docs/architecture.md, "Layout", says what each room is for."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import networkx as nx

from sf_core.cli.arguments import FLAG_CHECKS
from tests.conftest import REPO, extra

grimp = extra("grimp", "dev")

PACKAGES = ("sf_core", "algo", "envs")
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='.importlinter', no_cache=True))")


def lint(root: str) -> subprocess.CompletedProcess:
    """import-linter over the packages under `root`, as its own process: it imports nothing of ours, and its
    graph is built from that tree alone."""
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env={"PYTHONPATH": root, "PATH": ""},
                          capture_output=True, text=True, timeout=120)


def test_the_layers_contract_holds():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract can fail: a contract module that imports the runner is named."""
    for package in PACKAGES:
        shutil.copytree(pathlib.Path(REPO, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(pathlib.Path(REPO, ".importlinter"), tmp_path)
    signals = tmp_path / "sf_core" / "contracts" / "signals.py"
    signals.write_text(signals.read_text(encoding="utf-8") + "\nimport sf_core.run.runner  # noqa\n", encoding="utf-8")
    result = lint(str(tmp_path))
    assert result.returncode != 0
    assert "sf_core.contracts.signals -> sf_core.run.runner" in result.stdout, result.stdout


def test_no_import_cycle():
    """Imports inside functions and under TYPE_CHECKING count too: a circle through either still ties the
    modules together."""
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    edges = nx.DiGraph((m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m))
    cycles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def _registering_modules() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in pathlib.Path(REPO, package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "register_check"
                     and isinstance(getattr(n, "ctx", None), ast.Load)]
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            if calls and not module.startswith("sf_core.config"):  # the engine's own, registered by the config
                found.add(module)
    return found


def test_every_module_that_registers_a_flag_check_is_imported_before_validation():
    """parse_args imports FLAG_CHECKS before Config.validate: a check registered anywhere else would never run
    for a command line."""
    assert _registering_modules() == set(FLAG_CHECKS)


ENTRY_MODULES = {"train", "enjoy", "evaluate", "export", "env_server", "plot"}


def test_sf_core_holds_only_the_config_the_entry_modules_and_rooms():
    """A library module belongs in a room (a sub-package) that says what it may touch; the config is one too."""
    top = {p.stem for p in pathlib.Path(REPO, "sf_core").glob("*.py")}
    assert top == {"__init__"} | ENTRY_MODULES
    assert pathlib.Path(REPO, "sf_core", "config", "__init__.py").is_file()  # the config: a package of its own


def test_env_services_reach_the_engine_through_their_seam():
    """Outside sf_core/service/, the training config's --env_service is read where buffers are sized and where a
    cluster node refits its flags, nowhere else: everything else asks sf_core/service/training.py, which answers
    for a run without services too. (The evaluator's own --env_service flag is its command line's, not this.)"""
    readers = set()
    for package in PACKAGES:
        for path in pathlib.Path(REPO, package).rglob("*.py"):
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith("sf_core/service/"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                read = ast.unparse(node) if isinstance(node, (ast.Attribute, ast.Subscript)) else ""
                if read in ("cfg.env_service", "self.cfg.env_service", "values['env_service']"):
                    readers.add(relative)
    assert readers == {"sf_core/contracts/buffers.py", "sf_core/machine/fit.py"}, readers


def test_the_per_policy_name_rule_is_written_once():
    """`name` for one policy, `name_p{k}` for several: sf_core/contracts/names.py alone writes it."""
    found = []
    for package in PACKAGES:
        for path in pathlib.Path(REPO, package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.JoinedStr) and any(
                        isinstance(v, ast.Constant) and str(v.value).endswith("_p") for v in node.values):
                    found.append(path.relative_to(REPO).as_posix())
    assert found == ["sf_core/contracts/names.py"], found
