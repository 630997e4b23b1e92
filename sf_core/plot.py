"""`python -m sf_core.plot`: the entry point lives in sf_core/cli/plot.py."""

from sf_core.cli import exit_process
from sf_core.cli.plot import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())
