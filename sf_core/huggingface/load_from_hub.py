"""`python -m sf_core.huggingface.load_from_hub`: the entry point lives in sf_core/cli/load_from_hub.py."""

from sf_core.cli import exit_process
from sf_core.cli.load_from_hub import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())
