"""`python -m sf_core.huggingface.push_to_hub`: the entry point lives in sf_core/cli/push_to_hub.py."""

from sf_core.cli import exit_process
from sf_core.cli.push_to_hub import main

__all__ = ["main"]

if __name__ == "__main__":
    exit_process(main())
