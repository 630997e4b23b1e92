"""`python -m sf_core.train`: the entry point lives in sf_core/cli/train.py."""

import sys

from sf_core.cli.train import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
