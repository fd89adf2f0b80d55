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
