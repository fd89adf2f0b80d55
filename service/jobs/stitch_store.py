"""Where trained stitches are published so that every replica can serve them.

A :class:`StitchStore` holds one stitch folder (``config.json``, ``model.safetensors``,
``README.md``) per stitch id. The replica that trained a stitch :meth:`~StitchStore.put` s it;
every replica's :class:`~service.jobs.watcher.StitchWatcher` loads it from
:meth:`~StitchStore.local_folder` once the job's record says it succeeded. The job record is
the commit point: a stitch is read only after its job succeeded, which happens after the put.

``LEAD_STITCH_STORE`` (:func:`open_stitch_store`) picks the implementation:

===============  ============================  ================================================
spec             store                         local folder to load from
===============  ============================  ================================================
unset            :class:`FolderStore`          ``data_dir/stitches/<id>`` (as on one machine)
a path           :class:`FolderStore`          ``<path>/<id>`` (a shared file system)
``proto://...``  :class:`.FsspecStore`         a copy in ``data_dir/stitch-cache/<store>/<id>``
``hub://ORG``    :class:`.HubStore`            the Hugging Face cache (repo ``ORG/<id>``)
===============  ============================  ================================================

The last two live in :mod:`service.jobs.remote_stitch_store` (fsspec and huggingface_hub
are imported only when used).
Stitch ids are checked against :data:`service.jobs.layout.STITCH_ID_PATTERN` everywhere.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from pydantic import SecretStr

from lead._durable import fsync_path
from lead.errors import InvalidInputError, StitchNotFoundError
from service.errors import echo
from service.jobs._stitch_files import (
    check_stitch_id,
    is_complete_stitch,
    publish_dir,
    remove_dir,
    stitch_files,
)
from service.jobs.remote_stitch_store import FsspecStore, HubStore, redact_url

__all__ = ["FolderStore", "FsspecStore", "HubStore", "StitchStore", "open_stitch_store"]


class StitchStore(Protocol):
    """Published stitch folders by stitch id, shared by every replica.

    Every method raises InvalidInputError for an id that does not match
    ``STITCH_ID_PATTERN``.
    """

    @property
    def url(self) -> str:
        """Where the store is, for logs (never a password)."""

    def put(self, stitch_id: str, folder: Path) -> None:
        """Publish the local stitch ``folder`` as ``stitch_id``; putting again replaces it.

        Raises
        ------
        StitchFormatError
            If ``folder`` lacks ``config.json`` or ``model.safetensors``.
        OSError, HubError
            If the store cannot be written.
        """

    def local_folder(self, stitch_id: str) -> Path:
        """A local folder holding the stitch's files, for :func:`lead.artifacts.load_stitch`.

        Raises
        ------
        StitchNotFoundError
            If the store holds no such stitch (or, offline, the Hub stitch is not cached).
        OSError, HubError
            If the store cannot be read.
        """

    def delete(self, stitch_id: str) -> None:
        """Remove the stitch from the store, and this machine's copy (nothing when absent)."""

    def evict(self, stitch_id: str) -> None:
        """Drop this machine's copy made by :meth:`local_folder` (not the published one)."""

    def exists(self, stitch_id: str) -> bool:
        """Whether the store holds a complete stitch ``stitch_id``."""


class FolderStore:
    """Stitch folders ``<root>/<stitch_id>/`` on a local or shared file system.

    :meth:`put` copies the files into a ``.tmp-*`` folder in ``root``, fsyncs them and
    renames the folder into place (an older version is moved aside first and deleted last),
    so a reader sees the old stitch or the new one, never a part. A folder that is already
    ``<root>/<stitch_id>`` (the worker saved it there) is left as it is.

    Parameters
    ----------
    root : Path
        The store folder (created on the first put); ``data_dir/stitches`` by default.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().resolve()

    @property
    def url(self) -> str:
        return str(self.root)

    def put(self, stitch_id: str, folder: Path) -> None:
        final = self.root / check_stitch_id(stitch_id)
        names = stitch_files(Path(folder))
        if Path(folder).resolve() == final:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{stitch_id}-", dir=self.root))
        try:
            for name in names:
                shutil.copyfile(Path(folder) / name, tmp / name)
                fsync_path(tmp / name)
            tmp.chmod(0o755)
            fsync_path(tmp)
            publish_dir(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def local_folder(self, stitch_id: str) -> Path:
        folder = self.root / check_stitch_id(stitch_id)
        if not is_complete_stitch(folder):
            raise StitchNotFoundError(
                f"no stitch {echo(stitch_id)} in the stitch store {self.url}", param="stitch_id"
            )
        return folder

    def delete(self, stitch_id: str) -> None:
        remove_dir(self.root / check_stitch_id(stitch_id))

    def evict(self, stitch_id: str) -> None:
        """Nothing: the store folder is the local folder."""
        check_stitch_id(stitch_id)

    def exists(self, stitch_id: str) -> bool:
        return is_complete_stitch(self.root / check_stitch_id(stitch_id))


def open_stitch_store(
    spec: str | None, data_dir: Path, hf_token: SecretStr | str | None = None
) -> StitchStore:
    """The stitch store that ``LEAD_STITCH_STORE`` names.

    Parameters
    ----------
    spec : str or None
        Unset or empty: ``data_dir/stitches``. ``hub://ORG``: :class:`.HubStore`. Any other
        ``proto://...``: :class:`.FsspecStore`. Else a folder path: :class:`FolderStore`.
    data_dir : Path
        ``LEAD_DATA_DIR``; fsspec stores keep local copies in ``data_dir/stitch-cache``.
    hf_token : SecretStr or str, optional
        Token of a Hub store.

    Returns
    -------
    StitchStore

    Raises
    ------
    InvalidInputError
        A ``hub://`` spec without a valid user or organisation, or an fsspec protocol that
        is unknown or whose package is not installed (``param="stitch_store"``).
    """
    data_dir = Path(data_dir).expanduser()
    if not spec:
        return FolderStore(data_dir / "stitches")
    if spec.startswith("hub://"):
        token = hf_token.get_secret_value() if isinstance(hf_token, SecretStr) else hf_token
        return HubStore(spec.removeprefix("hub://"), token)
    if "://" in spec:
        try:
            return FsspecStore(spec, data_dir / "stitch-cache")
        except (ValueError, ImportError) as error:
            raise InvalidInputError(
                f"LEAD_STITCH_STORE {redact_url(spec)}: {error}", param="stitch_store"
            ) from None
    return FolderStore(Path(spec))
