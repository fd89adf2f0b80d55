"""Qdrant source and target in qdrant-client's local mode: round trips, resume, bad input."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lead import migrate
from lead.errors import (
    ConflictError,
    InvalidInputError,
    NonFiniteError,
    ShapeMismatchError,
    StoreError,
    StoreNotFoundError,
    ZeroVectorError,
)
from lead.migrate.qdrant import LEAD_NAMESPACE
from lead.migrate.registry import open_source, open_target
from lead.migrate.stores import parse_store_uri, with_params
from lead.migrate.translator import LocalTranslator
from tests.migrate._data import stop_after, write_parquet
from tests.migrate.conftest import make_table

qdrant_client = pytest.importorskip("qdrant_client")
models = qdrant_client.models


@pytest.fixture(scope="module")
def minilm_to_mpnet() -> LocalTranslator:
    return LocalTranslator("minilm-to-mpnet")


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[str]:
    """A local Qdrant storage folder. Local mode commits every point in its own SQLite
    transaction (an fsync each, ~8 ms on disk), so it lives in /dev/shm where there is one."""
    shm = Path("/dev/shm")
    folder = tempfile.mkdtemp(prefix="lead-qdrant-", dir=shm if shm.is_dir() else tmp_path)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _client(storage: str) -> Any:
    return qdrant_client.QdrantClient(path=storage)


def make_collection(
    storage: str,
    name: str,
    ids: list[Any],
    vectors: dict[str, np.ndarray] | np.ndarray,
    *,
    distance: str = "Cosine",
) -> str:
    """Create collection ``name`` (one unnamed vector, or named ones) holding the points;
    returns its local URI. A named vector's NaN row leaves that point without the vector."""
    with_names = isinstance(vectors, dict)
    table = vectors if isinstance(vectors, dict) else {"": vectors}
    params = {k: models.VectorParams(size=v.shape[1], distance=distance) for k, v in table.items()}
    points = []
    for i, key in enumerate(ids):
        row = {k: v[i].tolist() for k, v in table.items() if not np.isnan(v[i]).any()}
        points.append(models.PointStruct(id=key, vector=row if with_names else row[""]))
    client = _client(storage)
    try:
        client.create_collection(name, vectors_config=params if with_names else params[""])
        client.upsert(name, points=points, wait=True)
    finally:
        client.close()
    return f"qdrant://{storage}/{name}"


def _points(storage: str, name: str) -> list[Any]:
    client = _client(storage)
    try:
        return list(client.scroll(name, limit=10_000, with_vectors=True)[0])
    finally:
        client.close()


def _fetch(target: str, ids: np.ndarray) -> np.ndarray:
    with open_target(target) as opened:
        return opened.fetch(ids)


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_pgvector_to_qdrant_matches_in_process_translation(
    pg_uri, scifact_small, minilm_to_mpnet, storage
):
    X = scifact_small.corpus["minilm"][:150]
    ids = np.arange(len(X), dtype=np.int64) * 7 + 3
    source = make_table(pg_uri, "t_to_qdrant", ids, X)
    exact = f"qdrant://{storage}/exact?distance=Dot"
    result = migrate.apply(source, exact, minilm_to_mpnet, batch_size=40, progress=False)
    assert (result.rows_written, result.rows_total) == (len(X), len(X))
    want = minilm_to_mpnet(X)
    np.testing.assert_allclose(_fetch(exact, ids[::-1]), want[::-1], atol=1e-5, rtol=0)
    again = migrate.apply(source, exact, minilm_to_mpnet, progress=False)
    assert again.already_done and again.rows_written == 0
    cosine = f"qdrant://{storage}/cosine"  # Qdrant keeps cosine vectors L2-normalised
    migrate.apply(source, cosine, minilm_to_mpnet, batch_size=64, progress=False)
    np.testing.assert_allclose(_fetch(cosine, ids), _unit(want), atol=1e-5, rtol=0)
    points = _points(storage, "exact")
    assert sorted(p.id for p in points) == ids.tolist()  # each point once, ids kept


def test_qdrant_to_qdrant_adds_a_named_vector_beside_the_source(
    scifact_small, minilm_to_mpnet, storage
):
    X = scifact_small.corpus["minilm"][:120]
    ids = [str(uuid.uuid5(uuid.NAMESPACE_URL, k)) for k in scifact_small.corpus_ids[:120]]
    source = make_collection(storage, "docs", ids, {"minilm": X})
    before = {p.id: p.vector["minilm"] for p in _points(storage, "docs")}
    with open_source(with_params(source, vector="minilm")) as opened:  # the only named one
        assert (opened.info.id_kind, opened.info.rows, opened.info.dim) == ("str", 120, 384)
    target = with_params(source, vector="mpnet")
    migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    order = np.asarray(ids[::-1], dtype=object)
    want = _unit(minilm_to_mpnet(X[::-1]))
    np.testing.assert_allclose(_fetch(target, order), want, atol=1e-5, rtol=0)
    points = _points(storage, "docs")
    assert len(points) == 120 and {p.id: p.vector["minilm"] for p in points} == before
    assert all(p.payload == {} for p in points)  # UUID ids are kept, no lead_id
    with pytest.raises(InvalidInputError, match="'minilm', 'mpnet'"):
        open_source(source)  # two named vectors now, and no ?vector=
    copy = f"qdrant://{storage}/copy?vector=v&distance=Dot"  # same storage, another collection
    migrate.apply(target, copy, LocalTranslator("mpnet-to-minilm"), progress=False)
    with open_source(copy) as opened:
        assert opened.info.rows == 120 and opened.info.dim == 384


def test_qdrant_to_parquet_matches_in_process_translation(
    scifact_small, minilm_to_mpnet, storage, tmp_path
):
    X = scifact_small.corpus["minilm"][:100]
    ids = list(range(500, 600))
    source = make_collection(storage, "plain", ids, X)
    target = tmp_path / "out"
    migrate.apply(source, str(target), minilm_to_mpnet, batch_size=30, progress=False)
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(target)
    assert table.column("id").to_pylist() == ids
    got = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, minilm_to_mpnet(X), atol=1e-5, rtol=0)


def test_resume_after_partial_run_writes_each_point_once(scifact_small, minilm_to_mpnet, storage):
    X = scifact_small.corpus["minilm"][:200]
    ids = list(range(len(X)))
    source = make_collection(storage, "src", ids, X)
    target = f"qdrant://{storage}/out?distance=Dot"
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=stop_after(2))
    assert len(_points(storage, "out")) == 100
    # a run killed after its third batch landed but before its checkpoint moved
    client = _client(storage)
    client.upsert("out", points=models.Batch(ids=ids[100:150], vectors=np.ones((50, 768)).tolist()))
    client.close()
    result = migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    assert (result.resumed_from, result.rows_written) == (100, len(X) - 100)
    points = _points(storage, "out")
    assert sorted(p.id for p in points) == ids
    np.testing.assert_allclose(_fetch(target, np.asarray(ids)), minilm_to_mpnet(X), atol=1e-5)


def test_text_ids_become_uuids_with_the_id_in_the_payload(
    scifact_small, minilm_to_mpnet, storage, tmp_path
):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    X = scifact_small.corpus["minilm"][:40]
    keys = [f"doc-{k}" for k in scifact_small.corpus_ids[:39]] + [str(uuid.UUID(int=7))]
    column = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), 384)
    pq.write_table(pa.table({"id": keys, "emb": column}), tmp_path / "in.parquet")
    target = f"qdrant://{storage}/out?distance=Dot"
    migrate.apply(str(tmp_path / "in.parquet"), target, minilm_to_mpnet, progress=False)
    ids = np.asarray(keys, dtype=object)
    np.testing.assert_allclose(_fetch(target, ids), minilm_to_mpnet(X), atol=1e-5, rtol=0)
    stored = {p.id: p.payload for p in _points(storage, "out")}
    assert stored[str(uuid.uuid5(LEAD_NAMESPACE, keys[0]))] == {"lead_id": keys[0]}
    assert stored[keys[-1]] == {}  # a UUID stays itself


def test_spellings_of_one_uuid_stay_distinct_points(
    scifact_small, minilm_to_mpnet, storage, tmp_path
):
    X = scifact_small.corpus["minilm"][:10]
    same = uuid.UUID("550e8400-e29b-41d4-a716-446655440000")
    spellings = [str(same), str(same).upper(), f"{{{same}}}", same.hex, f"urn:uuid:{same}"]
    keys = spellings + [f"doc-{k}" for k in scifact_small.corpus_ids[:5]]
    source = write_parquet(tmp_path / "in.parquet", keys, X)
    target = f"qdrant://{storage}/out?distance=Dot"
    result = migrate.apply(source, target, minilm_to_mpnet, batch_size=4, progress=False)
    assert result.rows_written == 10
    stored = {p.id: p.payload for p in _points(storage, "out")}
    assert len(stored) == 10  # one point per id, none overwritten by another spelling
    assert stored[str(same)] == {}  # the canonical spelling is the point id itself
    for key in keys[1:]:
        assert stored[str(uuid.uuid5(LEAD_NAMESPACE, key))] == {"lead_id": key}
    ids = np.asarray(keys[::-1], dtype=object)
    want = minilm_to_mpnet(X[::-1])
    np.testing.assert_allclose(_fetch(target, ids), want, atol=1e-5, rtol=0)
    with open_source(target) as opened:  # as a source, any spelling of a UUID is its point
        np.testing.assert_allclose(
            opened.fetch(np.asarray(spellings[:4], dtype=object)),
            np.repeat(want[-1:], 4, axis=0),
            atol=1e-5,
            rtol=0,
        )


def test_points_without_the_vector_are_refused_or_skipped(scifact_small, minilm_to_mpnet, storage):
    X = scifact_small.corpus["minilm"][:30].copy()
    X[11] = np.nan  # point 111 has no "minilm" vector
    source = make_collection(storage, "holes", list(range(100, 130)), {"minilm": X})
    with open_source(source) as opened:
        assert opened.info.null_rows == 1
    target = f"qdrant://{storage}/holes_out"
    with pytest.raises(InvalidInputError, match="id 111"):
        migrate.apply(source, target, minilm_to_mpnet, progress=False)
    assert "holes_out" not in {c.name for c in _collections(storage)}  # nothing written
    result = migrate.apply(source, target, minilm_to_mpnet, skip_null=True, progress=False)
    assert result.rows_written == 29


def _collections(storage: str) -> list[Any]:
    client = _client(storage)
    try:
        return list(client.get_collections().collections)
    finally:
        client.close()


def test_infinity_is_refused_naming_the_point_before_anything_is_written(
    scifact_small, minilm_to_mpnet, storage
):
    X = scifact_small.corpus["minilm"][:20].copy()
    X[17, 5] = np.inf  # local mode keeps infinity (it refuses NaN)
    source = make_collection(storage, "inf", list(range(20)), X, distance="Dot")
    with open_source(source) as opened, pytest.raises(NonFiniteError, match="id 17"):
        opened.check()
    target = f"qdrant://{storage}/inf_out"
    with pytest.raises(NonFiniteError, match="id 17"):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=5, progress=False)
    assert "inf_out" not in {c.name for c in _collections(storage)}  # nothing written


def test_bad_sources_are_refused_before_anything_is_written(
    scifact_small, minilm_to_mpnet, storage, tmp_path
):
    X = scifact_small.corpus["mpnet"][:10]  # 768-d into a 384-d stitch
    source = make_collection(storage, "wide", list(range(10)), {"a": X, "b": X})
    target = f"qdrant://{storage}/wide_out"
    with pytest.raises(ShapeMismatchError, match=r"wide\.a "):
        migrate.apply(with_params(source, vector="a"), target, minilm_to_mpnet, progress=False)
    assert "wide_out" not in {c.name for c in _collections(storage)}
    with pytest.raises(StoreNotFoundError, match=r"no collection 'nope' \(collections: wide\)"):
        open_source(f"qdrant://{storage}/nope")
    with pytest.raises(StoreNotFoundError, match=r"no vector 'c' \(its vectors: 'a', 'b'\)"):
        open_source(with_params(source, vector="c"))
    with pytest.raises(InvalidInputError, match="2 named vectors"):
        open_source(source)
    missing = tmp_path / "no-storage"
    with pytest.raises(StoreNotFoundError, match="not a Qdrant local storage"):
        open_source(f"qdrant://{missing}/c")
    assert not missing.exists()
    mixed = make_collection(storage, "mixed", [3, str(uuid.UUID(int=9))], X[:2, :384])
    with open_source(mixed) as opened, pytest.raises(InvalidInputError, match="mixes"):
        opened.check()


def test_target_with_other_content_is_refused(scifact_small, minilm_to_mpnet, storage):
    X = scifact_small.corpus["minilm"][:20]
    source = make_collection(storage, "src", list(range(20)), X)
    make_collection(storage, "taken", [1, 2, 3], X[:3])
    with pytest.raises(ConflictError, match="not made by a LEAD migration"):
        migrate.apply(source, f"qdrant://{storage}/taken", minilm_to_mpnet, progress=False)
    assert len(_points(storage, "taken")) == 3
    make_collection(storage, "named", [1, 2], {"v": X[:2]})
    with pytest.raises(ConflictError, match="vector 'v' of"):
        migrate.apply(source, f"qdrant://{storage}/named?vector=v", minilm_to_mpnet, progress=False)
    out = f"qdrant://{storage}/out"
    migrate.apply(source, out, minilm_to_mpnet, progress=False)
    with pytest.raises(ConflictError, match="another migration"):
        migrate.apply(source, out, LocalTranslator("minilm-to-pml3"), progress=False)
    with pytest.raises(ConflictError, match="distance"):
        migrate.apply(source, f"{out}?distance=Dot", minilm_to_mpnet, progress=False)


def test_one_client_per_storage_folder_closed_with_the_last_store(scifact_small, storage):
    X = scifact_small.corpus["minilm"][:2]
    source = make_collection(storage, "c", [1, 2], X)
    first, second = open_source(source), open_source(source)  # one folder lock, shared
    first.close()
    np.testing.assert_allclose(second.fetch(np.array([2])), X[1:], atol=1e-6)  # still open
    second.close()
    _client(storage).close()  # the folder is free again


def test_uri_errors_and_the_api_key_is_never_shown():
    uri = "qdrant://127.0.0.1:1/c?api_key=SECRET-KEY&https=true&timeout=2"
    assert "SECRET-KEY" not in parse_store_uri(uri).uri
    with pytest.raises(StoreError, match="cannot reach Qdrant") as caught:
        open_source(uri)
    assert "SECRET-KEY" not in str(caught.value)
    with pytest.raises(InvalidInputError, match="unknown parameter 'colour'"):
        open_source("qdrant://localhost/c?colour=red")
    with pytest.raises(InvalidInputError, match="distance='L7'"):
        open_target("qdrant://localhost/c?distance=L7")
    with pytest.raises(InvalidInputError, match="keeps nothing"):
        open_target("qdrant://:memory:/c")
    with pytest.raises(InvalidInputError, match="table= is not a Qdrant parameter"):
        open_source("qdrant://localhost/c?table=t")
    shown = parse_store_uri("postgresql://u:pw@h/db?table=t&password=pw2&sslmode=require")
    assert shown.uri == "postgresql://u:***@h/db?password=***&sslmode=require"
    assert parse_store_uri("qdrant:///srv/qdrant/c").uri == "qdrant:///srv/qdrant/c"


@pytest.fixture
def refusing_server() -> Iterator[tuple[str, list[int]]]:
    """A loopback HTTP server that answers every request with the status in ``status[0]``
    and a Qdrant error body, as a server with an API key does to a wrong one (401/403)."""
    status = [401]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"status": {"error": "Must provide an API key"}}).encode()
            self.send_response(status[0])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"qdrant://127.0.0.1:{server.server_address[1]}", status
    server.shutdown()
    server.server_close()


def test_server_answers_become_lead_errors(refusing_server):
    address, status = refusing_server
    with pytest.raises(StoreError, match=r"refused the API key \(HTTP 401\)"):
        open_source(f"{address}/c")
    status[0] = 404
    with pytest.raises(StoreNotFoundError, match="Must provide"):
        open_source(f"{address}/c")
    status[0] = 500
    with open_target(f"{address}/c") as target, pytest.raises(StoreError, match="HTTP 500"):
        target.fetch(np.arange(3))


def _vectors(storage: str, name: str) -> set[str]:
    client = _client(storage)
    try:
        config = client.get_collection(name).config
    finally:
        client.close()
    vectors = config.params.vectors
    return set(vectors) if isinstance(vectors, dict) else {""}


def test_a_new_vector_for_ids_that_are_not_points_is_refused_before_anything_is_written(
    scifact_small, minilm_to_mpnet, storage, tmp_path
):
    X = scifact_small.corpus["minilm"][:41]
    make_collection(storage, "ints", list(range(40)), {"old": X[:40]})
    before = {p.id: p.vector for p in _points(storage, "ints")}
    target = f"qdrant://{storage}/ints?vector=newv"
    other = make_collection(storage, "other", list(range(41)), X)  # id 40 is not in "ints"
    with pytest.raises(InvalidInputError, match=r"id 40 .*not a point"):
        migrate.apply(other, target, minilm_to_mpnet, batch_size=10, progress=False)
    assert _vectors(storage, "ints") == {"old"}  # id 40 is in the last batch: nothing added
    ids = np.arange(41, dtype=np.int64)
    ids[-1] = -1  # refused before the vector is added, though the last row read
    source = write_parquet(tmp_path / "neg.parquet", ids.tolist(), X)
    with pytest.raises(InvalidInputError, match="id -1: Qdrant point ids are unsigned"):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=10, progress=False)
    assert _vectors(storage, "ints") == {"old"}
    client = _client(storage)
    try:
        assert not client.get_collection("ints").config.metadata  # no checkpoint either
    finally:
        client.close()
    assert {p.id: p.vector for p in _points(storage, "ints")} == before
    own = f"qdrant://{storage}/ints?vector=old"
    result = migrate.apply(own, target, minilm_to_mpnet, progress=False)
    assert result.rows_written == 40  # the collection's own ids: no second read needed


def test_a_negative_id_leaves_no_collection_behind(
    scifact_small, minilm_to_mpnet, storage, tmp_path
):
    X = scifact_small.corpus["minilm"][:20]
    source = write_parquet(tmp_path / "neg.parquet", list(range(-1, 19)), X)
    with pytest.raises(InvalidInputError, match="id -1: Qdrant point ids are unsigned"):
        migrate.apply(source, f"qdrant://{storage}/neg", minilm_to_mpnet, progress=False)
    assert "neg" not in {c.name for c in _collections(storage)}


def test_a_storage_folder_below_a_file_is_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for uri in (f"qdrant://{afile}/c", f"qdrant://{afile}/sub/c"):
        with pytest.raises(InvalidInputError, match=f"{afile} is a file, not a folder"):
            open_target(uri)
    assert afile.read_text() == "not a folder"


@pytest.fixture(scope="module")
def scored(tmp_path_factory, scifact_small) -> LocalTranslator:
    from tests.migrate._data import scored_stitch

    return LocalTranslator(scored_stitch(tmp_path_factory.mktemp("scored") / "s", scifact_small))


@pytest.mark.parametrize("new_collection", [True, False])
def test_the_confidence_is_a_payload_field_written_once_across_resume(
    scifact_small, scored, storage, new_collection
):
    X = scifact_small.corpus["minilm"][:200]
    ids = list(range(len(X)))
    source = make_collection(storage, "src", ids, {"minilm": X})
    target = (
        f"qdrant://{storage}/out?distance=Dot"
        if new_collection
        else with_params(source, vector="mpnet")
    )
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(
            with_params(source, vector="minilm"), target, scored, batch_size=50,
            progress=stop_after(2), confidence_column="confidence",
        )  # fmt: skip
    result = migrate.apply(
        with_params(source, vector="minilm"),
        target,
        scored,
        batch_size=50,
        progress=False,
        confidence_column="confidence",
    )
    assert (result.resumed_from, result.rows_written) == (100, len(X) - 100)
    points = sorted(_points(storage, "out" if new_collection else "src"), key=lambda p: p.id)
    assert [p.id for p in points] == ids
    _, _, expected, _ = scored.translate_scored(X)
    got = np.asarray([p.payload["confidence"] for p in points], dtype=np.float32)
    assert got.tobytes() == expected.tobytes()  # float32 values survive the JSON payload


def test_a_confidence_field_is_refused_without_a_head(scifact_small, unscored, storage):
    X = scifact_small.corpus["minilm"][:20]
    source = make_collection(storage, "src", list(range(20)), X)
    target = f"qdrant://{storage}/out"
    with pytest.raises(InvalidInputError, match="has no confidence head"):
        migrate.apply(source, target, unscored, progress=False, confidence_column="c")
    client = _client(storage)
    try:
        assert not client.collection_exists("out")
    finally:
        client.close()


def test_a_confidence_field_never_overwrites_a_payload(scifact_small, scored, storage, tmp_path):
    """``lead_id`` holds text ids; in an existing collection, a field its points have is
    theirs: both refused before anything is written."""
    X = scifact_small.corpus["minilm"][:20]
    texts = write_parquet(tmp_path / "texts.parquet", [f"d{i}" for i in range(20)], X)
    with pytest.raises(InvalidInputError, match="cannot be named 'lead_id'"):
        migrate.apply(
            texts, f"qdrant://{storage}/out", scored, progress=False, confidence_column="lead_id"
        )
    source = make_collection(storage, "src", list(range(20)), {"minilm": X})
    client = _client(storage)
    try:
        assert not client.collection_exists("out")
        client.set_payload("src", payload={"title": "kept"}, points=[3], wait=True)
    finally:
        client.close()
    with pytest.raises(ConflictError, match="1 points of 'src' have a payload field 'title'"):
        migrate.apply(
            with_params(source, vector="minilm"), with_params(source, vector="mpnet"), scored,
            progress=False, confidence_column="title",
        )  # fmt: skip
    assert [p.payload for p in _points(storage, "src") if p.id == 3] == [{"title": "kept"}]
    assert all(set(p.vector) == {"minilm"} for p in _points(storage, "src"))


def test_a_zero_vector_is_refused_before_anything_is_written(
    scifact_small, minilm_to_mpnet, storage
):
    X = scifact_small.corpus["minilm"][:30].copy()
    X[17] = 0.0  # a unit-input stitch cannot scale it
    source = make_collection(storage, "zeros", list(range(30)), X, distance="Dot")
    with pytest.raises(ZeroVectorError, match=r"id 17 in .* is all zeros"):
        migrate.apply(source, f"qdrant://{storage}/zeros_out", minilm_to_mpnet, progress=False)
    client = _client(storage)
    try:
        assert not client.collection_exists("zeros_out")
    finally:
        client.close()
