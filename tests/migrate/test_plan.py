"""plan on real SciFact vectors in Parquet: problems are listed, never raised."""

from __future__ import annotations

import numpy as np

from lead import migrate
from tests.migrate._data import doc_ids, write_parquet

#: a stitch fitted on unit-length vectors: it cannot scale a zero vector
UNIT_STITCH = "minilm-to-mpnet"


def test_zero_vectors_of_the_probe_are_problems_named_by_id(scifact_small, tmp_path):
    ids = doc_ids(scifact_small)
    vectors = scifact_small.corpus["minilm"].copy()
    vectors[[10, 30]] = 0.0
    source = write_parquet(tmp_path / "zero.parquet", ids, vectors)
    result = migrate.plan(source, UNIT_STITCH)  # was a ZeroVectorError naming input[10]
    assert not result.ok and len(result.problems) == 1
    problem = result.problems[0]
    assert f"ids {ids[10]}, {ids[30]} in emb are all zeros (2 of the 400 rows)" in problem
    assert "input[" not in problem
    # the other rows were translated: the estimate is still there
    assert result.estimated_seconds is not None and result.estimated_seconds > 0
    assert result.probe["rows"] == 400 and result.probe["translate_rows_per_second"] > 0


def test_a_source_of_zero_vectors_has_no_estimate(scifact_small, tmp_path):
    ids = doc_ids(scifact_small)[:20]
    source = write_parquet(tmp_path / "zeros.parquet", ids, np.zeros((20, 384), np.float32))
    result = migrate.plan(source, UNIT_STITCH)
    assert not result.ok and result.estimated_seconds is None
    assert "and 10 more in emb are all zeros (20 of the 20 rows)" in result.problems[0]
    assert "translate_rows_per_second" not in result.probe
    assert result.as_dict()["problems"] == result.problems


def test_a_clean_source_has_no_problems(scifact_small, tmp_path):
    source = write_parquet(
        tmp_path / "ok.parquet", doc_ids(scifact_small), scifact_small.corpus["minilm"]
    )
    result = migrate.plan(source, UNIT_STITCH)
    assert result.ok and result.problems == [] and result.estimated_seconds > 0


def test_the_stored_value_type_is_named_as_the_source_holds_it(scifact_small, tmp_path):
    """float64 Parquet lists and .npy files were reported as float32 (what they are read as)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    X = scifact_small.corpus["minilm"][:50].astype(np.float64)
    lists = pa.array(list(X), type=pa.list_(pa.float64()))
    path = tmp_path / "double.parquet"
    pq.write_table(pa.table({"id": pa.array(range(50)), "emb": lists}), path)
    np.save(tmp_path / "half.npy", X.astype(np.float16))
    for source, stored in ((f"{path}?column=emb", "float64"), (tmp_path / "half.npy", "float16")):
        result = migrate.plan(str(source), UNIT_STITCH)
        assert result.ok, result.problems
        assert result.source["vector_type"] == stored


def test_ids_that_will_be_row_numbers_are_noted(scifact_small, tmp_path):
    """A Parquet file whose ids sit in `doc_id` planned "ok" without a word, and apply
    wrote ids 0..n-1 (a new user's trial)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lead._arrow import vector_column

    X = scifact_small.corpus["minilm"][:20]
    path = tmp_path / "named.parquet"
    names = pa.array([f"doc-{i}" for i in range(20)])
    pq.write_table(pa.table({"doc_id": names, "vec": vector_column(X)}), path)
    result = migrate.plan(str(path), UNIT_STITCH)
    assert result.ok and len(result.notes) == 1
    assert "no column 'id'" in result.notes[0] and "?id=COLUMN" in result.notes[0]
    assert "doc_id" in result.notes[0] and result.as_dict()["notes"] == result.notes
    named = migrate.plan(f"{path}?id=doc_id", UNIT_STITCH)
    assert named.ok and named.notes == [] and named.source["id_kind"] == "str"


def test_a_zero_vector_in_the_second_half_of_the_probe_is_named_alone(scifact_small, tmp_path):
    """The probe times two halves of its batch; the error's row counts from the half, and
    was taken as a row of the batch: a good vector 600 rows earlier was named beside the
    zero one (an adversarial pass)."""
    vectors = np.vstack([scifact_small.corpus["minilm"]] * 3)  # 1,200 rows
    vectors[700] = 0.0
    np.save(tmp_path / "zero700.npy", vectors)
    result = migrate.plan(str(tmp_path / "zero700.npy"), UNIT_STITCH)
    assert not result.ok and len(result.problems) == 1
    assert "ids 700 in" in result.problems[0] and "(1 of the 1200 rows)" in result.problems[0]
