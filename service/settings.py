"""Service settings, read from environment variables with the prefix ``LEAD_``.

List settings (``LEAD_STITCHES``, ``LEAD_API_KEYS``) accept a JSON list
(``'["models/minilm-to-mpnet","org/name@abc123"]'``) or a comma-separated string
(``models/minilm-to-mpnet,org/name@abc123``).

Each API key is written ``KEY`` or ``KEY:SCOPE`` (:class:`ApiKey`): the scope ``translate``
allows reading (info, stitches and their files, the API documentation), translating and
alignment scores; ``admin`` allows everything, datasets, jobs and deleting stitches
included. A key without a scope is an ``admin`` key, as every key was before scopes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from lead._options import API_KEY
from lead.artifacts import BUNDLED_MODELS_DIR

__all__ = ["DEFAULT_MODELS_DIR", "SCOPES", "ApiKey", "Scope", "Settings"]

#: ``models/`` of the repository: the bundled stitches.
DEFAULT_MODELS_DIR = BUNDLED_MODELS_DIR

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,30}")


def _split_list(value: Any) -> Any:
    """A JSON list or a comma-separated string → list of stripped, non-empty strings."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json.loads(text)
    return [part.strip() for part in text.split(",") if part.strip()]


Scope = Literal["translate", "admin"]
#: The scopes of API keys, each granting what the ones before it grant.
SCOPES: tuple[Scope, ...] = ("translate", "admin")


class ApiKey(BaseModel):
    """One entry of ``LEAD_API_KEYS``: ``KEY`` (an ``admin`` key) or ``KEY:SCOPE``.

    The text after the last ``:`` must be a scope, so a key that itself contains ``:``
    is written ``KEY:admin``. Error messages never show the key.
    """

    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    secret: SecretStr
    scope: Scope = "admin"

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if not isinstance(value, str):
            return value
        text = value.strip()
        secret, colon, scope = text.rpartition(":")
        if not colon:
            secret, scope = text, "admin"
        elif scope not in SCOPES:
            raise ValueError(  # never quote the text: it may be part of the key
                "an API key is written KEY or KEY:SCOPE, but the text after the last ':' is "
                f"not a scope ({', '.join(SCOPES)}); a key that contains ':' is written "
                "KEY:admin"
            )
        if not secret.strip():
            raise ValueError("an API key is empty")
        if not API_KEY.fullmatch(secret.strip()):  # LeadClient refuses the others too
            raise ValueError("an API key must be printable ASCII without spaces")
        return {"secret": secret.strip(), "scope": scope}

    def get_secret_value(self) -> str:
        """The key itself (as :meth:`pydantic.SecretStr.get_secret_value`)."""
        return self.secret.get_secret_value()

    def grants(self, scope: str) -> bool:
        """Whether this key may act in ``scope`` (``admin`` includes ``translate``)."""
        return scope in SCOPES and SCOPES.index(scope) <= SCOPES.index(self.scope)


class Settings(BaseSettings):
    """Configuration of the translation service (environment variables ``LEAD_*``)."""

    # hide_input_in_errors: a refused LEAD_API_KEYS must not print the keys
    model_config = SettingsConfigDict(
        env_prefix="LEAD_",
        extra="ignore",
        frozen=True,
        env_ignore_empty=True,
        hide_input_in_errors=True,
    )

    stitches: Annotated[list[str] | None, NoDecode] = Field(
        default=None,
        description="Stitches to serve: local folders and Hub repo ids (`org/name@revision`). "
        "Default: every folder with a config.json under `models_dir`.",
    )
    models_dir: Path = Field(
        default=DEFAULT_MODELS_DIR, description="Folder searched when `stitches` is not set."
    )
    device: str = Field(
        default="auto",
        description="`auto` (cuda when available, else cpu), `cpu`, `cuda`, `cuda:N`.",
    )
    dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32", description="Dtype the stitches run in (inputs and outputs are float32)."
    )
    api_keys: Annotated[list[ApiKey], NoDecode] = Field(
        default_factory=list,
        description="When non-empty, every route except /healthz, /readyz, /metrics and the "
        "documentation (/docs, /redoc, /openapi.json) requires `Authorization: Bearer <key>`. "
        "Each entry is `KEY` (scope `admin`) or `KEY:SCOPE` with the scope `translate` or "
        "`admin`.",
    )
    max_vectors: int = Field(default=2048, ge=1, description="Vectors per translate request.")
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1, description="Request body bytes.")
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=8 * 1024,
        le=16 * 1024 * 1024,
        description="A request's line and headers (and a chunked body's trailers), in bytes: "
        "beyond it 431 `headers_too_large` and the connection closed, before the rest is read "
        "into memory (service.http_protocol). Needs uvicorn's `--http "
        "service.http_protocol:BoundedHttpToolsProtocol`, as scripts/serve.sh and the image "
        "pass it.",
    )
    header_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Time a request's line and headers may take to arrive (a connection's "
        "first request: from the connection's start; a later one: from its first byte, or "
        "from when the server finished the earlier answers): beyond it 408 `request_timeout` "
        "and the connection closed (a connection that sent nothing is just closed), so that "
        "clients trickling heads cannot hold connections (and the process's open files) for "
        "ever. Idle keep-alive connections between requests have LEAD_KEEP_ALIVE_S instead. "
        "Needs uvicorn's `--http service.http_protocol:BoundedHttpToolsProtocol`, as "
        "scripts/serve.sh and the image pass it.",
    )
    max_vectors_arrow: int = Field(
        default=65_536,
        ge=1,
        description="Vectors per translate request whose body is an Arrow IPC stream "
        "(`application/vnd.apache.arrow.stream`: raw float32, no JSON to parse).",
    )
    max_body_bytes_arrow: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        description="Request body bytes of a translate request whose body is an Arrow IPC "
        "stream (instead of `max_body_bytes`): 65,536 vectors of 768 float32 values are 192 MiB.",
    )
    max_translate_bytes_in_flight: int = Field(
        default=128 * 1024 * 1024,
        ge=1,
        description="Translate work admitted at once, counted in request body bytes (being "
        "decoded, waiting for or in a forward); a request beyond it gets 429 with Retry-After. "
        "An eighth of it is kept for small requests (bodies up to 64 KiB: query time), the "
        "rest for bulk ones, so that neither kind starves the other; in each share a request "
        "is always admitted when none is in flight. Bytes rather than requests: many "
        "single-vector callers (a few KB each) are served together, a few bulk ones bound "
        "the memory.",
    )
    micro_batching: bool = Field(
        default=True,
        description="Gather concurrent small translate requests for the same route into one "
        "forward (answers are bit-identical either way; a lone request waits for nothing).",
    )
    batch_max_vectors: int = Field(
        default=256,
        ge=1,
        description="The most vectors in one micro-batched forward; requests with more "
        "vectors run alone.",
    )
    batch_wait_ms: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="The longest a micro-batch waits for translate requests already on their "
        "way (milliseconds); 0 batches only the requests already waiting.",
    )
    busy_poll_us: int = Field(
        default=300,
        ge=0,
        le=10_000,
        description="After its last answer, the server polls its sockets this many "
        "microseconds before it sleeps (service.event_loop): a client's next request is read at "
        "once instead of waking a sleeping (virtual) CPU, ~0.1-0.3 ms. Costs at most that much "
        "CPU after each burst of traffic; 0 turns it off (uvloop's loop). Needs uvicorn's "
        "`--loop service.event_loop:new_event_loop`, as scripts/serve.sh and the image pass it.",
    )
    tune_malloc: bool = Field(
        default=True,
        description="Set glibc's malloc thresholds at start-up (mmap 32 MiB, trim 128 MiB) so "
        "that the large buffers of bulk requests are reused from the heap instead of mapped "
        "and page-faulted afresh each time: +15-25 % vectors/s on Arrow batches of 8,192 "
        "(service/allocator.py). The process keeps up to ~128 MiB more after a burst. No "
        "effect outside glibc.",
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Time a request body may take to arrive, beyond it 408: the whole body of "
        "a JSON request; each piece of a dataset upload (uploads are large, so the wait between "
        "pieces is limited instead). Stalled clients hold no translate slot meanwhile. Also the "
        "time a client may take to read each MiB of a bulk translate answer (which holds its "
        "share of the byte budget until read), beyond which its connection is closed.",
    )
    retry_after_seconds: int = Field(default=1, ge=1, description="Retry-After on 429.")
    torch_threads: int = Field(
        default=1,
        ge=1,
        description="torch intra-op threads (torch.set_num_threads, set at start-up). Requests "
        "run concurrently, one forward per worker thread, so 1 avoids oversubscribing the cores; "
        "raise it for lower latency of single large batches on an idle many-core CPU (a stitch's "
        "dense products run on one thread whatever it is: batch-invariant answers).",
    )
    workers: int = Field(
        default=1,
        ge=1,
        description="Server processes (`scripts/serve.sh` passes it to `uvicorn --workers`), "
        "each with its own copy of the stitches and its own micro-batcher; they share the job "
        "store, claim jobs from it and watch the stitch store like replicas do; `/metrics` sums "
        "them (`PROMETHEUS_MULTIPROC_DIR`, set by `scripts/serve.sh`). On 2 cores shared with "
        "the clients, 2 workers served 1.2x (single vectors) to 1.4x (batches of 32) the "
        "requests of 1 (bench/workers.py).",
    )
    keep_alive_s: int = Field(
        default=75,
        ge=1,
        description="Seconds an idle keep-alive connection stays open (`scripts/serve.sh` "
        "passes it to `uvicorn --timeout-keep-alive`, whose own default is 5). Keep it above "
        "the idle timeout of the load balancer or client pool in front (60 s is common): a "
        "server that closes a connection as a client reuses it drops that request unanswered "
        "('Server disconnected without sending a response'), as 3 of 5 runs of 600 mixed "
        "requests from 30 clients did here at 5 s, none of 7 at 75 s.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Level of the `lead` loggers."
    )
    load_in_background: bool = Field(
        default=True,
        description="Load stitches after start-up (readiness via /readyz) instead of before it.",
    )

    # Training jobs, datasets and alignment (service/jobs).
    enable_jobs: bool = Field(
        default=True,
        description="Run training jobs here (false on translation-only replicas: the jobs, "
        "datasets and align routes then answer 503). A translation-only replica that shares "
        "a job store (`database_url`, or a `data_dir` holding one) still serves and follows "
        "the stitches the other replicas train.",
    )
    data_dir: Path = Field(
        default=Path(".lead-data"),
        description="Job records (SQLite), uploaded datasets and trained stitches.",
    )
    job_workers: int = Field(
        default=1, ge=1, description="Training jobs run at once, each in its own process."
    )
    job_torch_threads: int = Field(
        default_factory=lambda: max(1, (os.cpu_count() or 2) - 1),
        ge=1,
        description="torch threads of a training process (default: all cores but one, which "
        "is left for translation).",
    )
    job_nice: int = Field(
        default=10, ge=0, le=19, description="CPU niceness added to training processes."
    )
    job_cancel_grace_seconds: float = Field(
        default=10.0, gt=0, description="Time a cancelled job has to stop before it is killed."
    )
    hf_token: SecretStr | None = Field(
        default=None, description="Hugging Face token for jobs with `push_to_hub`."
    )

    # Beyond one machine: shared state, distributed training, a shared stitch store.
    database_url: SecretStr | None = Field(
        default=None,
        description="Where job, dataset and stitch records live. Unset: the SQLite file "
        "`lead.sqlite3` under `data_dir` (one machine). `postgresql://user:password@host:port/db` "
        "(libpq query parameters such as `?host=/socket/dir` pass through): every replica shares "
        "one PostgreSQL database, uploaded datasets included, with versioned schema migrations.",
    )
    ray_address: str | None = Field(
        default=None,
        description="Where training jobs run. Unset: processes spawned by this server "
        "(`job_workers` of them). `auto` (the Ray cluster this machine belongs to), "
        "`host:port` or `ray://host:port`: each job is a Ray task, with the job's `resources`.",
    )
    stitch_store: str | None = Field(
        default=None,
        description="Where trained stitches are published for every replica. Unset: "
        "`data_dir/stitches`. A shared folder, an fsspec URL (`file://`, `s3://`, `gs://`; the "
        "matching fsspec package must be installed), or `hub://ORG` (one Hub model repo "
        "`ORG/<stitch_id>` per stitch, pushed with `hf_token`).",
    )
    stitch_poll_seconds: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="How often each replica looks for stitches published or deleted through "
        "another replica (and registers or drops them).",
    )
    job_lease_seconds: float = Field(
        default=15.0,
        ge=1,
        description="A running job's lease, renewed by the replica that runs it every third of "
        "it. A job whose lease ran out (its replica died) is retried or failed by any replica.",
    )
    job_max_attempts: int = Field(
        default=2,
        ge=1,
        le=10,
        description="Times a job is started at most: a job whose replica, worker or Ray node "
        "died is queued again until it has been started this many times, then `failed`. A "
        "graceful stop of its replica (SIGTERM: a deploy) queues it again without counting.",
    )
    max_dataset_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=1, description="Size of an uploaded dataset file."
    )
    max_dataset_rows: int = Field(default=2_000_000, ge=4, description="Pairs in a dataset.")
    max_dimension: int = Field(
        default=16_384,
        ge=1,
        description="Dimension of the vectors of a dataset, a job's or an align request's "
        "pairs (the widest embedding models have 4,096); a wider side would cost a job "
        "gigabytes before it failed.",
    )
    max_inline_pairs: int = Field(
        default=4096, ge=4, description="Pairs sent inline in a job or align request."
    )
    max_align_pairs: int = Field(
        default=20_000, ge=4, description="Pairs accepted by POST /v1/align."
    )
    max_concurrent_align: int = Field(
        default=1,
        ge=1,
        description="POST /v1/align requests computed at once (each holds n × n float64 "
        "matrices of up to `max_align_pairs` pairs, gigabytes at the default); beyond it 429 "
        "with Retry-After.",
    )

    @field_validator("stitches", mode="before")
    @classmethod
    def _parse_list(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: Any) -> Any:
        # an empty entry is refused, not dropped: "${KEY_1},${KEY_2}" with both variables
        # unset (",") turned authentication off
        if isinstance(value, str) and not value.strip().startswith("["):
            parts = [part.strip() for part in value.split(",")]
            empty = [i + 1 for i, part in enumerate(parts) if not part]
            if empty:
                raise ValueError(
                    f"entry {empty[0]} of {len(parts)} is empty; list keys as KEY or KEY:SCOPE "
                    "separated by commas (unset the variable to serve without keys)"
                )
            return parts
        keys = _split_list(value)
        if isinstance(value, str) and keys == []:
            # like "," above: a template that rendered no keys must not turn authentication off
            raise ValueError("the list is empty; unset the variable to serve without keys")
        return keys

    @field_validator("api_keys")
    @classmethod
    def _distinct_keys(cls, value: list[ApiKey]) -> list[ApiKey]:
        secrets = [key.get_secret_value() for key in value]
        for i, secret in enumerate(secrets):
            if secret in secrets[:i]:
                raise ValueError(
                    f"API keys {secrets.index(secret) + 1} and {i + 1} are the same key; "
                    "list each key once, with one scope"
                )
        return value

    @field_validator("database_url")
    @classmethod
    def _postgresql_only(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        url = value.get_secret_value().strip()
        if not url.startswith(("postgresql://", "postgres://")):
            scheme = url.partition("://")[0] if "://" in url else ""
            named = f"a {scheme}:// URL" if _SCHEME.fullmatch(scheme) else "not a URL"
            raise ValueError(  # never quote the value: it holds the password
                f"database_url must be a PostgreSQL URL, postgresql://user:password@host:port/db "
                f"(got {named}); unset it to keep the records in SQLite under data_dir"
            )
        return SecretStr(url)

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        value = value.strip().lower()
        if not _DEVICE.match(value):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {value!r}")
        return value
