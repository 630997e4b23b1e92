"""`python -m sf_core.fleet`: the entry point lives in sf_core/cli/fleet.py."""

from sf_core.cli import exit_process
from sf_core.cli.fleet import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())
