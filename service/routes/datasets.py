"""Paired-embedding datasets: ``POST /v1/datasets`` (upload), ``GET /v1/datasets``,
``GET /v1/datasets/{id}``, ``DELETE /v1/datasets/{id}``.

The upload is a ``.safetensors`` file, sent as the raw body
(``Content-Type: application/octet-stream``) or as the ``file`` field of a
``multipart/form-data`` form. It streams to disk under the size limit, is validated
(``service.jobs.datasets``) and renamed into place, never parsed with pickle.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel
from starlette.datastructures import FormData, UploadFile

from lead._options import name_problem
from lead.errors import InvalidInputError, LimitExceededError, UnsupportedMediaTypeError
from service.deps import body_error, media_type
from service.jobs.datasets import METADATA_LIMIT
from service.jobs.deps import JobsDep, get_jobs
from service.jobs.schemas import DatasetList, DatasetOut, job_error_responses

__all__ = ["router"]

# the feature first: a translation-only replica answers 503, not a check of the body
router = APIRouter(tags=["datasets"], dependencies=[Depends(get_jobs)])

_RAW_TYPES = ("application/octet-stream", "application/x-safetensors")
_CHUNK = 1 << 20

_UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A .safetensors file with tensors `source` (n, d_src) and `target` "
        "(n, d_tgt), float32/float16/float64, n >= 4; optionally `source_queries`, "
        "`target_queries` and the metadata entries `query_ids`, `corpus_ids`, `qrels` (JSON) "
        "for retrieval scores.",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "name": {"type": "string", "maxLength": METADATA_LIMIT},
                    },
                    "required": ["file"],
                    "additionalProperties": False,
                    "description": "`name` here or as `?name=`, not both (422).",
                }
            },
        },
    }
}


class DatasetDeleted(BaseModel):
    id: str
    object: Literal["dataset.deleted"] = "dataset.deleted"
    deleted: bool = True


async def _file_chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(_CHUNK):
        yield chunk


def _check_label(name: str | None) -> None:
    """Refuse a dataset label holding a control or format character (``a%00b%0a`` was
    stored and listed as it was; model names already refuse them).

    Raises
    ------
    InvalidInputError
        Naming the character.
    """
    problem = name_problem(name) if name else None
    if problem is not None:
        raise InvalidInputError(f"name {problem}", param="name")


#: The fields of a multipart upload: the file, and its label (or ``?name=``).
_FORM_FIELDS = ("file", "name")


def _check_form_fields(form: FormData, *, query_name: str | None) -> None:
    """Refuse (422) a form field other than ``file`` and ``name``, one given twice, or a
    ``name`` given both as a form field and as ``?name=`` (one would be dropped silently),
    as unknown and repeated query parameters are."""
    seen: set[str] = set()
    for key, value in form.multi_items():
        shown = value if isinstance(value, str) else "(a file)"
        if key not in _FORM_FIELDS:
            raise body_error(key, shown, "not a field of this form (file, name)")
        if key in seen:
            raise body_error(key, shown, "given more than once; give each form field once")
        if key == "name" and not isinstance(value, str):
            raise body_error(key, shown, "a text field, not a file")
        if key == "name" and query_name is not None:
            raise body_error(key, shown, "given both as a form field and as ?name=; give one")
        seen.add(key)


@router.post(
    "/v1/datasets",
    status_code=201,
    response_model=DatasetOut,
    responses=job_error_responses(400, 408, 413, 415, 422, 507),
    openapi_extra=_UPLOAD_BODY,
    summary="Upload a paired-embedding dataset",
)
async def upload_dataset(
    request: Request,
    response: Response,
    jobs: JobsDep,
    name: Annotated[str | None, Query(max_length=METADATA_LIMIT, description="A label.")] = None,
) -> DatasetOut:
    """Store a dataset for jobs and alignment; answers 201 with its id and shapes."""
    media = media_type(request)  # two Content-Type headers: 415
    _check_label(name)
    if media in _RAW_TYPES:
        record = await jobs.upload_dataset(request.stream(), name=name)
    elif media == "multipart/form-data":
        # two files: a 'name' sent as a file part is named by _check_form_fields (one file
        # at most made Starlette say "Too many files")
        async with request.form(max_files=2, max_fields=4) as form:
            _check_form_fields(form, query_name=name)
            upload = form.get("file")
            if isinstance(upload, str):
                raise InvalidInputError(
                    "the form field 'file' is text: send the file as a part with a filename",
                    param="file",
                )
            if upload is None:
                raise InvalidInputError(
                    "the multipart form holds no complete file field named 'file' (a form "
                    "ends with its closing boundary, --BOUNDARY--)",
                    param="file",
                )
            label = form.get("name")
            if isinstance(label, str) and len(label) > METADATA_LIMIT:
                raise LimitExceededError(
                    f"the form field 'name' has {len(label)} characters; at most "
                    f"{METADATA_LIMIT} (as for ?name=)",
                    limit=METADATA_LIMIT,
                    got=len(label),
                    param="name",
                )
            label = name or (label if isinstance(label, str) else None)
            _check_label(label)
            record = await jobs.upload_dataset(_file_chunks(upload), name=label)
    else:
        content_type = request.headers.get("content-type", "")
        raise UnsupportedMediaTypeError(
            "send the .safetensors file as application/octet-stream or multipart/form-data, "
            f"not {content_type or 'no Content-Type'!r}",
            param="Content-Type",
        )
    response.headers["Location"] = f"/v1/datasets/{record.id}"
    return DatasetOut.from_record(record)


@router.get("/v1/datasets", response_model=DatasetList, responses=job_error_responses(404))
def list_datasets(
    jobs: JobsDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(description="List the datasets before this id.")] = None,
) -> DatasetList:
    """Datasets, newest first."""
    records, has_more = jobs.store.list_datasets(limit=limit, after=after)
    data = [DatasetOut.from_record(r) for r in records]
    return DatasetList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.get(
    "/v1/datasets/{dataset_id}", response_model=DatasetOut, responses=job_error_responses(404)
)
def get_dataset(dataset_id: str, jobs: JobsDep) -> DatasetOut:
    """One dataset's shapes, dtype, size and checksum."""
    return DatasetOut.from_record(jobs.store.get_dataset(dataset_id))


@router.delete(
    "/v1/datasets/{dataset_id}",
    response_model=DatasetDeleted,
    responses=job_error_responses(404, 409),
)
def delete_dataset(dataset_id: str, jobs: JobsDep) -> DatasetDeleted:
    """Delete a dataset (409 while a queued or running job uses it)."""
    return DatasetDeleted(id=jobs.delete_dataset(dataset_id).id)
