"""`python -m sf_core.evaluate`: the entry point lives in sf_core/cli/evaluate.py."""

import sys

from sf_core.cli.evaluate import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
