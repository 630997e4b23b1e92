"""The Python blocks of README.md and docs/custom_env.md run as written.

A block with a `__main__` guard is a program: it runs as a script, with a small frame budget and its own
folder given on its command line (the docs' programs pass `sys.argv[1:]` last, so these win), and must
train; it is then replayed and exported through `--env_module`, as the pages say. The other blocks are
pieces of a page: they run in order, in one interpreter, as a reader would paste them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

PAGES = ("README.md", "docs/custom_env.md")
BUDGET = ["--train_for_env_steps=3000", "--num_workers=1", "--num_envs_per_worker=8", "--batch_size=256",
          "--rollout=16", "--worker_num_splits=2", "--restart_behavior=overwrite"]


def python_blocks(page: str) -> list[str]:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def programs(page: str) -> list[str]:
    return [b for b in python_blocks(page) if "if __name__ == \"__main__\":" in b]


def run(args: list[str], cwd, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=REPO))


def test_every_page_has_its_blocks():
    assert len(programs("README.md")) == 1 and len(programs("docs/custom_env.md")) == 2
    assert len(python_blocks("docs/custom_env.md")) == 7


@pytest.mark.parametrize("page", PAGES)
def test_every_program_registers_its_env_where_the_tools_can_import_it(page):
    """A `register_env` call under the `__main__` guard runs only in the training script: `enjoy` and `export`
    given the file as --env_module would not know the env. The docs' programs register at import."""
    for program in programs(page):
        guarded = program[program.index('if __name__ == "__main__":'):]
        assert "register_env(" in program and "register_env(" not in guarded, program


@pytest.mark.parametrize("page", PAGES)
def test_the_pieces_of_a_page_run_in_order(page, tmp_path):
    pieces = [b for b in python_blocks(page) if b not in programs(page)]
    if not pieces:
        return
    (tmp_path / "pieces.py").write_text("\n\n".join(pieces))
    done = run(["pieces.py"], tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("page,index", [("README.md", 0), ("docs/custom_env.md", 0), ("docs/custom_env.md", 1)])
def test_a_program_of_the_docs_trains_as_written(page, index, tmp_path):
    script = tmp_path / "my_env.py"
    script.write_text(programs(page)[index])
    where = [f"--train_dir={tmp_path / 'runs'}", "--experiment=snippet"]
    trained = run([str(script), *BUDGET, *where], tmp_path, timeout=150)
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "snippet" / "training_summary.json").read_text())
    assert summary["frames"] >= 3000 and summary["samples_trained"] > 0 and summary["error"] is None
    # the pages' next step: replay and export through --env_module, which imports the program's file
    played = run(["-m", "sf_core.enjoy", *where, "--env_module=my_env", "--max_num_episodes=2"], tmp_path, 120)
    assert played.returncode == 0, played.stderr[-3000:]
    assert json.loads((tmp_path / "runs" / "snippet" / "eval_results.json").read_text())["episodes"] >= 2
    exported = run(["-m", "sf_core.export", *where, "--env_module=my_env", "--format=torchscript"], tmp_path, 120)
    assert exported.returncode == 0, exported.stderr[-3000:]
