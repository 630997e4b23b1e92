"""`python -m sf_core.enjoy`: the entry point lives in sf_core/cli/enjoy.py."""

import sys

from sf_core.cli.enjoy import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
