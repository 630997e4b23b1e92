"""Checkpoints, resume after kill -9, interrupt saves, env-fault policies, stalls, plots."""

import json
import os
import re
import signal
import subprocess
import textwrap
import time

import pytest

import sf_core.train

from sf_core.records import checkpoint
from sf_core.records.experiment_lock import LOCK_FILE
from tests import launch
from tests.helpers import kill_9_once, read_summary, train, wait_for


def wait_for_training(proc, timeout=45):
    """Read the trainer's console until the learner has published at least one new policy."""
    import re
    import threading

    seen = []
    progressed = threading.Event()

    def read():
        for line in proc.stdout:
            seen.append(line)
            match = re.search(r"policy v(\d+)", line)
            if match and int(match.group(1)) > 0:
                progressed.set()

    threading.Thread(target=read, daemon=True).start()
    assert progressed.wait(timeout), "training made no progress:\n" + "".join(seen[-20:])
    return seen


def tb_steps(experiment_path, tag="episode/return"):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(experiment_path, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_resuming_an_experiment_of_another_env_or_model_is_one_message_and_loads_nothing(tmp_path, capsys):
    short = ["--serial_mode", "--train_for_env_steps=2000"]
    code, _ = train(tmp_path, "--env=CartPole-v1", *short)
    assert code == 0
    capsys.readouterr()
    for flags, differs in ((["--env=Acrobot-v1"], "--env=CartPole-v1 there, Acrobot-v1 now"),
                           (["--env=CartPole-v1", "--encoder_mlp_layers", "32"],
                            "--encoder_mlp_layers=[64, 64] there, [32] now")):
        code, _ = train(tmp_path, *flags, *short)
        err = capsys.readouterr().err
        assert code == 1 and differs in err, err[-2000:]
        assert "--experiment=NAME" in err and "--restart_behavior=overwrite" in err and "Traceback" not in err
    code, _ = train(tmp_path, "--env=Acrobot-v1", "--restart_behavior=overwrite", *short)  # the way out it names
    assert code == 0


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_kill_9_then_rerun_resumes_from_last_checkpoint(tmp_path):
    args = ["--env=CartPole-v1", "--num_workers=2", "--num_envs_per_worker=64", f"--train_dir={tmp_path}",
            "--experiment=run", "--save_every_sec=1", "--experiment_summaries_interval=0.5", "--seed=7"]
    ckpt_dir = tmp_path / "run" / "checkpoint"
    kill_9_once(args + ["--train_for_env_steps=10000000"],
                lambda: len(checkpoint.list_checkpoints(str(ckpt_dir))) >= 2, 60, "two checkpoints")

    last = checkpoint.latest_checkpoint(str(ckpt_dir))
    saved = checkpoint.load(last)
    frames_at_kill = saved["runner"]["frames"]
    assert frames_at_kill > 0 and saved["version"] > 0

    # enough for every env to finish an episode after the resume (its episode restarts with the envs), even
    # once CartPole is solved: its episodes then last 500 steps, and 128 envs share these frames
    target = frames_at_kill + 100000
    result = launch.run(args + [f"--train_for_env_steps={target}"], timeout=90)
    assert result.returncode == 0, result.stdout[-3000:]
    assert f"resuming from {last}" in result.stdout
    summary = read_summary(tmp_path, "run")
    assert target <= summary["frames"] < target + 60000  # counters continued, not restarted
    assert summary["policy_version"] > saved["version"]
    assert summary["episodes"] > saved["runner"]["episodes"]
    # TensorBoard curve: continuous in env frames, nothing from the lost stretch after the checkpoint
    steps = tb_steps(str(tmp_path / "run"))
    assert steps == sorted(steps), "curve goes backwards in env frames"
    assert steps[-1] >= target


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_sigterm_leaves_a_final_checkpoint(tmp_path):
    proc = launch.start(["--env=CartPole-v1", "--num_workers=2", f"--train_dir={tmp_path}", "--experiment=t",
                          "--save_every_sec=1000", "--train_for_seconds=120", "--report_interval=0.3"])
    try:
        seen = wait_for_training(proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, "".join(seen[-30:])
    found = checkpoint.list_checkpoints(str(tmp_path / "t" / "checkpoint"))
    assert len(found) == 1, "the stop must save exactly one final checkpoint (periodic saves are off)"
    assert checkpoint.load(found[0])["version"] > 0
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "t" / "checkpoint"))


FAULTY = textwrap.dedent('''
    import sys
    import time

    import gymnasium as gym

    import sf_core.train
    from sf_core import register_env


    class Faulty(gym.Wrapper):
        """Raises (or hangs) on the 150th step of every instance."""

        mode = "raise"

        def __init__(self, env):
            super().__init__(env)
            self.steps = 0

        def step(self, action):
            self.steps += 1
            if self.steps == 150:
                if self.mode == "hang":
                    time.sleep(3600)
                raise ValueError("simulator lost its licence server")
            return self.env.step(action)


    def make(name, cfg, ctx):
        env = Faulty(gym.make("CartPole-v1"))
        env.mode = name.split("-")[0].lower()
        return env


    if __name__ == "__main__":
        register_env("Raise-v0", make)
        register_env("Hang-v0", make)
        sys.exit(sf_core.train.main(sys.argv[1:]))
''')


def run_faulty(tmp_path, *args: str, timeout: float = 80):
    """Run FAULTY's script with these trainer flags; returns (CompletedProcess, seconds, output)."""
    script = tmp_path / "faulty.py"
    script.write_text(FAULTY)
    started = time.time()
    result = launch.run(["--num_workers=2", f"--train_dir={tmp_path}", *args], timeout=timeout, script=str(script),
                     cwd=str(tmp_path))
    return result, time.time() - started, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_by_default_an_env_that_raises_is_made_again_and_training_goes_on(tmp_path):
    result, _, output = run_faulty(tmp_path, "--env=Raise-v0", "--experiment=f",
                                   "--train_for_env_steps=40000", "--experiment_summaries_interval=0.5")
    assert result.returncode == 0, output[-3000:]
    assert "simulator lost its licence server" in output
    summary = read_summary(tmp_path, "f")
    # every env instance faults at its 150th step; 2 workers × 2 splits all restart at least once
    assert summary["env_faults"] >= 4
    assert summary["frames"] >= 40000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "f" / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert acc.Scalars("faults/env_restarts")[-1].value >= 4


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_stop_policy_exits_with_env_traceback_and_checkpoint(tmp_path):
    result, seconds, output = run_faulty(tmp_path, "--env=Raise-v0", "--experiment=s", "--train_for_seconds=60",
                                         "--env_fault_policy=stop")
    assert result.returncode == 1
    assert "simulator lost its licence server" in output
    assert seconds < 40
    assert checkpoint.list_checkpoints(str(tmp_path / "s" / "checkpoint")), "no checkpoint saved on the way out"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_hung_env_is_named_by_heartbeat(tmp_path):
    result, seconds, output = run_faulty(tmp_path, "--env=Hang-v0", "--experiment=h", "--heartbeat_timeout=3",
                                         "--train_for_seconds=60", "--env_fault_policy=stop")
    assert result.returncode == 1, output[-3000:]
    assert "no heartbeat for" in output and "its last activity: stepping envs" in output
    assert "rollout_worker_" in output
    # a stuck worker cannot stop: it is killed once the others have, without waiting out the grace period,
    # and the learner's checkpoint is saved first
    assert re.search(r"rollout_worker_\d_proc is stuck \(no heartbeat\): killing it", output), output[-3000:]
    assert "did not stop in" not in output, output[-3000:]
    assert "last checkpoint: " in output
    assert seconds < 45


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_plot_compares_two_experiments(tmp_path):
    for name, seed in (("a", 1), ("b", 2)):
        code, _ = train(tmp_path, "--env=CartPole-v1", "--serial_mode=True", f"--seed={seed}",
                        "--train_for_env_steps=40000", "--experiment_summaries_interval=0.2", experiment=name)
        assert code == 0
    import sf_core.plot

    out = tmp_path / "curves.png"
    assert sf_core.plot.main([f"--train_dir={tmp_path}", "--experiments", "a", "b", f"--output={out}"]) == 0
    from PIL import Image

    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] >= 800 and image.size[1] >= 300
    # both curves are there: the legend texts are drawn, so the file is far from a blank canvas
    assert out.stat().st_size > 20_000


def _make_start_order_objects(main_loop, thread_loop, results):
    from signal_slot.signal_slot import EventLoopObject

    class Main(EventLoopObject):
        def __init__(self):
            super().__init__(main_loop, "start_order_main")
            self.started = False
            main_loop.start.connect(self.on_start)

        def on_start(self):
            time.sleep(0.5)  # building a model takes a while
            self.started = True

        def ping(self):
            results.put(self.started)
            self.event_loop.stop()

    class Early(EventLoopObject):
        def __init__(self):
            super().__init__(thread_loop, "start_order_early")
            self.name = "start_order_early"  # ComponentProcess names the thread after it
            thread_loop.start.connect(self.on_start)

        def on_start(self):
            self.emit("ping")
            self.event_loop.stop()

    main, early = Main(), Early()
    early.connect("ping", main.ping)
    return main, early


@pytest.mark.timeout(60)
def test_thread_loops_start_after_the_process_loop_handled_start():
    """A signal from the batcher thread reached the learner before its on_start (KeyError
    'actor_critic' under spawn on a loaded machine): thread loops now start from the main loop's start."""
    import multiprocessing

    from signal_slot.signal_slot import EventLoop

    from sf_core.contracts.component import ComponentProcess, Routing

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    proc = ComponentProcess("start_order_proc", ctx, 1)
    thread_loop = Routing.use_plain_pickle(EventLoop("start_order_thread_loop"))
    _, early = _make_start_order_objects(proc.event_loop, thread_loop, results)
    proc.threads.append((thread_loop, early))
    proc.start()
    try:
        assert results.get(timeout=30) is True, "the thread's signal was handled before on_start"
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        results.close()
        results.join_thread()


# ------------------------------------------------------------------ one run per folder, clean ends, finished runs
def holder_pid(folder) -> int | None:
    try:
        return json.loads((folder / LOCK_FILE).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_second_trainer_in_a_busy_folder_fails_at_once_and_the_first_finishes(tmp_path):
    stale = subprocess.Popen(["true"])
    stale.wait()
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / LOCK_FILE).write_text(json.dumps({"pid": stale.pid, "host": os.uname().nodename,
                                                            "since": time.time() - 60, "command": "killed"}))
    args = ["--env=CartPole-v1", "--num_workers=1", f"--train_dir={tmp_path}", "--experiment=same"]
    first = launch.start(args + ["--train_for_env_steps=60000"])
    try:
        wait_for(lambda: holder_pid(tmp_path / "same") == first.pid, 30, "the first trainer to hold the lock")
        started = time.time()
        second = launch.run(args + ["--train_for_env_steps=10000"], timeout=60)
        seconds = time.time() - started
        output, _ = first.communicate(timeout=90)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 2 and second.stdout == "", second.stdout[-2000:]
    error = second.stderr.strip()
    assert "\n" not in error and f"is in use by another training run (pid {first.pid} on " in error, error
    assert "wait for it to finish" in error and f"kill {first.pid}" in error and "--experiment" in error
    assert seconds < 20, f"the second trainer took {seconds:.0f}s to refuse"
    assert first.returncode == 0, output[-3000:]
    assert f"took over the lock of pid {stale.pid} on " in output and "which is no longer running" in output
    assert read_summary(tmp_path, "same")["frames"] >= 60000
    assert len(os.listdir(tmp_path / "same" / "tb")) == 1, "one run, one event file"
    assert not (tmp_path / "same" / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_run_that_fails_before_writing_leaves_no_folder_behind(tmp_path, capsys):
    """The lock makes the folder (and --train_dir) to lock it: a run that stops before writing removes them."""
    for flags, code in ((["--env=NoSuchEnv-v9"], 1), (["--env=CartPole-v1", "--num_workers=0"], 2)):
        assert sf_core.train.main([f"--train_dir={tmp_path / 'runs'}", "--experiment=x", *flags]) == code
        assert "sf_core.train: error: " in capsys.readouterr().err
        assert not (tmp_path / "runs").exists()


def can_mount() -> bool:
    """Whether a tmpfs can be mounted in a private mount namespace here (root, or user namespaces)."""
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def on_a_full_disk(folder, command: list[str], free_kb: int, after: str = "") -> str:
    """Run `command` with `folder` a 1 MiB tmpfs (its own mount namespace) filled up to `free_kb`, then the
    shell's `after`; returns stdout and stderr together (the mount goes with the namespace)."""
    script = (f'mount -t tmpfs -o size=1m tmpfs "$0" && head -c {1024 - free_kb - 8}K /dev/zero > "$0/filler" '
              f'&& "$@"; echo "exit=$?"; {after}')
    result = subprocess.run(["timeout", "-k", "10", "100", "unshare", "-m", "sh", "-c", script, str(folder),
                             *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=130,
                            cwd=launch.REPO, env=launch.environment())
    return result.stdout


needs_mount = pytest.mark.skipif(not can_mount(), reason="cannot mount a tmpfs here (`unshare -m` needs root)")


@pytest.mark.slow
@pytest.mark.timeout(150)
@needs_mount
def test_a_full_disk_ends_with_one_last_line_a_summary_and_no_temporary_file(tmp_path):
    folder = tmp_path / "disk"
    folder.mkdir()
    trainer = launch.command(["--env=CartPole-v1", "--num_workers=1", f"--train_dir={folder}", "--experiment=x",
                              "--save_every_sec=1", "--train_for_seconds=60"])
    output = on_a_full_disk(folder, trainer, free_kb=224, after='echo "@@files"; find "$0" -type f; '
                                                               'echo "@@summary"; cat "$0/x/training_summary.json"')
    console, _, rest = output.partition("exit=")
    code, _, rest = rest.partition("@@files")
    files, _, summary_text = rest.partition("@@summary")
    assert code.strip() == "1", output[-3000:]
    last = console.strip().splitlines()[-1]
    assert "ERROR training stopped: " in last and "No space left on device" in last, console[-3000:]
    assert "Exception in thread" not in console
    assert files.strip() and ".tmp" not in files, files
    summary = json.loads(summary_text)
    assert summary["running"] is False and summary["exit_code"] == 1 and "No space left" in summary["error"]


WRITE_UNTIL_FULL = textwrap.dedent('''
    import sys, time
    from sf_core.records.experiment import DeferredSummaryWriter

    writer = DeferredSummaryWriter(log_dir=sys.argv[1], flush_secs=0.05)
    try:
        for step in range(1_000_000):
            writer.add_scalar("x" * 200 + str(step % 1000), 1.0, step)
            if step % 100 == 0:
                time.sleep(0.06)  # the writer's thread flushes: the disk fills in its hands
    except OSError as exc:
        print("raised:", exc)
    try:
        writer.close()
    except OSError:
        pass
    time.sleep(0.5)
''')


@pytest.mark.slow
@pytest.mark.timeout(60)
@needs_mount
def test_a_tensorboard_write_the_disk_refuses_is_raised_in_the_caller_naming_the_folder(tmp_path):
    (tmp_path / "disk").mkdir()
    output = on_a_full_disk(tmp_path / "disk", launch.command([str(tmp_path / "disk" / "tb")],
                                                              code=WRITE_UNTIL_FULL), free_kb=32)
    assert f"raised: [Errno 28] No space left on device: '{tmp_path / 'disk' / 'tb'}'" in output, output[-3000:]
    assert "Exception in thread" not in output and "Traceback" not in output, output[-3000:]


def folder_state(folder) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rerunning_a_finished_experiment_changes_nothing_and_a_higher_limit_trains_on(tmp_path, capsys):
    trained = {}
    for limit, experiment in (("--train_for_env_steps=2000", "frames"), ("--train_for_seconds=4", "seconds")):
        flags = ["--env=CartPole-v1", "--serial_mode", limit]
        code, first = train(tmp_path, *flags, experiment=experiment)
        assert code == 0 and not first["running"], first.get("error")
        trained[experiment] = first["frames"]  # whole rollouts: past the limit, by more with a vector env
        before = folder_state(tmp_path / experiment)
        capsys.readouterr()
        code, again = train(tmp_path, *flags, experiment=experiment)
        out = capsys.readouterr().out
        assert code == 0 and again == first
        assert folder_state(tmp_path / experiment) == before, "a finished experiment's files changed"
        assert f"already finished: it reached {limit} (" in out, out[-2000:]
        assert f"raise {limit.split('=')[0]}" in out and "--restart_behavior=restart" in out
        assert "experiment folder" not in out and "resuming" not in out
    higher = trained["frames"] + 4000  # a limit above what the first run trained
    code, more = train(tmp_path, "--env=CartPole-v1", "--serial_mode", f"--train_for_env_steps={higher}",
                       experiment="frames")
    assert code == 0 and more["frames"] >= higher
    assert "resuming from" in capsys.readouterr().out
