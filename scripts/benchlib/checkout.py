"""Running another checkout's sf_core whole (`--baseline_repo`): its sf_core, sf_core.algo and sf_core.envs.

The venv's editable install maps sf_core.algo and sf_core.envs to this checkout's algo/ and envs/ (setup.py
FOLDERS), and PYTHONPATH alone does not undo that: another checkout's sf_core, found first on the path, has no
algo/ or envs/ folder inside it, so its `import sf_core.algo` falls through to the editable install and gets
this checkout's. A `sitecustomize` module, in a folder put first on PYTHONPATH, maps all three packages to the
other checkout in every interpreter of the run's process tree (spawned and forkserver processes included).
"""

from __future__ import annotations

import os

from . import REPO

# setup.py's FOLDERS, and sf_core itself: package -> folder in the checkout (the same since the first commit)
PACKAGES = {"sf_core": "sf_core", "sf_core.algo": "algo", "sf_core.envs": "envs"}

SITECUSTOMIZE = '''"""Written by scripts/benchlib/checkout.py: sf_core and its packages from {root}."""
import os
import sys
from importlib.util import spec_from_file_location

_ROOT = {root!r}
_PACKAGES = {packages!r}


class _CheckoutFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        folder = _PACKAGES.get(name)
        if folder is None:
            return None
        where = os.path.join(_ROOT, folder)
        return spec_from_file_location(name, os.path.join(where, "__init__.py"), submodule_search_locations=[where])


sys.meta_path.insert(0, _CheckoutFinder)
'''


def checkout_env(repo: str, work_dir: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment (`base`, default os.environ) whose interpreters import sf_core from `repo`: this
    checkout's as the editable install has it, another's through a sitecustomize written under `work_dir`."""
    env = dict(os.environ if base is None else base)
    path = [repo]
    if os.path.realpath(repo) != os.path.realpath(REPO):
        folder = os.path.join(work_dir, "checkout_" + os.path.basename(os.path.realpath(repo)))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE.format(root=os.path.realpath(repo), packages=PACKAGES))
        path.insert(0, folder)
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env
