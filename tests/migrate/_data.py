"""Stores of the SciFact fixture for the calibrate and verify tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lead.migrate.quality import RetrievalQueries
from lead.migrate.stores import with_params

#: Documents whose new-model (mpnet) vectors the user holds: 300 of the 400.
NATIVE_ROWS = np.sort(np.random.default_rng(0).choice(400, 300, replace=False))


def doc_ids(scifact: Any) -> np.ndarray:
    """The SciFact corpus ids as int64 (they are numbers): the pgvector table's ids."""
    return np.asarray([int(i) for i in scifact.corpus_ids], dtype=np.int64)


def write_parquet(path: Path, ids: Any, vectors: np.ndarray) -> str:
    """A Parquet file with ``id`` and a fixed-size-list ``emb`` column; its store URI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lead._arrow import vector_column

    pq.write_table(pa.table({"id": pa.array(list(ids)), "emb": vector_column(vectors)}), path)
    return with_params(str(path), column="emb", id="id")


def queries(scifact: Any, *, source: bool = True) -> RetrievalQueries:
    """The 100 test queries by mpnet (and minilm), with their judgments."""
    return RetrievalQueries(
        target_queries=scifact.queries["mpnet"],
        query_ids=scifact.query_ids,
        qrels=scifact.qrels,
        source_queries=scifact.queries["minilm"] if source else None,
    )


def unscored_stitch(folder: Path, scifact: Any) -> Path:
    """A MiniLM → mpnet ridge stitch without a confidence head (fitted with no held-out
    rows), fitted on the 400 fixture documents; its folder."""
    from lead.artifacts import save_stitch
    from lead.fitting import fit_stitch

    stitch = fit_stitch(scifact.corpus["minilm"], scifact.corpus["mpnet"], "ridge")
    return save_stitch(stitch, folder)


def scored_stitch(folder: Path, scifact: Any) -> Path:
    """A MiniLM → mpnet ridge stitch with a confidence head, fitted on 320 fixture documents
    and calibrated on the other 80; its folder."""
    from lead.artifacts import save_stitch
    from lead.confidence import fit_confidence
    from lead.fitting import fit_stitch

    X, Y = scifact.corpus["minilm"], scifact.corpus["mpnet"]
    stitch = fit_stitch(X[:320], Y[:320], "ridge")
    fit_confidence(stitch, X[:320], Y[:320], X[320:], Y[320:])
    return save_stitch(stitch, folder)


def stop_after(batches: int) -> Callable[[int, int], None]:
    """A ``progress`` callback that interrupts an apply after ``batches`` written batches,
    as a ``kill`` would (the batches before it are in the target)."""
    calls: list[int] = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == batches:
            raise KeyboardInterrupt

    return progress
