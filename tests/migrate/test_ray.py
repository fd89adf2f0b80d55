"""``apply --engine ray`` on a local Ray cluster: the same bytes as the in-process engine,
each row written once across a resume, no-op re-runs, conflicts refused before writing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lead import migrate
from lead.errors import (
    ConflictError,
    InvalidInputError,
    NonFiniteOutputError,
    ShapeMismatchError,
    ZeroVectorError,
)
from lead.migrate.apply import migration_spec
from lead.migrate.partitions import (
    Partition,
    migrate_partition,
    partition_store,
    plan_partitions,
)
from lead.migrate.registry import open_source, open_target
from lead.migrate.stores import with_params
from lead.migrate.translator import LocalTranslator
from tests.migrate.conftest import checksum, make_table, sql

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from lead.migrate.ray_engine import run_apply_ray  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # a Ray cluster starts in seconds; each run starts its actors
    # Ray Data's own DataContext() sets its deprecated fields (ray 2.60)
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"),
]

STITCH = "minilm-to-mpnet"


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """One small local Ray cluster for the module, shut down after it."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def minilm_to_mpnet() -> LocalTranslator:
    return LocalTranslator(STITCH)


def _parquet_folder(folder: Path, ids: np.ndarray, X: np.ndarray, files: int) -> Path:
    """``files`` Parquet files of (id, emb), each of two row groups."""
    folder.mkdir()
    for k, rows in enumerate(np.array_split(np.arange(len(X)), files)):
        values = pa.FixedSizeListArray.from_arrays(pa.array(X[rows].reshape(-1)), X.shape[1])
        table = pa.table({"id": pa.array(ids[rows]), "emb": values})
        pq.write_table(table, folder / f"chunk-{k}.parquet", row_group_size=len(rows) // 2 + 1)
    return folder


def _read(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(folder)
    ids = table.column("id").to_numpy()
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return ids, vectors


def test_parquet_matches_in_process_bit_for_bit(tmp_path, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64) * 3 + 1
    source = str(_parquet_folder(tmp_path / "src", ids, X, files=3))
    with open_source(source) as opened:
        assert [p.until for p in plan_partitions(opened)] == [134, 267, 400]  # per file
        assert len(plan_partitions(opened, workers=4)) == 6  # few files: per row group
        plan = plan_partitions(opened, 5)
    assert [p.index for p in plan] == list(range(5))  # 6 row groups: cut inside files
    ray_out, local_out = tmp_path / "ray", tmp_path / "local"
    result = run_apply_ray(
        source, str(ray_out), STITCH, batch_size=64, partitions=5, progress=False
    )
    assert (result.rows_written, result.rows_total, result.resumed_from) == (len(X), len(X), 0)
    migrate.apply(source, str(local_out), minilm_to_mpnet, batch_size=64, progress=False)
    got_ids, got = _read(ray_out)
    want_ids, want = _read(local_out)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_ids, want_ids)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    assert sorted(p.name for p in ray_out.glob("part-*")) == [
        f"part-00000{k}.parquet" for k in range(5)
    ]
    assert (ray_out / "_SUCCESS").is_file()
    # finished: a re-run by either engine writes nothing; verify's fetch reads the folder
    again = run_apply_ray(source, str(ray_out), STITCH, progress=False)
    assert again.already_done and (again.rows_written, again.rows_total) == (0, len(X))
    local = migrate.apply(source, str(ray_out), minilm_to_mpnet, progress=False)
    assert local.already_done and local.rows_total == len(X)
    with open_target(str(ray_out)) as opened:
        np.testing.assert_array_equal(opened.fetch(ids[[5, 0, 399]]), want[[5, 0, 399]])


def test_pgvector_matches_in_process_and_leaves_the_source(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64) * 7 + 3
    source = make_table(pg_uri, "r_src", ids, X)
    before = checksum(pg_uri, "r_src")
    ray_out = with_params(pg_uri, table="r_out_ray", column="emb")
    local_out = with_params(pg_uri, table="r_out_local", column="emb")
    result = run_apply_ray(source, ray_out, STITCH, batch_size=50, partitions=4, progress=False)
    assert (result.rows_written, result.rows_total) == (len(X), len(X))
    migrate.apply(source, local_out, minilm_to_mpnet, batch_size=50, progress=False)
    assert checksum(pg_uri, "r_out_ray") == checksum(pg_uri, "r_out_local")
    assert sql(pg_uri, "SELECT count(*), count(DISTINCT id) FROM r_out_ray")[0] == (len(X), len(X))
    assert checksum(pg_uri, "r_src") == before
    marks = sql(
        pg_uri,
        "SELECT partition, rows, done FROM lead_migration_partitions "
        "WHERE target = 'public.r_out_ray.emb' ORDER BY partition",
    )
    assert [m[0] for m in marks] == [0, 1, 2, 3] and all(m[2] for m in marks)
    assert sum(m[1] for m in marks) == len(X) and min(m[1] for m in marks) > 50  # balanced
    checkpoints = sql(
        pg_uri,
        "SELECT target, position, rows_written, done FROM lead_migrations "
        "WHERE target IN ('public.r_out_ray.emb', 'public.r_out_local.emb') ORDER BY target",
    )
    assert [c[1:] for c in checkpoints] == [(int(ids[-1]), len(X), True)] * 2
    for engine in (run_apply_ray, migrate.apply):
        stitch: Any = STITCH if engine is run_apply_ray else minilm_to_mpnet
        again = engine(source, ray_out, stitch, progress=False)
        assert again.already_done and again.rows_written == 0


def test_new_column_of_text_id_table(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:150]
    ids = np.asarray(scifact_small.corpus_ids[:150], dtype=object)
    source = make_table(pg_uri, "r_text", ids, X)
    target = with_params(pg_uri, table="r_text", column="emb_mpnet")
    result = run_apply_ray(source, target, STITCH, batch_size=20, partitions=3, progress=False)
    assert result.rows_written == 150
    with open_target(target) as opened:
        got = opened.fetch(ids[::-1])
    np.testing.assert_array_equal(got, minilm_to_mpnet(X[::-1]))
    ranges = sql(
        pg_uri,
        "SELECT after, until, rows FROM lead_migration_partitions "
        "WHERE target = 'public.r_text.emb_mpnet' ORDER BY partition",
    )
    assert len(ranges) == 3 and ranges[0][0] is None and ranges[-1][1] is None
    assert all(isinstance(r[1], str) for r in ranges[:-1]) and sum(r[2] for r in ranges) == 150


def _start(source: str, target: str, translator: LocalTranslator, count: int) -> list[Partition]:
    """Begin a partitioned run as the ray driver does; the plan it records."""
    with open_source(source) as src, open_target(target) as tgt:
        spec = migration_spec(src, translator, inverse=False, normalize=False)
        state = tgt.open(spec, src.info, partitioned=True)
        return partition_store(tgt).claim(plan_partitions(src, count), state)


def _write(source: str, target: str, translator: LocalTranslator, parts: list[Partition]) -> None:
    """Land ``parts`` as a ray worker does (what a run killed after them leaves behind)."""
    with open_source(source) as src, open_target(target) as tgt:
        spec = migration_spec(src, translator, inverse=False, normalize=False)
        tgt.open(spec, src.info, partitioned=True)
        store = partition_store(tgt)
        for part in parts:
            migrate_partition(src, store, translator, part, batch_size=30)


def test_resume_writes_each_row_once(pg_uri, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64)
    source = make_table(pg_uri, "r_resume", ids, X)
    target = with_params(pg_uri, table="r_resume_out", column="emb")
    plan = _start(source, target, minilm_to_mpnet, 5)
    _write(source, target, minilm_to_mpnet, [plan[0], plan[3]])
    done = sql(pg_uri, "SELECT count(*) FROM r_resume_out")[0][0]
    assert 0 < done < len(X)

    def broken(rows: Any) -> Iterator[Any]:  # a partition killed after its first batch
        first = next(iter(rows))
        yield first
        raise KeyboardInterrupt

    with open_source(source) as src, open_target(target) as tgt:
        spec = migration_spec(src, minilm_to_mpnet, inverse=False, normalize=False)
        tgt.open(spec, src.info, partitioned=True)
        store = partition_store(tgt)
        batches = (
            (b.ids, minilm_to_mpnet(b.vectors), b.position)
            for b in src.batches(30, plan[1].after, plan[1].until)
        )
        with pytest.raises(KeyboardInterrupt):
            store.write(plan[1], broken(batches))
    assert sql(pg_uri, "SELECT count(*) FROM r_resume_out")[0][0] == done  # rolled back
    # the in-process engine will not resume a partitioned run
    with pytest.raises(ConflictError, match="--engine ray"):
        migrate.apply(source, target, minilm_to_mpnet, progress=False)
    # another partition count is asked for: the recorded plan is kept
    result = run_apply_ray(source, target, STITCH, batch_size=40, partitions=2, progress=False)
    assert (result.resumed_from, result.rows_written) == (done, len(X) - done)
    assert sql(pg_uri, "SELECT count(*), count(DISTINCT id) FROM r_resume_out")[0] == (
        len(X),
        len(X),
    )
    with open_target(target) as opened:
        np.testing.assert_array_equal(opened.fetch(ids), minilm_to_mpnet(X))


def test_resume_of_a_parquet_folder(tmp_path, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:200]
    ids = np.arange(200, dtype=np.int64) + 1000
    source = str(_parquet_folder(tmp_path / "src", ids, X, files=4))
    target = tmp_path / "out"
    plan = _start(source, str(target), minilm_to_mpnet, 4)
    assert [(p.after, p.until) for p in plan] == [(0, 50), (50, 100), (100, 150), (150, 200)]
    _write(source, str(target), minilm_to_mpnet, [plan[2]])
    (target / ".part-000001.parquet.dead.tmp").write_bytes(b"half a part")  # a killed worker
    with pytest.raises(ConflictError, match="--engine ray"):
        migrate.apply(source, str(target), minilm_to_mpnet, progress=False)
    result = run_apply_ray(source, str(target), STITCH, progress=False)
    assert (result.resumed_from, result.rows_written) == (50, 150)
    assert not list(target.glob(".*.tmp"))
    got_ids, got = _read(target)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got, minilm_to_mpnet(X))


def test_bad_input_and_conflicts_are_refused_before_writing(
    pg_uri, tmp_path, scifact_small, minilm_to_mpnet
):
    X = scifact_small.corpus["minilm"][:60]
    source = make_table(pg_uri, "r_bad", np.arange(60), X)
    wide = make_table(pg_uri, "r_wide", np.arange(10), scifact_small.corpus["mpnet"][:10])
    with pytest.raises(ShapeMismatchError, match="emb"):
        run_apply_ray(wide, with_params(pg_uri, table="r_wide_out"), STITCH, progress=False)
    assert sql(pg_uri, "SELECT to_regclass('r_wide_out')")[0][0] is None
    make_table(pg_uri, "r_taken", np.arange(3), X[:3])
    taken = with_params(pg_uri, table="r_taken", column="emb")
    with pytest.raises(ConflictError, match="not made by a LEAD migration"):
        run_apply_ray(source, taken, STITCH, progress=False)
    assert sql(pg_uri, "SELECT count(*) FROM r_taken")[0][0] == 3
    npy = tmp_path / "rows.npy"
    np.save(npy, X)
    with pytest.raises(InvalidInputError, match="without --engine ray"):
        run_apply_ray(str(npy), str(tmp_path / "from_npy"), STITCH, progress=False)
    assert not (tmp_path / "from_npy").exists()
    # a target the in-process engine filled in part is not resumed by this one
    local = with_params(pg_uri, table="r_bad_local", column="emb")

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        migrate.apply(source, local, minilm_to_mpnet, batch_size=20, progress=stop)
    with pytest.raises(ConflictError, match="in-process engine"):
        run_apply_ray(source, local, STITCH, progress=False)
    # another stitch into a finished target
    out = with_params(pg_uri, table="r_bad_out", column="emb")
    migrate.apply(source, out, minilm_to_mpnet, progress=False)
    with pytest.raises(ConflictError, match="another migration"):
        run_apply_ray(source, out, "minilm-to-pml3", progress=False)


def test_a_zero_vector_is_refused_before_the_workers_start(pg_uri, scifact_small):
    X = scifact_small.corpus["minilm"][:40].copy()
    X[23] = 0.0
    source = make_table(pg_uri, "r_zero", np.arange(40) + 500, X)
    target = with_params(pg_uri, table="r_zero_out", column="emb")
    with pytest.raises(ZeroVectorError, match=r"id 523 in r_zero\.emb is all zeros"):
        run_apply_ray(source, target, STITCH, partitions=2, progress=False)
    assert sql(pg_uri, "SELECT to_regclass('r_zero_out')")[0][0] is None


def test_a_worker_error_reaches_the_driver_as_itself(pg_uri, scifact_small, tmp_path):
    """A stitch (of any input length) whose output overflows float32 for one row: the
    NonFiniteOutputError of the worker that meets it reaches the driver as itself."""
    import torch

    from lead import StitchInfo, fit_stitch, save_stitch

    X, Y = 2 * scifact_small.corpus["minilm"], scifact_small.corpus["mpnet"]
    stitch = fit_stitch(X, Y, method="ridge", info=StitchInfo(source_model="a", target_model="b"))
    towards = torch.from_numpy(X[23]) - stitch.source_mean.detach()
    with torch.no_grad():  # row 23 maps to 2.5e38 + 2e38: infinity in float32
        stitch.weight.copy_((2e38 * towards / towards.dot(towards)).expand(768, 384))
        stitch.target_mean.fill_(2.5e38)
    save_stitch(stitch, tmp_path / "overflows")
    source = make_table(pg_uri, "r_huge", np.arange(40) + 500, X[:40])
    target = with_params(pg_uri, table="r_huge_out", column="emb")
    with pytest.raises(NonFiniteOutputError, match="NaN or infinity"):
        run_apply_ray(source, target, str(tmp_path / "overflows"), partitions=2, progress=False)
    assert sql(pg_uri, "SELECT count(*) FROM r_huge_out")[0][0] <= 20  # the other partition


@pytest.mark.gpu
def test_workers_translate_on_their_gpu(tmp_path, scifact_small, minilm_to_mpnet):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64)
    source = str(_parquet_folder(tmp_path / "src", ids, X, files=2))
    result = run_apply_ray(source, str(tmp_path / "out"), STITCH, num_gpus=1, progress=False)
    assert result.rows_written == len(X)
    got_ids, got = _read(tmp_path / "out")
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_allclose(got, minilm_to_mpnet(X), atol=1e-5, rtol=0)
