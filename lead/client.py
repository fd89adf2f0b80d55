"""A small HTTP client of a LEAD server: datasets, training jobs, stitches, translation,
alignment.

::

    from lead.client import LeadClient

    with LeadClient("http://127.0.0.1:8000") as lead:
        dataset = lead.upload_dataset("pairs.safetensors")
        job = lead.submit_job("minilm", "e5", dataset=dataset["id"], method="ridge")
        job = lead.wait_job(job["id"])
        vectors = lead.translate(queries, stitch=job["result"]["stitch_id"])
        lead.download_stitch(job["result"]["stitch_id"], "my-stitch")  # lead.load_stitch(...)

The server URL defaults to ``LEAD_SERVER_URL`` and the API key to ``LEAD_API_KEY``. An
error response raises the :class:`~lead.errors.LeadError` subclass matching its ``code``
(with ``status_code``, ``code`` and ``request_id`` attributes), so callers handle remote
and local errors alike.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import email.utils
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx
import numpy as np

from lead import _arrow
from lead import errors as le
from lead._options import API_KEY, check_float_option, check_int_option
from lead.artifacts import ARTIFACT_FILES, is_occupied, is_replaceable, replace_folder

__all__ = ["DEFAULT_SERVER_URL", "TERMINAL_STATUSES", "LeadClient", "encode_base64"]

DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
#: Job statuses after which nothing changes any more.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})

_SIMPLE_ERRORS: dict[str, type[le.LeadError]] = {
    "decode_error": le.DecodeError,
    "shape_mismatch": le.ShapeMismatchError,
    "non_finite_input": le.NonFiniteError,
    "ill_conditioned_input": le.IllConditionedError,
    "unsupported_media_type": le.UnsupportedMediaTypeError,
    "stitch_format_error": le.StitchFormatError,
    "stitch_not_found": le.StitchNotFoundError,
    "job_not_found": le.JobNotFoundError,
    "dataset_not_found": le.DatasetNotFoundError,
    "fit_failed": le.FitError,
    "non_finite_output": le.NonFiniteOutputError,
    "invalid_api_key": le.AuthenticationError,
    "insufficient_scope": le.PermissionDeniedError,
    "idempotency_key_reused": le.IdempotencyKeyReusedError,
    "conflict": le.ConflictError,
    "hub_error": le.HubError,
    "feature_disabled": le.FeatureDisabledError,
    "model_mismatch": le.ModelMismatchError,
    "no_confidence": le.NoConfidenceError,
}
_BY_STATUS: dict[int, type[le.LeadError]] = {
    400: le.InvalidInputError,
    401: le.AuthenticationError,
    403: le.PermissionDeniedError,
    404: le.NotFoundError,
    409: le.ConflictError,
    415: le.UnsupportedMediaTypeError,
    422: le.InvalidInputError,
}


def _float32_rows(vectors: Any) -> np.ndarray:
    """``vectors`` as a C-contiguous little-endian float32 array of shape (n, d)."""
    try:
        given = np.asarray(vectors)
        if given.dtype.kind not in "fiu":  # complex lost its imaginary part, with a warning
            raise TypeError(f"{given.dtype} values are not real numbers")
        rows = np.ascontiguousarray(given, dtype="<f4")
    except (ValueError, TypeError) as error:  # strings, ragged lists
        raise le.InvalidInputError(
            f"vectors must be a 2-D array of numbers (n, d): {str(error)[:200]}", param="input"
        ) from None
    if rows.ndim != 2:
        raise le.ShapeMismatchError(
            f"expected a 2-D array (n, d), got shape {rows.shape}",
            expected="(n, d)",
            got=rows.shape,
        )
    return rows


def encode_base64(vectors: Any) -> list[str]:
    """Rows of ``vectors`` (n, d) as base64 strings of little-endian float32, one per row."""
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in _float32_rows(vectors)]


def _decode_base64(items: list[str]) -> np.ndarray:
    """Base64 rows of little-endian float32 as (n, d) float32.

    Raises
    ------
    ValueError
        Invalid base64 (``binascii.Error``), rows of other lengths, or empty rows.
    """
    rows = [np.frombuffer(base64.b64decode(s, validate=True), dtype="<f4") for s in items]
    if rows and not rows[0].size:
        raise ValueError("an empty vector")
    return np.stack(rows).astype(np.float32)


def _json_body(body: dict[str, Any]) -> bytes:
    """``body`` as strict JSON (RFC 8259: no NaN or infinity).

    Raises
    ------
    InvalidInputError
        Naming the first field that holds NaN, an infinity or a value JSON cannot hold.
    """
    try:
        return json.dumps(body, allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError):
        pass
    for key, value in body.items():
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise le.InvalidInputError(
                f"{key}: NaN and infinities cannot be sent (JSON has no such numbers)", param=key
            ) from None
        except (TypeError, RecursionError) as error:
            raise le.InvalidInputError(
                f"{key}: cannot be sent as JSON ({error})", param=key
            ) from None
    raise le.InvalidInputError("the request cannot be sent as JSON")  # not reached


def _check_header(value: str, name: str, param: str) -> str:
    """A header value the server takes: 1-255 printable ASCII characters, no spaces."""
    if not isinstance(value, str) or len(value) > 255 or not API_KEY.fullmatch(value):
        raise le.InvalidInputError(
            f"{name} must be 1 to 255 printable ASCII characters without spaces, got {value!r:.80}",
            param=param,
        )
    return value


def _check_server_url(url: Any) -> str:
    """An http(s) URL with a host, a port in range, and no query or fragment.

    Raises
    ------
    InvalidInputError
        Naming what is wrong with it.
    """
    if not isinstance(url, str):
        raise le.InvalidInputError(
            f"the server URL must be a string, got {type(url).__name__}", param="server"
        )
    problem = None
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        problem = str(error)
    else:
        if parsed.scheme not in ("http", "https"):  # httpx: "unsupported protocol"
            problem = "it must be an http:// or https:// URL"
        elif not parsed.host:
            problem = "it has no host"
        elif parsed.port is not None and not 0 < parsed.port < 65536:
            problem = f"port {parsed.port} is not in 1-65535"
        elif parsed.query or parsed.fragment:
            problem = "a query or fragment would be lost from every path; drop it"
    if problem is not None:
        raise le.InvalidInputError(f"the server URL {url!r:.200}: {problem}", param="server")
    return url


def _retry_after(value: str | None) -> int:
    """Whole seconds to wait from a ``Retry-After`` header: a number of seconds or an HTTP
    date (RFC 9110, section 10.2.3); 1 when it is missing or neither."""
    text = (value or "").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return 1
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        seconds = (when - datetime.datetime.now(datetime.UTC)).total_seconds()
    return math.ceil(min(max(0.0, seconds), 86400.0)) if math.isfinite(seconds) else 1


def _not_lead_message(where: object, detail: str, request: str = "") -> str:
    """What to say of an answer no LEAD server sends (a proxy, another server)."""
    return f"{where} did not answer{request} as a LEAD server: {detail}"[:400]


def _body_text(response: httpx.Response) -> str:
    """One line of a response's body, for a message."""
    return " ".join(response.text.split())[:200] or "(no body)"


def _not_lead(response: httpx.Response, detail: str) -> le.LeadError:
    """A successful answer that is not what a LEAD server sends (a proxy, another server)."""
    message = _not_lead_message(response.request.url.copy_with(query=None), detail)
    return le.LeadError(message, param="server")


def _error_from(response: httpx.Response) -> le.LeadError:
    """The LeadError an error response stands for."""
    try:
        body = response.json()["error"]
        code, message, param = str(body.get("code")), str(body["message"]), body.get("param")
        request_id = body.get("request_id")
    except (ValueError, KeyError, TypeError):
        # not LEAD's error envelope (a proxy, another server): one line of its body
        code, param, request_id = "http_error", None, None
        url = response.request.url.copy_with(query=None)
        message = _not_lead_message(url, _body_text(response))
    status = response.status_code
    retry_after = _retry_after(response.headers.get("retry-after"))
    exc: le.LeadError
    if code in _SIMPLE_ERRORS:
        exc = _SIMPLE_ERRORS[code](message, param=param)
    elif code == "zero_vector":
        index = re.fullmatch(r".*\[(\d+)\]", param or "")
        exc = le.ZeroVectorError(message, row=int(index[1]) if index else -1, param=param)
    elif code == "too_few_pairs":
        exc = le.TooFewPairsError(message, minimum=0, got=0, param=param)
    elif status == 413:
        exc = le.PayloadTooLargeError(message, limit=0, got=0, param=param)
    elif code == "limit_exceeded":
        exc = le.LimitExceededError(message, limit=0, got=0, param=param)
    elif status == 429:
        exc = le.OverloadedError(message, retry_after=retry_after)
    elif status == 503:
        exc = le.NotReadyError(message, retry_after=retry_after)
    else:
        exc = _BY_STATUS.get(status, le.LeadError)(f"HTTP {status}: {message}", param=param)
    exc.status_code = status  # type: ignore[attr-defined]
    exc.code = code  # type: ignore[attr-defined]
    exc.request_id = request_id  # type: ignore[attr-defined]
    return exc


#: Translated rows, and with ``return_confidence`` their confidences and out-of-distribution
#: flags (else None).
_Scored = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]


def _naming(
    stitch: str | None, source_model: str | None, target_model: str | None
) -> dict[str, str]:
    """The stitch by id, else the models (the server names what is missing).

    Raises
    ------
    InvalidInputError
        Both a stitch and a model: the models were dropped without a word (the server
        refuses the same request).
    """
    models = {"source_model": source_model, "target_model": target_model}
    if stitch is not None and (source_model is not None or target_model is not None):
        raise le.InvalidInputError(
            "give either stitch or source_model + target_model, not both", param="stitch"
        )
    naming = {"stitch": stitch} if stitch is not None else models
    return {key: value for key, value in naming.items() if value is not None}


def _shifted(exc: le.LeadError, start: int) -> le.LeadError:
    """``exc`` of a request that held the vectors from ``start`` on, naming the caller's
    row (``input[i]`` becomes ``input[start + i]``)."""
    match = re.fullmatch(r"input\[(\d+)\]", exc.param or "")
    if match and start:
        row = start + int(match[1])
        exc.param = f"input[{row}]"
        exc.message = exc.message.replace(f"input[{match[1]}]", f"input[{row}]")
        exc.args = (exc.message, *exc.args[1:])
        if hasattr(exc, "row"):
            exc.row = row
    return exc


def _path_part(value: str, safe: str = "") -> str:
    """``value`` as it goes into a URL path: percent-encoded (``/`` and ``@`` kept only
    where ``safe`` says: stitch ids hold them), and a ``.`` or ``..`` segment encoded too,
    which a URL would otherwise resolve (``delete_dataset("../stitches/x")`` deleted
    stitch ``x``)."""
    if not isinstance(value, str):
        raise le.InvalidInputError(
            f"an id must be a string, got {type(value).__name__}", param="id"
        )
    if not value.strip("/"):  # the collection's own URL (or a redirect to it) otherwise
        raise le.InvalidInputError(f"an id cannot be empty, got {value!r}", param="id")
    parts = quote(value, safe=safe).split("/")
    return "/".join(p.replace(".", "%2E") if p in (".", "..") else p for p in parts)


class LeadClient:
    """Talk to a LEAD server over HTTP.

    Parameters
    ----------
    base_url : str, optional
        Server URL; default ``LEAD_SERVER_URL``, else ``http://127.0.0.1:8000``.
    api_key : str, optional
        Sent as ``Authorization: Bearer``; default ``LEAD_API_KEY``.
    timeout : float or None, default 120
        Seconds per request; None waits for ever.
    http : httpx.Client, optional
        A ready client to use instead (its base URL is used; e.g. a test client).

    Raises
    ------
    InvalidInputError
        A server URL that is not an http:// or https:// URL with a host (a port in
        1-65535, no query or fragment), a timeout that is not a positive number, or an API
        key that is not a string of printable ASCII without spaces.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | None = 120.0,
        http: httpx.Client | None = None,
    ) -> None:
        url = base_url or os.environ.get("LEAD_SERVER_URL") or DEFAULT_SERVER_URL
        if http is None:
            _check_server_url(url)
        if timeout is not None:  # None: no timeout (httpx's meaning)
            timeout = check_float_option(timeout, "timeout", minimum=0.0, inclusive=False)
        key = api_key if api_key is not None else os.environ.get("LEAD_API_KEY")
        if key is not None and not isinstance(key, str):
            raise le.InvalidInputError(
                f"the API key must be a string, got {type(key).__name__}", param="api_key"
            )
        if key and not API_KEY.fullmatch(key):  # httpx raised UnicodeEncodeError, or sent it
            raise le.InvalidInputError(
                "the API key must be printable ASCII without spaces (as LEAD_API_KEYS holds it)",
                param="api_key",
            )
        self._owns_http = http is None
        self.http = http if http is not None else httpx.Client(base_url=url, timeout=timeout)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._limits: dict[str, Any] | None = None  # GET /v1/info's, read when first needed

    def close(self) -> None:
        """Close the connection pool (when this client created it)."""
        if self._owns_http:
            self.http.close()

    def __enter__(self) -> LeadClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """A server that cannot be reached as a :class:`~lead.errors.StoreError` naming its
        URL (httpx's own says ``[Errno 111] Connection refused``, without one)."""
        try:
            yield
        except httpx.HTTPError as error:  # the client raises no HTTPStatusError itself
            reason = str(error) or type(error).__name__
            raise le.StoreError(
                f"cannot reach the LEAD server at {self.http.base_url}: {reason}", param="server"
            ) from error

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request, sent once more on a fresh connection when the server closed the
        kept-alive connection as the request went out (httpx's "Server disconnected without
        sending a response": the race of every keep-alive timeout) and repeating it is
        harmless: a ``GET``, a translation, an alignment, a job with an ``Idempotency-Key``."""
        with self._reaching():
            try:
                return self.http.request(method, path, **kwargs)
            except httpx.RemoteProtocolError:
                repeatable = method == "GET" or path in ("/v1/translate", "/v1/align")
                if not repeatable and "Idempotency-Key" not in kwargs.get("headers", {}):
                    raise
                return self.http.request(method, path, **kwargs)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {**self._headers, **kwargs.pop("headers", {})}
        if "json" in kwargs:  # strict: httpx's ValueError / TypeError named no field
            kwargs["content"] = _json_body(kwargs.pop("json"))
            headers["Content-Type"] = "application/json"
        response = self._send(method, path, headers=headers, **kwargs)
        if response.is_error:
            raise _error_from(response)
        try:
            answer = response.json()
        except ValueError:
            raise _not_lead(response, _body_text(response)) from None
        if not isinstance(answer, dict):  # every LEAD answer is a JSON object
            raise _not_lead(response, f"a JSON {type(answer).__name__}, not an object")
        return answer

    # ---------------------------------------------------------------- datasets
    def upload_dataset(
        self, file: str | Path | bytes, *, name: str | None = None
    ) -> dict[str, Any]:
        """Upload a ``.safetensors`` dataset (tensors ``source``, ``target``; see the server).

        Parameters
        ----------
        file : str, Path or bytes
            The file, or its bytes.
        name : str, optional
            A label.

        Returns
        -------
        dict
            The dataset: ``id``, ``pairs``, ``source_dim``, ``target_dim``, ...
        """
        if name is not None and not isinstance(name, str):
            raise le.InvalidInputError(
                f"name must be a string, got {type(name).__name__}", param="name"
            )
        kwargs: dict[str, Any] = {
            "headers": {"Content-Type": "application/octet-stream"},
            "params": {"name": name} if name else None,
        }
        if isinstance(file, bytes):
            return dict(self._request("POST", "/v1/datasets", content=file, **kwargs))
        if not isinstance(file, str | Path):  # open(0) reads stdin: an int is no file here
            raise le.InvalidInputError(
                f"file must be a path or bytes, got {type(file).__name__}", param="file"
            )
        try:
            handle = open(file, "rb")  # noqa: SIM115 (closed below, after the request)
        except OSError as error:
            raise le.InvalidInputError(
                f"cannot read {file}: {error.strerror or error}", param="file"
            ) from None
        with handle:
            return dict(self._request("POST", "/v1/datasets", content=handle, **kwargs))

    def upload_pairs(
        self,
        source: Any,
        target: Any,
        *,
        name: str | None = None,
        source_model: str | None = None,
        target_model: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Upload arrays ``source`` (n, d_src) and ``target`` (n, d_tgt) as a dataset.

        ``source_model`` / ``target_model`` are recorded in the file's metadata: the server
        lists them with the dataset and refuses jobs that name other models. ``extra``
        arrays (``source_queries``, ``target_queries``) are stored beside them.
        """
        from safetensors.numpy import save

        tensors = {"source": source, "target": target, **extra}
        models = {"source_model": source_model, "target_model": target_model}
        for key, model in models.items():
            if model is not None and not isinstance(model, str):
                raise le.InvalidInputError(
                    f"{key} must be a string, got {type(model).__name__}", param=key
                )
        arrays = {}
        for key, value in tensors.items():
            try:
                arrays[key] = np.asarray(_float32_rows(value), dtype=np.float32)  # no copy
            except le.LeadError as error:
                raise type(error)(f"{key}: {error.message}", param=key) from None
        data = save(arrays, metadata={k: v for k, v in models.items() if v is not None} or None)
        return self.upload_dataset(data, name=name)

    def list_datasets(self, *, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        """A page of datasets, newest first (``data``, ``has_more``, ``last_id``)."""
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        return dict(self._request("GET", "/v1/datasets", params=params))

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/datasets/{_path_part(dataset_id)}"))

    def delete_dataset(self, dataset_id: str) -> dict[str, Any]:
        return dict(self._request("DELETE", f"/v1/datasets/{_path_part(dataset_id)}"))

    # -------------------------------------------------------------------- jobs
    def submit_job(
        self,
        source_model: str,
        target_model: str,
        *,
        dataset: str | None = None,
        source: Any = None,
        target: Any = None,
        method: str = "ridge",
        options: dict[str, Any] | None = None,
        holdout_fraction: float = 0.2,
        seed: int = 0,
        push_to_hub: str | None = None,
        stitch_id: str | None = None,
        allow_below_baseline: bool = False,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Start a training job from a dataset id or inline arrays (n, d_src) / (n, d_tgt).

        ``allow_below_baseline`` serves (and pushes) the stitch even when its held-out
        R² is at or below the mean-estimator baseline; otherwise such a job succeeds with
        ``result.served`` false and ``result.not_served_reason``.

        Returns
        -------
        dict
            The job (``status`` ``queued``); follow it with :meth:`wait_job`.
        """
        body: dict[str, Any] = {
            "source_model": source_model,
            "target_model": target_model,
            "method": method,
            "options": options or {},
            "holdout_fraction": holdout_fraction,
            "seed": seed,
        }
        if dataset is not None:
            body["dataset"] = dataset
        if source is not None or target is not None:
            body["source"], body["target"] = encode_base64(source), encode_base64(target)
        if push_to_hub is not None:
            body["push_to_hub"] = push_to_hub
        if stitch_id is not None:
            body["stitch_id"] = stitch_id
        if allow_below_baseline:
            body["allow_below_baseline"] = True
        headers = {}
        if idempotency_key is not None:
            key = _check_header(idempotency_key, "the Idempotency-Key", "idempotency_key")
            headers["Idempotency-Key"] = key
        return dict(self._request("POST", "/v1/jobs", json=body, headers=headers))

    def get_job(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/jobs/{_path_part(job_id)}"))

    def list_jobs(
        self, *, limit: int = 20, after: str | None = None, status: str | None = None
    ) -> dict[str, Any]:
        """A page of jobs, newest first (``data``, ``has_more``, ``last_id``)."""
        params: dict[str, Any] = {"limit": limit}
        params.update({k: v for k, v in (("after", after), ("status", status)) if v})
        return dict(self._request("GET", "/v1/jobs", params=params))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job (raises :class:`~lead.errors.ConflictError` when it has finished)."""
        return dict(self._request("POST", f"/v1/jobs/{_path_part(job_id)}/cancel"))

    def wait_job(
        self,
        job_id: str,
        *,
        poll_interval: float = 1.0,
        timeout: float | None = None,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll a job until it has finished; return it (whatever its final status).

        Raises
        ------
        TimeoutError
            If ``timeout`` seconds pass first.
        InvalidInputError
            A ``poll_interval`` or ``timeout`` that is not a finite number >= 0, or an
            ``on_update`` that cannot be called.
        """
        poll_interval = check_float_option(poll_interval, "poll_interval", minimum=0.0)
        if timeout is not None:
            timeout = check_float_option(timeout, "timeout", minimum=0.0)
        if on_update is not None and not callable(on_update):
            raise le.InvalidInputError("on_update must be callable", param="on_update")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if on_update is not None:
                on_update(job)
            if job["status"] in TERMINAL_STATUSES:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['status']} after {timeout} s")
            time.sleep(poll_interval)

    # ---------------------------------------------------------------- stitches
    def list_stitches(self) -> dict[str, Any]:
        """The stitches the server serves (``data``: id, models, dimensions, scorecard)."""
        return dict(self._request("GET", "/v1/stitches"))

    def get_stitch(self, stitch_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/stitches/{_path_part(stitch_id, safe='/@')}"))

    def delete_stitch(self, stitch_id: str) -> dict[str, Any]:
        """Delete a stitch trained by a job (needs an ``admin`` key).

        Raises
        ------
        ConflictError
            If the stitch is configured on the server (bundled, a local folder, the Hub).
        StitchNotFoundError
            If the server has no such stitch.
        """
        return dict(self._request("DELETE", f"/v1/stitches/{_path_part(stitch_id, safe='/@')}"))

    def download_stitch(self, stitch_id: str, folder: str | Path, *, force: bool = False) -> Path:
        """Download a served stitch's ``config.json``, ``model.safetensors`` and ``README.md``
        into ``folder``, which :func:`lead.load_stitch` then loads.

        Parameters
        ----------
        stitch_id : str
            Any served stitch (``minilm-to-mpnet``, ``org/name@revision``).
        folder : str or Path
            Created; if it exists it must be empty, or (with ``force``) hold a stitch. The
            files appear together (they are downloaded into a temporary folder beside it,
            which then replaces it).
        force : bool, default False
            Replace a stitch already in ``folder`` (a folder holding anything else is never
            replaced).

        Returns
        -------
        Path
            ``folder``.

        Raises
        ------
        InvalidInputError
            If ``folder`` exists and is not an empty folder (with ``force``: nor a stitch
            folder).
        StitchNotFoundError
            If the server has no such stitch, or no files for it.
        """
        if not isinstance(folder, str | Path):
            raise le.InvalidInputError(
                f"folder must be a path, got {type(folder).__name__}", param="folder"
            )
        folder = Path(folder)
        if is_occupied(folder) and not (force and is_replaceable(folder)):
            hint = (
                "; pass --force (force=True from Python) to replace the stitch in it"
                if not force
                else ""
            )
            raise le.InvalidInputError(
                f"refusing to download into {folder}: it exists and is not an empty folder"
                + (" or a stitch folder" if force else "")
                + hint,
                param="folder",
            )
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        try:
            for name in ARTIFACT_FILES:  # GET /v1/stitch-files/{name}
                self._download(f"/v1/stitch-files/{name}", {"stitch": stitch_id}, tmp / name)
            replace_folder(tmp, folder, overwrite=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return folder

    def _download(self, path: str, params: dict[str, str], target: Path) -> None:
        with (
            self._reaching(),
            self.http.stream("GET", path, params=params, headers=self._headers) as response,
        ):
            if response.is_error:
                response.read()
                raise _error_from(response)
            with target.open("wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)

    # -------------------------------------------------------- translate, align
    def translate(
        self,
        vectors: Any,
        *,
        stitch: str | None = None,
        source_model: str | None = None,
        target_model: str | None = None,
        normalize: bool = False,
        format: Literal["json", "arrow"] = "json",
        batch_size: int | None = None,
        retries: int = 5,
    ) -> np.ndarray:
        """Translate ``vectors`` (n, d_src) with a stitch id or a model pair.

        Any number of vectors (at least one): they are sent in requests of at most
        ``batch_size`` (by default the server's limit for the format, from
        ``GET /v1/info``), and a request
        refused for a while (429 overloaded, 503 not ready) is sent again after the
        server's ``Retry-After``. The server's answers are batch-invariant, so the result
        is the same bytes however the vectors were split.

        Parameters
        ----------
        vectors : array_like of shape (n, d_src)
            Sent as float32.
        stitch : str, optional
            A stitch id; else ``source_model`` and ``target_model`` name the models.
        source_model, target_model : str, optional
        normalize : bool, default False
            L2-normalise the output rows.
        format : {"json", "arrow"}, default "json"
            ``"json"``: base64 in a JSON body (up to the server's ``max_vectors_per_request``).
            ``"arrow"``: an Arrow IPC stream both ways, raw float32 without base64 or JSON,
            up to the server's ``max_vectors_arrow`` (65,536 by default): for bulk
            migrations. Needs pyarrow (``pip install pyarrow``, or the ``arrow`` extra).
        batch_size : int, optional
            Vectors per request; default the server's limit for ``format``.
        retries : int, default 5
            How many times one request is sent again after a 429 or 503.

        Returns
        -------
        ndarray of shape (n, d_tgt), float32

        Raises
        ------
        ImportError
            ``format="arrow"`` without pyarrow installed.
        InvalidInputError
            ``format`` is neither ``"json"`` nor ``"arrow"``; ``vectors`` not a non-empty
            2-D array of numbers; ``batch_size`` or ``retries`` not an integer (at least 1
            and 0).
        LeadError
            The subclass matching the server's error (see the module docstring).
        """
        y, _, _ = self._translate(
            vectors,
            naming=_naming(stitch, source_model, target_model),
            normalize=normalize,
            format=format,
            batch_size=batch_size,
            retries=retries,
            scored=False,
        )
        return y

    def translate_with_confidence(
        self,
        vectors: Any,
        *,
        stitch: str | None = None,
        source_model: str | None = None,
        target_model: str | None = None,
        normalize: bool = False,
        format: Literal["json", "arrow"] = "json",
        batch_size: int | None = None,
        retries: int = 5,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`translate` with ``"return_confidence": true``: the vectors (the same bytes)
        and, for each, the stitch's confidence and out-of-distribution flag.

        Returns
        -------
        vectors : ndarray of shape (n, d_tgt), float32
        confidence : ndarray of shape (n,), float32 in [0, 1]
            The stitch's calibrated estimate of the cosine to the target model's own vector.
        out_of_distribution : ndarray of shape (n,), bool

        Raises
        ------
        NoConfidenceError
            The stitch (or a stitch of the chain) has no confidence head.
        ImportError, InvalidInputError, LeadError
            As :meth:`translate`.
        """
        y, confidence, ood = self._translate(
            vectors,
            naming=_naming(stitch, source_model, target_model),
            normalize=normalize,
            format=format,
            batch_size=batch_size,
            retries=retries,
            scored=True,
        )
        assert confidence is not None and ood is not None
        return y, confidence, ood

    def _translate(
        self,
        vectors: Any,
        *,
        naming: dict[str, str],
        normalize: bool,
        format: str,
        batch_size: int | None,
        retries: int,
        scored: bool,
    ) -> _Scored:
        if format not in ("json", "arrow"):
            raise le.InvalidInputError(
                f"format must be 'json' or 'arrow', got {format!r}", param="format"
            )
        rows = _float32_rows(vectors)
        if not len(rows):
            raise le.InvalidInputError("vectors holds no rows: nothing to translate", param="input")
        retries = check_int_option(retries, "retries", minimum=0)
        size = (
            check_int_option(batch_size, "batch_size", minimum=1)
            if batch_size is not None
            else self._translate_limit(format, rows.shape[1])
        )
        send = self._translate_arrow if format == "arrow" else self._translate_json
        parts: list[_Scored] = []
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]

            def call(chunk: np.ndarray = chunk) -> _Scored:
                return send(chunk, normalize=normalize, naming=naming, scored=scored)

            try:
                parts.append(self._retrying(call, retries))
            except le.LeadError as exc:
                raise _shifted(exc, start) from None
        if len(parts) == 1:
            return parts[0]
        y = np.concatenate([part[0] for part in parts])
        if not scored:
            return y, None, None
        return (
            y,
            np.concatenate([part[1] for part in parts if part[1] is not None]),
            np.concatenate([part[2] for part in parts if part[2] is not None]),
        )

    def _translate_limit(self, format: str, d_src: int) -> int:
        """The server's vectors per request for ``format`` (``GET /v1/info``, read once)."""
        try:
            if self._limits is None:
                self._limits = dict(self._request("GET", "/v1/info")["limits"])
            if format != "arrow":
                return max(1, int(self._limits["max_vectors_per_request"]))
            # an Arrow request must also fit max_body_bytes_arrow: 4 bytes a value, 1 KiB
            # spare per vector for the stream's framing (a few hundred bytes a batch)
            d = max(int(d_src), 1)
            by_bytes = int(self._limits.get("max_body_bytes_arrow", 2**62)) // (4 * d + 1024)
            return max(1, min(int(self._limits["max_vectors_arrow"]), by_bytes))
        except (KeyError, TypeError, ValueError) as error:  # not LEAD's /v1/info
            self._limits = None
            detail = f"{type(error).__name__}: {str(error)[:100]}; give batch_size"
            message = _not_lead_message(self.http.base_url, detail, " GET /v1/info")
            raise le.LeadError(message, param="server") from None

    @staticmethod
    def _retrying(call: Callable[[], _Scored], retries: int) -> _Scored:
        for attempt in range(retries + 1):  # retries >= 0 (checked by _translate)
            try:
                return call()
            except (le.OverloadedError, le.NotReadyError) as exc:
                if attempt == retries:
                    raise
                # Retry-After, longer at each attempt and jittered, so that refused clients
                # do not all come back at the same moment
                wait = float(exc.retry_after or 1) * (1 + attempt) * random.uniform(0.5, 1.5)
                time.sleep(min(wait, 60.0))
        raise AssertionError("unreachable")

    def _translate_json(
        self, rows: np.ndarray, *, normalize: bool, naming: dict[str, str], scored: bool
    ) -> _Scored:
        body: dict[str, Any] = {
            "input": encode_base64(rows),
            "encoding_format": "base64",
            "normalize": normalize,
        }
        if scored:
            body["return_confidence"] = True
        response = self._request("POST", "/v1/translate", json={**body, **naming})
        try:
            data = response["data"]
            y = _decode_base64([item["embedding"] for item in data])
            if len(y) != len(rows):
                raise ValueError(f"{len(y)} vectors for {len(rows)}")
            if not scored:
                return y, None, None
            confidence = np.array([item["confidence"] for item in data], dtype=np.float32)
            return y, confidence, np.array([item["out_of_distribution"] for item in data], bool)
        except (KeyError, TypeError, ValueError, binascii.Error) as error:
            detail = f"{type(error).__name__}: {str(error)[:100]}"
            message = _not_lead_message(self.http.base_url, detail, " POST /v1/translate")
            raise le.LeadError(message, param="server") from None

    def _translate_arrow(
        self, rows: np.ndarray, *, normalize: bool, naming: dict[str, str], scored: bool
    ) -> _Scored:
        params = {**naming, "normalize": "true" if normalize else "false"}
        if scored:
            params["return_confidence"] = "true"
        headers = {**self._headers, "Content-Type": _arrow.ARROW_STREAM}
        content = _arrow.vectors_stream(rows)
        response = self._send(
            "POST", "/v1/translate", content=content, params=params, headers=headers
        )
        if response.is_error:
            raise _error_from(response)
        return _arrow.read_scored(response.content, scored=scored)

    def align(
        self,
        *,
        dataset: str | None = None,
        source: Any = None,
        target: Any = None,
        folds: int = 5,
        seed: int = 0,
    ) -> dict[str, Any]:
        """Alignment scores (linear CKA, mutual k-NN, cross-validated ridge R²) of paired sets."""
        body: dict[str, Any] = {"folds": folds, "seed": seed}
        if dataset is not None:
            body["dataset"] = dataset
        if (source is None) != (target is None):
            missing = "target" if target is None else "source"
            raise le.InvalidInputError(
                f"align needs source and target vectors together: {missing} is missing",
                param=missing,
            )
        if source is not None:
            body["source"], body["target"] = encode_base64(source), encode_base64(target)
        return dict(self._request("POST", "/v1/align", json=body))
