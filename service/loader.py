"""Start-up loading: which stitches to serve, on which device, and loading them.

A configured entry is a local folder when one exists at that path (relative paths are
tried against the working directory, then the repository root); otherwise a Hugging Face
Hub repo id, ``org/name`` or ``org/name@revision``, loaded through :func:`lead.load_stitch`
(which honours the Hub cache and ``HF_HUB_OFFLINE``). A stitch that fails is logged and
recorded in the registry, never skipped silently.
"""

from __future__ import annotations

import gc
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from lead.artifacts import load_stitch, stitch_folder
from lead.errors import ConflictError, LeadError
from service.registry import StitchRegistry
from service.settings import DEFAULT_MODELS_DIR, Settings

__all__ = ["StitchRef", "configured_refs", "load_stitches", "parse_stitch_ref", "resolve_device"]

logger = logging.getLogger("lead.service")

_REPO_ROOT = DEFAULT_MODELS_DIR.parent
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


@dataclass(frozen=True)
class StitchRef:
    """A configured stitch: its service id and where to load it from."""

    id: str
    location: str
    origin: Literal["local", "hub"]
    revision: str | None = None


def resolve_device(spec: str) -> torch.device:
    """``auto`` → ``cuda`` when available, else ``cpu``; ``cuda[:N]`` must exist.

    Raises
    ------
    RuntimeError
        If a CUDA device is requested but unavailable.
    """
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"LEAD_DEVICE={spec!r} but CUDA is not available (torch {torch.__version__}, "
                f"CUDA build {torch.version.cuda}); use LEAD_DEVICE=cpu or auto"
            )
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise RuntimeError(
                f"LEAD_DEVICE={spec!r} but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    return device


def _local_folder(text: str) -> Path | None:
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, _REPO_ROOT / path]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    return None


def parse_stitch_ref(text: str) -> StitchRef:
    """Turn a ``LEAD_STITCHES`` entry into a :class:`StitchRef`."""
    text = text.strip()
    folder = _local_folder(text)
    if folder is not None:
        return StitchRef(folder.name, str(folder), "local")
    if _HUB_ID.match(text):
        repo_id, _, revision = text.partition("@")
        return StitchRef(text, repo_id, "hub", revision or None)
    # Neither: keep it so that loading fails loudly with "not found".
    return StitchRef(Path(text).name or text, text, "local")


def configured_refs(settings: Settings) -> list[StitchRef]:
    """The stitches to serve: ``settings.stitches``, else every stitch folder in ``models_dir``."""
    if settings.stitches is not None:
        return [parse_stitch_ref(text) for text in settings.stitches]
    models_dir = settings.models_dir
    if not models_dir.is_dir():
        logger.warning("no stitches configured and %s does not exist", models_dir)
        return []
    return [
        StitchRef(folder.name, str(folder.resolve()), "local")
        for folder in sorted(models_dir.iterdir())
        if (folder / "config.json").is_file()
    ]


def load_stitches(registry: StitchRegistry, refs: list[StitchRef]) -> None:
    """Load, test and register every ref; record and log each failure. Runs in a thread."""
    seen: set[str] = set()
    try:
        for ref in refs:
            if registry.closed.is_set():
                return
            try:
                if ref.id in seen:
                    raise ConflictError(
                        f"two configured stitches have the id {ref.id!r} ({ref.location})"
                    )
                seen.add(ref.id)
                folder = stitch_folder(ref.location, ref.revision)
                # float32: the registry decides the serving precision (service.routing.serving_copy)
                stitch = load_stitch(folder, device=registry.device, dtype=torch.float32)
                registry.register(
                    ref.id, stitch, origin=ref.origin, revision=ref.revision, folder=folder
                )
                logger.info(
                    "loaded stitch %s (%s → %s) from %s",
                    ref.id,
                    stitch.info.source_model,
                    stitch.info.target_model,
                    ref.location,
                )
            except Exception as exc:
                failure = registry.fail(ref.id, exc)
                logger.error(
                    "stitch %s failed to load from %s: %s: %s",
                    ref.id,
                    ref.location,
                    failure.error,
                    failure.message,
                    exc_info=not isinstance(exc, LeadError),
                )
    finally:
        registry.finish_loading()
        # Everything loaded so far lives as long as the server: out of the collector's sight,
        # so that a full collection walks only what requests allocate (~110 ms every few
        # seconds under load otherwise: the p99 of single-vector requests).
        gc.freeze()
