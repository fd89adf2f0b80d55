"""``GET /v1/stitches`` and ``GET /v1/stitches/{id}`` (ids may hold ``/`` and ``@``)."""

from __future__ import annotations

from fastapi import APIRouter

from lead.stitches import InvertibleStitch
from service.deps import RegistryDep
from service.registry import StitchEntry
from service.schemas import ModelSide, StitchList, StitchOut, error_responses

__all__ = ["router", "stitch_out"]

router = APIRouter(tags=["stitches"])


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
        origin=entry.origin,
        revision=entry.revision,
        fit=dict(info.fit),
        scorecard=info.scorecard,
    )


@router.get("/v1/stitches", response_model=StitchList, responses=error_responses(401, 503))
async def list_stitches(registry: RegistryDep) -> StitchList:
    """Every stitch served now, sorted by id."""
    return StitchList(data=[stitch_out(entry) for entry in registry.entries()])


@router.get(
    "/v1/stitches/{stitch_id:path}",
    response_model=StitchOut,
    responses=error_responses(401, 404, 422, 503),
)
async def get_stitch(stitch_id: str, registry: RegistryDep) -> StitchOut:
    """One stitch: models and dimensions, architecture, revision, fit, scorecard."""
    return stitch_out(registry.get(stitch_id))
