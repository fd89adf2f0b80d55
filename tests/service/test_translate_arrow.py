"""POST /v1/translate with Arrow IPC streams (application/vnd.apache.arrow.stream): the
same answer as JSON bit for bit, columns passed through, every bad stream a clear 4xx."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from service_helpers import b64, unb64

ARROW = "application/vnd.apache.arrow.stream"
HEADERS = {"content-type": ARROW}
STITCH = {"stitch": "minilm-to-mpnet"}


def vectors(x: np.ndarray, d: int | None = None) -> pa.FixedSizeListArray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), d or x.shape[1])


def stream(*batches: pa.RecordBatch, **write: Any) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(**write)
    with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def body_of(x: np.ndarray, **columns: Any) -> bytes:
    """One batch: ``embedding`` from ``x`` plus ``columns``."""
    data = {"embedding": vectors(x), **columns}
    return stream(pa.RecordBatch.from_pydict(data))


def post(client: TestClient, body: bytes, params: dict[str, Any] | None = None, **kw: Any) -> Any:
    headers = {**HEADERS, **kw.pop("headers", {})}
    query = STITCH if params is None else params
    return client.post("/v1/translate", content=body, params=query, headers=headers, **kw)


def answer(response: Any) -> tuple[pa.Table, dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == ARROW
    table = pa.ipc.open_stream(response.content).read_all()
    return table, json.loads(table.schema.metadata[b"lead"])


def column_vectors(table: pa.Table, name: str = "embedding") -> np.ndarray:
    column = table.column(name).combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), -1)


def json_answer(client: TestClient, x: np.ndarray, **options: Any) -> tuple[np.ndarray, Any]:
    body = {**STITCH, "input": b64(x), "encoding_format": "base64", **options}
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 200, r.text
    payload = r.json()
    return unb64([d["embedding"] for d in payload.pop("data")]), payload


def test_arrow_equals_json_bit_for_bit(client: TestClient, queries: Any) -> None:
    x = queries["minilm"]
    expected, fields = json_answer(client, x)
    table, metadata = answer(post(client, body_of(x)))
    got = column_vectors(table)
    assert got.dtype == np.float32 and got.shape == (100, 768)
    assert np.array_equal(got, expected)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 768)
    fields.pop("object")
    assert metadata == fields
    assert metadata["usage"] == {"vectors": 100} and metadata["stitch"]["chain"] == [
        "minilm-to-mpnet"
    ]


@pytest.mark.parametrize(
    "options",
    [
        {"normalize": True},
        {"direction": "forward", "strict": True},
    ],
)
def test_arrow_options_from_the_query_match_json(
    client: TestClient, queries: Any, fitted: Any, options: dict[str, Any]
) -> None:
    x = queries["minilm"][:20] * 3.0  # off unit length: rescaled_inputs counts them
    expected, fields = json_answer(client, x, **options)
    fields.pop("object")
    # "True" as Python's requests writes a boolean parameter, "true" as httpx and curl users
    for spell in (str, lambda v: str(v).lower()):
        params = {**STITCH, **{k: spell(v) for k, v in options.items()}}
        table, metadata = answer(post(client, body_of(x), params))
        assert np.array_equal(column_vectors(table), expected)
        assert metadata == fields and metadata["rescaled_inputs"] == 20


def test_arrow_by_models_through_a_chain(make_client: Any, queries: Any, fitted: Any) -> None:
    client = make_client(["minilm-to-pml3", "pml3-to-mpnet"])
    x = queries["minilm"][:10]
    models = {"source_model": fitted.models["minilm"], "target_model": fitted.models["mpnet"]}
    expected, fields = json_answer(client, x, **{**models, "stitch": None})
    table, metadata = answer(post(client, body_of(x), models))
    assert metadata["stitch"]["chain"] == ["minilm-to-pml3", "pml3-to-mpnet"]
    assert metadata["model"] == fitted.models["mpnet"]
    fields.pop("object")
    assert metadata == fields
    assert np.array_equal(column_vectors(table), expected)
    np.testing.assert_allclose(
        column_vectors(table), fitted.expected(["minilm-to-pml3", "pml3-to-mpnet"], x), atol=1e-5
    )


@pytest.mark.parametrize(
    "ids",
    [
        pa.array(np.arange(1000, 1030, dtype=np.int64)),
        pa.array([f"doc-{i}" for i in range(30)]),
        pa.array([f"k{i}" for i in range(30)]).dictionary_encode(),
    ],
    ids=["int64", "string", "dictionary"],
)
def test_other_columns_pass_through_in_order(client: TestClient, queries: Any, ids: Any) -> None:
    """Three batches of 10, 0 and 20 rows: the answer keeps them, the id column untouched
    (type and values), and equals one JSON request for all 30 rows."""
    x = queries["minilm"][:30]
    payload = pa.array([{"a": i} for i in range(30)])
    batch = pa.RecordBatch.from_pydict({"id": ids, "embedding": vectors(x), "payload": payload})
    body = stream(batch.slice(0, 10), batch.slice(10, 0), batch.slice(10, 20))
    expected, _ = json_answer(client, x)
    r = post(client, body)
    reader = pa.ipc.open_stream(r.content)
    assert [b.num_rows for b in reader] == [10, 0, 20]
    table, metadata = answer(r)
    assert table.column_names == ["id", "embedding", "payload"]
    assert table.column("id").combine_chunks().equals(ids)
    assert table.column("payload").combine_chunks().equals(payload)
    assert np.array_equal(column_vectors(table), expected)
    assert metadata["usage"] == {"vectors": 30}


def test_the_only_fixed_size_list_column_is_the_vectors(client: TestClient, queries: Any) -> None:
    x = queries["minilm"][:4]
    batch = pa.RecordBatch.from_pydict({"key": ["a", "b", "c", "d"], "vector": vectors(x)})
    table, _ = answer(post(client, stream(batch)))
    assert table.column_names == ["key", "vector"]
    assert np.array_equal(column_vectors(table, "vector"), json_answer(client, x)[0])


def test_gzip_content_encoding(client: TestClient, queries: Any) -> None:
    x = queries["minilm"][:8]
    r = post(client, gzip.compress(body_of(x)), headers={"content-encoding": "gzip"})
    table, _ = answer(r)
    assert np.array_equal(column_vectors(table), json_answer(client, x)[0])


def _two_lists(x: np.ndarray) -> bytes:
    return stream(pa.RecordBatch.from_pydict({"a": vectors(x), "b": vectors(x)}))


def _nulls(x: np.ndarray, *, in_values: bool) -> bytes:
    flat = pa.array(x.ravel(), mask=np.arange(x.size) == 2 * 384 + 5) if in_values else None
    values = flat if flat is not None else pa.array(x.ravel())
    mask = None if in_values else pa.array(np.arange(len(x)) == 3)
    column = pa.FixedSizeListArray.from_arrays(values, 384, mask=mask)
    return stream(pa.RecordBatch.from_pydict({"embedding": column}))


def _zstd(x: np.ndarray) -> bytes:
    return stream(pa.RecordBatch.from_pydict({"embedding": vectors(x)}), compression="zstd")


def _zstd_dictionary(x: np.ndarray) -> bytes:
    ids = pa.array([f"k{i}" for i in range(len(x))]).dictionary_encode()
    batch = pa.RecordBatch.from_pydict({"id": ids, "embedding": vectors(x)})
    return stream(batch, compression="zstd")


def _bad_offsets(x: np.ndarray) -> bytes:
    """String ids whose last offset points past their data (a crafted stream)."""
    body = body_of(x[:3], id=pa.array(["a", "b", "c"]))
    offsets = np.array([0, 1, 2, 3], "<i4").tobytes()
    assert body.count(offsets) == 1
    return body.replace(offsets, np.array([0, 1, 2, 1000], "<i4").tobytes())


def _ipc_file(x: np.ndarray) -> bytes:
    batch = pa.RecordBatch.from_pydict({"embedding": vectors(x)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def _with_value(x: np.ndarray, row: int, value: float) -> bytes:
    x = x.copy()
    x[row, 7] = value
    return body_of(x)


def _bad_name(x: np.ndarray, column: str) -> bytes:
    """A column name whose bytes are not UTF-8 (an adversarial pass: a 500)."""
    body = body_of(x, idZ=pa.array(range(len(x))))
    name = column.encode()
    return body.replace(name, name[:-1] + b"\xff", 1)


BAD_STREAMS: dict[str, tuple[Callable[[np.ndarray], bytes], int, str, str | None]] = {
    "not arrow": (lambda x: b"hello, not arrow", 400, "decode_error", "body"),
    "json": (lambda x: b' {"input": [[0.1]]}', 400, "decode_error", "body"),
    "empty body": (lambda x: b"", 400, "decode_error", "body"),
    "truncated": (lambda x: body_of(x)[:-500], 400, "decode_error", "body"),
    "trailing bytes": (lambda x: body_of(x) + b"junk", 400, "decode_error", "body"),
    "ipc file": (_ipc_file, 400, "decode_error", "body"),
    "zstd batches": (_zstd, 400, "decode_error", "body"),
    "zstd dictionary": (_zstd_dictionary, 400, "decode_error", "body"),
    "bad offsets": (_bad_offsets, 400, "decode_error", "body"),
    "schema only": (lambda x: stream_without_batches(), 400, "invalid_input", "input"),
    "wrong size": (lambda x: body_of(x[:, :300]), 422, "shape_mismatch", "embedding"),
    "float64": (
        lambda x: body_of(
            x,
            embedding=pa.FixedSizeListArray.from_arrays(
                pa.array(x.ravel().astype(np.float64)), 384
            ),
        ),
        400,
        "invalid_input",
        "embedding",
    ),
    "variable list": (
        lambda x: body_of(x, embedding=pa.array(x.tolist(), pa.list_(pa.float32()))),
        400,
        "invalid_input",
        "embedding",
    ),
    "no vector column": (
        lambda x: stream(pa.RecordBatch.from_pydict({"id": [1, 2]})),
        400,
        "invalid_input",
        "body",
    ),
    "two list columns": (_two_lists, 400, "invalid_input", "body"),
    "column name not utf-8": (lambda x: _bad_name(x, "idZ"), 400, "decode_error", "body"),
    "vector name not utf-8": (lambda x: _bad_name(x, "embedding"), 400, "decode_error", "body"),
    "null vector": (lambda x: _nulls(x, in_values=False), 400, "invalid_input", "input[3]"),
    "null value": (lambda x: _nulls(x, in_values=True), 400, "invalid_input", "input[2]"),
    "nan": (lambda x: _with_value(x, 4, np.nan), 422, "non_finite_input", "input[4]"),
    "infinity": (lambda x: _with_value(x, 1, np.inf), 422, "non_finite_input", "input[1]"),
    "zero vector": (
        lambda x: body_of(np.vstack([x[:2], np.zeros((1, 384), np.float32)])),
        422,
        "zero_vector",
        "input[2]",
    ),
}


def stream_without_batches() -> bytes:
    sink = pa.BufferOutputStream()
    schema = pa.schema([("embedding", pa.list_(pa.float32(), 384))])
    with pa.ipc.new_stream(sink, schema):
        pass
    return bytes(sink.getvalue().to_pybytes())


@pytest.mark.parametrize("case", list(BAD_STREAMS))
def test_bad_streams_get_a_clear_4xx_and_the_next_request_answers(
    client: TestClient, queries: Any, case: str
) -> None:
    make, status, code, param = BAD_STREAMS[case]
    x = queries["minilm"][:6]
    r = post(client, make(x))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert r.headers["content-type"] == "application/json"
    json_hint = "it looks like JSON: send JSON as Content-Type: application/json"
    assert (json_hint in error["message"]) is (case == "json"), error  # a new user's trial
    table, _ = answer(post(client, body_of(x)))
    assert table.num_rows == 6


def test_too_many_rows_across_batches(make_client: Any, queries: Any) -> None:
    client = make_client(max_vectors=4, max_vectors_arrow=10)
    x = queries["minilm"][:11]
    batch = pa.RecordBatch.from_pydict({"embedding": vectors(x)})
    r = post(client, stream(batch.slice(0, 6), batch.slice(6, 5)))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "limit_exceeded"
    assert "the limit is 10" in r.json()["error"]["message"]
    table, _ = answer(post(client, body_of(x[:10])))  # over max_vectors (JSON), under Arrow's
    assert table.num_rows == 10
    r = client.post("/v1/translate", json={**STITCH, "input": b64(x[:10])})
    assert r.status_code == 422 and r.json()["error"]["code"] == "limit_exceeded"


def test_a_stream_of_too_many_batches_is_refused(client: TestClient, queries: Any) -> None:
    """Every batch costs a read whatever its rows: a million empty ones took 28 s."""
    from service._arrow_stream import MAX_MESSAGES

    x = queries["minilm"][:2]
    batch = pa.RecordBatch.from_pydict({"embedding": vectors(x)})
    empty = batch.slice(0, 0)
    r = post(client, stream(*[empty] * MAX_MESSAGES, batch))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("limit_exceeded", "body")
    assert "fewer, larger batches" in error["message"]
    table, _ = answer(post(client, stream(*[empty] * 100, batch)))  # under the limit
    assert table.num_rows == 2


def test_a_stream_of_many_wide_batches_is_refused(client: TestClient, queries: Any) -> None:
    """Reading a batch costs in proportion to its columns: 4,096 one-row batches of 3,000
    null columns took 16-21 s. Their metadata is bounded instead."""
    x = queries["minilm"][:1]
    columns: dict[str, Any] = {f"c{i}": pa.nulls(1) for i in range(3000)}
    wide = pa.RecordBatch.from_pydict({**columns, "embedding": vectors(x)})
    start = time.perf_counter()
    r = post(client, stream(*[wide] * 200))
    assert r.status_code == 422, r.text[:300]
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("limit_exceeded", "body")
    assert "metadata" in error["message"]
    assert time.perf_counter() - start < 10
    table, _ = answer(post(client, stream(*[wide] * 2)))  # a few wide batches pass
    assert table.num_rows == 2 and table.num_columns == 3001


def test_a_schema_of_hundreds_of_thousands_of_fields_is_refused_unread(
    client: TestClient,
) -> None:
    """A 260 MB schema of 6.5 million null fields cost 16 s and 2 GB to build before its
    400 (an adversarial pass); its size is bounded like the batches' metadata."""
    from service._arrow_stream import MAX_METADATA_BYTES

    fields = [pa.field(f"c{i}", pa.null()) for i in range(MAX_METADATA_BYTES // 40)]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema(fields)):
        pass
    start = time.perf_counter()
    r = post(client, sink.getvalue().to_pybytes())
    assert r.status_code == 422, r.text[:300]
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("limit_exceeded", "body")
    assert "schema exceeds" in error["message"]
    assert time.perf_counter() - start < 5


def test_arrow_bodies_have_their_own_byte_limit(make_client: Any, queries: Any) -> None:
    x = queries["minilm"][:20]  # about 31 kB either way
    client = make_client(max_body_bytes=20_000, max_body_bytes_arrow=40_000)
    assert len(body_of(x)) > 20_000
    table, _ = answer(post(client, body_of(x)))
    assert table.num_rows == 20
    r = client.post("/v1/translate", json={**STITCH, "input": b64(x)})
    assert r.status_code == 413, r.text
    r = post(client, body_of(queries["minilm"][:30]))
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "payload_too_large"
    assert "40000" in r.json()["error"]["message"]
    limits = client.get("/v1/info").json()["limits"]
    assert (limits["max_vectors_arrow"], limits["max_body_bytes_arrow"]) == (65_536, 40_000)


@pytest.mark.parametrize(
    ("params", "status", "code", "param"),
    [
        ({}, 422, "validation_error", None),
        ({"stitch": "nope"}, 404, "stitch_not_found", "stitch"),
        ({**STITCH, "normalize": "yes"}, 422, "validation_error", "normalize"),
        ({**STITCH, "direction": "sideways"}, 422, "validation_error", "direction"),
        ({**STITCH, "encoding_format": "base64"}, 422, "validation_error", "encoding_format"),
        ({**STITCH, "colour": "blue"}, 422, "validation_error", "colour"),
        ({"stitch": ["minilm-to-mpnet", "minilm-to-pml3"]}, 422, "validation_error", "stitch"),
    ],
)
def test_bad_query_options(
    client: TestClient,
    queries: Any,
    params: dict[str, Any],
    status: int,
    code: str,
    param: str | None,
) -> None:
    r = post(client, body_of(queries["minilm"][:2]), params)
    assert r.status_code == status, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)
    if params.get("normalize") == "yes":
        assert "normalize: must be true or false, got 'yes'" in r.json()["error"]["message"]


def test_json_bodies_refuse_options_in_the_query(client: TestClient, queries: Any) -> None:
    """``?normalize=true`` beside a JSON body would be ignored: it is a 422 instead."""
    body = {**STITCH, "input": b64(queries["minilm"][:2])}
    r = client.post("/v1/translate", params={"normalize": "true"}, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == "normalize"
    assert f"Arrow bodies only (Content-Type: {ARROW})" in r.json()["error"]["message"]
    r = client.post("/v1/translate", params={"unrelated": "1"}, json=body)
    assert r.status_code == 422, r.text  # a parameter no route takes: named too
    assert r.json()["error"]["param"] == "unrelated"
    assert client.post("/v1/translate", json=body).status_code == 200


def test_a_json_body_sent_as_arrow_is_named_before_its_missing_query(
    client: TestClient, queries: Any
) -> None:
    """A new user's trial: the README's JSON body under the Arrow content type, with no
    query string, got 422 "give `stitch`", not the hint to send it as JSON."""
    body = json.dumps({**STITCH, "input": b64(queries["minilm"][:2])}).encode()
    for params in ({}, STITCH):
        r = post(client, body, params)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["code"], error["param"]) == ("decode_error", "body"), error
        assert "it looks like JSON: send JSON as Content-Type: application/json" in error["message"]
    answer(post(client, body_of(queries["minilm"][:2])))


def test_arrow_is_accepted_on_translate_only(client: TestClient, queries: Any) -> None:
    body = body_of(queries["minilm"][:4])
    for path in ("/v1/align", "/v1/jobs"):
        r = client.post(path, content=body, headers=HEADERS)
        assert r.status_code == 415, (path, r.text)
    r = client.post("/v1/translate", content=body, headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert ARROW in r.json()["error"]["message"]


def test_openapi_documents_arrow(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/translate"]["post"]
    assert ARROW in operation["requestBody"]["content"]
    assert ARROW in operation["responses"]["200"]["content"]
    assert "application/json" in operation["responses"]["200"]["content"]
    names = [p["name"] for p in operation["parameters"] if p["in"] == "query"]
    assert names == [
        "stitch",
        "source_model",
        "target_model",
        "direction",
        "normalize",
        "strict",
        "return_confidence",
    ]
