"""Request and response models of the HTTP API (they are its OpenAPI documentation).

The translate route decodes its body with msgspec (:mod:`service.translate_body`, whose
Struct a test keeps in step with :class:`TranslateOptions`); :class:`TranslateRequest`
documents the whole body in the schema, and :class:`TranslateOptions` names the problems
of a body that the typed decoder refused. :func:`stitch_naming_error` is the rule both
apply to the fields that name the stitch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, model_validator

__all__ = [
    "EmbeddingOut",
    "ErrorBody",
    "ErrorEnvelope",
    "HealthOut",
    "InfoOut",
    "JobsInfoOut",
    "LimitsOut",
    "LoadFailureOut",
    "ModelSide",
    "ReadinessOut",
    "StitchDeleted",
    "StitchList",
    "StitchOut",
    "StitchSummary",
    "StitchUsed",
    "TranslateOptions",
    "TranslateRequest",
    "TranslateResponse",
    "Usage",
    "error_responses",
    "stitch_naming_error",
]


def stitch_naming_error(
    stitch: str | None, source_model: str | None, target_model: str | None, direction: str
) -> str | None:
    """Why a translate body's fields do not name one stitch (or chain) one way, or None.

    The rule of :class:`TranslateOptions` and of the service's typed decoder
    (:class:`service.translate_body.TranslateFields`) alike.
    """
    named = {"stitch": stitch, "source_model": source_model, "target_model": target_model}
    for name, value in named.items():
        if value == "":
            return f"`{name}` is empty: give a stitch id, or the models' names"
    by_models = source_model is not None or target_model is not None
    if direction == "inverse" and stitch is None:
        return "direction 'inverse' needs `stitch` (an invertible stitch's id)"
    if stitch is not None and by_models:
        return "give either `stitch` or `source_model` + `target_model`, not both"
    if stitch is None and (source_model is None or target_model is None):
        return "give `stitch`, or both `source_model` and `target_model`"
    if source_model is not None and source_model == target_model:
        return "source_model and target_model must differ (as for jobs)"
    return None


class TranslateOptions(BaseModel):
    """Everything in a translate request except ``input``."""

    model_config = ConfigDict(extra="forbid")

    stitch: str | None = Field(
        default=None,
        description="Stitch id (`minilm-to-mpnet`, or `org/name@revision` for a Hub stitch). "
        "Give either this or `source_model` + `target_model`.",
    )
    source_model: str | None = Field(default=None, description="Model that made the input.")
    target_model: str | None = Field(default=None, description="Model whose space to map to.")
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="Output encoding: float arrays, or base64 of little-endian float32.",
    )
    # strict: JSON true / false only (not "yes", 1 or "true")
    normalize: bool = Field(
        default=False,
        strict=True,
        description="L2-normalise the output vectors. Stitches whose `normalize_output` is "
        "true (every stitch fitted on unit-length target vectors, the bundled ones included) "
        "answer with unit vectors anyway.",
    )
    strict: bool = Field(
        default=False,
        strict=True,
        description="Refuse to translate through a chain of stitches when no direct one exists.",
    )
    direction: Literal["forward", "inverse"] = Field(
        default="forward",
        description="`inverse` runs an invertible stitch backwards: `input` holds vectors of "
        "the stitch's target model, and the answer is in its source model's space. Needs "
        "`stitch`; a stitch that is not invertible gets 422 `not_invertible`.",
    )

    return_confidence: bool = Field(
        default=False,
        strict=True,
        description="Add `confidence` and `out_of_distribution` to each `data[i]`: the "
        "stitch's calibrated estimate (in [0, 1]) of the cosine between the translation and "
        "the target model's own vector, and whether the input lies far outside what the "
        "stitch was fitted on. Forward direction only; a stitch fitted without held-out "
        "pairs has no confidence head: 422 `no_confidence`.",
    )

    @model_validator(mode="after")
    def _one_way_to_name_the_stitch(self) -> TranslateOptions:
        problem = stitch_naming_error(
            self.stitch, self.source_model, self.target_model, self.direction
        )
        if problem is not None:
            raise ValueError(problem)
        return self


class TranslateRequest(TranslateOptions):
    """Body of ``POST /v1/translate``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"stitch": "minilm-to-mpnet", "input": [[0.012, -0.034, 0.051, 0.007]]},
                {
                    "source_model": "sentence-transformers/all-MiniLM-L6-v2",
                    "target_model": "sentence-transformers/all-mpnet-base-v2",
                    "input": ["AACAPwAAAEAAAEBAAACAQA=="],
                    "encoding_format": "base64",
                },
            ]
        },
    )

    # StrictFloat: numbers only (not true / false or "0.1"), as the service decodes them
    input: (
        Annotated[list[list[StrictFloat]], Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1)]
    ) = Field(
        description="Vectors of the source model, `d_src` values each: float arrays, or base64 "
        "strings of `4 * d_src` little-endian float32 bytes. `data[i]` answers `input[i]`.",
    )


class EmbeddingOut(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(
        description="The translated vector: floats, or base64 of little-endian float32."
    )
    confidence: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description='With `"return_confidence": true` only: the stitch\'s calibrated estimate '
        "of the cosine between this translation and the target model's own vector of the same "
        "text (higher = more trustworthy); 0 when `out_of_distribution`.",
    )
    out_of_distribution: bool | None = Field(
        default=None,
        description='With `"return_confidence": true` only: the input lies far outside the '
        "inputs the stitch was fitted on; its translation is a guess (confidence 0).",
    )


class StitchUsed(BaseModel):
    id: str | None = Field(description="The stitch id; null when a chain was used.")
    direction: Literal["forward", "inverse"] = Field(
        default="forward", description="`inverse` when an invertible stitch ran backwards."
    )
    chain: list[str] = Field(description="Stitch ids applied in order (one for a direct stitch).")
    models: list[str] = Field(description="Models along the way, source first, target last.")


class Usage(BaseModel):
    vectors: int


class TranslateResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "object": "list",
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.021, -0.013]}],
                    "model": "sentence-transformers/all-mpnet-base-v2",
                    "stitch": {
                        "id": "minilm-to-mpnet",
                        "chain": ["minilm-to-mpnet"],
                        "models": [
                            "sentence-transformers/all-MiniLM-L6-v2",
                            "sentence-transformers/all-mpnet-base-v2",
                        ],
                    },
                    "input_normalized": True,
                    "rescaled_inputs": 0,
                    "usage": {"vectors": 1},
                }
            ]
        }
    )

    object: Literal["list"] = "list"
    data: list[EmbeddingOut]
    model: str = Field(description="The model whose space the answer is in.")
    stitch: StitchUsed
    input_normalized: bool = Field(
        description="Whether the input vectors were scaled to unit length before translation: "
        "true when the (first) stitch was fitted on unit-length vectors of the input's model "
        "(its `source.normalized`, or `target.normalized` for `inverse`)."
    )
    rescaled_inputs: int = Field(
        ge=0,
        description="How many input vectors were not of unit length (L2 norm off 1 by more "
        "than 1e-3) and were rescaled to unit length; always 0 when `input_normalized` is "
        "false. Nonzero means the vectors were scaled somewhere on their way (e.g. "
        "unnormalised model output) and now answer as their unit-length versions.",
    )
    usage: Usage


class ModelSide(BaseModel):
    model: str
    dim: int
    normalized: bool
    revision: str | None = None


class StitchSummary(BaseModel):
    """A stitch as ``GET /v1/stitches`` lists it: what it maps and how well, without the
    bulky parts (the fit's data and held-out ids, the scorecard's baselines) that
    ``GET /v1/stitches/{id}`` shows."""

    object: Literal["stitch"] = "stitch"
    id: str
    source: ModelSide
    target: ModelSide
    architecture: str
    invertible: bool = Field(
        description='Runs backwards too: `"direction": "inverse"` on POST /v1/translate.'
    )
    normalize_output: bool
    confidence: dict[str, Any] | None = Field(
        default=None,
        description='How far `"return_confidence": true` can be trusted on this stitch: the '
        "Spearman correlation between its confidence and the true cosine on held-out pairs "
        "(`in_domain_spearman_score`; `out_of_domain_spearman_score` on general text kept out "
        "of training, when the fit held some out), and how the head was calibrated; null when "
        "the stitch has no confidence head (422 `no_confidence`; why: `fit.no_confidence` in "
        "GET /v1/stitches/{id}, when the fit recorded it).",
    )
    origin: Literal["local", "hub", "job"]
    revision: str | None = Field(description="Pinned Hub revision, when the stitch came from one.")
    commit: str | None = Field(
        default=None,
        description="The Hub commit a Hub stitch's files came from, pinned or not (a stitch "
        "served as `org/name` follows the branch: this says which commit it loaded); null "
        "for a local or job-trained stitch.",
    )
    fit: dict[str, Any] = Field(
        description="`method`, `pairs` and `seed` of the fit (when recorded); the rest (data "
        "files, held-out split with its ids, options) in GET /v1/stitches/{id}."
    )
    scorecard: dict[str, Any] | None = Field(
        description="The held-out scorecard's `pairs` and core metrics (`r2_score`, "
        "`mean_cosine_similarity`, ...); retrieval, baselines and round trip in "
        "GET /v1/stitches/{id}."
    )


class StitchOut(StitchSummary):
    """One stitch in full, as ``GET /v1/stitches/{id}`` shows it."""

    fit: dict[str, Any] = Field(description="How the stitch was fitted.")
    scorecard: dict[str, Any] | None = Field(description="Held-out scorecard (lead.Scorecard).")


class StitchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[StitchSummary]


class StitchDeleted(BaseModel):
    object: Literal["stitch.deleted"] = "stitch.deleted"
    id: str
    deleted: Literal[True] = True
    job: str | None = Field(
        description="The job that trained the stitch (its `result.stitch_deleted_at` is now "
        "set), or null for a saved stitch that no job record names."
    )


class LimitsOut(BaseModel):
    max_vectors_per_request: int = Field(description="Vectors in one translate request.")
    max_body_bytes: int = Field(description="Bytes of a request body (not a dataset upload).")
    max_vectors_arrow: int = Field(
        description="Vectors in one translate request whose body is an Arrow IPC stream."
    )
    max_body_bytes_arrow: int = Field(
        description="Bytes of a translate request body that is an Arrow IPC stream."
    )
    max_translate_bytes_in_flight: int = Field(
        description="Translate request body bytes worked on at once (beyond it 429)."
    )
    max_concurrent_align: int = Field(description="Align requests computed at once.")
    max_dataset_bytes: int = Field(description="Bytes of an uploaded dataset file.")
    max_dataset_rows: int = Field(description="Pairs in an uploaded dataset.")
    max_inline_pairs: int = Field(description="Pairs sent inline in a job or align request.")
    max_dimension: int = Field(
        description="Dimension of the vectors of a dataset, a job's or an align request's pairs."
    )
    max_align_pairs: int = Field(
        description="Pairs that POST /v1/align scores (a seeded subset of a larger dataset)."
    )


class JobsInfoOut(BaseModel):
    enabled: bool = Field(
        description="Whether this server runs training jobs, dataset uploads and POST "
        "/v1/align (LEAD_ENABLE_JOBS); when false those routes answer 503."
    )
    workers: int = Field(description="Training jobs of this server run at once.")
    engine: Literal["process", "ray"] = Field(
        description="Where jobs train: `process` (spawned by this server) or `ray` "
        "(LEAD_RAY_ADDRESS)."
    )
    database: Literal["sqlite", "postgresql"] = Field(
        description="Where job and dataset records live: `sqlite` (this machine) or "
        "`postgresql` (LEAD_DATABASE_URL, shared by every replica)."
    )
    shared_stitch_store: bool = Field(
        description="Whether trained stitches are published to LEAD_STITCH_STORE (for every "
        "replica) rather than to this server's LEAD_DATA_DIR."
    )


class InfoOut(BaseModel):
    object: Literal["info"] = "info"
    name: str = "lead"
    version: str
    device: str
    dtype: str
    limits: LimitsOut
    jobs: JobsInfoOut
    encodings: list[str] = Field(
        description="The `encoding_format`s of a JSON translate request (input and answer)."
    )
    media_types: list[str] = Field(
        description="The bodies `POST /v1/translate` takes, each answered in its own kind "
        "(an Arrow IPC stream with one)."
    )
    auth: bool = Field(description="Whether API keys are required.")
    stitches: int = Field(description="Stitches served now.")


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class LoadFailureOut(BaseModel):
    id: str
    error: str
    message: str


class ReadinessOut(BaseModel):
    status: Literal["ready", "loading", "failed"]
    ready: list[str]
    pending: list[str]
    failed: list[LoadFailureOut]
    retrying: list[LoadFailureOut] = Field(
        default_factory=list,
        description="Stitches trained by a job whose files this server could not load on "
        "its last try (why, in `error` and `message`). They are tried again, requests naming "
        "them get 503 `not_ready` meanwhile, and they do not make the server unready: one "
        "job's broken files do not take a replica out of service.",
    )


class ErrorBody(BaseModel):
    type: str = Field(examples=["invalid_request_error"])
    code: str = Field(examples=["shape_mismatch"])
    message: str = Field(examples=["input[3] has 768 dimensions, but the stitch expects 384"])
    param: str | None = Field(default=None, examples=["input[3]"])
    request_id: str | None = Field(default=None, examples=["5f0c6a3b2d8e4f1aa0b1c2d3e4f5a6b7"])


class ErrorEnvelope(BaseModel):
    error: ErrorBody


_ERROR_DESCRIPTIONS = {
    400: "Malformed request: invalid JSON, bad base64, bytes that are not float32, empty input.",
    401: "Missing or wrong API key (`Authorization: Bearer <key>`).",
    403: "The API key lacks the scope this route needs (`translate`: reading, translating "
    "and alignment; `admin`: datasets, jobs and deleting stitches).",
    404: "Unknown stitch, model or route.",
    408: "The request body did not arrive in time (LEAD_BODY_TIMEOUT_SECONDS).",
    413: "Request body over the byte limit.",
    415: "Content-Type is not application/json.",
    422: "Dimension mismatch, ragged batch, NaN or infinity, an all-zero vector for a stitch "
    "fitted on unit-length vectors (`zero_vector`), too many vectors, invalid fields.",
    429: "Too many requests in flight; see Retry-After.",
    503: "Not ready: stitches still loading; see Retry-After.",
    507: "No room left to write on the server (its disk or database is full); nothing was kept.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries with the error envelope for ``statuses``."""
    return {
        status: {"model": ErrorEnvelope, "description": _ERROR_DESCRIPTIONS[status]}
        for status in statuses
    }
