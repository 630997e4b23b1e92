"""Files replaced whole: written under a temporary name, then renamed over the real one.

A reader sees the old content or the new, never half of it. A failed write (a full disk, an
interrupt) leaves no temporary file behind and names the file it was writing.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def replacing(path: str) -> Iterator[str]:
    """Yields the temporary path to write `path`'s new content to; once the block ends, it replaces `path`.

    On any exception the temporary file is removed. An OSError that names no file (a failed flush or
    fsync) is raised again naming `path`, so the console says which file the disk refused."""
    tmp = f"{path}.tmp"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            raise OSError(exc.errno, exc.strerror, path) from exc
        raise
