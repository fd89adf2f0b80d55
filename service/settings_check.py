"""``python -m service.settings_check``: read the ``LEAD_*`` settings once and say what is
wrong, with exit status 1.

``scripts/serve.sh`` and the Docker image run it before uvicorn: with ``LEAD_WORKERS`` > 1,
uvicorn's supervisor would restart workers that refuse the settings forever instead of
stopping. The device is checked too (``create_app`` refuses CUDA where there is none), so
is every ``LEAD_STITCHES`` entry that can only be a local folder or a bundled id, and,
when the server runs jobs, what the jobs need: the job database answers
(``LEAD_DATABASE_URL``), the stitch store can be opened and a stitch folder written
(``LEAD_STITCH_STORE``), the Ray head's port answers (``LEAD_RAY_ADDRESS``). Messages never
show a password.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from lead.errors import LeadError, StitchNotFoundError
from service.loader import resolve_device
from service.settings import Settings

__all__ = ["OTHER_VARIABLES", "describe", "main", "unknown_variables"]


def _writable_folder(folder: Path) -> None:
    """Raise OSError unless ``folder`` (or the nearest folder above it that exists, where it
    would be created) can be written."""
    here = folder.expanduser().absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir() or not os.access(here, os.W_OK | os.X_OK):
        raise OSError(f"LEAD_STITCH_STORE: cannot write stitches under {folder} ({here})")


def _check_stitches(settings: Settings) -> None:
    """Each ``LEAD_STITCHES`` entry that can only be local (not of a Hub id's form: a
    folder or a bundled stitch's id, or a path under a folder that exists) names one: a
    misspelt id left a server that started and was never ready (``/readyz`` 503 for
    good). Hub ids are not fetched here."""
    from lead.artifacts import stitch_folder
    from service.loader import parse_stitch_ref

    for text in settings.stitches or ():
        ref = parse_stitch_ref(text)
        path = Path(ref.location)
        if ref.origin == "hub" and path.parent.is_dir() and not path.exists():
            # "models/minilm-to-mpnett": a Hub id's form, but models/ is a folder here
            raise StitchNotFoundError(
                f"LEAD_STITCHES: no stitch folder {text!r}: the folder {path.parent} has no "
                f"{path.name!r}"
            )
        if ref.origin == "local":
            try:
                stitch_folder(ref.location)
            except StitchNotFoundError as exc:
                raise StitchNotFoundError(f"LEAD_STITCHES: {exc.message}") from None


def _check_jobs(settings: Settings) -> None:
    """What the jobs of this server need; raises LeadError or OSError naming the problem."""
    from lead._ray import check_ray_reachable
    from service.jobs.db import PostgresDatabase
    from service.jobs.stitch_store import FolderStore, open_stitch_store

    if settings.database_url is not None:
        PostgresDatabase(settings.database_url.get_secret_value()).close()
    data_dir = Path(settings.data_dir).expanduser()
    store = open_stitch_store(settings.stitch_store, data_dir, settings.hf_token)
    if isinstance(store, FolderStore):
        _writable_folder(store.root)
    if settings.ray_address:
        check_ray_reachable(settings.ray_address)


#: ``LEAD_*`` variables that are not settings of the service: read by the scripts, the
#: ``lead`` CLI and client, the benchmarks and the live-Hub tests.
OTHER_VARIABLES = frozenset(
    {
        "LEAD_API_KEY",
        "LEAD_SERVER_URL",
        "LEAD_SHARED_DATA",
        "LEAD_VENV",
        "LEAD_EXTRAS",
        "LEAD_TEST_HUB_REPO",
        "LEAD_TEST_HUB_ORG",
        "LEAD_SCALEOUT_SECONDS",
    }
)


def _variable(field: object) -> str:
    return f"LEAD_{str(field).upper()}"


def describe(error: ValidationError) -> list[str]:
    """Each refused setting as ``LEAD_NAME: why``, a line each (pydantic names the fields
    and adds a documentation link; the variables are what a user set). Values are not
    repeated: the settings hold secrets."""
    lines = []
    for item in error.errors(include_url=False):
        loc = item.get("loc") or ("",)
        where = _variable(loc[0]) if loc[0] else "settings"
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return lines


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``LEAD_*`` variable that is no setting (a misspelt one is
    otherwise ignored without a word), with the closest setting's name."""
    known = {_variable(name) for name in Settings.model_fields} | OTHER_VARIABLES
    warnings = []
    for name in sorted(environ):
        if name.upper().startswith("LEAD_") and name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), sorted(known), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.append(f"{name} is not a LEAD setting and is ignored{hint}")
    return warnings


def main() -> int:
    """Check the settings of the environment; 0 when the service can start with them."""
    for warning in unknown_variables(os.environ):
        sys.stderr.write(f"LEAD settings: warning: {warning}\n")
    try:
        settings = Settings()
        resolve_device(settings.device)
        _check_stitches(settings)
        if settings.enable_jobs:
            _check_jobs(settings)
    except LeadError as exc:
        sys.stderr.write(f"LEAD settings: {exc.message}\n")
        return 1
    except ValidationError as exc:
        sys.stderr.write("".join(f"LEAD settings: {line}\n" for line in describe(exc)))
        return 1
    except (RuntimeError, OSError) as exc:  # RuntimeError: no CUDA there
        sys.stderr.write(f"LEAD settings: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
