"""`python -m sf_core.train`: the entry point lives in sf_core/cli/train.py."""

from sf_core.machine.heap import collector_paused

with collector_paused():  # gymnasium's and numpy's imports: sf_core/machine/heap.py (torch's come in main)
    from sf_core.cli import exit_process
    from sf_core.cli.train import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())
