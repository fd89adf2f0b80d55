"""pgvector source and target on a real PostgreSQL: round trips, resume, bad input."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lead import migrate
from lead.errors import (
    ConflictError,
    InvalidInputError,
    ShapeMismatchError,
    StoreError,
    StoreNotFoundError,
)
from lead.migrate.apply import run_apply
from lead.migrate.registry import open_source, open_target
from lead.migrate.stores import with_params
from lead.migrate.translator import LocalTranslator
from tests.migrate.conftest import checksum, make_table, sql


def _fetch(target: str, ids: np.ndarray) -> np.ndarray:
    with open_target(target) as opened:
        return opened.fetch(ids)


@pytest.fixture(scope="module")
def minilm_to_mpnet() -> LocalTranslator:
    return LocalTranslator("minilm-to-mpnet")


def test_apply_new_table_matches_in_process_translation(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64) * 7 + 3
    source = make_table(pg_uri, "t_new", ids, X)
    before = checksum(pg_uri, "t_new")
    target = with_params(pg_uri, table="t_new_mpnet", column="emb")
    result = migrate.apply(source, target, minilm_to_mpnet, batch_size=97, progress=False)
    assert (result.rows_written, result.rows_total) == (len(X), len(X))
    got = _fetch(target, ids)
    np.testing.assert_allclose(got, minilm_to_mpnet(X), atol=1e-5, rtol=0)
    assert sql(pg_uri, "SELECT count(*), count(DISTINCT id) FROM t_new_mpnet")[0] == (
        len(X),
        len(X),
    )
    assert checksum(pg_uri, "t_new") == before
    again = migrate.apply(source, target, minilm_to_mpnet, progress=False)
    assert again.already_done and again.rows_written == 0


def test_apply_new_column_text_ids_and_halfvec(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:120]
    ids = np.asarray(scifact_small.corpus_ids[:120], dtype=object)
    source = make_table(pg_uri, "t_text", ids, X)
    before = checksum(pg_uri, "t_text")
    target = with_params(pg_uri, table="t_text", column="emb_mpnet", type="halfvec")
    migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    got = _fetch(target, ids[::-1])
    np.testing.assert_allclose(got, minilm_to_mpnet(X[::-1]), atol=2e-3, rtol=0)  # float16
    assert checksum(pg_uri, "t_text") == before
    kind = sql(
        pg_uri,
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 't_text'::regclass AND attname = 'emb_mpnet'",
    )
    assert kind == [("halfvec(768)",)]


def test_resume_after_partial_run_writes_each_row_once(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64)
    source = make_table(pg_uri, "t_resume", ids, X)
    target = with_params(pg_uri, table="t_resume_out", column="emb")
    stopped = []

    def stop_after_three(done: int, total: int) -> None:
        stopped.append(done)
        if len(stopped) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=stop_after_three)
    assert sql(pg_uri, "SELECT count(*) FROM t_resume_out")[0][0] == 150
    result = migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    assert (result.resumed_from, result.rows_written) == (150, len(X) - 150)
    got = _fetch(target, ids)
    np.testing.assert_allclose(got, minilm_to_mpnet(X), atol=1e-5, rtol=0)


def test_null_vectors_are_refused_or_skipped(pg_uri, scifact_small, minilm_to_mpnet):
    X = list(scifact_small.corpus["minilm"][:30])
    X[11] = None
    ids = np.arange(30, dtype=np.int64) + 100
    source = make_table(pg_uri, "t_null", ids, X)
    with open_source(source) as opened:
        assert opened.info.null_rows == 1
    target = with_params(pg_uri, table="t_null_out", column="emb")
    with pytest.raises(InvalidInputError, match="id 111"):
        migrate.apply(source, target, minilm_to_mpnet, progress=False)
    assert sql(pg_uri, "SELECT to_regclass('t_null_out')")[0][0] is None  # nothing written
    result = migrate.apply(source, target, minilm_to_mpnet, skip_null=True, progress=False)
    assert result.rows_written == 29


def test_bad_input_is_refused_before_anything_is_written(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["mpnet"][:10]  # 768-d into a 384-d stitch
    source = make_table(pg_uri, "t_dim", np.arange(10), X)
    target = with_params(pg_uri, table="t_dim_out", column="emb")
    with pytest.raises(ShapeMismatchError, match="emb"):
        migrate.apply(source, target, minilm_to_mpnet, progress=False)
    assert sql(pg_uri, "SELECT to_regclass('t_dim_out')")[0][0] is None
    with pytest.raises(StoreNotFoundError, match="no table"):
        open_source(with_params(pg_uri, table="nope", column="emb"))
    with pytest.raises(StoreNotFoundError, match="no column"):
        open_source(with_params(pg_uri, table="t_dim", column="nope"))
    bad_password = pg_uri.replace("postgres:@", "nobody:secret@")
    with pytest.raises(StoreError) as caught:
        open_source(with_params(bad_password, table="t_dim", column="emb"))
    assert "secret" not in str(caught.value)


def test_target_with_other_content_is_refused(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:20]
    source = make_table(pg_uri, "t_conflict", np.arange(20), X)
    make_table(pg_uri, "t_conflict_taken", np.arange(3), X[:3])
    taken = with_params(pg_uri, table="t_conflict_taken", column="emb")
    with pytest.raises(ConflictError, match="not made by a LEAD migration"):
        migrate.apply(source, taken, minilm_to_mpnet, progress=False)
    assert sql(pg_uri, "SELECT count(*) FROM t_conflict_taken")[0][0] == 3
    out = with_params(pg_uri, table="t_conflict_out", column="emb")
    migrate.apply(source, out, minilm_to_mpnet, progress=False)
    with pytest.raises(ConflictError, match="another migration"):
        migrate.apply(source, out, LocalTranslator("minilm-to-pml3"), progress=False)


def test_next_batch_is_translated_while_a_batch_is_written(pg_uri, scifact_small, minilm_to_mpnet):
    # in-process apply overlaps batch k+1's translation with batch k's write (CPU for the
    # stitch while PostgreSQL stores rows); before, each write waited for the next translation
    X = scifact_small.corpus["minilm"][:200]
    source = make_table(pg_uri, "t_overlap", np.arange(200), X)
    target = with_params(pg_uri, table="t_overlap_out", column="emb")
    started = threading.Semaphore(0)  # released when a batch's translation starts

    class Watched:  # the real translator, noting each start
        ref, concurrency = minilm_to_mpnet.ref, 1

        def __call__(self, rows: np.ndarray) -> np.ndarray:
            started.release()
            return minilm_to_mpnet(rows)

    overlapped = []
    with open_source(source) as src, open_target(target) as tgt:
        write = tgt.write

        def watched_write(ids, vectors, progress) -> None:
            started.acquire()  # this batch's own start
            if progress.rows_written < 200:  # the next one starts before this write returns
                overlapped.append(started.acquire(timeout=5))
                if overlapped[-1]:
                    started.release()  # for the next write's own start
            write(ids, vectors, progress)

        tgt.write = watched_write
        run_apply(src, tgt, Watched(), batch_size=50, progress=False)
    assert overlapped == [True, True, True]
    got = _fetch(target, np.arange(200))
    np.testing.assert_allclose(got, minilm_to_mpnet(X), atol=1e-5, rtol=0)
