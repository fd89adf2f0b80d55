"""A row's translation is bit-identical alone, in any batch, at any position, any thread count.

Checked on every bundled stitch (both directions of the invertible one) with real SciFact
embeddings, on the machine that runs the tests (the property rests on its BLAS kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from lead import load_stitch
from lead.batch_invariance import ROW_QUANTUM, forward_batch_invariant
from lead.stitches import oriented

MODELS = Path(__file__).resolve().parents[2] / "models"
BUNDLED = sorted(p.name for p in MODELS.iterdir() if (p / "config.json").is_file())
DIRECTIONS = [(name, False) for name in BUNDLED] + [("minilm-to-pml3-invertible", True)]


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _rows(scifact_small: Any, d: int, n: int = 1024) -> Tensor:
    """``n`` unit rows of dimension ``d`` from the real fixture embeddings: the rows
    themselves, then normalised sums of two of them (seeded)."""
    key = "mpnet" if d == 768 else "minilm"
    real = np.concatenate([scifact_small.corpus[key], scifact_small.queries[key]])
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, len(real), size=(2, n - len(real)))
    mixed = real[i] + real[j]
    rows = np.concatenate([real, mixed / np.linalg.norm(mixed, axis=1, keepdims=True)])
    return torch.from_numpy(rows.astype(np.float32))


def _run(name: str, inverse: bool) -> tuple[Callable[[Tensor], Tensor], int]:
    stitch = load_stitch(MODELS / name).eval()
    run, d_in, _ = oriented(stitch, inverse=inverse)
    return run, d_in


@pytest.mark.parametrize(("name", "inverse"), DIRECTIONS)
def test_rows_are_bit_identical_in_any_batch(
    name: str, inverse: bool, scifact_small: Any, restore_threads: None
) -> None:
    run, d_in = _run(name, inverse)
    x = _rows(scifact_small, d_in)
    with torch.inference_mode():
        torch.set_num_threads(1)
        alone = torch.cat([forward_batch_invariant(run, x[i : i + 1]) for i in range(256)])
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            whole = forward_batch_invariant(run, x)  # 1,024 rows, row i at position i
            assert torch.equal(whole[:256], alone), (threads, "batch of 1,024")
            shifted = forward_batch_invariant(run, x[5:261])  # row i at position i - 5
            assert torch.equal(shifted[:251], alone[5:]), (threads, "shifted")
            for size in (7, ROW_QUANTUM + 1, 100):
                parts = [forward_batch_invariant(run, x[i : i + size]) for i in range(0, 256, size)]
                assert torch.equal(torch.cat(parts)[:256], alone), (threads, size)


def test_a_plain_forward_is_not_batch_invariant(scifact_small: Any) -> None:
    """What the padding is for: without it the same rows differ across batch sizes (if this
    ever fails, the BLAS became invariant by itself and the padding could go)."""
    run, d_in = _run("minilm-to-mpnet", False)
    x = _rows(scifact_small, d_in)
    with torch.inference_mode():
        alone = torch.cat([run(x[i : i + 1]) for i in range(64)])
        whole = run(x)[:64]
    assert not torch.equal(alone, whole)


def test_output_matches_the_plain_forward_to_rounding(scifact_small: Any) -> None:
    run, d_in = _run("minilm-to-e5", False)
    x = _rows(scifact_small, d_in)[:37]
    with torch.inference_mode():
        padded, plain = forward_batch_invariant(run, x), run(x)
    assert padded.shape == plain.shape == (37, 384)
    torch.testing.assert_close(padded, plain, rtol=0, atol=1e-6)


def test_an_empty_batch_goes_through() -> None:
    run, d_in = _run("minilm-to-pml3", False)
    with torch.inference_mode():
        out = forward_batch_invariant(run, torch.zeros((0, d_in)))
    assert out.shape == (0, 384)
