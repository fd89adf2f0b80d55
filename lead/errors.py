"""The one exception tree of LEAD.

Every error that the library or the service raises on purpose is a :class:`LeadError`.
Each class also inherits the builtin that fits, so ``except ValueError`` keeps working
for callers who do not know LEAD. ``service/errors.py`` is the only place that maps
these classes to HTTP statuses; a handler on a base class covers its subclasses.

::

    LeadError
    ├── InvalidInputError (ValueError)            bad arrays or arguments
    │   ├── ShapeMismatchError                    wrong dimension or row count (expected, got)
    │   ├── NonFiniteError                        NaN or infinity in the input (or beyond float32)
    │   ├── ZeroVectorError                       an all-zero vector where a unit-length one
    │   │                                         is needed (row)
    │   ├── IllConditionedError                   column scales too far apart for float32
    │   ├── TooFewPairsError                      fewer paired rows than a method needs
    │   ├── DecodeError                           base64 or file bytes that do not decode
    │   ├── NotInvertibleError                    an inverse asked of a stitch that has none
    │   ├── ModelMismatchError                    data recorded with other models than named
    │   └── LimitExceededError                    more vectors / bytes than allowed (limit, got)
    │       └── PayloadTooLargeError              request body over the byte limit
    ├── UnsupportedMediaTypeError (ValueError)    request body that is not JSON / safetensors
    ├── RequestTimeoutError (TimeoutError)        request body that did not arrive in time
    ├── StitchFormatError (ValueError)            artifact with a bad config or tensors
    │   └── UnknownArchitectureError              architecture not in the registry
    ├── NotFoundError (LookupError)
    │   ├── StitchNotFoundError                   no stitch (or chain) with that id / models
    │   ├── JobNotFoundError
    │   ├── DatasetNotFoundError
    │   └── StoreNotFoundError                    no such table, column, collection or file
    ├── FitError (RuntimeError)                   fitting failed or diverged
    ├── NonFiniteOutputError (RuntimeError)       a stitch produced NaN / infinity
    ├── AuthenticationError (PermissionError)     missing or wrong API key
    ├── PermissionDeniedError (PermissionError)   an API key used outside its scope (required)
    ├── ConflictError (ValueError)                a job in a state that forbids the action,
    │   │                                         a stitch id or dataset still in use
    │   └── IdempotencyKeyReusedError             Idempotency-Key reused with another body
    ├── OverloadedError (RuntimeError)            too many concurrent requests (retry_after)
    ├── NotReadyError (RuntimeError)              stitches not loaded yet (retry_after)
    ├── FeatureDisabledError (RuntimeError)       a feature this server is configured without
    ├── JobCancelledError (RuntimeError)          raised inside a training run to stop it
    ├── HubError (RuntimeError)                   Hugging Face Hub download / upload failed
    ├── StorageFullError (OSError)                no room left to write (disk, database)
    └── StoreError (RuntimeError)                 a vector store that cannot be reached or
                                                  refuses the credentials (migrations)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError",
    "ConflictError",
    "DatasetNotFoundError",
    "DecodeError",
    "FeatureDisabledError",
    "FitError",
    "HubError",
    "IdempotencyKeyReusedError",
    "IllConditionedError",
    "InvalidInputError",
    "JobCancelledError",
    "JobNotFoundError",
    "LeadError",
    "LimitExceededError",
    "ModelMismatchError",
    "NoConfidenceError",
    "NonFiniteError",
    "NonFiniteOutputError",
    "NotFoundError",
    "NotInvertibleError",
    "NotReadyError",
    "OverloadedError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RequestTimeoutError",
    "ShapeMismatchError",
    "StitchFormatError",
    "StitchNotFoundError",
    "StorageFullError",
    "StoreError",
    "StoreNotFoundError",
    "TooFewPairsError",
    "UnknownArchitectureError",
    "UnsupportedMediaTypeError",
    "ZeroVectorError",
]


class LeadError(Exception):
    """Base class of every error LEAD raises on purpose.

    Parameters
    ----------
    message : str
        A sentence a user can act on.
    param : str, optional
        The input field the error is about (``"input"``, ``"input[3]"``, ``"stitch"``).
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidInputError(LeadError, ValueError):
    """Input arrays or arguments that LEAD cannot use."""


class ShapeMismatchError(InvalidInputError):
    """An array with the wrong dimension or row count.

    Attributes
    ----------
    expected, got : Any
        The shape (or dimension, or count) that was expected and the one received.
    """

    def __init__(
        self, message: str, *, expected: Any = None, got: Any = None, param: str | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.expected = expected
        self.got = got


class NonFiniteError(InvalidInputError):
    """NaN or infinity in the input."""


class ZeroVectorError(InvalidInputError):
    """An all-zero input vector for a stitch fitted on unit-length vectors: it has no
    direction, so it cannot be scaled to unit length.

    Attributes
    ----------
    row : int
        Index of the (first) zero vector in the input.
    """

    def __init__(self, message: str, *, row: int, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.row = row


class IllConditionedError(InvalidInputError):
    """Finite data that float32 fitting cannot use: column scales too far apart, or all
    variation below the smallest float32."""


class TooFewPairsError(InvalidInputError):
    """Fewer paired rows than the method or metric needs (``minimum``, ``got``)."""

    def __init__(self, message: str, *, minimum: int, got: int, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.minimum = minimum
        self.got = got


class DecodeError(InvalidInputError):
    """Bytes (base64, a file) that do not decode to the expected vectors."""


class InvalidJSONError(InvalidInputError):
    """A request body that is not JSON."""


class NotInvertibleError(InvalidInputError):
    """The inverse direction was asked of a stitch that is not invertible."""


class NoConfidenceError(InvalidInputError):
    """A per-vector confidence was asked of a stitch (or direction) that has none."""


class ModelMismatchError(InvalidInputError):
    """Vectors recorded as made by one model are said to come from another."""


class LimitExceededError(InvalidInputError):
    """More vectors, rows or bytes than a configured limit allows (``limit``, ``got``)."""

    def __init__(self, message: str, *, limit: int, got: int, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.limit = limit
        self.got = got


class PayloadTooLargeError(LimitExceededError):
    """A request body larger than the configured byte limit."""


class UnsupportedMediaTypeError(LeadError, ValueError):
    """A request body whose content type the endpoint does not accept."""


class RequestTimeoutError(LeadError, TimeoutError):
    """A request body that did not arrive within the configured time (slow or stalled client)."""


class StitchFormatError(LeadError, ValueError):
    """A stitch artifact whose config or tensors are missing, malformed or inconsistent."""


class UnknownArchitectureError(StitchFormatError):
    """An ``architecture`` name that is not in the stitch registry."""


class NotFoundError(LeadError, LookupError):
    """Something addressed by id that does not exist."""


class StitchNotFoundError(NotFoundError):
    """No stitch (and, unless chains are refused, no chain) for the given id or models."""


class JobNotFoundError(NotFoundError):
    """No training job with that id."""


class DatasetNotFoundError(NotFoundError):
    """No uploaded dataset with that id."""


class StoreNotFoundError(NotFoundError):
    """A vector store's table, column, collection, named vector or file that does not exist."""


class FitError(LeadError, RuntimeError):
    """Fitting failed: the solver broke down or training diverged."""


class NonFiniteOutputError(LeadError, RuntimeError):
    """A stitch produced NaN or infinity from finite input."""


class AuthenticationError(LeadError, PermissionError):
    """A missing or wrong API key."""


class PermissionDeniedError(LeadError, PermissionError):
    """A valid API key used outside its scope.

    Attributes
    ----------
    required : str or None
        The scope the action needs (``"admin"``), when known.
    """

    def __init__(
        self, message: str, *, required: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.required = required


class ConflictError(LeadError, ValueError):
    """A request that conflicts with the current state (idempotency key reuse, job state)."""


class IdempotencyKeyReusedError(ConflictError):
    """An ``Idempotency-Key`` sent again with a different request body."""


class OverloadedError(LeadError, RuntimeError):
    """Too many requests in flight; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotReadyError(LeadError, RuntimeError):
    """The service has not loaded and checked its stitches yet."""

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class FeatureDisabledError(LeadError, RuntimeError):
    """A feature this server is configured not to run (e.g. training jobs on a
    translation-only replica, ``LEAD_ENABLE_JOBS=false``): retrying will not help."""


class JobCancelledError(LeadError, RuntimeError):
    """Raised from a progress callback to stop a training run that was cancelled."""


class HubError(LeadError, RuntimeError):
    """Downloading from or uploading to the Hugging Face Hub failed."""


class StorageFullError(LeadError, OSError):
    """A write found no room left: the disk or a quota under the data folder is full, or
    the database is (``ENOSPC``, ``EDQUOT``, SQLite's "database or disk is full")."""


class StoreError(LeadError, RuntimeError):
    """A vector store (or the LEAD server a migration translates through) that cannot be
    reached, or that refuses the credentials or a query."""
