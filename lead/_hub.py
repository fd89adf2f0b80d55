"""Hugging Face Hub transfers of stitch folders (private; used by :mod:`lead.artifacts`).

Downloads go through ``huggingface_hub.snapshot_download``, so they use the Hugging Face
cache and honour ``HF_HUB_OFFLINE``; the Hub's exceptions become LEAD's:
:class:`~lead.errors.StitchNotFoundError` when the repo or revision does not exist (or is
not cached while offline), :class:`~lead.errors.HubError` for everything else.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from lead.errors import HubError, StitchNotFoundError

__all__ = ["download_snapshot", "upload_folder"]


def _offline_env() -> bool:
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return bool(constants.HF_HUB_OFFLINE) or env in {"1", "ON", "YES", "TRUE"}


def _one_line(error: BaseException) -> str:
    """``error``'s message on one line (huggingface_hub's span several)."""
    return " ".join(str(error).split())


def download_snapshot(
    repo_id: str, revision: str | None, files: Sequence[str], *, token: str | None = None
) -> Path:
    """The local folder of ``files`` of Hub model repo ``repo_id`` at ``revision``
    (``token``: default the logged-in one, or ``HF_TOKEN``)."""
    import huggingface_hub
    from huggingface_hub import errors

    offline = _offline_env()
    where = f"{repo_id}@{revision or 'main'}"
    try:
        path = huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=list(files),
            cache_dir=os.environ.get("HF_HUB_CACHE") or None,  # also when set after import
            local_files_only=offline,
            token=token,
        )
    except errors.GatedRepoError as error:
        raise HubError(f"no access to gated Hub repo {where}: {_one_line(error)}") from None
    except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError):
        raise StitchNotFoundError(f"no stitch on the Hub at {where}", param="stitch") from None
    except errors.LocalEntryNotFoundError as error:
        if offline or isinstance(error.__cause__, errors.OfflineModeIsEnabled):
            raise StitchNotFoundError(
                f"stitch {where} is not in the Hugging Face cache and HF_HUB_OFFLINE is set",
                param="stitch",
            ) from None
        raise HubError(f"cannot download {where} from the Hub: {_one_line(error)}") from None
    except errors.HFValidationError as error:
        raise StitchNotFoundError(
            f"{repo_id!r} is not a stitch folder or Hub id: {_one_line(error)}"
        ) from None
    except (errors.HfHubHTTPError, OSError, ValueError) as error:
        raise HubError(f"cannot download {where} from the Hub: {_one_line(error)}") from None
    return Path(path)


def upload_folder(
    folder: Path, repo_id: str, files: Sequence[str], *, token: str | None, revision: str | None
) -> str:
    """Commit ``files`` of ``folder`` to Hub model repo ``repo_id``; returns ``repo_id@sha``."""
    from huggingface_hub import HfApi, errors

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="model",
            revision=revision,
            allow_patterns=list(files),
            commit_message="Upload LEAD stitch",
        )
    except (errors.HfHubHTTPError, OSError, ValueError) as error:
        raise HubError(f"cannot upload {folder} to {repo_id}: {_one_line(error)}") from None
    return f"{repo_id}@{commit.oid}"
