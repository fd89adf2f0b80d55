"""Stitch stores beyond the file system: any fsspec URL, and the Hugging Face Hub.

See :mod:`service.jobs.stitch_store` for the protocol and :func:`open_stitch_store`, which
picks these for ``LEAD_STITCH_STORE=proto://...`` and ``hub://ORG``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from lead._durable import fsync_path
from lead.artifacts import ARTIFACT_FILES, CONFIG_FILE
from lead.errors import HubError, InvalidInputError, StitchNotFoundError
from service.errors import echo
from service.jobs._stitch_files import (
    REQUIRED_FILES,
    check_stitch_id,
    is_complete_stitch,
    publish_dir,
    remove_dir,
    stitch_files,
)

__all__ = ["FsspecStore", "HubStore", "redact_url"]

logger = logging.getLogger("lead.jobs")

_ORG = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}$")


def redact_url(url: str) -> str:
    """``url`` without a password (``proto://user:secret@host/p`` → ``proto://user:***@host/p``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


class FsspecStore:
    """Stitch folders ``<url>/<stitch_id>/`` on any fsspec file system (``s3://``, ``gs://``,
    ``file://``, ``memory://``...), with local copies in a cache folder.

    Object stores have no atomic rename: :meth:`put` removes an older version, then uploads
    the files one by one, ``config.json`` last. Readers load a stitch only after its job has
    succeeded (after the put), and a cached copy is reused as long as it is there: the files
    of a stitch id do not change once its job succeeded (ids are never used again).

    Parameters
    ----------
    url : str
        An fsspec URL (chained URLs such as ``simplecache::s3://...`` work too).
    cache : Path
        Local copies go to ``cache/<sha256 of url>/<stitch_id>/``, each written to a
        ``.tmp-*`` folder and renamed into place.
    **storage_options
        Passed to the file system (credentials, endpoint...).

    Raises
    ------
    ValueError
        If fsspec knows no such protocol.
    ImportError
        If the protocol's package (``s3fs``, ``gcsfs``...) is not installed.
    """

    def __init__(self, url: str, cache: Path, **storage_options: Any) -> None:
        from fsspec.core import url_to_fs

        self.fs, path = url_to_fs(url, **storage_options)
        self._root = str(path).rstrip("/")
        self._url = redact_url(url)
        self.cache = Path(cache) / hashlib.sha256(url.encode()).hexdigest()[:16]

    @property
    def url(self) -> str:
        return self._url

    def _remote(self, stitch_id: str) -> str:
        return f"{self._root}/{check_stitch_id(stitch_id)}"

    def put(self, stitch_id: str, folder: Path) -> None:
        remote = self._remote(stitch_id)
        names = stitch_files(Path(folder))
        if self.fs.exists(remote):
            self.fs.rm(remote, recursive=True)
        self.fs.makedirs(remote, exist_ok=True)
        for name in names:  # config.json last: exists() is true once all files are there
            self.fs.put_file(str(Path(folder) / name), f"{remote}/{name}")
        self.evict(stitch_id)

    def local_folder(self, stitch_id: str) -> Path:
        remote = self._remote(stitch_id)
        final = self.cache / stitch_id
        if is_complete_stitch(final):
            return final
        self.cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{stitch_id}-", dir=self.cache))
        try:
            for name in ARTIFACT_FILES:
                try:
                    self.fs.get_file(f"{remote}/{name}", str(tmp / name))
                except FileNotFoundError:
                    if name in REQUIRED_FILES:
                        raise StitchNotFoundError(
                            f"no stitch {echo(stitch_id)} in the stitch store {self.url}",
                            param="stitch_id",
                        ) from None
                    continue
                fsync_path(tmp / name)
            tmp.chmod(0o755)
            if not is_complete_stitch(final):  # else another process fetched it meanwhile
                remove_dir(final)
                publish_dir(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def delete(self, stitch_id: str) -> None:
        remote = self._remote(stitch_id)
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
            self.fs.rm(remote, recursive=True)
        self.evict(stitch_id)

    def evict(self, stitch_id: str) -> None:
        remove_dir(self.cache / check_stitch_id(stitch_id))

    def exists(self, stitch_id: str) -> bool:
        remote = self._remote(stitch_id)
        return all(bool(self.fs.exists(f"{remote}/{name}")) for name in REQUIRED_FILES)


class HubStore:
    """One Hugging Face Hub model repo ``<org>/<stitch_id>`` per stitch.

    :meth:`put` pushes with :func:`lead.artifacts.push_stitch`; :meth:`local_folder`
    downloads through ``huggingface_hub.snapshot_download`` into the Hugging Face cache
    (``HF_HUB_CACHE``; honours ``HF_HUB_OFFLINE``). :meth:`delete` does **not** delete the
    Hub repo (a published model may have other users): the stitch is only forgotten here,
    since the job record says it is deleted; delete the repo on the Hub if wanted.

    Parameters
    ----------
    org : str
        A Hub user or organisation.
    token : str, optional
        Hub token (default: the logged-in one, or ``HF_TOKEN``).
    """

    def __init__(self, org: str, token: str | None = None) -> None:
        if _ORG.match(org) is None:
            raise InvalidInputError(
                f"LEAD_STITCH_STORE hub://{org} does not name a Hub user or organisation",
                param="stitch_store",
            )
        self.org = org
        self._token = token

    @property
    def url(self) -> str:
        return f"hub://{self.org}"

    def _repo(self, stitch_id: str) -> str:
        return f"{self.org}/{check_stitch_id(stitch_id)}"

    def put(self, stitch_id: str, folder: Path) -> None:
        from lead.artifacts import push_stitch

        stitch_files(Path(folder))
        pushed = push_stitch(folder, self._repo(stitch_id), token=self._token)
        logger.info("published stitch %s to the Hub as %s", stitch_id, pushed)

    def local_folder(self, stitch_id: str) -> Path:
        from lead._hub import download_snapshot

        return download_snapshot(self._repo(stitch_id), None, ARTIFACT_FILES, token=self._token)

    def delete(self, stitch_id: str) -> None:
        logger.info(
            "stitch %s is deleted here; its Hub repo %s is kept", stitch_id, self._repo(stitch_id)
        )

    def evict(self, stitch_id: str) -> None:
        """Nothing: the Hugging Face cache is shared with other programs (``hf cache``)."""
        check_stitch_id(stitch_id)

    def exists(self, stitch_id: str) -> bool:
        import huggingface_hub
        from huggingface_hub import errors

        from lead._hub import _offline_env

        repo = self._repo(stitch_id)
        if _offline_env():
            cached = huggingface_hub.try_to_load_from_cache(
                repo, CONFIG_FILE, cache_dir=os.environ.get("HF_HUB_CACHE") or None
            )
            return isinstance(cached, str)
        try:
            return bool(huggingface_hub.HfApi(token=self._token).file_exists(repo, CONFIG_FILE))
        except (errors.HfHubHTTPError, OSError, ValueError) as error:
            raise HubError(f"cannot reach the Hub for {repo}: {error}") from None
