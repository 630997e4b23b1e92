"""The command-line tools: `python -m sf_core.train|enjoy|evaluate|export|env_server|plot` and
`python -m sf_core.huggingface.push_to_hub|load_from_hub`. Those entry modules are nine lines each and call a
`main` here; nothing below this layer imports it (.importlinter)."""

from __future__ import annotations

import gc
import sys
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    """End a command-line process with `code`. The heap is frozen first: the interpreter's last garbage
    collections then skip the objects torch's import made, which otherwise take most of the time a run
    spends exiting (docs/performance.md, "Exiting and starting processes"). For a process that ends here
    only: frozen objects are never collected. atexit handlers still run and files still close."""
    gc.freeze()
    sys.exit(code)
