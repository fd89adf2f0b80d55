"""The GPU translate path (no host read-back before the result), run on the CPU.

``Route.translate`` reads nothing back between hops on a GPU (``sync_free``): the unit
scaling flags zero rows in a mask checked once the result is on the host. The same code
runs here on the CPU, and must give the same bytes and the same errors as the
synchronising path. ``test_gpu_path_on_cuda`` runs it on a real device (``-m gpu``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from service_helpers import b64, unb64

from lead import load_stitch, save_stitch
from lead.errors import ZeroVectorError
from service.routing import Route, StitchEntry, serving_copy
from tests.conftest import FIXTURES

MODELS = Path(__file__).resolve().parents[2] / "models"


def _route(*ids: str, device: str = "cpu", **kwargs: Any) -> Route:
    entries = tuple(
        StitchEntry(i, load_stitch(MODELS / i, device=device, dtype=torch.float32)) for i in ids
    )
    return Route(entries, torch.device(device), **kwargs)


def _inputs(scifact_small: Any) -> np.ndarray:
    x = np.concatenate([scifact_small.queries["minilm"], scifact_small.corpus["minilm"][:60]])
    x = np.ascontiguousarray(x, dtype=np.float32)
    x[::3] *= 7.5  # off unit length: rescaled first
    return x


@pytest.mark.parametrize(
    ("ids", "inverse"),
    [
        (("minilm-to-mpnet",), False),
        (("minilm-to-mpnet", "mpnet-to-minilm"), False),  # a chain: scaled again in between
        (("minilm-to-pml3-invertible",), True),
    ],
)
def test_sync_free_path_gives_the_same_bytes(
    ids: tuple[str, ...], inverse: bool, scifact_small: Any
) -> None:
    synced = _route(*ids, inverse=inverse, sync_free_override=False)
    free = dataclasses.replace(synced, sync_free_override=True)
    assert free.sync_free and not synced.sync_free
    x = _inputs(scifact_small)
    if inverse:
        x = np.ascontiguousarray(_route(*ids).translate(x))  # pml3-space inputs
        x[::3] *= 7.5
    for normalize in (False, True):
        expected = synced.translate(x, normalize=normalize)
        assert free.translate(x, normalize=normalize).tobytes() == expected.tobytes()
    # the rows scaled to unit length before the first stitch: the answer's rescaled_inputs
    for route in (synced, free):
        answer = route.run(x)
        assert answer.rescaled is not None
        np.testing.assert_array_equal(np.flatnonzero(answer.rescaled), np.arange(0, len(x), 3))
        assert answer.rescaled_inputs == len(x[::3])


def test_sync_free_path_names_the_same_zero_rows(scifact_small: Any) -> None:
    x = _inputs(scifact_small)[:10]
    x[6] = 0.0
    for sync_free in (False, True):
        route = _route("minilm-to-mpnet", sync_free_override=sync_free)
        with pytest.raises(ZeroVectorError) as raised:
            route.translate(x)
        assert raised.value.param == "input[6]"
        assert "input[6] is a zero vector" in str(raised.value)


@pytest.mark.gpu
def test_gpu_path_on_cuda(scifact_small: Any) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = _inputs(scifact_small)
    # the bundled gated stitch that the GPU run carries (its tree is limited in size)
    gpu = _route("minilm-to-pml3", device="cuda")
    assert gpu.sync_free
    y = gpu.translate(x)
    np.testing.assert_allclose(y, _route("minilm-to-pml3").translate(x), atol=1e-4)
    # batch-invariant on the device too: fixed tiles, whatever a row's tile and position
    alone = np.concatenate([gpu.translate(x[i : i + 1]) for i in range(32)])
    assert alone.tobytes() == y[:32].tobytes()
    big = np.concatenate([np.tile(x, (10, 1))[:1000], x])  # x across a tile boundary
    assert gpu.translate(big)[1000:].tobytes() == y.tobytes()


def _overflowing_copy(folder: Path, tmp_path: Path) -> Path:
    """The stitch with its map scaled by 1e7: the same unit answers in float32, but its
    pre-normalisation values (~1e5) overflow float16 (65,504)."""
    stitch = load_stitch(folder)
    with torch.no_grad():
        stitch.weight.mul_(1e7)
        stitch.target_mean.mul_(1e7)
    save_stitch(stitch, tmp_path / "overflowing")
    return tmp_path / "overflowing"


def test_reduced_precision_only_where_the_stitch_allows(
    fitted: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cpu = torch.device("cpu")
    fine = serving_copy(load_stitch(fitted.folder("minilm-to-mpnet")), cpu, torch.bfloat16)
    assert next(fine.parameters()).dtype == torch.bfloat16
    overflowing = load_stitch(_overflowing_copy(fitted.folder("minilm-to-mpnet"), tmp_path))
    with caplog.at_level("WARNING", logger="lead.service"):
        kept = serving_copy(overflowing, cpu, torch.float16)
    assert next(kept.parameters()).dtype == torch.float32
    assert "runs in float32, not float16" in caplog.text


def test_a_stitch_that_overflows_float16_is_served_in_float32(
    make_client: Any, fitted: Any, queries: Any, tmp_path: Path
) -> None:
    folder = _overflowing_copy(fitted.folder("minilm-to-mpnet"), tmp_path)
    x = queries["minilm"][:5]
    body = {"stitch": "overflowing", "input": b64(x), "encoding_format": "base64"}
    answers = []
    for dtype in ("float16", "float32"):
        client = make_client([str(folder)], dtype=dtype)
        r = client.post("/v1/translate", json=body)
        assert r.status_code == 200, r.text
        answers.append([item["embedding"] for item in r.json()["data"]])
    assert answers[0] == answers[1]  # float32 both times: the same bytes
    np.testing.assert_allclose(
        unb64(answers[0]), fitted.expected(["minilm-to-mpnet"], x), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    ("name", "dtype"),
    [("e5-to-minilm", torch.bfloat16), ("e5-to-minilm", torch.float16)],
)
def test_inputs_near_their_mean_keep_their_answers_in_any_precision(
    name: str, dtype: torch.dtype
) -> None:
    """e5 vectors sit close to their mean (norm 0.89): centring them in bfloat16 lost the
    answers of an earlier bundled stitch (mean cosine 0.67 to float32 on real vectors)
    while isotropic probes passed. Whatever precision the probe keeps, real e5 vectors
    (the everyday sentences, in no training data) keep their float32 answers."""
    exact = load_stitch(MODELS / name)
    kept = serving_copy(load_stitch(MODELS / name), torch.device("cpu"), dtype)
    x = torch.from_numpy(load_file(FIXTURES / "everyday_sentences.safetensors")["e5"])
    with torch.no_grad():
        want = exact(x)
        got = kept(x.to(next(kept.parameters()).dtype)).float()
    assert float(torch.nn.functional.cosine_similarity(want, got).min()) >= 0.999


def test_both_directions_of_an_invertible_stitch_are_probed() -> None:
    stitch = load_stitch(MODELS / "minilm-to-pml3-invertible")
    kept = serving_copy(stitch, torch.device("cpu"), torch.bfloat16)
    assert next(kept.parameters()).dtype == torch.float32  # the inverse: cosine 0.996


@pytest.mark.parametrize("name", ["minilm-to-mpnet", "mpnet-to-minilm", "minilm-to-pml3"])
def test_confidences_hold_in_a_reduced_precision(name: str) -> None:
    """bfloat16 rounding of a unit output moves its norm by ~4e-3, and the norm features of
    a head fitted on unit rows (version 2) with it: the bundled stitches' confidences moved
    by up to 0.30 on real sentences (an adversarial test found it) until they were scored on
    the output renormalised in float32. Version-3 heads score the output before its L2
    normalisation, whose norm varies from row to row far more than bfloat16 moves it (0.004
    at most measured): within the serving probe's tolerance."""
    from service.registry import StitchRegistry

    src = name.split("-to-")[0]
    x = load_file(FIXTURES / "everyday_sentences.safetensors")[src]
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    confidences = []
    for dtype in (torch.float32, torch.bfloat16):
        registry = StitchRegistry(torch.device("cpu"), dtype)
        registry.register(name, load_stitch(MODELS / name))
        confidences.append(registry.route_for_id(name).translate_scored(x)[1])
    assert np.abs(confidences[0] - confidences[1]).max() <= 0.05
    assert len(np.unique(confidences[1])) > 40  # not flattened to a few levels


@pytest.mark.parametrize("name", ["mpnet-to-minilm", "minilm-to-mpnet", "e5-to-minilm"])
def test_the_reduced_precision_probe_scores_real_inputs(name: str) -> None:
    """Synthetic probe rows were all out of distribution for mpnet -> MiniLM's head (an
    adversarial pass found it), so its confidences read 0 in any precision and the
    reduced-precision check on them measured nothing. The gated stitch's memory keys
    (real training inputs) join the probe, and the head takes them as in distribution."""
    from service.routing import PROBE_TYPICAL_ROWS, _probe_batch

    stitch = load_stitch(MODELS / name)
    typical = stitch.typical_inputs()
    assert typical is not None and len(typical) > PROBE_TYPICAL_ROWS
    x = _probe_batch(stitch.d_src, stitch.source_mean, typical)
    assert x.shape == (64 + PROBE_TYPICAL_ROWS, stitch.d_src)
    with torch.inference_mode():
        ood = stitch.score_confidence(x, stitch(x))[1]
    assert not bool(ood[64:].any())  # every real row is scored
    synthetic_only = _probe_batch(stitch.d_src, stitch.source_mean)
    assert synthetic_only.shape == (64, stitch.d_src)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_served_stitches_are_frozen(dtype: torch.dtype) -> None:
    """The registry freezes what it serves, so a lone vector's memory search reads float16
    keys (half the bytes); the answer is the same bits as an unfrozen stitch's."""
    from service.registry import StitchRegistry

    name = "minilm-to-mpnet"
    registry = StitchRegistry(torch.device("cpu"), dtype)
    served = registry.register(name, load_stitch(MODELS / name)).stitch
    assert served.domain._frozen_keys()[0] is not None
    x = load_file(FIXTURES / "scifact_small.safetensors")["minilm_queries"][:3]
    plain = load_stitch(MODELS / name).to(dtype=served.domain.keys.dtype).eval()
    assert plain.domain._frozen_keys() == (None, None)
    for row in x:
        one = torch.from_numpy(row[None] / np.linalg.norm(row)).to(plain.domain.keys.dtype)
        with torch.inference_mode():
            assert torch.equal(served(one), plain(one))


@pytest.mark.parametrize("ids", [("minilm-to-mpnet",), ("minilm-to-mpnet", "mpnet-to-minilm")])
def test_a_large_request_runs_in_blocks_with_the_same_bytes(
    ids: tuple[str, ...], scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above CPU_BLOCK_ROWS a request runs block by block (its intermediates bounded):
    the same vectors, confidences, out-of-distribution flags and rescaled rows as one
    forward, and a zero vector is named by its row in the whole request."""
    from service import routing

    route = _route(*ids, sync_free_override=False)
    x = _inputs(scifact_small)  # 160 rows, every third off unit length
    whole = {scored: route.run(x, scored=scored, normalize=True) for scored in (False, True)}
    blocks: list[int] = []
    run = Route._run

    def counting(self: Route, rows: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        blocks.append(len(rows))
        return run(self, rows, *args, **kwargs)

    monkeypatch.setattr(Route, "_run", counting)
    monkeypatch.setattr(routing, "CPU_BLOCK_ROWS", 48)
    for scored in (False, True):
        blocks.clear()
        blocked = route.run(x, scored=scored, normalize=True)
        assert blocks == [48, 48, 48, 16]
        for got, want in zip(blocked, whole[scored], strict=True):
            assert (got is None) == (want is None)
            if got is not None:
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        assert blocked.rescaled_inputs == len(x[::3])
    x[100] = 0.0
    with pytest.raises(ZeroVectorError) as raised:
        route.translate(x)
    assert raised.value.param == "input[100]" and "input[100]" in str(raised.value)
