"""`python -m sf_core.export`: the entry point lives in sf_core/cli/export.py."""

from sf_core.cli import exit_process
from sf_core.machine.heap import collector_paused

with collector_paused():  # torch's first import: sf_core/machine/heap.py
    from sf_core.cli.export import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())
