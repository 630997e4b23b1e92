"""`python -m sf_core.env_server`: the entry point lives in sf_core/cli/env_server.py."""

import sys

from sf_core.cli.env_server import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
