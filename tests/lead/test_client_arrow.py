"""LeadClient.translate(format="arrow") against the real app serving a bundled stitch: the
same vectors as the JSON path, bit for bit; server errors as LeadError subclasses; pyarrow
stays optional for ``lead``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from lead.client import LeadClient
from lead.errors import InvalidInputError, ShapeMismatchError, StitchNotFoundError
from service.app import create_app
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"


@pytest.fixture(scope="module")
def lead(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LeadClient]:
    settings = Settings(
        stitches=[str(REPO / "models" / "minilm-to-mpnet")],
        data_dir=tmp_path_factory.mktemp("client-arrow"),
        device="cpu",
        load_in_background=False,
        enable_jobs=False,
        max_vectors=16,
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as http:
        yield LeadClient(http=http)


def test_arrow_equals_json_bit_for_bit(lead: LeadClient, scifact_small: Any) -> None:
    x = scifact_small.queries["minilm"][:16]
    by_json = lead.translate(x, stitch="minilm-to-mpnet")
    by_arrow = lead.translate(x, stitch="minilm-to-mpnet", format="arrow")
    assert by_arrow.dtype == np.float32 and by_arrow.shape == (16, 768)
    assert by_arrow.flags.writeable
    assert np.array_equal(by_arrow, by_json)
    by_models = lead.translate(x, source_model=MINILM, target_model=MPNET, format="arrow")
    assert np.array_equal(by_models, by_json)
    normalized = lead.translate(x * 2.0, stitch="minilm-to-mpnet", normalize=True, format="arrow")
    assert np.array_equal(
        normalized, lead.translate(x * 2.0, stitch="minilm-to-mpnet", normalize=True)
    )


def test_arrow_carries_more_than_the_json_limit(lead: LeadClient, scifact_small: Any) -> None:
    """The server takes 16 vectors per JSON request here (the client splits the call into
    7 requests, or refuses a larger batch_size); Arrow takes all 100 at once."""
    x = scifact_small.queries["minilm"]
    with pytest.raises(InvalidInputError, match="too many vectors"):
        lead.translate(x, stitch="minilm-to-mpnet", batch_size=100)
    y = lead.translate(x, stitch="minilm-to-mpnet", format="arrow")
    assert y.shape == (100, 768)
    assert y.tobytes() == lead.translate(x, stitch="minilm-to-mpnet").tobytes()


def test_arrow_errors_are_lead_errors(lead: LeadClient, scifact_small: Any) -> None:
    x = scifact_small.queries["minilm"][:4]
    with pytest.raises(ShapeMismatchError) as info:
        lead.translate(x[:, :100], stitch="minilm-to-mpnet", format="arrow")
    assert info.value.status_code == 422  # type: ignore[attr-defined]
    with pytest.raises(StitchNotFoundError):
        lead.translate(x, stitch="nope", format="arrow")
    with pytest.raises(ShapeMismatchError):  # refused before anything is sent
        lead.translate(x[0], stitch="minilm-to-mpnet", format="arrow")


def test_arrow_without_pyarrow_says_how_to_install_it(
    lead: LeadClient, scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = scifact_small.queries["minilm"][:2]
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(ImportError, match="pip install pyarrow"):
        lead.translate(x, stitch="minilm-to-mpnet", format="arrow")
    assert lead.translate(x, stitch="minilm-to-mpnet").shape == (2, 768)


def test_lead_does_not_import_pyarrow() -> None:
    code = "import sys, lead, lead.client, lead.cli; assert 'pyarrow' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


def test_an_unknown_format_is_refused() -> None:
    from lead.client import LeadClient
    from lead.errors import InvalidInputError

    with (
        LeadClient("http://127.0.0.1:9") as client,
        pytest.raises(InvalidInputError, match="format must be 'json' or 'arrow'"),
    ):
        client.translate(np.zeros((1, 4), np.float32), stitch="s", format="xml")  # type: ignore[arg-type]
