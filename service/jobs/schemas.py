"""Request and response models of the jobs, datasets and align routes (their OpenAPI docs)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from lead._options import MAX_SEED, echo, name_problem
from lead.errors import InvalidInputError, NonFiniteError
from service.encoding import json_kind
from service.jobs.layout import STITCH_ID_PATTERN
from service.jobs.store import DatasetRecord, JobRecord
from service.schemas import ErrorEnvelope, error_responses

__all__ = [
    "AlignRequest",
    "AlignResponse",
    "DatasetList",
    "DatasetOut",
    "JobCreate",
    "JobError",
    "JobList",
    "JobOut",
    "JobProgress",
    "JobResult",
    "PairsInput",
    "PushResult",
    "job_error_responses",
]

_VECTORS = (
    "{side}-model vectors of the pairs, row i of `source` and `target` embedding the same text: "
    "float arrays, or base64 strings of little-endian float32 (one vector each)."
)
_RESERVED_OPTIONS = frozenset({"seed", "progress", "info", "method"})
#: Deepest nesting accepted in job options (the methods take flat values).
_MAX_OPTION_DEPTH = 8


def _depth(value: Any, limit: int = _MAX_OPTION_DEPTH + 1) -> int:
    """Nesting depth of JSON-like ``value`` (a scalar is 0), counted up to ``limit``."""
    if limit <= 0 or not isinstance(value, dict | list):
        return 0
    children = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(child, limit - 1) for child in children), default=0)


_HUB_REPO = r"^[A-Za-z0-9][\w.-]*/[\w.-]+$"
# Vectors: validation stops at the first bad item (a body of millions of wrong items would
# otherwise collect an error for each, and each of those for every union member).
_FloatRows = Annotated[list[Annotated[list[float], Field(fail_fast=True)]], Field(fail_fast=True)]
_Base64Rows = Annotated[list[str], Field(fail_fast=True)]


def job_error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """:func:`service.schemas.error_responses` with the meanings of 409 and 503 on the
    jobs, datasets and align routes; 503 is always listed (jobs may be off)."""
    out = error_responses(*(s for s in statuses if s not in (409, 503)))
    if 409 in statuses:
        out[409] = {
            "model": ErrorEnvelope,
            "description": "Conflict: the job has finished, the stitch id is taken, or the "
            "dataset is still used by a job.",
        }
    out[503] = {
        "model": ErrorEnvelope,
        "description": "Jobs, datasets and alignment are off on this replica "
        "(LEAD_ENABLE_JOBS=false), or the job runner has not started yet.",
    }
    return out


def _check_finite(value: Any, path: str) -> None:
    """Raise :class:`NonFiniteError` naming the first NaN / infinity in parsed JSON.

    The body parser accepts ``NaN``, ``Infinity`` and ``1e999``; JSON output would turn
    them into ``null`` (so a job would run with another option than sent).
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise NonFiniteError(f"{path} is {value!r}; numbers must be finite", param=path)
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, f"{path}[{i}]")


#: What a vector of inline pairs may hold: JSON numbers (integers and floats).
_NUMBER_TYPES = frozenset({int, float})


class PairsInput(BaseModel):
    """Paired embeddings: an uploaded dataset id, or ``source`` + ``target`` inline."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """State in the schema what :meth:`_one_kind_of_data` checks: a ``dataset`` id and
        no vectors, or ``source`` and ``target`` and no dataset (null counts as absent).
        The two exclude each other, hence ``oneOf``."""
        schema = handler.resolve_ref_schema(handler(core_schema))
        null = {"type": "null"}
        vectors = {key: schema["properties"][key]["anyOf"][:-1] for key in ("source", "target")}
        schema["oneOf"] = [
            {
                "title": "By dataset",
                "required": ["dataset"],
                "properties": {"dataset": {"type": "string"}, "source": null, "target": null},
            },
            {
                "title": "Inline pairs",
                "required": ["source", "target"],
                "properties": {
                    "dataset": null,
                    "source": {"anyOf": vectors["source"]},
                    "target": {"anyOf": vectors["target"]},
                },
            },
        ]
        return schema

    @model_validator(mode="before")
    @classmethod
    def _finite_fields(cls, data: Any) -> Any:
        """NaN / infinity anywhere but the vectors is 422 (the vectors are checked later,
        naming the row)."""
        if isinstance(data, dict):
            for key, value in data.items():
                if key not in ("source", "target"):
                    _check_finite(value, str(key))
        return data

    @field_validator("source", "target", mode="before")
    @classmethod
    def _numbers_only(cls, value: Any, info: ValidationInfo) -> Any:
        """Only JSON numbers in a vector, as ``POST /v1/translate`` takes them: pydantic
        would read ``true`` / ``false`` as 1.0 / 0.0 and ``"0.12"`` as 0.12."""
        if isinstance(value, list):
            for i, row in enumerate(value):
                if isinstance(row, list) and not set(map(type, row)) <= _NUMBER_TYPES:
                    name = f"{info.field_name}[{i}]"
                    odd = next(v for v in row if type(v) not in _NUMBER_TYPES)
                    raise InvalidInputError(
                        f"{name} contains {json_kind(odd)}, not a number", param=name
                    )
        return value

    dataset: str | None = Field(default=None, description="Id of an uploaded dataset (`ds_...`).")
    source: _FloatRows | _Base64Rows | None = Field(
        default=None, description=_VECTORS.format(side="Source")
    )
    target: _FloatRows | _Base64Rows | None = Field(
        default=None, description=_VECTORS.format(side="Target")
    )

    @model_validator(mode="after")
    def _one_kind_of_data(self) -> PairsInput:
        inline = self.source is not None or self.target is not None
        if self.dataset is not None and inline:
            raise ValueError("give either `dataset` or `source` + `target`, not both")
        if self.dataset is None and (self.source is None or self.target is None):
            raise ValueError("give `dataset`, or both `source` and `target`")
        return self


class JobResources(BaseModel):
    """What a job asks of the cluster (used when jobs run on Ray, ``LEAD_RAY_ADDRESS``)."""

    model_config = ConfigDict(extra="forbid")

    cpus: int = Field(
        default=1, ge=1, le=1024, strict=True, description="Ray `num_cpus`, and torch threads."
    )
    gpus: float = Field(
        default=0,
        ge=0,
        le=64,
        strict=True,
        description="Ray `num_gpus`; a gradient method (mlp, invertible, ...) then trains on "
        "`cuda` unless `options.device` says otherwise. Needs `LEAD_RAY_ADDRESS`.",
    )


class JobCreate(PairsInput):
    """Body of ``POST /v1/jobs``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "source_model": "sentence-transformers/all-MiniLM-L6-v2",
                    "target_model": "intfloat/multilingual-e5-small",
                    "dataset": "ds_0123456789abcdef01234567",
                    "method": "ridge",
                },
                {
                    "source_model": "minilm",
                    "target_model": "mpnet",
                    "dataset": "ds_0123456789abcdef01234567",
                    "method": "mlp",
                    "options": {"hidden_dim": 256, "max_epochs": 30, "loss": "cosine"},
                    "stitch_id": "minilm-to-mpnet-mlp",
                },
            ]
        },
    )

    source_model: str = Field(min_length=1, max_length=200, description="Model of `source`.")
    target_model: str = Field(min_length=1, max_length=200, description="Model of `target`.")
    method: str = Field(
        default="ridge",
        description="`ridge` (alias `affine`), `procrustes` (alias `orthogonal`), `mlp`, "
        "`invertible` (also runs backwards), `anchors` (zero-shot from a few pairs), "
        "`unsupervised` (fitted without the pairing; the held-out pairs only score it), "
        "`local` (a global map plus the nearest training pairs' residuals) or `gated` (a "
        "local stitch near the training pairs, a residual MLP elsewhere).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options of the method (lead.fit_stitch): ridge `alpha`, `alphas`; "
        "procrustes `scaling`; mlp `hidden_dim`, `depth`, `loss`, `lr`, `max_epochs`, ...; "
        "local `k`, `base`, `temperature`, `strength`, `sink`, `max_memory`; gated those "
        "of local and mlp's `hidden_dim`, `depth`, `max_epochs`, `patience`, "
        "`gate_quantile`, `gate_width`, and the general memory's `general_memory`, "
        "`general_k`, `general_temperature`, `general_sink`, `general_strength`. "
        "Unknown names and bad values are refused at submission (422; a local or gated `k` above "
        "the training pairs: 400 `invalid_input`); a fit that fails "
        "later (e.g. training that diverges) fails the job with a reason.",
    )
    holdout_fraction: float = Field(
        default=0.2,
        gt=0,
        lt=1,
        strict=True,  # a JSON number only (not "0.3"), as every other job field
        description="Share of pairs held out for the scorecard.",
    )
    seed: int = Field(
        default=0, ge=0, le=MAX_SEED, strict=True, description="Seed of the split and of the fit."
    )
    push_to_hub: str | None = Field(
        default=None,
        pattern=_HUB_REPO,
        description="Hub repo (`org/name`) to push the stitch to; needs LEAD_HF_TOKEN "
        "(400 without).",
    )
    stitch_id: str | None = Field(
        default=None,
        pattern=STITCH_ID_PATTERN,
        description="Id of the resulting stitch; default `<source>-to-<target>-<job>`.",
    )
    resources: JobResources | None = Field(
        default=None,
        description="CPUs and GPUs for the job's Ray task (default 1 CPU, no GPU). Without "
        "`LEAD_RAY_ADDRESS` jobs train in this server's worker processes "
        "(`LEAD_JOB_TORCH_THREADS`) and asking for GPUs is refused (422).",
    )
    # strict: JSON true / false only (not "yes", 1 or "true")
    allow_below_baseline: bool = Field(
        default=False,
        strict=True,
        description="Serve (and push) the stitch even when its held-out `r2_score` is at or "
        "below the mean-estimator baseline (0: no better than answering the training mean "
        "for every vector). By default such a job succeeds and keeps the stitch on disk, but "
        "does not serve or push it; `result.served` is false and `result.not_served_reason` "
        "says why.",
    )

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        from lead.fitting import METHODS

        if value.lower() not in METHODS:
            raise ValueError(f"unknown method {echo(value)}; choose one of {', '.join(METHODS)}")
        return value.lower()

    @field_validator("options")
    @classmethod
    def _checked_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        from lead.errors import InvalidInputError
        from lead.fitting import check_method_options

        if _depth(value) > _MAX_OPTION_DEPTH:
            raise ValueError(
                f"options nest more than {_MAX_OPTION_DEPTH} levels deep; every method "
                "option is a number, a string, a boolean or a flat list"
            )
        reserved = sorted(_RESERVED_OPTIONS & set(value))
        if reserved:
            raise ValueError(f"set {', '.join(reserved)} as top-level fields, not as options")
        if "method" in info.data:  # else the method itself was refused
            try:
                check_method_options(info.data["method"], value)
            except InvalidInputError as error:
                raise ValueError(str(error)) from None
        return value

    @field_validator("source_model", "target_model")
    @classmethod
    def _printable(cls, value: str) -> str:
        # shown in listings, logs, stitch ids and /metrics labels: no controls, no bidi
        # overrides, no line separators (a name with NUL and a newline was served)
        problem = name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _two_models(self) -> JobCreate:
        if self.source_model == self.target_model:
            raise ValueError("source_model and target_model must differ")
        return self


class JobProgress(BaseModel):
    stage: str | None = Field(
        description="`starting`, `loading`, `fit` / `init` / `train` / `match` / `refine` "
        "(by method), `scoring`, `saving`, `pushing`, `registering`, `done`; null while "
        "queued."
    )
    step: int
    total: int = Field(
        description="Steps of the current stage (`train`: max_epochs, lowered to the epochs "
        "run when early stopping ends training, so that the stage ends at step == total)."
    )
    fraction: float = Field(ge=0, le=1, description="step / total of the current stage.")


class JobError(BaseModel):
    code: str = Field(examples=["fit_failed", "interrupted", "invalid_input"])
    message: str


class PushResult(BaseModel):
    status: Literal["pending", "succeeded", "failed", "skipped"] = Field(
        description="`skipped`: not pushed because the stitch is not served."
    )
    repo_id: str | None = None
    stitch: str | None = Field(default=None, description="`org/name@commit` once pushed.")
    reason: str | None = Field(default=None, description="Why the push failed or was skipped.")


class JobWorker(BaseModel):
    engine: Literal["process", "ray"] = Field(
        description="`process`: a worker process of the server; `ray`: a Ray task."
    )
    host: str = Field(description="Host name of the machine that trained the stitch.")
    pid: int = Field(description="Its process id.")


class JobResult(BaseModel):
    stitch_id: str = Field(
        description="The stitch's id; when `served`, use it at once with `POST /v1/translate`."
    )
    served: bool = Field(
        default=True,
        description="Whether the stitch is served (listed in `GET /v1/stitches`). False when "
        "its held-out `r2_score` is at or below the mean-estimator baseline (0) and the job "
        "did not set `allow_below_baseline` (the stitch is still saved under "
        "`LEAD_DATA_DIR/stitches/`, and stays unserved after a restart), and once the "
        "stitch is deleted.",
    )
    not_served_reason: str | None = Field(
        default=None, description="Why the stitch is not served (null when it is)."
    )
    push: PushResult | None = None
    worker: JobWorker | None = Field(default=None, description="Where the stitch was trained.")
    stitch_deleted_at: int | None = Field(
        default=None,
        description="Unix seconds when the stitch was deleted (`DELETE /v1/stitches/{id}`); "
        "null while it is served.",
    )


class JobOut(BaseModel):
    object: Literal["job"] = "job"
    id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelling", "cancelled"]
    source_model: str
    target_model: str
    method: str
    options: dict[str, Any]
    holdout_fraction: float
    seed: int
    dataset: str | None = Field(description="The dataset id, or null for inline pairs.")
    pairs: int
    stitch_id: str = Field(description="Id the stitch gets (or got).")
    push_to_hub: str | None
    allow_below_baseline: bool = Field(
        description="Whether the stitch is served even at or below the baseline."
    )
    resources: JobResources | None = Field(description="What the job asked of Ray.")
    attempts: int = Field(
        description="Times the job was started, less the runs a graceful server stop handed "
        "back: a job whose server or worker died is queued again until it has been started "
        "`LEAD_JOB_MAX_ATTEMPTS` times; one whose server stopped gracefully (a deploy) is "
        "queued again without using up an attempt."
    )
    progress: JobProgress
    created_at: int = Field(description="Unix seconds.")
    started_at: int | None
    finished_at: int | None
    scorecard: dict[str, Any] | None = Field(
        description="lead.Scorecard.to_dict() on the held-out split (lead.holdout_split with "
        "this job's holdout_fraction and seed)."
    )
    result: JobResult | None
    error: JobError | None

    @classmethod
    def from_record(cls, job: JobRecord) -> JobOut:
        r = job.request
        fraction = 1.0 if job.status == "succeeded" else job.step / job.total if job.total else 0.0
        return cls(
            id=job.id,
            status=job.status,  # type: ignore[arg-type]
            source_model=r["source_model"],
            target_model=r["target_model"],
            method=r["method"],
            options=r["options"],
            holdout_fraction=r["holdout_fraction"],
            seed=r["seed"],
            dataset=job.dataset_id,
            pairs=job.pairs,
            stitch_id=job.stitch_id,
            push_to_hub=r.get("push_to_hub"),
            allow_below_baseline=r.get("allow_below_baseline", False),
            resources=r.get("resources"),
            attempts=job.attempts,
            progress=JobProgress(
                stage=job.stage, step=job.step, total=job.total, fraction=min(fraction, 1.0)
            ),
            created_at=int(job.created_at),
            started_at=None if job.started_at is None else int(job.started_at),
            finished_at=None if job.finished_at is None else int(job.finished_at),
            scorecard=job.scorecard,
            result=None if job.result is None else JobResult.model_validate(job.result),
            error=None if job.error is None else JobError.model_validate(job.error),
        )


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobOut]
    first_id: str | None
    last_id: str | None
    has_more: bool = Field(description="Ask again with `after=<last_id>` for more.")


class DatasetOut(BaseModel):
    object: Literal["dataset"] = "dataset"
    id: str
    name: str | None
    pairs: int
    source_dim: int
    target_dim: int
    dtype: str = Field(description="Stored dtype(s): float32, float16, float64.")
    queries: int | None = Field(description="Query rows, when the file has queries.")
    retrieval: bool = Field(description="Whether job scorecards get retrieval figures.")
    source_model: str | None = None
    target_model: str | None = None
    bytes: int
    sha256: str
    created_at: int

    @classmethod
    def from_record(cls, record: DatasetRecord) -> DatasetOut:
        return cls(id=record.id, created_at=int(record.created_at), **record.info)


class DatasetList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DatasetOut]
    first_id: str | None
    last_id: str | None
    has_more: bool


class AlignRequest(PairsInput):
    """Body of ``POST /v1/align``."""

    model_config = ConfigDict(extra="forbid")

    folds: int = Field(
        default=5, ge=2, le=20, strict=True, description="Folds of the cross-validated R²."
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, strict=True, description="Seed of the folds.")


class AlignResponse(BaseModel):
    model_config = ConfigDict(extra="allow")

    object: Literal["alignment"] = "alignment"
    pairs: int
    linear_cka_score: float = Field(description="Linear CKA (Kornblith et al. 2019), 0..1.")
    unbiased_cka_score: float = Field(
        description="Linear CKA with the unbiased HSIC estimator (Song et al. 2012; Nguyen "
        "et al. 2021), -1..1; about 0 for unrelated sets at any n."
    )
    mutual_knn_score: float = Field(
        description="Mutual k-NN overlap, k = 10 (Huh et al. 2024), 0..1."
    )
    cknna_score: float = Field(
        description="CKNNA: unbiased CKA over mutual 10-NN pairs (Huh et al. 2024), -1..1."
    )
    cycle_knn_score: float = Field(
        description="Cycle 10-NN: share of items that a 10-NN step in the target space and "
        "one back in the source space can return to (Huh et al. 2024), 0..1."
    )
    svcca_score: float | None = Field(
        description="SVCCA: mean canonical correlation of the 10 leading singular directions "
        "of each side (Raghu et al. 2017), 0..1; null unless there are more pairs than the "
        "directions kept on both sides together (at most 20)."
    )
    pwcca_score: float | None = Field(
        description="Projection-weighted CCA of all directions (Morcos et al. 2018), 0..1; "
        "null unless there are more pairs than the two sides' dimensions together."
    )
    ridge_r2_score: float = Field(
        description="Cross-validated ridge R², the 'alignability' (1 best; ≤ 0 no better than "
        "the mean)."
    )
    k: int = Field(description="Neighbourhood size the k-NN scores used: min(10, pairs - 2).")
    distinct_pairs: int = Field(
        description="Distinct (source, target) rows; repeated rows inflate every score."
    )
    shuffled_baseline: dict[str, float | None] = Field(
        description="The same similarity scores with the target rows in a seeded random "
        "order: what unrelated sets of this size score. Few pairs, repeated rows and CCA near "
        "its pair threshold raise it; a score means something only well above it."
    )
