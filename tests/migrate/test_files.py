"""Parquet stores on real SciFact vectors: one writer per target folder, ids kept exact,
targets outside the source, memory that follows the batch size, and one clear error for
each kind of bad file or folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lead import migrate
from lead._arrow import vector_column
from lead.cli import main
from lead.errors import (
    ConflictError,
    DecodeError,
    InvalidInputError,
    ShapeMismatchError,
    ZeroVectorError,
)
from lead.migrate.apply import migration_spec
from lead.migrate.partitions import Partition, migrate_partition, partition_store
from lead.migrate.plan import run_plan
from lead.migrate.registry import open_source, open_target
from lead.migrate.stores import with_params
from lead.migrate.translator import LocalTranslator
from tests.conftest import REPO
from tests.migrate._data import stop_after, write_parquet

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

STITCH = "minilm-to-mpnet"


@pytest.fixture(scope="module")
def minilm_to_mpnet() -> LocalTranslator:
    return LocalTranslator(STITCH)


def _column(vectors: np.ndarray) -> object:
    return vector_column(vectors)


def _read(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(folder)
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return table.column("id").to_numpy(), vectors


def _apply(source: str, target: Path, translator: LocalTranslator, **kw: object) -> object:
    return migrate.apply(source, str(target), translator, progress=False, **kw)


# 1. one writer per folder


def test_a_second_run_into_a_folder_being_written_is_refused(
    tmp_path, scifact_small, minilm_to_mpnet
):
    X = scifact_small.corpus["minilm"][:100]
    source = write_parquet(tmp_path / "src.parquet", np.arange(100), X)
    target = tmp_path / "out"
    with open_source(source) as src, open_target(str(target)) as running:
        running.open(migration_spec(src, minilm_to_mpnet, inverse=False, normalize=False), src.info)
        with pytest.raises(ConflictError, match="another apply is writing it") as refused:
            _apply(source, target, minilm_to_mpnet, batch_size=30)
        assert str(target) in str(refused.value)
        assert not list(target.glob("part-*"))
    # once that run has ended, the same command resumes the folder
    result = _apply(source, target, minilm_to_mpnet, batch_size=30)
    assert (result.rows_written, result.rows_total) == (100, 100)
    ids, vectors = _read(target)
    np.testing.assert_array_equal(ids, np.arange(100))
    np.testing.assert_array_equal(vectors, minilm_to_mpnet(X))


def test_a_finished_migration_of_a_source_that_grew_is_not_already_done(
    tmp_path, scifact_small, minilm_to_mpnet
):
    """Rows added to the source after a migration finished were ignored: the next run said
    ``already_done`` with the old ``rows_total`` and exit status 0."""
    X = scifact_small.corpus["minilm"][:105]
    source = write_parquet(tmp_path / "src.parquet", np.arange(100), X[:100])
    target = tmp_path / "out"
    assert _apply(source, target, minilm_to_mpnet).rows_total == 100
    assert _apply(source, target, minilm_to_mpnet).already_done  # unchanged: done
    write_parquet(tmp_path / "src.parquet", np.arange(105), X)
    with pytest.raises(ConflictError, match="whose files changed since it started"):
        _apply(source, target, minilm_to_mpnet)
    assert len(_read(target)[0]) == 100  # untouched


def test_a_source_rewritten_between_runs_is_refused_not_mixed_in(
    tmp_path, scifact_small, minilm_to_mpnet
):
    """A run killed half-way, the source rewritten with the same rows in reverse order, and
    the resume wrote 1,050 duplicates, missed 1,050 ids and said it succeeded (an adversarial
    pass): the checkpoint counts rows by position. Same for a finished migration whose
    source was rewritten with as many rows."""
    X = scifact_small.corpus["minilm"][:300]
    ids = np.arange(300)
    source = write_parquet(tmp_path / "src.parquet", ids, X)
    target = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(source, str(target), minilm_to_mpnet, batch_size=50, progress=stop_after(2))
    write_parquet(tmp_path / "src.parquet", ids[::-1], X[::-1])
    with pytest.raises(ConflictError, match="whose files changed since it started") as refused:
        _apply(source, target, minilm_to_mpnet, batch_size=50)
    assert "write some rows twice and miss others" in str(refused.value)
    assert len(_read(target)[0]) == 100  # the two batches written before, nothing more
    # finished, then rewritten with as many rows: not "already done"
    other = tmp_path / "out2"
    assert _apply(source, other, minilm_to_mpnet).rows_total == 300
    write_parquet(tmp_path / "src.parquet", ids, X)
    with pytest.raises(ConflictError, match="whose files changed"):
        _apply(source, other, minilm_to_mpnet)


def test_one_source_named_another_way_resumes_its_migration(
    tmp_path, monkeypatch, scifact_small, minilm_to_mpnet
):
    """The source was recorded as typed: a run begun on ``src.parquet`` and resumed on
    ``$PWD/src.parquet`` (or ``./src.parquet``, or through a link) was "another
    migration". A relative ``file.safetensors:tensor`` was an unknown URI scheme."""
    X = scifact_small.corpus["minilm"][:200]
    write_parquet(tmp_path / "src.parquet", np.arange(200), X)
    (tmp_path / "link.parquet").symlink_to(tmp_path / "src.parquet")
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(
            "src.parquet?column=emb&id=id",
            str(target),
            minilm_to_mpnet,
            batch_size=50,
            progress=stop_after(1),
        )
    for spelling in ("./src.parquet", str(tmp_path / "link.parquet")):
        with pytest.raises(KeyboardInterrupt):  # resumed: one more batch written
            migrate.apply(
                f"{spelling}?column=emb&id=id",
                str(target),
                minilm_to_mpnet,
                batch_size=50,
                progress=stop_after(1),
            )
    done = _apply(f"{tmp_path / 'src.parquet'}?column=emb&id=id", target, minilm_to_mpnet)
    assert (done.rows_written, done.rows_total) == (50, 200)
    ids, vectors = _read(target)
    np.testing.assert_array_equal(np.sort(ids), np.arange(200))
    np.testing.assert_array_equal(vectors[np.argsort(ids)], minilm_to_mpnet(X))

    from safetensors.numpy import save_file

    save_file({"corpus": X[:20]}, str(tmp_path / "emb.safetensors"))
    done = _apply("emb.safetensors:corpus", tmp_path / "out2", minilm_to_mpnet)
    assert (done.rows_written, done.rows_total) == (20, 20)
    # another tensor of the same file is another source
    save_file({"corpus": X[:20], "other": X[20:40]}, str(tmp_path / "emb2.safetensors"))
    _apply("emb2.safetensors:corpus", tmp_path / "out3", minilm_to_mpnet)
    with pytest.raises(ConflictError, match="another migration"):
        _apply(str(tmp_path / "emb2.safetensors:other"), tmp_path / "out3", minilm_to_mpnet)


def test_the_lock_of_a_killed_run_is_gone(tmp_path, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:50]
    source = write_parquet(tmp_path / "src.parquet", np.arange(50), X)
    target = tmp_path / "out"
    holder = (
        "import sys, time\n"
        "from lead.migrate.apply import migration_spec\n"
        "from lead.migrate.registry import open_source, open_target\n"
        "from lead.migrate.translator import LocalTranslator\n"
        f"src, tgt = open_source({source!r}), open_target({str(target)!r})\n"
        f"spec = migration_spec(src, LocalTranslator({STITCH!r}), inverse=False, "
        "normalize=False)\n"
        "tgt.open(spec, src.info)\n"
        "print('holding', flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(
        [sys.executable, "-c", holder], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "holding"
            with pytest.raises(ConflictError, match="another apply is writing it"):
                _apply(source, target, minilm_to_mpnet)
        finally:
            process.kill()  # SIGKILL: no chance to let go of the lock itself
    assert _apply(source, target, minilm_to_mpnet).rows_total == 50


def test_a_partitioned_runs_workers_write_under_its_drivers_lock(
    tmp_path, scifact_small, minilm_to_mpnet
):
    X = scifact_small.corpus["minilm"][:80]
    source = write_parquet(tmp_path / "src.parquet", np.arange(80), X)
    target = tmp_path / "out"
    plan = [Partition(0, 0, 40), Partition(1, 40, 80)]
    with open_source(source) as src, open_target(str(target)) as driver:
        spec = migration_spec(src, minilm_to_mpnet, inverse=False, normalize=False)
        state = driver.open(spec, src.info, partitioned=True)
        partition_store(driver).claim(plan, state)
        with open_target(str(target)) as worker:  # a worker, as `--engine ray` opens it
            worker.open(spec, src.info, partitioned=True)
            for part in plan:
                migrate_partition(src, partition_store(worker), minilm_to_mpnet, part)
        with pytest.raises(ConflictError, match="another apply is writing it"):
            _apply(source, target, minilm_to_mpnet)
        with open_target(str(target)) as second_driver:
            state = second_driver.open(spec, src.info, partitioned=True)
            with pytest.raises(ConflictError, match="another apply is writing it"):
                partition_store(second_driver).claim(plan, state)
    ids, vectors = _read(target)
    np.testing.assert_array_equal(ids, np.arange(80))
    np.testing.assert_array_equal(vectors, minilm_to_mpnet(X))


# 2. ids beyond int64


def test_unsigned_ids_beyond_int64_are_refused_naming_the_id(
    tmp_path, scifact_small, minilm_to_mpnet
):
    X = scifact_small.corpus["minilm"][:20]
    ids = np.arange(20, dtype=np.uint64) * 7
    small = tmp_path / "small.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.uint64()), "emb": _column(X)}), small)
    assert _apply(str(small), tmp_path / "ok", minilm_to_mpnet).rows_total == 20
    np.testing.assert_array_equal(_read(tmp_path / "ok")[0], ids.astype(np.int64))

    ids[13] = 2**63 + 5
    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.uint64()), "emb": _column(X)}), big)
    with pytest.raises(InvalidInputError, match=str(2**63 + 5)):
        _apply(str(big), tmp_path / "out", minilm_to_mpnet)
    assert not (tmp_path / "out").exists()


# 3. a target inside the source folder


@pytest.mark.parametrize("inside", ["out", "deeper/out", "."])
def test_a_target_inside_the_source_folder_is_refused(
    inside, tmp_path, scifact_small, minilm_to_mpnet
):
    folder = tmp_path / "src"
    folder.mkdir()
    write_parquet(folder / "a.parquet", np.arange(40), scifact_small.corpus["minilm"][:40])
    before = sorted(p.name for p in folder.rglob("*"))
    with pytest.raises(InvalidInputError, match="inside the source folder"):
        _apply(with_params(str(folder), column="emb"), folder / inside, minilm_to_mpnet)
    assert sorted(p.name for p in folder.rglob("*")) == before  # nothing written


# 4. memory follows the batch size


def test_memory_follows_the_batch_size_not_the_row_group(tmp_path, scifact_small):
    X = np.tile(scifact_small.corpus["minilm"], (100, 1))  # 40,000 x 384: 61 MB
    path = tmp_path / "one-group.parquet"
    table = pa.table({"id": pa.array(np.arange(len(X))), "emb": _column(X)})
    pq.write_table(table, path, row_group_size=len(X))
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    del table
    script = (
        "import pyarrow as pa\n"
        "from lead.migrate.registry import open_source\n"
        f"source = open_source({str(path)!r})\n"
        "source.check()\n"
        "rows = sum(len(b.ids) for b in source.batches(256))\n"
        "print(rows, pa.default_memory_pool().max_memory())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    rows, peak = map(int, done.stdout.split())
    assert rows == len(X)
    assert peak < X.nbytes / 2, f"Arrow held {peak / 1e6:.0f} MB at once"


def test_resume_positions_are_exact_across_slices_and_row_groups(tmp_path, scifact_small):
    X = scifact_small.corpus["minilm"].copy()
    path = tmp_path / "groups.parquet"
    rows = [None if i % 97 == 5 else list(map(float, x)) for i, x in enumerate(X)]
    emb = pa.array(rows, pa.list_(pa.float32()))  # NULL vectors count as source rows
    pq.write_table(pa.table({"id": np.arange(400) + 10, "emb": emb}), path, row_group_size=150)
    with open_source(str(path)) as source:
        batches = list(source.batches(37, after=61, until=355))
    positions = [b.position for b in batches]
    assert positions == sorted(positions) and positions[-1] == 355
    kept = [i for i in range(61, 355) if i % 97 != 5]
    np.testing.assert_array_equal(np.concatenate([b.ids for b in batches]), np.add(kept, 10))
    np.testing.assert_array_equal(np.concatenate([b.vectors for b in batches]), X[kept])
    for batch in batches[:-1]:  # each position: the source rows up to its last row
        assert batch.position == int(batch.ids[-1]) - 10 + 1
        assert len(batch.ids) == 37


# 5. one clear error for each bad file or folder


def _bad_sources(folder: Path, X: np.ndarray) -> dict[str, str]:
    """name -> source URI of a bad Parquet file or folder."""
    (folder / "mixed").mkdir()
    pq.write_table(
        pa.table({"id": np.arange(5), "emb": _column(X[:5])}), folder / "mixed/a.parquet"
    )
    pq.write_table(
        pa.table({"id": np.arange(5, 9), "vec": _column(X[5:9])}), folder / "mixed/b.parquet"
    )
    (folder / "ids").mkdir()
    pq.write_table(pa.table({"id": np.arange(5), "emb": _column(X[:5])}), folder / "ids/a.parquet")
    texts = pa.array([str(i) for i in range(5, 9)])
    pq.write_table(pa.table({"id": texts, "emb": _column(X[5:9])}), folder / "ids/b.parquet")
    (folder / "notes.parquet").write_text("these are not Parquet bytes")
    nested = pa.array([{"x": float(v)} for v in X[:4, 0]])
    pq.write_table(pa.table({"id": np.arange(4), "embedding": nested}), folder / "nested.parquet")
    deep = pa.array([[list(map(float, v[:3]))] for v in X[:4]], pa.list_(pa.list_(pa.float32())))
    pq.write_table(pa.table({"id": np.arange(4), "embedding": deep}), folder / "deep.parquet")
    words = pa.array(["a", "b", "c", "d"])
    pq.write_table(pa.table({"id": np.arange(4), "embedding": words}), folder / "words.parquet")
    ints = pa.array(np.rint(X[:4] * 100).astype(np.int32).tolist(), pa.list_(pa.int32()))
    pq.write_table(pa.table({"id": np.arange(4), "codes": ints}), folder / "ints.parquet")
    return {
        "mixed": str(folder / "mixed"),
        "ids": str(folder / "ids"),
        "notes": str(folder / "notes.parquet"),
        "nested": str(folder / "nested.parquet") + "?column=embedding",
        "deep": str(folder / "deep.parquet") + "?column=embedding",
        "words": str(folder / "words.parquet") + "?column=embedding",
        "ints": str(folder / "ints.parquet"),  # no column named: lists of int32 only
    }


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("mixed", InvalidInputError, "b.parquet has no column 'emb'"),
        ("ids", InvalidInputError, "column 'id' is string in"),
        ("notes", DecodeError, "notes.parquet is not a readable Parquet file"),
        ("nested", InvalidInputError, "'embedding' of .*nested.parquet is struct"),
        ("deep", InvalidInputError, "not a list of numbers"),
        ("words", InvalidInputError, "'embedding' of .*words.parquet is string"),
        (
            "ints",
            InvalidInputError,
            r"no list-of-floats column, but lists of other numbers: "
            r"'codes' \(list<element: int32>\); name the vector column with \?column=NAME",
        ),
    ],
)
def test_bad_sources_get_one_clear_error(
    name, error, message, tmp_path, scifact_small, minilm_to_mpnet, capsys
):
    source = _bad_sources(tmp_path, scifact_small.corpus["minilm"])[name]
    with pytest.raises(error, match=message):
        _apply(source, tmp_path / "out", minilm_to_mpnet)
    assert not (tmp_path / "out").exists()
    assert main(["migrate", "plan", source, "--stitch", STITCH]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_bad_targets_get_one_clear_error(tmp_path, scifact_small, minilm_to_mpnet):
    source = write_parquet(
        tmp_path / "ok.parquet", np.arange(10), scifact_small.corpus["minilm"][:10]
    )
    with pytest.raises(ConflictError, match=r"ok\.parquet exists and is not a folder"):
        _apply(source, tmp_path / "ok.parquet" / "sub", minilm_to_mpnet)
    if Path("/proc/self").is_dir():  # a folder no one can create, root included
        with pytest.raises(InvalidInputError, match="cannot create or lock the target folder"):
            _apply(source, Path("/proc/lead-no-such-folder/out"), minilm_to_mpnet)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "_lead_migration.json").write_text('{"source": ')
    with pytest.raises(DecodeError, match=r"_lead_migration\.json is damaged"):
        _apply(source, damaged, minilm_to_mpnet)
    # a refused run leaves nothing: it left _lead.lock in a user's folder, and a folder it
    # made itself (an adversarial pass)
    own = tmp_path / "mine"
    own.mkdir()
    (own / "notes.txt").write_text("mine")
    with pytest.raises(ConflictError, match="exists with other content"):
        _apply(source, own, minilm_to_mpnet)
    assert [p.name for p in own.iterdir()] == ["notes.txt"]
    with pytest.raises(InvalidInputError, match="confidence column must not be named"):
        _apply(source, tmp_path / "new" / "a" / "b", minilm_to_mpnet, confidence_column="id")
    assert not (tmp_path / "new").exists()  # nor its parents


def test_a_damaged_part_is_named(tmp_path, scifact_small, minilm_to_mpnet):
    source = write_parquet(
        tmp_path / "ok.parquet", np.arange(60), scifact_small.corpus["minilm"][:60]
    )
    target = tmp_path / "out"
    _apply(source, target, minilm_to_mpnet, batch_size=20)
    (target / "_SUCCESS").unlink()
    (target / "part-000002.parquet").write_bytes(b"half a part")
    with pytest.raises(DecodeError, match="damaged"):
        _apply(source, target, minilm_to_mpnet, batch_size=20)


def test_an_empty_source_migrates_to_an_empty_finished_target(tmp_path, minilm_to_mpnet):
    """An empty Parquet file was refused as "dimension 0" (its list column tells no
    dimension), while an empty .npy finished: both finish now, as a folder that reads as a
    table of 0 rows (it held no part: "holds no .parquet files" to verify, plan and any
    reader; an adversarial pass)."""
    empty = np.zeros((0, 384), dtype=np.float32)
    np.save(tmp_path / "empty.npy", empty)
    lists = pa.array([], pa.list_(pa.float32()))  # a list column: no fixed dimension
    table = pa.table({"id": pa.array([], pa.int64()), "emb": lists})
    pq.write_table(table, tmp_path / "empty.parquet")
    parquet = f"{tmp_path / 'empty.parquet'}?column=emb"
    for name, source in (("npy", str(tmp_path / "empty.npy")), ("parquet", parquet)):
        result = _apply(source, tmp_path / name, minilm_to_mpnet)
        assert (result.rows_written, result.rows_total) == (0, 0), name
        assert (tmp_path / name / "_SUCCESS").is_file()
        assert _apply(source, tmp_path / name, minilm_to_mpnet).already_done
        assert pq.read_table(tmp_path / name).num_rows == 0
        with open_source(str(tmp_path / name)) as written:
            assert (written.info.rows, written.info.dim) == (0, 768)
        # plan says so too: the list column's dimension is unknown, not 0
        with open_source(source) as opened:
            planned = run_plan(opened, minilm_to_mpnet, column=name)
        assert planned.problems == [] and planned.rows_to_translate == 0, name
        dim, notes = planned.source["dim"], " ".join(planned.notes)
        assert (dim, "dimension is unknown" in notes) == (
            (384, False) if name == "npy" else (None, True)
        )


@pytest.mark.parametrize("kind", ["parquet", "npy"])
def test_a_zero_vector_is_refused_before_anything_is_written(
    kind, tmp_path, scifact_small, minilm_to_mpnet
):
    """A unit-input stitch cannot scale a zero vector: the source's check finds it (row 70,
    past the first batches) before the target exists; the fixed file then migrates."""
    X = scifact_small.corpus["minilm"][:100].copy()
    broken = X.copy()
    broken[70] = 0
    if kind == "parquet":
        source = write_parquet(tmp_path / "src.parquet", np.arange(100), broken)
        where = "id 70 in 'emb' of"
    else:
        np.save(tmp_path / "src.npy", broken)
        source, where = str(tmp_path / "src.npy"), "id 70 in"
    target = tmp_path / "out"
    with pytest.raises(ZeroVectorError, match=f"{where} .* is all zeros") as refused:
        _apply(source, target, minilm_to_mpnet, batch_size=30)
    assert "fix or delete that row" in str(refused.value) and refused.value.row == 70
    assert not target.exists()
    if kind == "parquet":
        write_parquet(tmp_path / "src.parquet", np.arange(100), X)
    else:
        np.save(tmp_path / "src.npy", X)
    result = _apply(source, target, minilm_to_mpnet, batch_size=30)
    assert (result.rows_written, result.rows_total) == (100, 100)
    np.testing.assert_array_equal(_read(target)[1], minilm_to_mpnet(X))


# 6. target parameters, part numbers, a manifest killed before its rename


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?column=id", "the ids go in column 'id'"),
        ("?type=halfvec", "not type"),
        ("?id=key", "not id"),
        ("?table=docs&vector=v", "not table, vector"),
    ],
)
def test_target_parameters_it_does_not_use_are_refused(
    query, message, tmp_path, scifact_small, minilm_to_mpnet
):
    source = write_parquet(
        tmp_path / "ok.parquet", np.arange(10), scifact_small.corpus["minilm"][:10]
    )
    with pytest.raises(InvalidInputError, match=message):
        migrate.apply(source, str(tmp_path / "out") + query, minilm_to_mpnet, progress=False)
    assert not (tmp_path / "out").exists()


def test_parts_past_a_million_resume_in_number_order(tmp_path, scifact_small, minilm_to_mpnet):
    X = scifact_small.corpus["minilm"][:80]
    source = write_parquet(tmp_path / "src.parquet", np.arange(80), X)
    target = tmp_path / "out"
    _apply(source, target, minilm_to_mpnet, batch_size=20)
    # the parts of a long run: 999,998 to 1,000,001 (by name, 1000000 sorts first)
    for k in range(4):
        (target / f"part-{k:06d}.parquet").rename(target / f"part-{999_998 + k:06d}.parquet")
    (target / "_SUCCESS").unlink()  # killed before it finished
    result = _apply(source, target, minilm_to_mpnet, batch_size=20)
    assert (result.rows_written, result.rows_total) == (0, 80)
    ids, vectors = _read(target)
    np.testing.assert_array_equal(np.sort(ids), np.arange(80))
    np.testing.assert_array_equal(vectors[np.argsort(ids)], minilm_to_mpnet(X))


def test_a_run_killed_before_its_manifest_landed_starts_over(
    tmp_path, scifact_small, minilm_to_mpnet
):
    X = scifact_small.corpus["minilm"][:30]
    source = write_parquet(tmp_path / "src.parquet", np.arange(30), X)
    target = tmp_path / "out"
    target.mkdir()
    (target / "._lead_migration.json.tmp").write_text('{"source": "half')
    (target / "_lead.lock").touch()
    assert _apply(source, target, minilm_to_mpnet).rows_total == 30
    assert not (target / "._lead_migration.json.tmp").exists()
    # a folder with anything else is still refused
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ConflictError, match="other content"):
        _apply(source, other, minilm_to_mpnet)


# 5. the confidence column


@pytest.fixture(scope="module")
def scored(tmp_path_factory, scifact_small) -> LocalTranslator:
    from tests.migrate._data import scored_stitch

    return LocalTranslator(scored_stitch(tmp_path_factory.mktemp("scored") / "s", scifact_small))


def test_the_confidence_column_lands_with_the_vectors_and_survives_resume(
    tmp_path, scifact_small, scored
):
    X = scifact_small.corpus["minilm"]
    ids = np.arange(len(X), dtype=np.int64) * 3
    source = write_parquet(tmp_path / "src.parquet", ids, X)
    target = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        migrate.apply(
            source, str(target), scored, batch_size=90, progress=stop_after(2),
            confidence_column="conf",
        )  # fmt: skip
    # resuming with other options: said how to resume (it said "another migration ...
    # remove this one first", and named only the first difference)
    with pytest.raises(ConflictError, match="begun with other options") as refused:
        _apply(source, target, scored, batch_size=90, normalize=True)
    assert "(--confidence-column conf, without --normalize)" in str(refused.value)
    result = _apply(source, target, scored, batch_size=90, confidence_column="conf")
    assert (result.resumed_from, result.rows_written) == (180, len(X) - 180)
    table = pq.read_table(target)
    assert table.schema.field("conf").type == pa.float32()
    assert table.column("id").to_numpy().tolist() == ids.tolist()  # each row once
    _, _, expected, _ = scored.translate_scored(X)
    got = table.column("conf").to_numpy()
    assert got.tobytes() == expected.tobytes()  # the bytes translate_scored gives
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    assert vectors.tobytes() == scored(X).tobytes()


def test_a_confidence_column_is_refused_before_anything_is_written(
    tmp_path, scifact_small, unscored, scored
):
    X = scifact_small.corpus["minilm"][:20]
    source = write_parquet(tmp_path / "src.parquet", np.arange(20), X)
    target = tmp_path / "out"
    with pytest.raises(InvalidInputError, match="has no confidence head"):
        _apply(source, target, unscored, confidence_column="conf")
    with pytest.raises(InvalidInputError, match="named like the id or the vector column"):
        _apply(source, target, scored, confidence_column="id")
    assert not target.exists() or not any(target.glob("part-*"))
    from tests.migrate._data import unscored_stitch

    headless = str(unscored_stitch(tmp_path / "headless", scifact_small))
    code = main(["migrate", "apply", source, str(target), "--stitch", headless, "--quiet",
                 "--confidence-column", "conf"])  # fmt: skip
    assert code == 2 and not any(target.glob("part-*"))


def test_source_parameters_a_matrix_does_not_use_are_refused(
    tmp_path, scifact_small, minilm_to_mpnet
):
    """``x.npy?column=foo`` ran, the parameter silently ignored (found by an adversarial
    pass)."""
    np.save(tmp_path / "x.npy", scifact_small.corpus["minilm"][:10])
    with pytest.raises(InvalidInputError, match="takes no parameters, not column"):
        _apply(f"{tmp_path / 'x.npy'}?column=foo", tmp_path / "out", minilm_to_mpnet)
    assert not (tmp_path / "out").exists()


def test_a_null_value_inside_a_vector_is_named_as_such(tmp_path, scifact_small, minilm_to_mpnet):
    """A NULL among a vector's numbers was reported as NaN or infinity."""
    rows = scifact_small.corpus["minilm"][:10].tolist()
    rows[4][7] = None
    table = pa.table({"id": pa.array(range(10), pa.int64()), "emb": pa.array(rows)})
    pq.write_table(table, tmp_path / "holes.parquet")
    with pytest.raises(InvalidInputError, match=r"id 4 in .* has a NULL value among its numbers"):
        _apply(str(tmp_path / "holes.parquet"), tmp_path / "out", minilm_to_mpnet)
    assert not (tmp_path / "out").exists()


def test_a_source_of_another_dimension_is_named_once(
    tmp_path, scifact_small, minilm_to_mpnet, capsys
):
    """A .npy of another dimension read "x.npy of x.npy has dimension 768" (an adversarial
    pass); a Parquet source names its column and its file."""
    mpnet = scifact_small.corpus["mpnet"][:10]
    np.save(tmp_path / "x.npy", mpnet)
    npy = str(tmp_path / "x.npy")
    with pytest.raises(ShapeMismatchError) as raised:
        _apply(npy, tmp_path / "out", minilm_to_mpnet)
    assert raised.value.message.startswith(f"{npy} has dimension 768, but stitch {STITCH}")
    parquet = write_parquet(tmp_path / "x.parquet", np.arange(10), mpnet)
    with pytest.raises(ShapeMismatchError, match=r"^emb of .*x\.parquet.* has dimension 768"):
        _apply(parquet, tmp_path / "out", minilm_to_mpnet)
    assert not (tmp_path / "out").exists()
    main(["migrate", "plan", npy, "--stitch", STITCH])
    assert f"{npy} has dimension 768," in capsys.readouterr().out
