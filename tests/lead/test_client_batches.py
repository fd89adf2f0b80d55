"""LeadClient.translate with any number of vectors: split into requests of the server's
limit, retried after 429, errors naming the caller's row; the same bytes however split."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lead.client import LeadClient
from lead.errors import ZeroVectorError
from service.app import create_app
from service.settings import Settings

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = Settings(
        stitches=[str(MODELS / "minilm-to-mpnet")],
        data_dir=tmp_path_factory.mktemp("client-batches"),
        device="cpu",
        load_in_background=False,
        max_vectors=50,
        enable_jobs=False,
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def _rows(scifact_small: Any) -> np.ndarray:
    return np.array(scifact_small.queries["minilm"][:100], dtype=np.float32)  # a copy


def test_more_vectors_than_the_server_takes_are_split(http: TestClient, scifact_small: Any) -> None:
    x = _rows(scifact_small)
    client = LeadClient(http=http)
    whole = client.translate(x, stitch="minilm-to-mpnet")  # 100 > max_vectors = 50
    assert whole.shape == (100, 768)
    sevens = client.translate(x, stitch="minilm-to-mpnet", batch_size=7)
    assert whole.tobytes() == sevens.tobytes()  # batch-invariant answers
    alone = np.concatenate(
        [client.translate(x[i : i + 1], stitch="minilm-to-mpnet") for i in (0, 99)]
    )
    assert alone.tobytes() == whole[[0, 99]].tobytes()


def test_an_error_names_the_callers_row(http: TestClient, scifact_small: Any) -> None:
    x = _rows(scifact_small)
    x[75] = 0.0
    with pytest.raises(ZeroVectorError) as raised:
        LeadClient(http=http).translate(x, stitch="minilm-to-mpnet")
    assert raised.value.param == "input[75]"  # row 25 of the second request
    assert raised.value.row == 75
    assert "input[75] is a zero vector" in str(raised.value)


def test_a_refused_request_is_sent_again_after_retry_after(
    http: TestClient, scifact_small: Any
) -> None:
    limiter = http.app.state.small_limiter  # type: ignore[attr-defined]
    assert limiter.try_acquire(limiter.limit)  # the small requests' share is taken
    timer = threading.Timer(0.3, limiter.release, args=(limiter.limit,))
    timer.start()
    try:
        y = LeadClient(http=http).translate(_rows(scifact_small)[:2], stitch="minilm-to-mpnet")
    finally:
        timer.join()
    assert y.shape == (2, 768)
    with pytest.raises(Exception, match="too many small translate requests"):
        assert limiter.try_acquire(limiter.limit)
        try:
            LeadClient(http=http).translate(
                _rows(scifact_small)[:2], stitch="minilm-to-mpnet", retries=0
            )
        finally:
            limiter.release(limiter.limit)
