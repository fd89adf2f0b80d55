"""``lead migrate apply --server``: translation through a running LEAD service (a real uvicorn
on loopback) gives the in-process bytes, split to the server's Arrow limit."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from lead import migrate
from lead.errors import StitchNotFoundError
from lead.migrate.registry import open_target
from lead.migrate.stores import with_params
from lead.migrate.translator import LocalTranslator, RemoteTranslator
from scripts._harness import Server
from tests.migrate._data import stop_after
from tests.migrate.conftest import make_table

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("server-data")
    running = Server(
        data,
        LEAD_STITCHES='["models/minilm-to-mpnet"]',
        LEAD_MAX_VECTORS_ARROW="100",  # the client must split every batch
        LEAD_ENABLE_JOBS="false",
    ).start()
    yield running
    running.stop()


def test_apply_through_the_server_equals_in_process(server, pg_uri, scifact_small, tmp_path):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64) + 1
    source = make_table(pg_uri, "srv_src", ids, X)
    via_server = with_params(pg_uri, table="srv_out", column="emb")
    result = migrate.apply(
        source, via_server, "minilm-to-mpnet", server=server.url, batch_size=256, progress=False
    )
    assert result.rows_written == len(X)
    in_process = str(tmp_path / "local")
    migrate.apply(source, in_process, "minilm-to-mpnet", batch_size=256, progress=False)
    with open_target(via_server) as a, open_target(in_process) as b:
        assert np.array_equal(a.fetch(ids), b.fetch(ids))  # batch-invariant: the same bytes


def test_a_run_started_in_process_resumes_through_the_server(server, scifact_small, tmp_path):
    X = scifact_small.corpus["minilm"]
    np.save(tmp_path / "x.npy", X)
    target = str(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(
            str(tmp_path / "x.npy"),
            target,
            "minilm-to-mpnet",
            batch_size=64,
            progress=stop_after(2),
        )
    result = migrate.apply(
        str(tmp_path / "x.npy"),
        target,
        "minilm-to-mpnet",
        server=server.url,
        batch_size=64,
        progress=False,
    )
    assert (result.resumed_from, result.rows_total) == (128, len(X))
    with open_target(target) as opened:
        got = opened.fetch(np.arange(len(X)))
    assert np.abs(got - LocalTranslator("minilm-to-mpnet")(X)).max() <= 1e-6


def test_a_stitch_the_server_does_not_serve_is_refused(server):
    with pytest.raises(StitchNotFoundError):
        RemoteTranslator(server.url, "minilm-to-e5")


def test_a_confidence_column_through_the_server_equals_in_process(server, scifact_small, tmp_path):
    """The bundled stitch has a confidence head: the server scores the rows
    (``return_confidence``), split into its Arrow limit, with the in-process bytes."""
    import pyarrow.parquet as pq

    from tests.migrate._data import write_parquet

    X = scifact_small.corpus["minilm"][:250]
    source = write_parquet(tmp_path / "src.parquet", np.arange(len(X)), X)
    tables = {}
    for name, where in (("server", server.url), ("local", None)):
        target = tmp_path / name
        result = migrate.apply(
            source, str(target), "minilm-to-mpnet", server=where, batch_size=120,
            progress=False, confidence_column="conf",
        )  # fmt: skip
        assert result.rows_written == len(X)
        tables[name] = pq.read_table(target).sort_by("id")
    for column in ("conf", "embedding"):
        a, b = tables["server"].column(column), tables["local"].column(column)
        assert a.equals(b), column
    assert tables["server"].schema.field("conf").type == "float"
