"""`python -m sf_core.export`: the entry point lives in sf_core/cli/export.py."""

import sys

from sf_core.cli.export import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
