"""`python -m sf_core.env_server`: the entry point lives in sf_core/cli/env_server.py."""

from sf_core.cli import exit_process
from sf_core.cli.env_server import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())
