"""The raw env-stepping baseline: what the machine does with the env alone, no trainer around it.

raw_env_1proc (one process) is the per-core baseline; raw_env_per_core (one process per usable core,
all at once) is the machine's ceiling for this env. With `episode_length`, episodes last as long as a
training run's (scripts/reproduce.py --raw_rate): a random policy falls over far sooner than a trained one,
so a raw rate over a random policy's episodes resets more often than the trainer does, and is not its rate.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import warnings

from .proctree import TreeMonitor, no_interrupts

N_ACTIONS = 4096
STEPS_PER_CLOCK_READ = 32  # the clock is read once per chunk, keeping its cost out of a cheap env's rate


def _raw_env_worker(env_name: str, index: int, warmup: float, seconds: float, episode_length: int | None,
                    ready, go, results) -> None:
    """Step one env with (pre-drawn) random actions; count steps inside [warmup, warmup + seconds]. With
    `episode_length`, `terminated` is ignored and the env resets every `episode_length` steps (or when
    truncated); otherwise it resets when an episode ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        from sf_core.envs.registry import EnvContext, registry_snapshot

        env = registry_snapshot().make(env_name, None, EnvContext(worker_index=index, env_index=index, seed=index))
        env.action_space.seed(index)
        actions = [env.action_space.sample() for _ in range(N_ACTIONS)]  # drawn up front: time the env, not sampling
        env.reset(seed=index)
        if episode_length:  # stepping on past `terminated` is the point here, not a mistake to warn about
            warnings.filterwarnings("ignore", message=".*already returned terminated = True")
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        ready.put((index, f"{type(exc).__name__}: {exc}"))
        return
    ready.put((index, None))
    go.wait()

    chunk, n_actions = STEPS_PER_CLOCK_READ, len(actions)
    started = time.perf_counter()
    warm_end, end = started + warmup, started + warmup + seconds
    steps = counted = since_reset = 0
    window_start = None
    now = started
    while now < end:
        for _ in range(chunk):
            _, _, terminated, truncated, _ = env.step(actions[steps % n_actions])
            steps += 1
            since_reset += 1
            if truncated or (since_reset >= episode_length if episode_length else terminated):
                env.reset()
                since_reset = 0
        now = time.perf_counter()
        if window_start is None:
            if now >= warm_end:
                window_start = now
        else:
            counted += chunk
    window = (now - window_start) if window_start is not None else 0.0
    env.close()
    results.put((index, counted, window, steps))


def run_raw_env(env_name: str, processes: int, warmup: float, seconds: float, frames_per_step: int = 1,
                episode_length: int | None = None) -> dict:
    """Env frames/s of `processes` processes stepping at once; a step is `frames_per_step` frames
    (--env_frameskip, e.g. 4 for Atari), the unit the trainer counts in. `episode_length` (env steps):
    reset on that schedule instead of at the end of each episode (see `_raw_env_worker`)."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_raw_env_worker, name=f"raw_env_{i}", daemon=True,
                         args=(env_name, i, warmup, seconds, episode_length, ready, go, results))
             for i in range(processes)]
    monitor: TreeMonitor | None = None
    started = time.time()
    try:
        for p in procs:
            p.start()
        monitor = TreeMonitor([p.pid for p in procs])
        monitor.start()
        for _ in procs:
            index, error = ready.get(timeout=120)
            if error:
                raise RuntimeError(f"raw env worker {index} could not make {env_name!r}: {error}")
        go.set()
        got = [results.get(timeout=warmup + seconds + 60) for _ in procs]
        for p in procs:
            p.join(timeout=10)
    finally:
        with no_interrupts():
            if monitor is not None:
                monitor.stop()
            _stop_all(procs)
            for q in (ready, results):
                q.cancel_join_thread()
                q.close()
    per_process = [frames_per_step * counted / window if window > 0 else 0.0 for _, counted, window, _ in sorted(got)]
    return {
        "status": "ok", "processes": processes, "fps": sum(per_process),
        "fps_per_process": [round(f, 1) for f in per_process],
        "steps_counted": sum(g[1] for g in got), "window_seconds": [round(g[2], 3) for g in got],
        "warmup_seconds": warmup, "wall_seconds": round(time.time() - started, 2),
        "actions": f"uniform random, {N_ACTIONS} drawn up front per process and cycled",
        "resets": (f"every {episode_length} steps (terminated ignored) or when truncated" if episode_length
                   else "when an episode ends"),
        **(monitor.report() if monitor else {}),
    }


def _stop_all(procs: list[multiprocessing.Process]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
