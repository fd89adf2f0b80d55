"""Durable file writes: a file appears whole or not at all, and survives a crash once written.

:func:`atomic_write` writes to a temporary file beside the target (``.NAME.<hex>.tmp``),
fsyncs it, renames it over the target and fsyncs the folder, so that after a crash (or a
SIGKILL) the target holds either its old content or the new one, never a part of it.
Sources: POSIX ``rename(2)`` (atomic within a file system) and ``fsync(2)`` of the file and
of its directory entry.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "fsync_path"]


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder (a folder: so that a rename into it is on disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Write ``path`` through ``write(handle)`` on a temporary file, then rename it.

    Parameters
    ----------
    path : str or Path
        The file; its folder is created if needed.
    write : callable
        Writes the content to the binary handle it is given.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OSError
        The folder or file cannot be written (the temporary file is removed).
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_path(file.parent)
    return file
