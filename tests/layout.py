"""The repository's folders against the one namespace that is installed: algo/ is the package sf_core.algo and
envs/ is sf_core.envs (setup.py's FOLDERS, read from there so it is written once)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

from tests.conftest import REPO

# the repository's folders of product code (scripts/ is not installed)
PACKAGE_FOLDERS = ("sf_core", "algo", "envs")


def _read_folders() -> dict[str, str]:
    tree = ast.parse(pathlib.Path(REPO, "setup.py").read_text(encoding="utf-8"))
    found = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets))
    return ast.literal_eval(found)


FOLDERS = _read_folders()  # installed package -> the repository's folder


def module_name(path: pathlib.Path | str) -> str:
    """The module a source file of the repository is when installed: algo/model.py is sf_core.algo.model."""
    parts = list(pathlib.Path(path).resolve().relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    for package, folder in FOLDERS.items():
        if parts[0] == folder:
            return ".".join([package, *parts[1:]])
    return ".".join(parts)


def source_base(module: str) -> pathlib.Path:
    """The repository path of `module` without its suffix: sf_core.algo.model is algo/model (add .py, or
    /__init__.py for a package)."""
    for package, folder in FOLDERS.items():
        if module == package or module.startswith(package + "."):
            return pathlib.Path(REPO, folder, *module[len(package):].split(".")[1:])
    return pathlib.Path(REPO, *module.split("."))


def build_installed_tree(dest: pathlib.Path | str) -> pathlib.Path:
    """The package as pip would install it (setup.py build_py), under `dest`; returns `dest`."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(dest)], cwd=REPO,
                   check=True, capture_output=True, timeout=120)
    return pathlib.Path(dest)
