"""Paired-embedding dataset files: validation on arrival, atomic storage, loading.

A dataset is one ``.safetensors`` file (parsed with ``safetensors``, never pickle) with

- ``source`` of shape ``(n, d_src)`` and ``target`` of shape ``(n, d_tgt)``, row ``i`` of both
  embedding the same text;
- optionally ``source_queries`` ``(m, d_src)`` and ``target_queries`` ``(m, d_tgt)`` with the
  metadata entries ``query_ids`` (JSON list of ``m`` ids), ``corpus_ids`` (JSON list of ``n``
  ids, the rows of ``source`` / ``target``) and ``qrels`` (JSON ``{query_id: {corpus_id:
  grade}}``), which add retrieval figures to a job's scorecard.

Tensors are float32, float16 or float64, two-dimensional, finite and checked as fitting
checks them (:func:`lead.data.check_embeddings`: within the float32 range, column spreads
not too far apart); there are at least 4 pairs. Files are written to a temporary name in
the same folder, fsynced and renamed, so a dataset is either completely there or absent.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save

from lead._durable import atomic_write, fsync_path
from lead._options import name_problem
from lead.data import check_embeddings
from lead.errors import (
    DecodeError,
    InvalidInputError,
    LimitExceededError,
    PayloadTooLargeError,
    ShapeMismatchError,
    TooFewPairsError,
)
from service.json_body import json_value_problem

__all__ = [
    "MIN_PAIRS",
    "PairedData",
    "any_judged",
    "check_dimension",
    "check_judged_held_out",
    "inspect_dataset",
    "load_paired",
    "publish",
    "receive_upload",
    "retrieval_meta",
    "save_pairs",
]

MIN_PAIRS = 4
_DTYPES = {"F32": "float32", "F16": "float16", "F64": "float64"}
_TENSORS = ("source", "target", "source_queries", "target_queries")
_RETRIEVAL_META = ("query_ids", "corpus_ids", "qrels")


@dataclass(frozen=True)
class PairedData:
    """Paired embeddings read from a dataset file.

    Attributes
    ----------
    source : ndarray of shape (n, d_src)
    target : ndarray of shape (n, d_tgt)
        Float32 or float64 (float16 files are widened to float32).
    retrieval : dict or None
        ``source_queries`` ``(m, d_src)`` or None, ``target_queries`` ``(m, d_tgt)``,
        ``query_ids`` (m), ``corpus_ids`` (n), ``qrels``; None without queries.
    """

    source: np.ndarray
    target: np.ndarray
    retrieval: dict[str, Any] | None = None


#: The largest relevance grade a dataset may hold (BEIR's are 0-2; 10**400 overflowed the
#: float conversion of a job's retrieval scores, an internal error).
_MAX_GRADE = 2**31 - 1


def _is_grade(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _MAX_GRADE


def _json_meta(meta: dict[str, str], key: str) -> Any:
    try:
        return json.loads(meta[key])
    except (ValueError, TypeError) as exc:
        problem = json_value_problem(exc) if isinstance(exc, ValueError) else exc
        raise DecodeError(
            f"metadata entry {key!r} is not valid JSON: {problem}", param=key
        ) from None
    except RecursionError:  # "[[[[..." a hundred thousand deep
        raise DecodeError(
            f"metadata entry {key!r} is nested too deeply to be read", param=key
        ) from None


def _check_retrieval_meta(meta: dict[str, str], n: int, m: int) -> None:
    missing = [key for key in _RETRIEVAL_META if key not in meta]
    if missing:
        raise InvalidInputError(
            f"query tensors need the metadata entries {', '.join(_RETRIEVAL_META)}; "
            f"missing: {', '.join(missing)}",
            param=missing[0],
        )
    query_ids, corpus_ids = _json_meta(meta, "query_ids"), _json_meta(meta, "corpus_ids")
    qrels = _json_meta(meta, "qrels")
    for key, ids, count in (("query_ids", query_ids, m), ("corpus_ids", corpus_ids, n)):
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise InvalidInputError(f"{key} must be a JSON list of strings", param=key)
        if len(ids) != count:
            raise ShapeMismatchError(
                f"{key} has {len(ids)} ids for {count} rows",
                expected=count,
                got=len(ids),
                param=key,
            )
        if len(set(ids)) != len(ids):  # retrieval would refuse them, or count a query twice
            repeated = next(i for i, c in Counter(ids).items() if c > 1)
            what = "document" if key == "corpus_ids" else "query"
            raise InvalidInputError(
                f"{key} holds {len(ids) - len(set(ids))} duplicate id(s), such as "
                f"{repeated!r:.80}: each {what} needs its own id",
                param=key,
            )
    if not isinstance(qrels, dict) or not all(
        isinstance(v, dict) and all(_is_grade(g) for g in v.values()) for v in qrels.values()
    ):
        raise InvalidInputError(
            "qrels must be a JSON object {query_id: {corpus_id: grade}}, each grade an "
            f"integer of at most {_MAX_GRADE} in magnitude",
            param="qrels",
        )
    if not any_judged(query_ids, corpus_ids, qrels):
        raise TooFewPairsError(
            f"none of the {m} queries has a document judged relevant (grade > 0) in qrels "
            "among corpus_ids, so no retrieval score could be computed; fix qrels or upload "
            "the dataset without query tensors",
            minimum=1,
            got=0,
            param="qrels",
        )


def check_judged_held_out(
    retrieval: dict[str, Any], test_idx: Any, holdout_fraction: float
) -> list[str]:
    """The ids of the held-out documents (rows ``test_idx``) of a dataset's ``retrieval``
    metadata (``query_ids``, ``corpus_ids``, ``qrels``), which some query must judge.

    Raises
    ------
    InvalidInputError
        No query has a document judged relevant among the held-out documents, so a job
        could compute no retrieval score: checked when the job is submitted and again
        before it trains.
    """
    held_out = [retrieval["corpus_ids"][i] for i in test_idx]
    if not any_judged(retrieval["query_ids"], held_out, retrieval["qrels"]):
        raise InvalidInputError(
            f"none of the {len(retrieval['query_ids'])} queries has a document judged "
            f"relevant among the {len(held_out)} held-out documents (holdout_fraction "
            f"{holdout_fraction:g} of {len(retrieval['corpus_ids'])} pairs), so no retrieval "
            "score could be computed: raise holdout_fraction, judge more documents, or upload "
            "the dataset without query tensors",
            param="qrels",
        )
    return held_out


def retrieval_meta(path: Path) -> dict[str, Any] | None:
    """A dataset file's ``query_ids``, ``corpus_ids`` and ``qrels`` (its header only), or
    None when it has none (or the file is not here: on a shared store, another replica's
    upload)."""
    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
    except Exception:  # not here, or unreadable: the job's worker reads it and says so
        return None
    if not all(key in meta for key in _RETRIEVAL_META):
        return None
    return {key: json.loads(meta[key]) for key in _RETRIEVAL_META}


def any_judged(query_ids: list[str], corpus_ids: list[str], qrels: dict[str, Any]) -> bool:
    """Whether some query has a document judged relevant (grade > 0) among ``corpus_ids``:
    without one no retrieval score can be computed."""
    corpus = set(corpus_ids)
    return any(
        grade > 0 and doc in corpus
        for qid in set(query_ids)
        for doc, grade in qrels.get(qid, {}).items()
    )


#: Longest ``name`` / ``source_model`` / ``target_model`` kept from a file's metadata.
METADATA_LIMIT = 200


def check_dimension(dim: int, max_dim: int, name: str) -> None:
    """Refuse vectors of dimension ``dim`` wider than ``max_dim`` (``LEAD_MAX_DIMENSION``).

    Raises
    ------
    LimitExceededError
        If ``dim > max_dim``; ``param`` is ``name``.
    """
    if dim > max_dim:
        raise LimitExceededError(
            f"{name} has vectors of dimension {dim}; the limit is {max_dim} (LEAD_MAX_DIMENSION)",
            limit=max_dim,
            got=dim,
            param=name,
        )


#: The first bytes of files sometimes uploaded in place of a .safetensors one.
_OTHER_FORMATS = (
    (np.lib.format.MAGIC_PREFIX, ".npy"),
    (b"\x1f\x8b", "gzip-compressed"),
    (b"PK\x03\x04", "zip"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed"),
    (b"BZh", "bzip2-compressed"),
    (b"\xfd7zXZ", "xz-compressed"),
)


def inspect_dataset(path: Path, *, max_rows: int, max_dim: int) -> dict[str, Any]:
    """Validate a dataset file and describe it.

    Parameters
    ----------
    path : Path
        A ``.safetensors`` file (see the module docstring for its layout).
    max_rows : int
        Largest accepted pair count ``n``.
    max_dim : int
        Largest accepted dimension of any tensor.

    Returns
    -------
    dict
        ``pairs`` (n), ``source_dim``, ``target_dim``, ``dtype``, ``queries`` (m or None),
        ``retrieval`` (bool), and ``source_model`` / ``target_model`` / ``name`` when the
        metadata names them.

    Raises
    ------
    DecodeError
        If the file is not safetensors or its metadata is not JSON (HTTP 400).
    InvalidInputError
        Missing or unexpected tensors, a dtype other than float16/32/64, incomplete
        retrieval metadata.
    ShapeMismatchError
        Tensors that are not 2-D, row counts or dimensions that disagree.
    NonFiniteError
        NaN or infinity in any tensor, or a value beyond the float32 range (±3.4e38) in
        which stitches compute (HTTP 422).
    IllConditionedError
        A tensor whose widest column spreads millions of times wider than its median
        column, so that float32 fitting would round the others away (HTTP 422).
    TooFewPairsError, LimitExceededError
        Fewer than 4 or more than ``max_rows`` pairs, a dimension above ``max_dim``
        (:func:`check_dimension`); query tensors with 0 rows, or whose
        queries have no document judged relevant among the corpus rows (HTTP 422).
    """
    try:
        handle = safe_open(str(path), framework="np")
    except Exception as exc:  # safetensors raises its own Rust-side error types
        with open(path, "rb") as file:
            start = file.read(6)  # safetensors said "header too large" to each of these
        kind = next((name for magic, name in _OTHER_FORMATS if start.startswith(magic)), None)
        hint = (
            " (it is a .npy file: put the pairs in one .safetensors file with tensors "
            "'source' and 'target', e.g. safetensors.numpy.save_file)"
            if kind == ".npy"
            else f" (it is a {kind} file: upload the .safetensors file itself, uncompressed)"
            if kind
            else ""
        )
        raise DecodeError(
            f"the file is not a valid safetensors file: {exc}{hint}", param="file"
        ) from None
    with handle as f:
        names, meta = set(f.keys()), f.metadata() or {}
        unknown = sorted(names - set(_TENSORS))
        if unknown or not {"source", "target"} <= names:
            raise InvalidInputError(
                "a dataset holds the tensors 'source' and 'target' (and optionally "
                f"'source_queries', 'target_queries'); got {sorted(names)}",
                param="file",
            )
        shapes: dict[str, tuple[int, ...]] = {}
        dtypes: set[str] = set()
        for name in sorted(names):
            piece = f.get_slice(name)
            dtype, shape = piece.get_dtype(), tuple(piece.get_shape())
            if dtype not in _DTYPES:
                raise InvalidInputError(
                    f"tensor {name!r} has dtype {dtype}; use float32, float16 or float64",
                    param=name,
                )
            if len(shape) != 2 or shape[1] < 1:
                raise ShapeMismatchError(
                    f"tensor {name!r} must be 2-D (rows, dim) with dim >= 1, got shape {shape}",
                    expected="(rows, dim)",
                    got=shape,
                    param=name,
                )
            shapes[name], dtypes = shape, dtypes | {_DTYPES[dtype]}
        n, d_src, d_tgt = shapes["source"][0], shapes["source"][1], shapes["target"][1]
        for name, shape in sorted(shapes.items()):
            check_dimension(shape[1], max_dim, name)
        if shapes["target"][0] != n:
            raise ShapeMismatchError(
                f"'source' has {n} rows but 'target' has {shapes['target'][0]}",
                expected=n,
                got=shapes["target"][0],
                param="target",
            )
        if n < MIN_PAIRS:
            raise TooFewPairsError(
                f"a dataset needs at least {MIN_PAIRS} pairs, got {n}",
                minimum=MIN_PAIRS,
                got=n,
                param="source",
            )
        if n > max_rows:
            raise LimitExceededError(
                f"{n} pairs exceed the limit of {max_rows}", limit=max_rows, got=n, param="source"
            )
        m = _check_queries(shapes, d_src, d_tgt)
        if m is not None:
            _check_retrieval_meta(meta, n, m)
        elif given := [key for key in _RETRIEVAL_META if key in meta]:
            # ignored, a job would report no retrieval scores without saying why
            raise InvalidInputError(
                f"the metadata entries {', '.join(given)} go with query tensors "
                "('target_queries', and 'source_queries' for the bound), which the file "
                "lacks: add them, or leave the entries out",
                param=given[0],
            )
        for name in sorted(names):  # as fitting will: finite, float32-sized, well-conditioned
            check_embeddings(f.get_tensor(name), name=name)
    info: dict[str, Any] = {
        "pairs": n,
        "source_dim": d_src,
        "target_dim": d_tgt,
        "dtype": "/".join(sorted(dtypes)),
        "queries": m,
        "retrieval": m is not None,
    }
    for key in ("name", "source_model", "target_model"):
        if key in meta:
            if len(meta[key]) > METADATA_LIMIT:
                raise LimitExceededError(
                    f"metadata {key!r} has {len(meta[key])} characters; at most "
                    f"{METADATA_LIMIT} (as for ?name=)",
                    limit=METADATA_LIMIT,
                    got=len(meta[key]),
                    param=key,
                )
            problem = name_problem(str(meta[key]))
            if problem is not None:
                raise InvalidInputError(f"metadata {key!r} {problem}", param=key)
            info[key] = str(meta[key])
    return info


def _check_queries(shapes: dict[str, tuple[int, ...]], d_src: int, d_tgt: int) -> int | None:
    if "target_queries" not in shapes:
        if "source_queries" in shapes:
            raise InvalidInputError(
                "'source_queries' needs 'target_queries' too", param="target_queries"
            )
        return None
    m = shapes["target_queries"][0]
    if m == 0:
        raise TooFewPairsError(
            "'target_queries' has 0 rows; send at least one query, or no query tensors",
            minimum=1,
            got=0,
            param="target_queries",
        )
    wanted = {"target_queries": (m, d_tgt)}
    if "source_queries" in shapes:
        wanted["source_queries"] = (m, d_src)
    for name, shape in wanted.items():
        if shapes[name] != shape:
            raise ShapeMismatchError(
                f"tensor {name!r} must have shape {shape}, got {shapes[name]}",
                expected=shape,
                got=shapes[name],
                param=name,
            )
    return m


def load_paired(path: Path) -> PairedData:
    """Read a dataset file validated by :func:`inspect_dataset`."""
    with safe_open(str(path), framework="np") as f:
        arrays = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        meta = f.metadata() or {}
    arrays = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in arrays.items()}
    retrieval = None
    if "target_queries" in arrays:
        retrieval = {
            "source_queries": arrays.get("source_queries"),
            "target_queries": arrays["target_queries"],
            **{key: json.loads(meta[key]) for key in _RETRIEVAL_META},
        }
    return PairedData(arrays["source"], arrays["target"], retrieval)


def save_pairs(path: Path, source: np.ndarray, target: np.ndarray) -> None:
    """Store inline pairs ``(n, d_src)``, ``(n, d_tgt)`` as a float32 dataset file, atomically."""
    tensors = {
        "source": np.ascontiguousarray(source, dtype=np.float32),
        "target": np.ascontiguousarray(target, dtype=np.float32),
    }
    data = save(tensors)
    atomic_write(path, lambda handle: handle.write(data))


async def receive_upload(
    chunks: AsyncIterator[bytes], tmp: Path, *, max_bytes: int
) -> tuple[int, str]:
    """Stream an upload into the temporary file ``tmp`` (fsynced), stopping past ``max_bytes``.

    Returns
    -------
    size : int
        Bytes written.
    sha256 : str
        Hex digest of the content.

    Raises
    ------
    PayloadTooLargeError
        As soon as more than ``max_bytes`` arrive (``tmp`` is removed).
    DecodeError
        If the body is empty.
    """
    digest, size = hashlib.sha256(), 0
    try:
        async with await anyio.open_file(tmp, "wb") as f:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLargeError(
                        f"the dataset is larger than the limit of {max_bytes} bytes",
                        limit=max_bytes,
                        got=size,
                        param="file",
                    )
                digest.update(chunk)
                await f.write(chunk)
            if size == 0:
                raise DecodeError(
                    "the request body is empty; send a .safetensors file", param="file"
                )
            await f.flush()
            await anyio.to_thread.run_sync(os.fsync, f.wrapped.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size, digest.hexdigest()


def publish(tmp: Path, path: Path) -> None:
    """Rename a complete, fsynced temporary file to its final name and fsync the folder."""
    os.replace(tmp, path)
    fsync_path(path.parent)
