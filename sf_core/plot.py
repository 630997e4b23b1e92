"""`python -m sf_core.plot`: the entry point lives in sf_core/cli/plot.py."""

import sys

from sf_core.cli.plot import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
