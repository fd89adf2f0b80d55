"""``GET /v1/stitches`` and ``GET /v1/stitches/{id}`` (ids may hold ``/`` and ``@``).

The list shows a summary of each stitch (:func:`stitch_summary`: the fit's method, pairs and
seed, the scorecard's core metrics); one stitch's view shows all of its fit record (data
files, held-out split with its ids) and scorecard (retrieval, baselines, round trip).
"""

from __future__ import annotations

from fastapi import APIRouter

from lead.scorecard import CORE_METRICS
from lead.stitches import InvertibleStitch
from service.deps import RegistryDep
from service.registry import StitchEntry
from service.schemas import ModelSide, StitchList, StitchOut, StitchSummary, error_responses

__all__ = ["router", "stitch_out", "stitch_summary"]

#: Entries of the fit record and of the scorecard that the list shows.
_FIT_SUMMARY = ("method", "pairs", "seed")
_SCORECARD_SUMMARY = ("pairs", *CORE_METRICS)

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
