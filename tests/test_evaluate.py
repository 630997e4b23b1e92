"""The evaluator (`python -m sf_core.evaluate`): every task exactly one result line, a broken slot's task
retried elsewhere, a graceful stop that keeps finished results, and clear errors before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests import launch
from tests.helpers import EnvServerProcess, free_ports, wait_for


def write_tasks(path, n: int, env: str, episodes: int = 1) -> set[str]:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"t{i}", "env": env, "seed": i, "episodes": episodes}) + "\n")
    return {f"t{i}" for i in range(n)}


def run_evaluate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return launch.run(list(args), timeout, module="sf_core.evaluate")


def read_results(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fifty_tasks_two_workers_small_pool_one_broken_slot(tmp_path):
    """Done-when 3: 50 tasks, 2 workers that would each run 4 at once, a pool of 3 slots (so 2 + 1).
    Instance 0 crashes mid-episode once: that task is retried on another slot; every task has exactly
    one result line, and the results do not depend on which slot ran them."""
    server = EnvServerProcess(tmp_path, "FlakyCartPole-v1", 3)
    try:
        server.start()
        ids = write_tasks(tmp_path / "tasks.jsonl", 50, "FlakyCartPole-v1", episodes=2)
        out = tmp_path / "results.jsonl"
        result = run_evaluate(f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}", "--num_workers=2",
                              "--concurrency=4", "--max_task_retries=2", f"--output={out}",
                              "--env_service_recheck_interval=0.3")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "50 tasks on 2 workers × 4 task runners (pool FlakyCartPole-v1: 3 slots)" in result.stdout
        lines = read_results(out)
        assert len(lines) == 50 and {r["id"] for r in lines} == ids  # exactly one line per task
        assert all(r["status"] == "ok" and len(r["returns"]) == 2 and len(r["lengths"]) == 2 for r in lines)
        slots = {f"127.0.0.1:{server.port}#{i}" for i in range(3)}
        assert {r["slot"] for r in lines} <= slots
        retried = [r for r in lines if r["failures"]]
        assert len(retried) == 1, retried
        first, second = retried[0]["attempts"]
        assert first["slot"] == f"127.0.0.1:{server.port}#0" and "simulated simulator crash" in first["error"]
        assert second["error"] is None and second["slot"] != first["slot"] == f"127.0.0.1:{server.port}#0"
        # episode k of a task is seeded seed + k, and the random policy by the task's seed: the retried
        # task gives what a fresh run of it on any slot gives
        rerun_tasks = tmp_path / "one.jsonl"
        rerun_tasks.write_text(json.dumps({"id": retried[0]["id"], "env": "FlakyCartPole-v1",
                                           "seed": retried[0]["seed"], "episodes": 2}) + "\n")
        again = run_evaluate(f"--tasks={rerun_tasks}", f"--env_service={server.spec}", "--num_workers=1",
                             f"--output={tmp_path / 'one.results.jsonl'}")
        assert again.returncode == 0, again.stderr
        assert read_results(tmp_path / "one.results.jsonl")[0]["returns"] == retried[0]["returns"]
    finally:
        server.kill()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_stops_gracefully_keeps_results_and_resume_finishes(tmp_path):
    server = EnvServerProcess(tmp_path, "SlowCartPole-v1", 2)
    proc = None
    try:
        server.start()
        ids = write_tasks(tmp_path / "tasks.jsonl", 30, "SlowCartPole-v1")
        out = tmp_path / "results.jsonl"
        args = [f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}", "--num_workers=2",
                f"--output={out}", "--grace_period=5"]
        proc = launch.start(args, module="sf_core.evaluate", output=subprocess.DEVNULL)
        wait_for(lambda: os.path.exists(out) and len(read_results(out)) >= 3, 60, "3 results")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
        kept = read_results(out)  # every line whole, every finished task kept
        assert 3 <= len(kept) < 30 and len({r["id"] for r in kept}) == len(kept)
        assert all(r["status"] == "ok" for r in kept)
        result = run_evaluate(*args, "--resume=True")
        assert result.returncode == 0, result.stderr
        final = read_results(out)
        assert len(final) == 30 and {r["id"] for r in final} == ids
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        server.kill()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_twenty_tasks_on_a_fleet_of_four_slots_leave_twenty_folders_and_resume_runs_only_the_unfinished(tmp_path):
    """20 tasks on 2 servers × 2 slots started by `python -m sf_core.fleet up`, half of them with a runner
    that writes into its task folder. The evaluator is killed (SIGKILL) mid-run; --resume runs only the
    tasks whose folder has no result.json, each from an emptied folder, and leaves 20 finished folders."""
    base = free_ports(2)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"services:\n  slow:\n    env: SlowCartPole-v1\n    env_module: tests.service_envs\n"
                     f"    replicas: 2\n    concurrency: 2\n    port: {base}\n")
    with open(tmp_path / "tasks.jsonl", "w") as f:
        for i in range(20):
            runner = {"runner": "recorded_episodes"} if i % 2 == 0 else {}
            f.write(json.dumps({"id": f"t{i}", "env": "SlowCartPole-v1", "seed": i, "episodes": 2, **runner}) + "\n")
    out, folders = tmp_path / "results.jsonl", tmp_path / "results"
    args = [f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={fleet}", "--num_workers=2",
            "--env_module=tests.service_envs", f"--output={out}"]
    proc = None

    def finished() -> dict[str, dict]:
        return {p.parent.name: json.loads(p.read_text()) for p in folders.glob("*/result.json")}

    try:
        up = launch.run(["up", str(fleet)], 90, module="sf_core.fleet")
        assert up.returncode == 0, up.stdout + up.stderr
        proc = launch.start(args, module="sf_core.evaluate", output=subprocess.DEVNULL)
        wait_for(lambda: len(finished()) >= 4, 60, "4 finished task folders")
        workers = psutil.Process(proc.pid).children(recursive=True)
        proc.kill()
        proc.wait(timeout=10)
        killed_at = time.time()
        _, alive = psutil.wait_procs(workers, timeout=20)  # they end their task in hand, see no coordinator, leave
        assert not alive
        before = finished()
        assert 4 <= len(before) < 20, len(before)
        result = run_evaluate(*args, "--resume=True")
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"--resume: {len(before)} tasks already finished, {20 - len(before)} to run" in result.stdout
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        launch.run(["down", str(fleet)], 60, module="sf_core.fleet")
    after = finished()
    assert sorted(after) == sorted(f"t{i}" for i in range(20)) == sorted(p.name for p in folders.iterdir())
    assert all(after[t] == line for t, line in before.items())  # finished tasks were not run again
    rerun = [after[t] for t in after if t not in before]
    assert all(line["status"] == "ok" and line["attempts"][0]["started"] > killed_at for line in rerun)
    lines = read_results(out)
    assert sorted(r["id"] for r in lines) == sorted(after)  # one line per task, none twice
    for task_id, line in after.items():
        files = sorted(p.name for p in (folders / task_id).iterdir())
        if int(task_id[1:]) % 2:  # the default runner: only the evaluator's marker
            assert files == ["result.json"], files
            continue
        assert len([f for f in files if f.startswith("attempt-")]) == 1, files  # an emptied folder per attempt
        steps = (folders / task_id / "trajectory.jsonl").read_text().splitlines()
        assert len(steps) == sum(line["lengths"]) and line["runner"] == "recorded_episodes"


@pytest.mark.slow
def test_bad_tasks_and_services_are_rejected_before_anything_starts(tmp_path):
    server = EnvServerProcess(tmp_path, "CartPole-v1", 1)
    try:
        server.start()
        write_tasks(tmp_path / "tasks.jsonl", 3, "CartPole-v1")
        # fewer slots than workers is no longer refused (the runners share the pool: the tests below)
        write_tasks(tmp_path / "other.jsonl", 3, "Pendulum-v1")
        result = run_evaluate(f"--tasks={tmp_path / 'other.jsonl'}", f"--env_service={server.spec}", "--num_workers=1")
        assert result.returncode == 2 and "tasks need Pendulum-v1, which no server" in result.stderr
        (tmp_path / "bad.jsonl").write_text('{"id": "a", "env": "CartPole-v1", "episodes": 0}\n')
        result = run_evaluate(f"--tasks={tmp_path / 'bad.jsonl'}", f"--env_service={server.spec}")
        assert result.returncode == 2 and "bad.jsonl:1: episodes must be a positive integer" in result.stderr
        result = run_evaluate(f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}", "--num_workers=1",
                              f"--train_dir={tmp_path}", "--experiment=never_trained")
        assert result.returncode == 2 and f"no experiment at {tmp_path / 'never_trained'}" in result.stderr
    finally:
        server.kill()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_trained_policy_evaluated_on_served_env(tmp_path):
    """--experiment: the tasks are played by the experiment's policy. Deterministic actions and episode k
    seeded seed + k give exactly the returns sf_core.enjoy gets with the same policy on a local env."""
    import sf_core.enjoy
    from tests.helpers import train

    code, _ = train(tmp_path, "--env=CartPole-v1", "--serial_mode=True", "--num_workers=1",
                    "--train_for_env_steps=5000", experiment="policy")
    assert code == 0
    assert sf_core.enjoy.main([f"--train_dir={tmp_path}", "--experiment=policy", "--max_num_episodes=3",
                               "--eval_deterministic=True", "--seed=5"]) == 0
    with open(tmp_path / "policy" / "eval_results.json") as f:
        local_returns = json.load(f)["returns"]
    server = EnvServerProcess(tmp_path, "CartPole-v1", 2)
    try:
        server.start()
        (tmp_path / "tasks.jsonl").write_text(
            "".join(json.dumps({"id": f"t{i}", "env": "CartPole-v1", "seed": 5, "episodes": 3}) + "\n" for i in range(2)))
        out = tmp_path / "results.jsonl"
        result = run_evaluate(f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}", "--num_workers=1",
                              f"--train_dir={tmp_path}", "--experiment=policy", "--eval_deterministic=True",
                              f"--output={out}")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "did not stop in time" not in result.stdout
        lines = read_results(out)
        assert [r["returns"] for r in lines] == [local_returns, local_returns]
    finally:
        server.kill()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_recurrent_dict_observation_policy_evaluates_as_enjoy_plays_it(tmp_path):
    """A recurrent policy with Dict observations (tests/service_envs.py: DictMemoryCue-v0, where only
    memory beats chance) acts the same through the evaluator as in sf_core.enjoy: same returns on the
    same seeds. The evaluator's two task threads share one model, each task with its own recurrent state."""
    import torch

    import sf_core.enjoy
    import tests.service_envs  # noqa: F401 - registers DictMemoryCue-v0 here, as --env_module does in the server
    from tests.helpers import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # serial training here: on cores busy with other work a second torch thread mostly waits
    try:
        code, summary = train(tmp_path, "--env=DictMemoryCue-v0", "--use_rnn=True", "--serial_mode=True",
                              "--num_workers=1", "--num_envs_per_worker=16", "--rnn_size=32", "--encoder_mlp_layers",
                              "32", "--rollout=16", "--batch_size=256", "--num_epochs=2", "--learning_rate=1e-3",
                              "--target_mean_return=0.7", "--train_for_env_steps=150000", "--seed=3",
                              experiment="memory")
        assert code == 0 and summary["time_to_target"] is not None, summary
        assert sf_core.enjoy.main([f"--train_dir={tmp_path}", "--experiment=memory", "--max_num_episodes=40",
                                   "--eval_deterministic=True", "--seed=5"]) == 0
    finally:
        torch.set_num_threads(threads)
    with open(tmp_path / "memory" / "eval_results.json") as f:
        local = json.load(f)
    assert local["mean_return"] >= 0.5, local  # chance is 0.25: the state is carried through each episode
    server = EnvServerProcess(tmp_path, "DictMemoryCue-v0", 2)
    try:
        server.start()
        (tmp_path / "tasks.jsonl").write_text(
            "".join(json.dumps({"id": f"t{i}", "env": "DictMemoryCue-v0", "seed": 5, "episodes": 40}) + "\n"
                    for i in range(2)))
        out = tmp_path / "results.jsonl"
        result = run_evaluate(f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}", "--num_workers=1",
                              f"--train_dir={tmp_path}", "--experiment=memory", "--eval_deterministic=True",
                              f"--output={out}")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 tasks on 1 workers × 2 task runners" in result.stdout  # both tasks at once on the one model
        lines = read_results(out)
        assert [r["status"] for r in lines] == ["ok", "ok"], lines
        assert [r["returns"] for r in lines] == [local["returns"]] * 2
        assert [r["lengths"] for r in lines] == [local["lengths"]] * 2
    finally:
        server.kill()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_tasks_longer_than_the_grace_period_are_killed(tmp_path):
    """SIGTERM with tasks of several seconds in hand and --grace_period=0.5: the workers are killed, the
    coordinator exits promptly with 143, and no half-finished task leaves a line."""
    import time

    server = EnvServerProcess(tmp_path, "SlowCartPole-v1", 2)
    proc = None
    try:
        server.start()
        write_tasks(tmp_path / "tasks.jsonl", 4, "SlowCartPole-v1", episodes=20)  # ~8 s each
        out, log = tmp_path / "results.jsonl", tmp_path / "evaluate.log"
        with open(log, "w") as f:
            proc = launch.start([f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}",
                                 "--num_workers=2", f"--output={out}", "--grace_period=0.5"], module="sf_core.evaluate",
                                output=f)
        wait_for(lambda: "4 tasks on 2 workers" in log.read_text(), 30, "the evaluator to start")
        # the spawned workers still have to import and reach their slots: on busy cores that took over a
        # second, and a worker stopped before it took a task has nothing to be killed for
        time.sleep(3.0)
        stopped = time.time()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
        assert time.time() - stopped < 8.0
        text = log.read_text()
        assert "did not stop in time: killing it" in text, text
        assert not out.exists() or read_results(out) == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        server.kill()


# ------------------------------------------------------------------ shared pools, named pools, inline, in-process


def overlapping(intervals: list[tuple[float, float]]) -> list[tuple]:
    ordered = sorted(intervals)
    return [(a, b) for a, b in zip(ordered, ordered[1:]) if b[0] < a[1]]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_six_tasks_on_two_slots_with_four_runners_never_share_a_slot(tmp_path, monkeypatch):
    """4 task runners (2 workers × 2) on 2 slots: every task completes, and no slot ever serves two tasks at
    once, by the evaluator's own record (each attempt's slot and start/end times) and by the server's
    (each instance logs its resets with their seeds and its restores between tasks)."""
    monkeypatch.setenv("SLOT_LOG", str(tmp_path / "slots.log"))  # the server inherits it
    server = EnvServerProcess(tmp_path, "SlotLogCartPole-v1", 2)
    try:
        server.start()
        with open(tmp_path / "tasks.jsonl", "w") as f:
            for i in range(6):
                f.write(json.dumps({"id": f"t{i}", "env": "SlotLogCartPole-v1", "seed": 100 * i, "episodes": 2}) + "\n")
        out = tmp_path / "results.jsonl"
        result = run_evaluate(f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}", "--num_workers=2",
                              "--concurrency=2", f"--output={out}")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "6 tasks on 2 workers × 2 task runners" in result.stdout
        assert "4 runners for 2 slots: at most 2 tasks run at once" in result.stdout
        lines = read_results(out)
        assert sorted(r["id"] for r in lines) == [f"t{i}" for i in range(6)]
        assert all(r["status"] == "ok" and r["failures"] == 0 for r in lines)
        by_slot: dict[str, list] = {}
        for r in lines:
            (attempt,) = r["attempts"]
            by_slot.setdefault(attempt["slot"], []).append((attempt["started"], attempt["ended"]))
        assert set(by_slot) == {f"127.0.0.1:{server.port}#{i}" for i in range(2)}  # both slots worked
        assert all(not overlapping(v) for v in by_slot.values()), by_slot
        # the server's view: between two restores of an instance, only one task's episodes (seeds 100i, 100i + 1)
        events = [json.loads(line) for line in open(tmp_path / "slots.log")]
        for slot in (0, 1):
            segment, tasks_seen = [], []
            for e in (e for e in events if e["slot"] == slot):
                if e["event"] == "reset" and e["seed"] is not None:  # the server's own reset at startup has none
                    segment.append(e["seed"])
                elif e["event"] == "restore" and segment:
                    assert len(segment) == 2 and len({s // 100 for s in segment}) == 1, (slot, segment)
                    tasks_seen.append(segment[0] // 100)
                    segment = []
            assert not segment, (slot, segment)
        assert len(tasks_seen) >= 1
    finally:
        server.kill()


def write_pool_tasks(path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"t{i}", "needs": ["sim", "reward"], "runner": "sim_with_reward",
                                "seed": 10 * i, "episodes": 3}) + "\n")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_pool_tasks_survive_a_killed_reward_server_and_match_the_in_process_run(tmp_path):
    """Tasks that need one `sim` and one `reward` slot (pools named in the YAML), 4 runners on 2 + 2 slots:
    no deadlock, and with one reward server killed (SIGKILL) mid-run every task still completes, retried
    on the surviving reward server. The same tasks run inline on in-process envs give the same returns."""
    sim = EnvServerProcess(tmp_path, "CartPole-v1", 2)
    rewards = [EnvServerProcess(tmp_path, "SlowObsReward-v0", 1) for _ in range(2)]
    proc = None
    try:
        for server in (sim, *rewards):
            server.start()
        pools = tmp_path / "pools.yaml"
        pools.write_text(f"pools:\n  sim: [{sim.spec}]\n  reward: [\"{rewards[0].spec}\", "
                         f"{{host: 127.0.0.1, port: {rewards[1].port}, capacity: 1}}]\n")
        write_pool_tasks(tmp_path / "tasks.jsonl", 8)
        out, log = tmp_path / "results.jsonl", tmp_path / "evaluate.log"
        with open(log, "w") as f:
            proc = launch.start([f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={pools}", "--num_workers=2",
                                 "--concurrency=2", "--env_module=tests.service_envs", "--env_service_timeout=1",
                                 "--env_service_recheck_interval=0.3", f"--output={out}"], module="sf_core.evaluate",
                                output=f)
        wait_for(lambda: out.exists() and len(read_results(out)) >= 1, 60, "a first result")
        rewards[0].kill()  # both reward slots are in use nearly all the time: a task is on it
        assert proc.wait(timeout=90) == 0, log.read_text()
        lines = read_results(out)
        assert sorted(r["id"] for r in lines) == [f"t{i}" for i in range(8)]
        assert all(r["status"] == "ok" and len(r["returns"]) == 3 for r in lines), lines
        dead, alive = f"127.0.0.1:{rewards[0].port}#0", f"127.0.0.1:{rewards[1].port}#0"
        failed = [a for r in lines for a in r["attempts"] if a["error"]]
        assert failed and all(a["failed_slots"] == [dead] for a in failed), failed
        assert all(r["slots"]["reward"] == alive for r in lines if r["failures"])  # retried on the survivor
        assert all(set(r["slots"]) == {"sim", "reward"} for r in lines)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for server in (sim, *rewards):
            server.kill()
    local = tmp_path / "local.jsonl"
    result = run_evaluate(f"--tasks={tmp_path / 'tasks.jsonl'}", "--num_workers=0", "--concurrency=2",
                          "--env_module=tests.service_envs", "--local_pools=sim=CartPole-v1,reward=ObsReward-v0",
                          f"--output={local}")
    assert result.returncode == 0, result.stdout + result.stderr
    by_id = {r["id"]: r["returns"] for r in lines}
    assert {r["id"]: r["returns"] for r in read_results(local)} == by_id


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_inline_and_in_process_modes_give_the_service_results(tmp_path):
    """The same seeded tasks, random policy: worker processes on a served env, the coordinator's own
    threads on it (--num_workers=0), and envs built in-process (no --env_service) in a worker process and
    inline, all write the same returns."""
    server = EnvServerProcess(tmp_path, "CartPole-v1", 2)
    try:
        server.start()
        write_tasks(tmp_path / "tasks.jsonl", 5, "CartPole-v1", episodes=2)
        runs = {"service": [f"--env_service={server.spec}", "--num_workers=2"],
                "service_inline": [f"--env_service={server.spec}", "--num_workers=0", "--concurrency=2"],
                "local": ["--num_workers=1", "--concurrency=2"],
                "local_inline": ["--num_workers=0"]}
        returns = {}
        for name, flags in runs.items():
            out = tmp_path / f"{name}.jsonl"
            result = run_evaluate(f"--tasks={tmp_path / 'tasks.jsonl'}", *flags, f"--output={out}")
            assert result.returncode == 0, result.stdout + result.stderr
            lines = read_results(out)
            assert all(r["status"] == "ok" for r in lines)
            returns[name] = {r["id"]: r["returns"] for r in lines}
        assert "inline on the coordinator" in result.stdout
        assert len(returns["service"]) == 5
        assert all(r == returns["service"] for r in returns.values()), returns
    finally:
        server.kill()


def test_bad_pools_runners_and_needs_are_refused_before_anything_starts(tmp_path, capsys):
    """Refused with exit code 2 and one message, before any server is asked (none runs here) or any
    worker starts."""
    import sf_core.evaluate

    def refused(tasks: list[dict], service: str, *flags: str) -> str:
        (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        capsys.readouterr()
        code = sf_core.evaluate.main([f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={service}",
                                      "--env_module=tests.service_envs", f"--output={tmp_path / 'out.jsonl'}", *flags])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("sf_core.evaluate: error: "), err
        assert not (tmp_path / "out.jsonl").exists()
        return err

    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  sim: [127.0.0.1:5999*2]\n  reward: [127.0.0.1:6999*1]\n")
    both = {"id": "a", "needs": ["sim", "reward"], "runner": "sim_with_reward", "seed": 1}
    assert "tasks need rewrd, which no pool of" in refused([{**both, "needs": ["sim", "rewrd"]}], str(pools))
    assert "names runner 'nope', which is not registered" in refused([{**both, "runner": "nope"}], str(pools))
    assert "needs 2 pools (sim, reward) but names no runner" in refused([{"id": "a", "needs": ["sim", "reward"]}],
                                                                        str(pools))
    assert "names runner 'nope'" in refused([{"id": "a", "env": "CartPole-v1", "runner": "nope"}], "")
    assert "pool 'reward' (--local_pools: env 'NoSuchReward-v0') cannot be built in-process" in refused(
        [both], "", "--local_pools=sim=CartPole-v1,reward=NoSuchReward-v0")
    (tmp_path / "empty.yaml").write_text("pools:\n  sim: [127.0.0.1:5999*2]\n  reward: []\n")
    assert "pool 'reward' has no slots" in refused([both], str(tmp_path / "empty.yaml"))
    (tmp_path / "twice.yaml").write_text("pools:\n  sim: [127.0.0.1:5999*2]\n  reward: [127.0.0.1:5999*1]\n")
    assert "127.0.0.1:5999 is listed in pool 'sim' and in pool 'reward'" in refused([both], str(tmp_path / "twice.yaml"))
    assert "--local_pools names the in-process envs" in refused([both], str(pools), "--local_pools=sim=CartPole-v1")
    assert "skip mode is for training; the evaluator runs the same tasks on in-process envs" in refused(
        [{"id": "a", "env": "CartPole-v1"}], "skip:CartPole-v1")
    assert "a task's folder is given by the evaluator" in refused([{"id": "a", "folder": "/tmp/x"}], str(pools))


def test_broker_leases_all_or_none_in_fifo_order_and_times_out_a_pool_without_healthy_slots():
    """The slot broker alone, on its real pools (no server is contacted while every slot is healthy): a task
    that needs two pools gets both slots or none, a later task never takes a slot an earlier waiting
    task needs (so the two-pool task is not starved by one-pool tasks), and a pool whose every slot
    failed fails the waiting task's attempt after --acquire_timeout, not before."""
    from sf_core.evaluation.slot_broker import SlotBroker
    from sf_core.service.env_pool import EnvPool

    pools = {"sim": EnvPool([("127.0.0.1:1", 0), ("127.0.0.1:1", 1)], timeout=0.5, recheck_interval=5.0),
             "reward": EnvPool([("127.0.0.1:2", 0)], timeout=0.5, recheck_interval=5.0)}
    broker = SlotBroker(pools, acquire_timeout=3.0)
    try:
        for task_id, needs in (("A", ["sim", "reward"]), ("B", ["sim"]), ("C", ["sim", "reward"]), ("D", ["sim"])):
            broker.submit({"id": task_id, "needs": needs})
        for worker in range(4):
            broker.runner_ready(worker)
        assigned, starved = broker.dispatch(0.0)
        assert [(w, t["id"], lease) for w, t, lease in assigned] == [
            (0, "A", {"sim": "127.0.0.1:1#0", "reward": "127.0.0.1:2#0"}), (1, "B", {"sim": "127.0.0.1:1#1"})]
        broker.release("B", {})
        assigned, _ = broker.dispatch(0.1)
        assert assigned == []  # D may not take the free sim slot: C, waiting for reward, is first in line
        assert pools["sim"].counts()["idle"] == 1 and pools["reward"].counts()["busy"] == 1
        broker.release("A", {"reward": {"error": "ServiceTimeout: gone", "server_down": False}})
        assigned, starved = broker.dispatch(0.2)
        assert assigned == [] and starved == []  # C now waits for a healthy reward slot, D behind it on sim
        assert broker.dispatch(3.1) == ([], [])  # 2.9 s without a healthy reward slot: still waiting
        assigned, starved = broker.dispatch(3.2)
        assert [t["id"] for t, _ in starved] == ["C"] and "no healthy slot in pool 'reward' within 3s" in starved[0][1]
        assert [(t["id"], lease) for _, t, lease in assigned] == [("D", {"sim": "127.0.0.1:1#0"})]
    finally:
        broker.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_worker_forfeits_its_task_and_slot_which_come_back(tmp_path):
    """SIGKILL one of two worker processes mid-task: its task is retried by the other worker, and the slot
    it held (in an unknown state) is health-checked, restored and leased again."""
    import psutil

    server = EnvServerProcess(tmp_path, "SlowCartPole-v1", 2)
    proc = None
    try:
        server.start()
        write_tasks(tmp_path / "tasks.jsonl", 8, "SlowCartPole-v1", episodes=3)
        out, log = tmp_path / "results.jsonl", tmp_path / "evaluate.log"
        with open(log, "w") as f:
            proc = launch.start([f"--tasks={tmp_path / 'tasks.jsonl'}", f"--env_service={server.spec}",
                                 "--num_workers=2", "--concurrency=1", "--env_service_recheck_interval=0.3",
                                 f"--output={out}"], module="sf_core.evaluate", output=f)
        wait_for(lambda: out.exists() and len(read_results(out)) >= 1, 60, "a first result")
        workers = [p for p in psutil.Process(proc.pid).children()
                   if any("spawn_main" in part for part in p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in workers]
        workers[0].kill()  # each worker's one runner is in a task nearly all the time
        assert proc.wait(timeout=60) == 0, log.read_text()
        lines = read_results(out)
        assert sorted(r["id"] for r in lines) == [f"t{i}" for i in range(8)] and all(r["status"] == "ok" for r in lines)
        (died,) = [a for r in lines for a in r["attempts"] if a["error"]]
        assert died["error"] == "the worker process died"
        later = [a for r in lines for a in r["attempts"] if a["slot"] == died["slot"] and a["started"] > died["ended"]]
        assert later, "the forfeited slot was never leased again"
        assert "eval worker" in log.read_text() and "died" in log.read_text()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        server.kill()
