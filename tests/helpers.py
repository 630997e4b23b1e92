"""Shared test helpers: run a training in-process and read what it reports."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import subprocess
import time
from typing import Iterator

import sf_core.train
from tests import launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def sf_core_log() -> Iterator[list[str]]:
    """The messages logged to the "sf_core" logger meanwhile, from INFO up: a handler of its own, since the entry
    points stop that logger's records from reaching the root's (and pytest's caplog)."""
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("sf_core")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def train(tmp_path, *args: str, experiment: str = "exp") -> tuple[int, dict]:
    """Run sf_core.train.main in this interpreter; returns (exit code, training_summary.json)."""
    code = sf_core.train.main([f"--train_dir={tmp_path}", f"--experiment={experiment}", *args])
    return code, read_summary(tmp_path, experiment)


def read_summary(train_dir, experiment: str = "exp") -> dict:
    path = os.path.join(train_dir, experiment, "training_summary.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def kill_9_once(args: list[str], ready, timeout: float, what: str) -> None:
    """Start `python -m sf_core.train ARGS`, wait until `ready()`, kill -9 the trainer (no chance to save
    anything) and check that none of its component processes outlives it."""
    import psutil

    proc = launch.start(args)
    try:
        wait_for(ready, timeout, what)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    _, alive = psutil.wait_procs(children, timeout=8)
    assert not alive, "component processes outlived a killed trainer"


def run_to_the_end(tmp_path, args: list[str], timeout: float) -> tuple[subprocess.Popen, str, list, list]:
    """Train with `args` (console in tmp_path/train.log) until the trainer exits or `timeout`; returns the process,
    its console, every process it started (seen while it ran), and those still alive 10 s after it ended."""
    import psutil

    log_path = tmp_path / "train.log"
    with open(log_path, "w") as log:
        proc = launch.start([f"--train_dir={tmp_path}", "--experiment=exp", *args], output=log)
    descendants: dict = {}  # every process the trainer started, seen while it ran
    deadline = time.time() + timeout
    try:
        while proc.poll() is None and time.time() < deadline:
            try:
                descendants.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.5)
        proc.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    _, alive = psutil.wait_procs(list(descendants.values()), timeout=10)
    return proc, log_path.read_text(), list(descendants.values()), alive


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class EnvServerProcess:
    """`python -m sf_core.env_server` as a subprocess, its output in a file; kill() in a finally."""

    def __init__(self, log_dir, env: str = "CartPole-v1", capacity: int = 4, port: int = 0, *extra: str):
        self.log_dir, self.env, self.capacity, self.extra = str(log_dir), env, capacity, extra
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 30.0) -> "EnvServerProcess":
        self.starts += 1
        log_path = os.path.join(self.log_dir, f"env_server_{id(self)}_{self.starts}.log")
        with open(log_path, "w") as log:
            self.proc = launch.start([f"--env={self.env}", f"--port={self.port}", f"--capacity={self.capacity}",
                                      "--env_module=tests.service_envs", *self.extra], module="sf_core.env_server",
                                     output=log)

        def serving() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"env server exited with {self.proc.returncode}: {open(log_path).read()}")
            text = open(log_path).read()
            return "serving" in text

        wait_for(serving, timeout, f"env server {self.env} to start")
        line = next(l for l in open(log_path) if l.startswith("env_server: serving"))
        self.port = int(line.split("tcp://")[1].split()[0].rsplit(":", 1)[1])
        return self

    @property
    def spec(self) -> str:
        return f"127.0.0.1:{self.port}*{self.capacity}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def final_returns(experiment_path, episodes: int = 8) -> list[float]:
    """Each policy's last checkpoint played deterministically on CartPole: its mean return."""
    from sf_core.algo.model import ModelSpec
    from sf_core.evaluation.policy import PolicyCheckpoint
    from sf_core.records import checkpoint
    from sf_core.records.experiment import load_config

    cfg = load_config(str(experiment_path))
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    returns = []
    for p in range(cfg.num_policies):
        path = checkpoint.latest_checkpoint(checkpoint.checkpoint_dir(str(experiment_path), p, cfg.num_policies))
        state = checkpoint.load(path)
        policy = PolicyCheckpoint(cfg, path, state["version"], state["model"], ModelSpec.from_config(cfg)).policy(
            env.observation_space, env.action_space, deterministic=True)
        total = 0.0
        for k in range(episodes):
            obs, _ = env.reset(seed=1000 + k)
            episode, done = policy.start_episode(), False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy.act([obs], episode)[0])
                total, done = total + reward, terminated or truncated
        returns.append(total / episodes)
    return returns


class Scalars:
    """A TensorBoard writer that keeps what it is given: tag -> [(step, value)]."""

    def __init__(self):
        self.scalars: dict[str, list[tuple[int, float]]] = {}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.setdefault(tag, []).append((step, float(value)))

    def flush(self) -> None:
        pass


def free_ports(n: int) -> int:
    """The first of `n` consecutive ports nothing listens on (loopback)."""
    for _ in range(200):
        base = random.randrange(20_000, 60_000)
        if all(bindable(base + k) for k in range(n)):
            return base
    raise AssertionError(f"no {n} consecutive free ports")


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
