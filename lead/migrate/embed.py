"""``calibrate --embed``: the new model's vectors of a sample, embedded by LEAD itself.

When the store holds the text of its rows (a text column of the same table, a string
column of the Parquet file, a payload field of the Qdrant points:
:meth:`~lead.migrate.stores.Source.texts`) and the new model is a sentence-transformers
model, a user need not embed anything: a seeded random sample of ids is drawn from the
source, their texts read and embedded with the new model (:func:`embed_texts`), and paired
with their source vectors (:func:`embedded_pairs`). The sample can be kept as a Parquet
file (``id``, ``embedding``; :func:`save_native`) for ``verify`` to use as its native store.

The model is a folder, or a Hugging Face Hub id already in the local cache: it is loaded
with ``local_files_only`` and never downloaded here (fetch it first with
``hf download MODEL``). sentence-transformers is the optional ``embed`` extra.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lead._arrow import vector_column
from lead._durable import atomic_write
from lead.errors import (
    ConflictError,
    InvalidInputError,
    NonFiniteOutputError,
    TooFewPairsError,
)
from lead.migrate._pairs import Paired, check_unique, checked_vectors
from lead.migrate.stores import Source, require

__all__ = [
    "EMBED_EXTRA",
    "check_embed_args",
    "embed_texts",
    "embedded_pairs",
    "load_model",
    "save_native",
    "sentence_transformer_class",
]

#: How to install what ``--embed`` needs.
EMBED_EXTRA = "pip install 'lead-stitch[embed]'"


def check_embed_args(
    native: str | None,
    embed_model: str | None,
    text_column: str,
    save_native: str | Path | None,
    force: bool,
) -> Path | None:
    """Refuse a bad combination of ``calibrate``'s ``native`` / ``embed_model`` /
    ``save_native``, before any work; the file to save the embedded sample to, or None.

    Raises
    ------
    InvalidInputError
        Both or neither of ``native`` and ``embed_model``; ``save_native`` without
        ``embed_model``, or a folder; an empty ``text_column``.
    ConflictError
        ``save_native`` exists and ``force`` is false.
    """
    if (native is None) == (embed_model is None):
        raise InvalidInputError(
            "give either the new model's vectors (a native store) or a model to embed the "
            "store's texts with (embed_model, --embed), not both"
            if native is not None
            else "give the new model's vectors (a native store), or a model to embed the "
            "store's texts with (embed_model, --embed)",
            param="native",
        )
    if embed_model is None:
        if save_native is not None:
            raise InvalidInputError(
                "save_native (--save-native) keeps the sample that embed_model (--embed) "
                "embeds; the native store given is already one",
                param="save_native",
            )
        return None
    if not isinstance(text_column, str) or not text_column:
        raise InvalidInputError("text_column must be a column name", param="text_column")
    if save_native is None:
        return None
    path = Path(save_native)
    if path.is_dir():
        raise InvalidInputError(f"{path} is a folder; save_native is a file", param="save_native")
    if path.exists() and not force:
        raise ConflictError(
            f"{path} exists already; pass --force (force=True from Python) to replace it",
            param="save_native",
        )
    return path


def sentence_transformer_class() -> Any:
    """``sentence_transformers.SentenceTransformer``, or say which extra installs it.

    Raises
    ------
    InvalidInputError
        sentence-transformers is not installed.
    """
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise InvalidInputError(
            f"embedding with the new model needs sentence-transformers: {EMBED_EXTRA}",
            param="embed_model",
        ) from None
    return SentenceTransformer


def load_model(model: str, *, device: str | None = None) -> Any:
    """A sentence-transformers model from a folder or the local Hugging Face cache.

    Parameters
    ----------
    model : str
        A model folder, or a Hub id (``sentence-transformers/all-MiniLM-L6-v2``) that is in
        the local cache; nothing is downloaded (``local_files_only``).
    device : str, optional
        ``cpu``, ``cuda``, ...; None: sentence-transformers' choice (a GPU when there is one).

    Returns
    -------
    sentence_transformers.SentenceTransformer

    Raises
    ------
    InvalidInputError
        sentence-transformers is not installed; no such folder or cached model, or one
        that sentence-transformers cannot load (with its reason).
    """
    cls = sentence_transformer_class()
    folder = Path(model).expanduser()
    name = str(folder) if folder.is_dir() else model
    try:
        return cls(name, device=device, local_files_only=True)
    except (OSError, ValueError) as error:
        text = str(error).strip()
        reason = text.splitlines()[0] if text else type(error).__name__
        hint = (
            ""
            if folder.is_dir()
            else f"; pass a model folder, or download it first with `hf download {model}`"
        )
        raise InvalidInputError(
            f"cannot load the embedding model {model!r} (from a folder or the local Hugging "
            f"Face cache, offline): {reason}{hint}",
            param="embed_model",
        ) from None


def embed_texts(
    model: Any, texts: Sequence[str], *, batch_size: int = 64, progress: bool = True
) -> np.ndarray:
    """Embed ``texts`` in batches; L2-normalised float32 rows.

    Parameters
    ----------
    model : sentence_transformers.SentenceTransformer
    texts : sequence of str, length n
    batch_size : int, default 64
        Texts per forward pass.
    progress : bool, default True
        A progress bar (texts per second) on stderr.

    Returns
    -------
    ndarray of shape (n, d), float32
        Row ``i`` embeds ``texts[i]``, unit L2 norm.

    Raises
    ------
    NonFiniteOutputError
        The model produced NaN or infinity, naming the row.
    """
    from tqdm import tqdm

    chunk = 4 * batch_size  # several batches per call: sentence-transformers sorts by length
    parts: list[np.ndarray] = []
    with tqdm(
        total=len(texts), desc="embedding", unit="text", disable=not progress, file=sys.stderr
    ) as bar:
        for start in range(0, len(texts), chunk):
            batch = list(texts[start : start + chunk])
            parts.append(
                np.asarray(
                    model.encode(
                        batch,
                        batch_size=batch_size,
                        convert_to_numpy=True,
                        normalize_embeddings=True,
                        show_progress_bar=False,
                    ),
                    dtype=np.float32,
                )
            )
            bar.update(len(batch))
    if not parts:
        raise InvalidInputError("no texts to embed", param="texts")
    vectors = np.concatenate(parts)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise NonFiniteOutputError(f"the embedding model gave NaN or infinity for text {row}")
    return vectors


def _sample(src: Source, n: int, seed: int, include: Sequence[str]) -> np.ndarray:
    """``n`` seeded random ids of ``src``, then the ``include`` ids it holds (as its ids)."""
    drawn = np.asarray(src.sample_ids(n, seed))
    if not include:
        return drawn
    every = {str(k): k for k in src.sample_ids(src.info.rows, seed).tolist()}
    seen = {str(k) for k in drawn.tolist()}
    extra = [every[k] for k in dict.fromkeys(include) if k in every and k not in seen]
    kind = np.int64 if src.info.id_kind == "int" else object
    return np.asarray(drawn.tolist() + extra, dtype=kind)


def embedded_pairs(
    src: Source,
    model: str,
    text_column: str,
    n: int,
    seed: int,
    *,
    minimum: int,
    include: Sequence[str] = (),
    device: str | None = None,
    batch_size: int = 64,
    progress: bool = True,
    save: str | Path | None = None,
) -> tuple[Paired, dict[str, Any]]:
    """Draw ids from ``src``, embed their texts with ``model``, pair them with their vectors.

    Parameters
    ----------
    src : Source
        The store to migrate, holding the texts in ``text_column``.
    model : str
        The new model (:func:`load_model`).
    text_column : str
        Where the store holds each row's text (:meth:`~lead.migrate.stores.Source.texts`).
    n : int
        Random ids drawn (seeded by ``seed``), plus those of ``include`` the store holds.
    minimum : int
        Fewest pairs allowed.
    include : sequence of str
        Ids to embed as well when the store holds them (the judged documents of queries).
    device, batch_size, progress
        As :func:`load_model` and :func:`embed_texts` take them.
    save : str or Path, optional
        Also write the embedded sample there (:func:`save_native`).

    Returns
    -------
    paired : Paired
        ``vectors`` = [source vectors (m, d_src), embedded vectors (m, d_tgt) float32,
        L2-normalised]; ``rows`` = [rows of the source, m].
    record : dict
        ``model``, ``text_column``, ``rows`` (m), ``dim`` (d_tgt) and ``saved`` (the file,
        or None): for the fit record.

    Raises
    ------
    TooFewPairsError
        The source holds fewer than ``minimum`` rows with a vector.
    InvalidInputError, NonFiniteError
        An id drawn twice; a source vector holding NaN or infinity (naming the id).
    InvalidInputError, StoreNotFoundError
        As :meth:`~lead.migrate.stores.Source.texts` and :func:`load_model` raise them.
    """
    sentence_transformer_class()  # a missing extra is said before the store is read
    ids = _sample(src, n, seed, include)
    if len(ids) < minimum:
        raise TooFewPairsError(
            f"only {len(ids)} rows of {src.info.uri} have a vector; at least {minimum} are "
            "needed to fit and score a stitch",
            minimum=minimum,
            got=len(ids),
            param="source",
        )
    keys = [str(k) for k in ids.tolist()]
    check_unique(keys, "source", src)
    texts = src.texts(ids, text_column)
    encoder = load_model(model, device=device)
    native = embed_texts(encoder, texts, batch_size=batch_size, progress=progress)
    vectors = checked_vectors(np.asarray(src.fetch(ids)), keys, "source", src)
    if save is not None:
        save = save_native(save, ids, native)
    record = {
        "model": model,
        "text_column": text_column,
        "rows": len(keys),
        "dim": int(native.shape[1]),
        "saved": None if save is None else str(save),
    }
    return Paired(keys, [vectors, native], [src.info.rows, len(keys)], None), record


def save_native(path: str | Path, ids: np.ndarray, vectors: np.ndarray) -> Path:
    """Write the embedded sample as one Parquet file, atomically (temporary name, fsync,
    rename): ``id`` (int64 or string) and ``embedding`` (fixed-size list of float32), a
    native store for ``verify``.

    Parameters
    ----------
    path : str or Path
        The file; its folder is created if needed.
    ids : ndarray of shape (m,)
        int64, or object (str).
    vectors : ndarray of shape (m, d), float32

    Returns
    -------
    Path
        ``path``.
    """
    pa = require("pyarrow", "arrow")
    pq = require("pyarrow.parquet", "arrow")
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    column = vector_column(vectors)
    keys = pa.array(ids.tolist(), type=pa.int64() if ids.dtype.kind in "iu" else pa.string())
    table = pa.table({"id": keys, "embedding": column})
    return atomic_write(file, lambda handle: pq.write_table(table, handle))
