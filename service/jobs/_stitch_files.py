"""Stitch folders on the local file system, shared by the stitch stores (private).

Every folder appears by a rename (``os.replace``) of a complete, fsynced ``.tmp-*`` folder,
and disappears by a rename to ``.deleted-*`` first, so readers never see a part of one.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

from lead._durable import fsync_path
from lead.artifacts import ARTIFACT_FILES, CONFIG_FILE, WEIGHTS_FILE
from lead.errors import InvalidInputError, StitchFormatError
from service.errors import echo
from service.jobs.layout import STITCH_ID_PATTERN

__all__ = [
    "REQUIRED_FILES",
    "check_stitch_id",
    "is_complete_stitch",
    "publish_dir",
    "remove_dir",
    "stitch_files",
]

#: The files a stitch needs; ``README.md`` is copied when present.
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE)


def check_stitch_id(stitch_id: str) -> str:
    """``stitch_id`` when it matches ``STITCH_ID_PATTERN`` (a folder name), else
    InvalidInputError."""
    if re.match(STITCH_ID_PATTERN, stitch_id) is None:
        raise InvalidInputError(
            f"{echo(stitch_id)} is not a stitch id (letters, digits, '.', '_', '-'; at most 128)",
            param="stitch_id",
        )
    return stitch_id


def is_complete_stitch(folder: Path) -> bool:
    return all((folder / name).is_file() for name in REQUIRED_FILES)


def stitch_files(folder: Path) -> list[str]:
    """The artifact files of a local stitch folder to publish (config.json last)."""
    if not is_complete_stitch(folder):
        raise StitchFormatError(
            f"{folder} is not a complete stitch folder (needs {', '.join(REQUIRED_FILES)})"
        )
    present = [name for name in ARTIFACT_FILES if (folder / name).is_file()]
    return sorted(present, key=lambda name: name == CONFIG_FILE)


def remove_dir(folder: Path) -> None:
    """Rename ``folder`` away (one atomic step), then delete it; nothing when absent."""
    trash = folder.with_name(f".deleted-{folder.name}-{secrets.token_hex(4)}")
    try:
        os.replace(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename the complete folder ``tmp`` to ``final``, replacing an older ``final``."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{secrets.token_hex(4)}")
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except OSError:
        if old is not None:
            os.replace(old, final)
        elif is_complete_stitch(final):  # another process published the same stitch meanwhile
            return
        raise
    fsync_path(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
