"""Where job records, datasets and trained stitches live under ``LEAD_DATA_DIR``.

::

    LEAD_DATA_DIR/
    ├── lead.sqlite3 (+ -wal, -shm)   job and dataset records
    ├── datasets/<dataset_id>.safetensors
    ├── job-data/<job_id>.safetensors  inline pairs sent with a job
    ├── stitches/<stitch_id>/          trained stitches (config.json, model.safetensors, README.md),
    │                                  unless LEAD_STITCH_STORE puts them elsewhere
    └── stitch-cache/                  local copies of stitches from an fsspec LEAD_STITCH_STORE

Every file appears by an atomic rename, so anything whose name starts with ``.`` is a
leftover of an interrupted write and is removed at start.
"""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.jobs.store import JobStore

__all__ = ["STITCH_ID_PATTERN", "DataLayout"]

logger = logging.getLogger(__name__)

#: A local stitch id is a folder name: letters, digits, ``.``, ``_``, ``-``; no leading dot.
STITCH_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@dataclass(frozen=True)
class DataLayout:
    """Paths under one data directory.

    Parameters
    ----------
    root : Path
        ``LEAD_DATA_DIR``.
    """

    root: Path

    @property
    def db(self) -> Path:
        return self.root / "lead.sqlite3"

    @property
    def datasets(self) -> Path:
        return self.root / "datasets"

    @property
    def job_data(self) -> Path:
        return self.root / "job-data"

    @property
    def stitches(self) -> Path:
        return self.root / "stitches"

    def dataset_file(self, dataset_id: str) -> Path:
        return self.datasets / f"{dataset_id}.safetensors"

    def job_file(self, job_id: str) -> Path:
        return self.job_data / f"{job_id}.safetensors"

    def relative(self, path: Path) -> str:
        """``path`` relative to the root, as stored in the database."""
        return path.relative_to(self.root).as_posix()

    def local_file(self, store: JobStore, relative: str) -> Path:
        """The local path of a dataset or job data file, fetched from the store's blobs
        first when another server wrote it (PostgreSQL: every replica reads every dataset).

        Raises
        ------
        DatasetNotFoundError
            If the file is neither here nor in the store.
        """
        from lead.errors import DatasetNotFoundError

        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() and not (store.shares_files and store.fetch_blob(relative, path)):
            raise DatasetNotFoundError(f"the data file {relative} is gone", param="dataset")
        return path

    @contextmanager
    def scratch(self, name: str) -> Iterator[Path]:
        """A fresh folder for one write (under ``stitches/``, removed afterwards; a crash
        leaves a dot-folder that :meth:`clean_leftovers` removes)."""
        folder = self.stitches / f".tmp-{name}-{secrets.token_hex(4)}"
        folder.mkdir(parents=True)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def prepare(self) -> None:
        """Create the folders."""
        for folder in (self.root, self.datasets, self.job_data, self.stitches):
            folder.mkdir(parents=True, exist_ok=True)

    def clean_leftovers(self) -> list[Path]:
        """Remove temporary files and folders of interrupted writes; return what was removed.

        A stitch folder without ``config.json`` and ``model.safetensors`` is incomplete and
        removed too.
        """
        removed = []
        for folder in (self.datasets, self.job_data, self.stitches):
            for entry in folder.iterdir():
                incomplete = folder == self.stitches and not (
                    (entry / "config.json").is_file() and (entry / "model.safetensors").is_file()
                )
                if entry.name.startswith(".") or incomplete:
                    if entry.is_dir():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
                    removed.append(entry)
        if removed:
            logger.warning(
                "removed %d leftover(s) of interrupted writes: %s", len(removed), removed
            )
        return removed
