"""The house's shape: the layers of .importlinter hold, no module imports in a circle, and config imports no
feature (each registers its own flag checks). docs/architecture.md, "Layout", says what each room is for."""

from __future__ import annotations

import ast
import pathlib
import shutil
import subprocess
import sys

import networkx as nx
import pytest

from sf_core.cli.arguments import FLAG_CHECKS
from tests.conftest import REPO, extra
from tests.layout import PACKAGE_FOLDERS as PACKAGES
from tests.layout import build_installed_tree, module_name

extra("grimp", "dev")

LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='.importlinter', no_cache=True))")
# every import between our modules, as "importer imported" lines
EDGES = ("import grimp; g = grimp.build_graph('sf_core', include_external_packages=False, cache_dir=None); "
         "print('\\n'.join(f'{m} {i}' for m in g.modules for i in g.find_modules_directly_imported_by(m)))")


def installed(tmp_path: pathlib.Path) -> pathlib.Path:
    """The package as installed (algo/ and envs/ inside sf_core/), with the contract beside it: the tools read
    the import graph from the files under one package's folder."""
    root = build_installed_tree(tmp_path / "installed")
    shutil.copy(pathlib.Path(REPO, ".importlinter"), root)
    return root


def run_over(root: pathlib.Path, code: str) -> subprocess.CompletedProcess:
    """`code` over the package under `root`, as its own process: it imports nothing of ours, and its graph is
    built from that tree alone."""
    return subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                          capture_output=True, text=True, timeout=120)


def test_the_layers_contract_holds(tmp_path):
    result = run_over(installed(tmp_path), LINT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract can fail: a contract module that imports the runner is named."""
    root = installed(tmp_path)
    signals = root / "sf_core" / "contracts" / "signals.py"
    signals.write_text(signals.read_text(encoding="utf-8") + "\nimport sf_core.run.runner  # noqa\n", encoding="utf-8")
    result = run_over(root, LINT)
    assert result.returncode != 0
    assert "sf_core.contracts.signals -> sf_core.run.runner" in result.stdout, result.stdout


def test_no_import_cycle(tmp_path):
    """Imports inside functions and under TYPE_CHECKING count too: a circle through either still ties the
    modules together."""
    result = run_over(installed(tmp_path), EDGES)
    assert result.returncode == 0, result.stderr
    edges = nx.DiGraph(tuple(line.split()) for line in result.stdout.splitlines())
    assert "sf_core.algo.model" in edges and "sf_core.envs.registry" in edges
    cycles = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_everything_is_imported_through_the_one_namespace():
    """A user's own `algo.py` or `envs/` must not shadow ours: no module of ours imports a top-level algo or envs
    (from the repository's root they would import, as a second copy of the package)."""
    found = []
    for package in (*PACKAGES, "scripts", "tests"):
        for path in pathlib.Path(REPO, package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                found += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in names
                          if name.split(".")[0] in ("algo", "envs")]
    assert not found, found


@pytest.mark.slow  # starts a process
def test_a_users_algo_module_and_envs_package_shadow_nothing(tmp_path):
    """Run from a folder that holds an `algo.py` and an `envs/` package, as RL projects often do."""
    (tmp_path / "algo.py").write_text("raise ImportError('the user algo.py was imported')\n")
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("raise ImportError('the user envs/ was imported')\n")
    code = ("import gymnasium as gym, sf_core, sf_core.algo.registry, sf_core.cli.train; "
            "print(gym.make('sf_core/Corridor-v0').spec.id)")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "sf_core/Corridor-v0" in result.stdout, result.stderr


def _registering_modules() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in pathlib.Path(REPO, package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "register_check"
                     and isinstance(getattr(n, "ctx", None), ast.Load)]
            module = module_name(path)
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
