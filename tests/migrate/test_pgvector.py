"""pgvector source and target on a real PostgreSQL: round trips, resume, bad input."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from lead import migrate
from lead.errors import (
    ConflictError,
    InvalidInputError,
    ShapeMismatchError,
    StoreError,
    StoreNotFoundError,
    ZeroVectorError,
)
from lead.migrate.apply import migration_spec, run_apply
from lead.migrate.partitions import partition_store, plan_partitions
from lead.migrate.registry import open_source, open_target
from lead.migrate.stores import with_params
from lead.migrate.translator import LocalTranslator
from tests.migrate._data import stop_after, write_parquet
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
    result = migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    assert "type=halfvec" in result.target  # what apply prints names the target as given
    got = _fetch(target, ids[::-1])
    np.testing.assert_allclose(got, minilm_to_mpnet(X[::-1]), atol=2e-3, rtol=0)  # float16
    assert checksum(pg_uri, "t_text") == before
    kind = sql(
        pg_uri,
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 't_text'::regclass AND attname = 'emb_mpnet'",
    )
    assert kind == [("halfvec(768)",)]
    again = migrate.apply(source, target, minilm_to_mpnet, progress=False)  # the resume checks
    assert again.already_done
    make_table(pg_uri, "t_text_docs", ids[1:], X[1:])  # another table lacks the first id
    other = with_params(pg_uri, table="t_text_docs", column="emb_mpnet", type="halfvec")
    with pytest.raises(InvalidInputError, match=f"id {ids[0]!r} of the source"):
        migrate.apply(source, other, minilm_to_mpnet, progress=False)
    assert _columns(pg_uri, "t_text_docs") == ["id", "emb"]


def test_resume_after_partial_run_writes_each_row_once(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64)
    source = make_table(pg_uri, "t_resume", ids, X)
    target = with_params(pg_uri, table="t_resume_out", column="emb")
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=stop_after(3))
    assert sql(pg_uri, "SELECT count(*) FROM t_resume_out")[0][0] == 150
    result = migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    assert (result.resumed_from, result.rows_written) == (150, len(X) - 150)
    got = _fetch(target, ids)
    np.testing.assert_allclose(got, minilm_to_mpnet(X), atol=1e-5, rtol=0)


def test_rows_added_behind_the_checkpoint_fail_the_resume(pg_uri, scifact_small, minilm_to_mpnet):
    """A run killed, rows inserted below its checkpoint, and the resume wrote the rest,
    said it succeeded and marked the migration finished without them (an adversarial pass)."""
    X = scifact_small.corpus["minilm"]
    ids = np.arange(100, 100 + len(X), dtype=np.int64)
    source = make_table(pg_uri, "t_behind", ids, X)
    target = with_params(pg_uri, table="t_behind_out", column="emb")
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=stop_after(3))
    vector = "[" + ",".join(repr(float(v)) for v in X[0]) + "]"
    sql(pg_uri, f"INSERT INTO t_behind SELECT g, '{vector}' FROM generate_series(1, 10) g")
    n = len(X)
    wrote = rf"wrote {n} rows \(150 of them before it resumed\), but the source had {n + 10}"
    with pytest.raises(ConflictError, match=wrote) as refused:
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    assert "not marked finished" in str(refused.value)
    # every later run says so too, instead of "already done"
    with pytest.raises(ConflictError, match=f"source had {n + 10}"):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    sql(pg_uri, "DELETE FROM t_behind WHERE id <= 10")  # the source as it was: finishes
    result = migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    assert (result.rows_total, result.already_done) == (n, False)
    np.testing.assert_allclose(_fetch(target, ids), minilm_to_mpnet(X), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("kind", "value"), [("vector", 0.0), ("halfvec", 0.0), ("vector", 1e-39)])
def test_a_zero_vector_is_refused_before_anything_is_written(
    kind, value, pg_uri, scifact_small, minilm_to_mpnet
):
    """All zeros, or only values below float32's smallest normal (1e-39 in each of 384:
    a norm of 2e-38 passed the first check, and the run stopped midway)."""
    X = scifact_small.corpus["minilm"][:200].copy()
    broken = X.copy()
    broken[120] = value  # a unit-input stitch cannot scale it
    broken[60, :10] = 1e-39  # tiny values beside normal ones: a vector like any other
    ids = np.arange(200, dtype=np.int64)
    name = f"t_zero_{kind}_{int(value > 0)}"
    source = make_table(pg_uri, name, ids, broken, kind=kind)
    target = with_params(pg_uri, table=f"{name}_out", column="emb")
    with pytest.raises(ZeroVectorError, match=rf"id 120 in {name}\.emb is all zeros"):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)
    assert sql(pg_uri, f"SELECT to_regclass('{name}_out')")[0][0] is None


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


def _columns(uri: str, table: str) -> list[str]:
    rows = sql(
        uri,
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum",
        (table,),
    )
    return [str(r[0]) for r in rows]


def _checkpoints(uri: str, key: str) -> int:
    if sql(uri, "SELECT to_regclass('lead_migrations')")[0][0] is None:
        return 0
    return int(sql(uri, "SELECT count(*) FROM lead_migrations WHERE target = %s", (key,))[0][0])


def test_new_column_refuses_ids_that_are_not_rows_before_writing(
    pg_uri, tmp_path: Path, scifact_small, minilm_to_mpnet
):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64) + 1
    source = make_table(pg_uri, "t_rows_src", ids, X)
    make_table(pg_uri, "t_rows_docs", ids[:300], X[:300])  # 100 source ids are no rows
    target = with_params(pg_uri, table="t_rows_docs", column="emb_mpnet")
    with pytest.raises(InvalidInputError, match=r"id 301 .*\(100 such ids\)"):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=100, progress=False)
    assert _columns(pg_uri, "t_rows_docs") == ["id", "emb"]
    assert _checkpoints(pg_uri, "public.t_rows_docs.emb_mpnet") == 0
    # a source in another store: its ids are read before anything is written ...
    parquet = write_parquet(tmp_path / "docs.parquet", ids, X)
    with open_source(parquet) as src, open_target(target) as tgt:
        spec = migration_spec(src, minilm_to_mpnet, inverse=False, normalize=False)
        tgt.open(spec, src.info)
        with pytest.raises(InvalidInputError, match=r"id 301 .*\(20 such ids in a batch of 64\)"):
            tgt.check_source(src, batch_size=64)  # the batch of ids 257..320
    # ... and a first batch refused by the database leaves no column and no checkpoint
    make_table(pg_uri, "t_rows_tail", ids[100:], X[100:])
    tail = with_params(pg_uri, table="t_rows_tail", column="emb_mpnet")
    with pytest.raises(InvalidInputError, match="id 1 of the source"):
        migrate.apply(parquet, tail, minilm_to_mpnet, batch_size=100, progress=False)
    assert _columns(pg_uri, "t_rows_tail") == ["id", "emb"]
    assert _checkpoints(pg_uri, "public.t_rows_tail.emb_mpnet") == 0


def test_new_column_of_a_table_with_repeated_ids_is_refused(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:50]
    source = make_table(pg_uri, "t_twice_src", np.arange(50), X)
    sql(pg_uri, "DROP TABLE IF EXISTS t_twice_docs")
    sql(pg_uri, "CREATE TABLE t_twice_docs (id bigint, title text)")
    sql(pg_uri, "INSERT INTO t_twice_docs SELECT i, 'doc' FROM generate_series(0, 49) i")
    sql(pg_uri, "INSERT INTO t_twice_docs VALUES (7, 'again')")
    target = with_params(pg_uri, table="t_twice_docs", column="emb")
    with pytest.raises(InvalidInputError, match="id 7 is more than one row"):
        migrate.apply(source, target, minilm_to_mpnet, progress=False)
    assert _columns(pg_uri, "t_twice_docs") == ["id", "title"]
    assert _checkpoints(pg_uri, "public.t_twice_docs.emb") == 0


@pytest.mark.parametrize("table, column", [("t_lock_out", "emb"), ("t_lock_src", "emb_mpnet")])
def test_a_second_apply_into_the_same_target_is_refused(
    pg_uri, scifact_small, minilm_to_mpnet, table, column
):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64)
    source = make_table(pg_uri, "t_lock_src", ids, X)
    sql(pg_uri, "DROP TABLE IF EXISTS t_lock_out")
    target = with_params(pg_uri, table=table, column=column)
    wrote, go = threading.Event(), threading.Event()

    def hold(done: int, total: int) -> None:  # the first run waits after its first batch
        if not wrote.is_set():
            wrote.set()
            go.wait(60)

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            migrate.apply, source, target, minilm_to_mpnet, batch_size=100, progress=hold
        )
        try:
            assert wrote.wait(60)
            with pytest.raises(ConflictError, match="another apply is writing"):
                migrate.apply(source, target, minilm_to_mpnet, batch_size=100, progress=False)
            with open_source(source) as src, open_target(target) as tgt:
                spec = migration_spec(src, minilm_to_mpnet, inverse=False, normalize=False)
                state = tgt.open(spec, src.info, partitioned=True)  # a ray worker: let in
                assert state.rows_written == 100
                with pytest.raises(ConflictError, match="another apply is writing"):
                    partition_store(tgt).claim(plan_partitions(src, 2), state)  # a driver
        finally:
            go.set()
        result = first.result(timeout=120)
    assert result.rows_written == len(X)
    written = sql(pg_uri, f"SELECT count({column}), count(DISTINCT id) FROM {table}")[0]
    assert written == (len(X), len(X))
    np.testing.assert_allclose(_fetch(target, ids), minilm_to_mpnet(X), atol=1e-5, rtol=0)


def test_database_refusals_are_lead_errors(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:20]
    source = make_table(pg_uri, "t_refused", np.arange(20), X)

    def apply(target: str) -> None:
        migrate.apply(source, target, minilm_to_mpnet, progress=False)

    with pytest.raises(StoreNotFoundError, match="no schema 'noschema'"):
        apply(with_params(pg_uri, table="noschema.out"))
    with pytest.raises(StoreError, match="permission denied"):
        apply(with_params(pg_uri, table="pg_catalog.lead_out"))
    with pytest.raises(InvalidInputError, match="named like the id column"):
        apply(with_params(pg_uri, table="t_refused_out", column="id"))
    assert sql(pg_uri, "SELECT to_regclass('t_refused_out')")[0][0] is None
    # a role that may not create tables in public, nor read the source
    sql(
        pg_uri,
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lead_nobody') "
        "THEN CREATE ROLE lead_nobody LOGIN; END IF; END $$",
    )
    nobody = pg_uri.replace("postgres:@", "lead_nobody:@")
    with pytest.raises(StoreError, match="permission denied for table t_refused"):
        open_source(with_params(nobody, table="t_refused", column="emb"))
    sql(pg_uri, "GRANT SELECT ON t_refused TO lead_nobody")
    with pytest.raises(StoreError, match="permission denied"):
        migrate.apply(
            with_params(nobody, table="t_refused", column="emb"),
            with_params(nobody, table="t_refused_nobody"),
            minilm_to_mpnet,
            progress=False,
        )
    # a table of the user's named like LEAD's checkpoints, beside the target
    sql(pg_uri, "DROP SCHEMA IF EXISTS t_theirs CASCADE")
    sql(pg_uri, "CREATE SCHEMA t_theirs")
    sql(pg_uri, "CREATE TABLE t_theirs.lead_migrations (note text)")
    with pytest.raises(ConflictError, match=r"t_theirs\.lead_migrations is not LEAD's"):
        apply(with_params(pg_uri, table="t_theirs.out"))


def test_uris_libpq_refuses_are_invalid_input_without_secrets(pg_uri):
    uri = with_params(pg_uri, table="t_any", column="emb")
    with pytest.raises(InvalidInputError, match="bogus"):
        open_source(uri + "&bogus=1")
    with pytest.raises(InvalidInputError, match="connect_timeout"):
        open_target(uri + "&connect_timeout=abc")
    with pytest.raises(InvalidInputError, match="percent-encoding") as caught:
        open_source(uri.replace("postgres:@", "postgres:s3%zzcret@"))
    assert "zzcret" not in str(caught.value)


def test_odd_table_names_views_and_materialized_views(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:60]
    ids = np.arange(60, dtype=np.int64) * 3
    base = make_table(pg_uri, "t_base", ids, X)
    sql(pg_uri, 'DROP TABLE IF EXISTS "t_we""ird", "t_we""ird_out"')
    sql(pg_uri, 'CREATE TABLE "t_we""ird" AS SELECT id, emb FROM t_base')  # no unique index
    sql(pg_uri, "DROP MATERIALIZED VIEW IF EXISTS t_mview")
    sql(pg_uri, "CREATE MATERIALIZED VIEW t_mview AS SELECT id, emb FROM t_base")
    sql(pg_uri, "CREATE OR REPLACE VIEW t_view AS SELECT id, emb FROM t_base")
    want = minilm_to_mpnet(X)
    for name in ('t_we"ird', "t_mview", "t_view"):
        source = with_params(pg_uri, table=name, column="emb")
        target = with_params(pg_uri, table=f"{name}_out", column="emb")
        result = migrate.apply(source, target, minilm_to_mpnet, batch_size=25, progress=False)
        assert result.rows_written == 60, name
        np.testing.assert_allclose(_fetch(target, ids), want, atol=1e-5, rtol=0)
    with pytest.raises(ConflictError, match="materialized view, not a table"):
        migrate.apply(base, with_params(pg_uri, table="t_mview", column="v"), minilm_to_mpnet)


def test_resume_into_a_redeclared_column_is_refused(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:100]
    source = make_table(pg_uri, "t_redeclared", np.arange(100), X)
    target = with_params(pg_uri, table="t_redeclared_out", column="emb")

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=stop)
    sql(pg_uri, "TRUNCATE t_redeclared_out")
    sql(pg_uri, "ALTER TABLE t_redeclared_out ALTER COLUMN emb TYPE vector(384)")
    with pytest.raises(ConflictError, match=r"declared vector\(384\) now.*vector\(768\)"):
        migrate.apply(source, target, minilm_to_mpnet, batch_size=50, progress=False)


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


@pytest.fixture(scope="module")
def scored(tmp_path_factory, scifact_small) -> LocalTranslator:
    from tests.migrate._data import scored_stitch

    return LocalTranslator(scored_stitch(tmp_path_factory.mktemp("scored") / "s", scifact_small))


@pytest.mark.parametrize("new_table", [True, False])
def test_the_confidence_column_is_a_real_column_written_once_across_resume(
    pg_uri, scifact_small, scored, new_table
):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64) * 5
    name = f"t_conf_{int(new_table)}"
    source = make_table(pg_uri, name, ids, X)
    if not new_table:  # a new column of another table of the same rows
        make_table(pg_uri, f"{name}_out", ids, X)
    target = with_params(pg_uri, table=f"{name}_out", column="emb_mpnet")
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(
            source, target, scored, batch_size=50, progress=stop_after(3),
            confidence_column="confidence",
        )  # fmt: skip
    table = f"{name}_out"
    assert sql(pg_uri, f"SELECT count(confidence) FROM {table}")[0][0] == 150
    with pytest.raises(ConflictError, match=r"same ones \(--confidence-column confidence\)"):
        migrate.apply(source, target, scored, batch_size=50, progress=False)
    result = migrate.apply(
        source, target, scored, batch_size=50, progress=False, confidence_column="confidence"
    )
    assert (result.resumed_from, result.rows_written) == (150, len(X) - 150)
    kind = sql(
        pg_uri,
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        f"WHERE attrelid = '{table}'::regclass AND attname = 'confidence'",
    )
    assert kind == [("real",)]
    rows = sql(pg_uri, f"SELECT id, confidence FROM {table} ORDER BY id")
    assert [r[0] for r in rows] == ids.tolist()  # each row once
    _, _, expected, _ = scored.translate_scored(X)
    got = np.asarray([r[1] for r in rows], dtype=np.float32)
    assert got.tobytes() == expected.tobytes()
    np.testing.assert_allclose(_fetch(target, ids), scored(X), atol=1e-5, rtol=0)


def test_a_confidence_column_is_refused_before_anything_is_written_in_postgres(
    pg_uri, scifact_small, unscored, scored
):
    X = scifact_small.corpus["minilm"][:30]
    ids = np.arange(len(X), dtype=np.int64)
    source = make_table(pg_uri, "t_conf_refused", ids, X)
    sql(pg_uri, "ALTER TABLE t_conf_refused ADD COLUMN conf real")
    target = with_params(pg_uri, table="t_conf_refused", column="emb_mpnet")
    with pytest.raises(InvalidInputError, match="has no confidence head"):
        migrate.apply(source, target, unscored, progress=False, confidence_column="c")
    with pytest.raises(ConflictError, match="has a column 'conf' already"):
        migrate.apply(source, target, scored, progress=False, confidence_column="conf")
    with pytest.raises(InvalidInputError, match="named like the vector or the id column"):
        migrate.apply(source, target, scored, progress=False, confidence_column="id")
    assert _columns(pg_uri, "t_conf_refused") == ["id", "emb", "conf"]


def test_a_new_column_of_the_source_table_itself_does_not_wait_on_its_own_read(
    pg_uri, scifact_small, minilm_to_mpnet
):
    """The README's example (docs.embedding → docs.embedding_mpnet) hung for good once the
    source was larger than a few batches: the source's streaming read of the table held a
    lock that ``ALTER TABLE ... ADD COLUMN`` of the first batch waited for, while the read
    waited for the run to take its rows (an adversarial pass)."""
    X = np.tile(scifact_small.corpus["minilm"], (20, 1))  # 8,000 rows, ~12 MB to stream
    ids = np.arange(len(X))
    source = make_table(pg_uri, "t_self", ids, X)
    target = with_params(pg_uri, table="t_self", column="emb_mpnet")
    done: list[object] = []
    run = threading.Thread(
        target=lambda: done.append(
            migrate.apply(source, target, minilm_to_mpnet, batch_size=500, progress=False)
        ),
        daemon=True,
    )
    run.start()
    run.join(timeout=240)
    if run.is_alive():  # unblock the run before failing: end the waiting ALTER TABLE
        sql(pg_uri, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query LIKE 'ALTER TABLE%%' AND pid <> pg_backend_pid()")  # fmt: skip
        run.join(timeout=60)
        pytest.fail("apply into a new column of its own source table waited on itself")
    assert done and done[0].rows_written == len(X)
    np.testing.assert_allclose(
        _fetch(target, ids[:400]), minilm_to_mpnet(X[:400]), atol=1e-6, rtol=0
    )
