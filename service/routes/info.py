"""``GET /v1/info``: version, device, limits, whether jobs run here, encodings."""

from __future__ import annotations

from fastapi import APIRouter

import lead
from service.arrow_io import ARROW_STREAM
from service.deps import RegistryDep, SettingsDep
from service.schemas import InfoOut, JobsInfoOut, LimitsOut, error_responses

__all__ = ["router"]

router = APIRouter(tags=["info"])


@router.get("/v1/info", response_model=InfoOut, responses=error_responses(401, 503))
async def info(settings: SettingsDep, registry: RegistryDep) -> InfoOut:
    """What this server runs and accepts."""
    return InfoOut(
        version=lead.__version__,
        device=str(registry.device),
        dtype=settings.dtype,
        limits=LimitsOut(
            max_vectors_per_request=settings.max_vectors,
            max_body_bytes=settings.max_body_bytes,
            max_vectors_arrow=settings.max_vectors_arrow,
            max_body_bytes_arrow=settings.max_body_bytes_arrow,
            max_translate_bytes_in_flight=settings.max_translate_bytes_in_flight,
            max_concurrent_align=settings.max_concurrent_align,
            max_dataset_bytes=settings.max_dataset_bytes,
            max_dataset_rows=settings.max_dataset_rows,
            max_inline_pairs=settings.max_inline_pairs,
            max_dimension=settings.max_dimension,
            max_align_pairs=settings.max_align_pairs,
        ),
        jobs=JobsInfoOut(
            enabled=settings.enable_jobs,
            workers=settings.job_workers,
            engine="ray" if settings.ray_address else "process",
            database="sqlite" if settings.database_url is None else "postgresql",
            shared_stitch_store=bool(settings.stitch_store),
        ),
        encodings=["float", "base64"],
        media_types=["application/json", ARROW_STREAM],
        auth=bool(settings.api_keys),
        stitches=len(registry.entries()),
    )
