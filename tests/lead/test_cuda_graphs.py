"""CUDA graphs of a stitch's tile (lead.cuda_graphs): the eager tiles' bits, captured again
when the stitch changes, eager where a map cannot be captured. The graph tests need a CUDA
device (``-m gpu``, run on the lent GPU machine); the gate runs everywhere."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lead import load_stitch
from lead.batch_invariance import CUDA_TILE, forward_batch_invariant
from lead.cuda_graphs import _GRAPHS, _MAX_CAPTURES, graphable, run_tiles

MODELS = Path(__file__).resolve().parents[2] / "models"
#: The bundled stitch that the GPU run carries (its tree is limited in size).
BUNDLED = "minilm-to-pml3"


def _eager_tiles(run: Any, x: Tensor, tile: int = CUDA_TILE) -> Tensor:
    parts = []
    for i in range(0, x.shape[0], tile):
        part = x[i : i + tile]
        padded = torch.cat([part, part.new_zeros((tile - part.shape[0], *part.shape[1:]))])
        parts.append(run(padded)[: part.shape[0]])
    return torch.cat(parts)


class _ReadsBack(nn.Module):
    """A map with a data-dependent branch (a value read back to the host)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: Tensor) -> Tensor:
        if bool((x.sum() > 0).item()):
            return x * self.scale
        return x


def test_not_graphable_off_a_gpu_with_autograd_or_training() -> None:
    stitch = nn.Linear(4, 4).eval()
    x = torch.ones(3, 4)
    with torch.inference_mode():
        assert not graphable(stitch, x)  # the CPU
        assert run_tiles(stitch, x, 8) is None
    if torch.cuda.is_available():
        on_gpu = stitch.cuda()
        xg = x.cuda()
        assert not graphable(on_gpu, xg)  # autograd on
        with torch.inference_mode():
            assert graphable(on_gpu, xg)
            assert graphable(on_gpu.forward, xg)  # a bound method of a module
            assert not graphable(lambda t: on_gpu(t), xg)  # not a module's: unkeyed
            assert not graphable(on_gpu.train(), xg)  # dropout would replay its draws


def _cuda_or_skip() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def _source_rows(scifact_small: Any, device: torch.device) -> Tensor:
    x = torch.cat(
        [
            torch.from_numpy(scifact_small.queries["minilm"]),
            torch.from_numpy(scifact_small.corpus["minilm"]),
        ]
    ).float()
    return x.to(device)


@pytest.mark.gpu
def test_graph_replays_give_the_eager_tiles_bits(scifact_small: Any) -> None:
    device = _cuda_or_skip()
    stitch = load_stitch(MODELS / BUNDLED, device=device).eval()
    x = _source_rows(scifact_small, device)
    big = x.repeat(-(-3000 // x.shape[0]), 1)[:3000]  # three tiles, the last one partial
    with torch.inference_mode():
        expected = _eager_tiles(stitch, big)
        for rows in (big[:1], big[:7], big[:CUDA_TILE], big[:1500], big):
            got = run_tiles(stitch, rows, CUDA_TILE)
            assert got is not None
            assert torch.equal(got, expected[: rows.shape[0]])
        graphs = _GRAPHS[stitch].tiles
        assert len(graphs) == 1 and next(iter(graphs.values())) is not None
        entry = next(iter(graphs.values()))
        run_tiles(stitch, big[:5], CUDA_TILE)
        assert next(iter(graphs.values())) is entry  # replayed, not captured again
        assert list(_GRAPHS[stitch].captures.values()) == [1]
        # the service's path: forward_batch_invariant goes through the graph
        assert torch.equal(forward_batch_invariant(stitch, big), expected)


@pytest.mark.gpu
def test_a_changed_stitch_is_captured_again(scifact_small: Any) -> None:
    device = _cuda_or_skip()
    stitch = load_stitch(MODELS / BUNDLED, device=device).eval()
    x = _source_rows(scifact_small, device)[:50]
    with torch.inference_mode():
        before = run_tiles(stitch, x, CUDA_TILE)
    with torch.no_grad():
        stitch.target_mean.add_(0.25)  # in place: the same address, a new version
    with torch.inference_mode():
        after = run_tiles(stitch, x, CUDA_TILE)
        assert after is not None and before is not None
        assert not torch.equal(after, before)
        assert torch.equal(after, _eager_tiles(stitch, x))
    for _ in range(8):  # a module that keeps changing: captured a few times, then eager
        with torch.no_grad():
            stitch.target_mean.add_(0.25)
        with torch.inference_mode():
            got = run_tiles(stitch, x, CUDA_TILE)
            assert got is None or torch.equal(got, _eager_tiles(stitch, x))
    assert max(_GRAPHS[stitch].captures.values()) == _MAX_CAPTURES + 1
    assert next(iter(_GRAPHS[stitch].tiles.values())) is None


@pytest.mark.gpu
def test_a_map_that_reads_back_runs_eagerly() -> None:
    device = _cuda_or_skip()
    module = _ReadsBack().to(device).eval()
    x = torch.randn(10, 3, device=device).abs()
    with torch.inference_mode():
        assert run_tiles(module, x, 16) is None  # its capture fails: eager from then on
        assert _GRAPHS[module].tiles[("__call__", x.dtype, (3,), x.device, 16)] is None
        assert torch.equal(forward_batch_invariant(module, x), x * 2.0)


@pytest.mark.gpu
def test_concurrent_callers_share_one_graph(scifact_small: Any) -> None:
    device = _cuda_or_skip()
    stitch = load_stitch(MODELS / BUNDLED, device=device).eval()
    x = _source_rows(scifact_small, device)
    with torch.inference_mode():
        expected = _eager_tiles(stitch, x)
    results: dict[int, Tensor] = {}

    def call(i: int) -> None:
        with torch.inference_mode():
            rows = x[i : i + 1 + i % 5]
            got = run_tiles(stitch, rows, CUDA_TILE)
            assert got is not None
            torch.cuda.synchronize()
            results[i] = got

    threads = [threading.Thread(target=call, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 32
    for i, got in results.items():
        assert torch.equal(got, expected[i : i + 1 + i % 5])
