"""The runner's loop watchdog (sf_core/contracts/loop_watchdog.py) on a loop that never turns again: it kills the
component processes, exits with the code it was given and names where the loop waits. The lock cases (a dead or a
stopped holder of the runner's queue lock) are run end to end in tests/test_worker_replacement.py."""

import psutil

from tests import launch

STUCK = """
import logging, multiprocessing, sys, threading, time
from sf_core.contracts.loop_watchdog import start_loop_watchdog

def a_loop_waiting_for_good():
    time.sleep(60)

if __name__ == "__main__":
    logging.basicConfig(stream=sys.stdout, format="%(message)s")
    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    child.start()
    print("child", child.pid, flush=True)
    start_loop_watchdog(lambda: time.time() - 10, 2.0, lambda: [child], threading.Event(), 7)
    a_loop_waiting_for_good()
"""


def test_a_loop_stuck_past_the_limit_ends_the_run_with_its_children_and_says_where_it_waits(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    done = launch.run([], timeout=30, script=str(script))
    assert done.returncode == 7, done.stdout + done.stderr
    child = int(done.stdout.split("child ")[1].split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert "the runner's event loop has not run for 2s: killing all components" in done.stdout
    assert "in a_loop_waiting_for_good" in done.stdout and "time.sleep(60)" in done.stdout
