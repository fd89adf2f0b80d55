"""Served stitches: ``GET /v1/stitches``, ``GET /v1/stitches/{id}``, their files
(``GET /v1/stitch-files/{name}?stitch={id}``) and ``DELETE /v1/stitches/{id}``.

Stitch ids may hold ``/`` and ``@`` (Hub ids ``org/name@revision``), so ``{id}`` is the rest
of the path. A file is therefore addressed by its name in the path and the stitch in the
query: no id, however it ends, can be mistaken for a file name. :data:`router` needs the
``translate`` scope; :data:`admin_router` (deletion) the ``admin`` scope.

The list shows a summary of each stitch (:func:`stitch_summary`: the fit's method, pairs and
seed, the scorecard's core metrics); one stitch's view shows all of its fit record (data
files, held-out split with its ids) and scorecard (retrieval, baselines, round trip).
"""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Iterator
from typing import Annotated, Any, BinaryIO, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response, StreamingResponse

from lead.errors import StitchNotFoundError
from lead.scorecard import CORE_METRICS
from lead.stitches import InvertibleStitch, Stitch
from service.deps import RegistryDep
from service.errors import echo
from service.jobs.deps import JobsDep
from service.registry import StitchEntry, StitchRegistry
from service.schemas import (
    ErrorEnvelope,
    ModelSide,
    StitchDeleted,
    StitchList,
    StitchOut,
    StitchSummary,
    error_responses,
)

__all__ = ["FILE_MEDIA_TYPES", "admin_router", "router", "stitch_out", "stitch_summary"]

#: Entries of the fit record and of the scorecard that the list shows.
_FIT_SUMMARY = ("method", "pairs", "seed")
_SCORECARD_SUMMARY = ("pairs", *CORE_METRICS)

router = APIRouter(tags=["stitches"])
admin_router = APIRouter(tags=["stitches"])

ArtifactFile = Literal["model.safetensors", "config.json", "README.md"]
#: Content-Type of each file of a stitch artifact (lead.artifacts.ARTIFACT_FILES).
FILE_MEDIA_TYPES: dict[str, str] = {
    "model.safetensors": "application/octet-stream",
    "config.json": "application/json",
    "README.md": "text/markdown; charset=utf-8",
}
_CHUNK = 1 << 20

_FILE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The file: the tensors (safetensors), the config or the model card.",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": {"type": "object"}},
            "text/markdown": {"schema": {"type": "string"}},
        },
    },
    **error_responses(404, 422, 503),
}
_DELETE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **error_responses(404, 503),
    409: {
        "model": ErrorEnvelope,
        "description": "The stitch is configured (bundled, a local folder, the Hub), not "
        "trained by a job; or its job has not finished.",
    },
}


def stitch_out(entry: StitchEntry) -> StitchOut:
    """The public description of a served stitch."""
    stitch, info = entry.stitch, entry.stitch.info
    return StitchOut(
        id=entry.id,
        source=ModelSide(
            model=info.source_model,
            dim=stitch.d_src,
            normalized=info.source_normalized,
            revision=info.source_revision,
        ),
        target=ModelSide(
            model=info.target_model,
            dim=stitch.d_tgt,
            normalized=info.target_normalized,
            revision=info.target_revision,
        ),
        architecture=stitch.architecture,
        invertible=isinstance(stitch, InvertibleStitch),
        normalize_output=stitch.normalize_output,
        confidence=_confidence_report(stitch),
        origin=entry.origin,
        revision=entry.revision,
        commit=entry.commit,
        fit=dict(info.fit),
        scorecard=info.scorecard,
    )


def _confidence_report(stitch: Stitch) -> dict[str, Any] | None:
    head = stitch.confidence_head
    return None if head is None else dict(head.report)


def stitch_summary(entry: StitchEntry) -> StitchSummary:
    """The listed description of a served stitch: :func:`stitch_out` without the bulky parts."""
    full = stitch_out(entry)
    scorecard = full.scorecard
    return StitchSummary(
        **full.model_dump(exclude={"fit", "scorecard"}),
        fit={key: full.fit[key] for key in _FIT_SUMMARY if key in full.fit},
        scorecard=None
        if scorecard is None
        else {key: scorecard[key] for key in _SCORECARD_SUMMARY if key in scorecard},
    )


@router.get("/v1/stitches", response_model=StitchList, responses=error_responses(401, 503))
async def list_stitches(registry: RegistryDep) -> StitchList:
    """Every stitch served now, sorted by id, summarised (`fit` and `scorecard` in full
    from GET /v1/stitches/{id})."""
    return StitchList(data=[stitch_summary(entry) for entry in registry.entries()])


@router.get(
    "/v1/stitches/{stitch_id:path}",
    response_model=StitchOut,
    responses=error_responses(401, 404, 422, 503),
)
async def get_stitch(stitch_id: str, registry: RegistryDep) -> StitchOut:
    """One stitch: models and dimensions, architecture, revision, fit, scorecard."""
    return stitch_out(registry.get(stitch_id))


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    """The rest of an open file, closed at the end or when the response is dropped."""
    with handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


FileName = Annotated[ArtifactFile, Path(description="One of the three files of a stitch.")]
StitchQuery = Annotated[
    str,
    Query(min_length=1, description="The stitch id (`minilm-to-mpnet`, `org/name@revision`)."),
]


def _file_headers(name: str, size: int) -> dict[str, str]:
    return {"Content-Length": str(size), "Content-Disposition": f'attachment; filename="{name}"'}


def _opened(registry: StitchRegistry, stitch: str, name: str) -> tuple[BinaryIO, int]:
    """The stitch's file ``name``, open at its start, and its size in bytes.

    Raises
    ------
    StitchNotFoundError
        No such stitch, or it has no such file on this server.
    """
    entry = registry.get(stitch)
    if entry.folder is None:
        raise StitchNotFoundError(
            f"stitch {echo(stitch)} has no files on this server", param="stitch"
        )
    handle = _open_file(entry.folder, name)
    if handle is None:  # deleted meanwhile, a configured folder changed, not a plain file
        raise StitchNotFoundError(
            f"stitch {echo(stitch)} has no file {name} on this server", param="stitch"
        )
    size = handle.seek(0, 2)
    handle.seek(0)
    return handle, size


@router.get(
    "/v1/stitch-files/{name}",
    response_class=StreamingResponse,
    responses=_FILE_RESPONSES,
    summary="Download a file of a stitch",
)
def get_stitch_file(
    name: FileName, stitch: StitchQuery, registry: RegistryDep
) -> StreamingResponse:
    """A file of a served stitch, from the folder it was loaded from (for a Hub stitch, the
    Hugging Face cache): ``model.safetensors``, ``config.json`` or ``README.md`` (the model
    card). The three in one folder load with ``lead.load_stitch(folder)``;
    ``lead stitches download`` fetches them.

    The file is opened before the answer starts, so deleting the stitch meanwhile does
    not cut a download short.
    """
    handle, size = _opened(registry, stitch, name)
    return StreamingResponse(
        _chunks(handle), media_type=FILE_MEDIA_TYPES[name], headers=_file_headers(name, size)
    )


@router.head(
    "/v1/stitch-files/{name}",
    response_class=Response,
    responses={
        200: {"description": "The file's headers (its size in Content-Length), no body."},
        # the same statuses as GET; a HEAD answer has no body, so no error envelope either
        **{
            code: {"description": answer["description"]}
            for code, answer in error_responses(404, 422, 503).items()
        },
    },
    summary="A file of a stitch: its headers, no body",
)
def head_stitch_file(name: FileName, stitch: StitchQuery, registry: RegistryDep) -> Response:
    """What ``GET`` answers, without the body: the size (``Content-Length``), the type
    and the file name, e.g. to check a download before starting it."""
    handle, size = _opened(registry, stitch, name)
    handle.close()
    return Response(media_type=FILE_MEDIA_TYPES[name], headers=_file_headers(name, size))


def _open_file(folder: pathlib.Path, name: str) -> BinaryIO | None:
    """``folder / name`` opened for reading, or None when it is missing or not a regular
    file of the stitch: a FIFO (which would block the server), a device, or a link that
    leads out of the folder (a configured folder's ``README.md`` linked to ``/etc/passwd``
    was served). A Hub stitch's files are links into its cache's ``blobs`` folder."""
    path = folder / name
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a loop of links
        return None
    home = folder.resolve()
    homes = [home]
    if home.parent.name == "snapshots":  # huggingface_hub's cache: snapshots/<rev>/name -> blobs
        homes.append((home.parent.parent / "blobs").resolve())  # itself a link, maybe
    if not any(real.is_relative_to(h) for h in homes):
        return None
    try:  # without O_NONBLOCK, opening a FIFO waits for a writer
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


@admin_router.delete(
    "/v1/stitches/{stitch_id:path}", response_model=StitchDeleted, responses=_DELETE_RESPONSES
)
def delete_stitch(stitch_id: str, jobs: JobsDep) -> StitchDeleted:
    """Delete a stitch trained by a job: it is no longer served (requests already running
    finish with it), its folder is removed, and its job's ``result.stitch_deleted_at`` says
    so. Its id is not used again. Configured stitches (bundled, local folders, the Hub)
    answer 409: remove them from ``LEAD_STITCHES`` instead."""
    job = jobs.delete_stitch(stitch_id)
    return StitchDeleted(id=stitch_id, job=None if job is None else job.id)
