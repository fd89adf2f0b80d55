"""Micro-batching: concurrent small translate requests share forwards, answers unchanged.

The answers are compared as bytes (base64 of float32): a vector's translation must be
bit-identical alone, in a batch of any size and position, and micro-batched with other
clients' vectors.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from service_helpers import b64

from lead.errors import ZeroVectorError
from service.app import create_app
from service.batcher import MicroBatcher
from service.observability import Metrics
from service.routing import Route, Translation
from service.settings import Settings

MODELS = Path(__file__).resolve().parents[2] / "models"
STITCH = "minilm-to-mpnet"  # bundled: the MLP stitch, fitted on unit-length vectors


def _settings(**overrides: Any) -> Settings:
    overrides.setdefault("stitches", [str(MODELS / STITCH)])
    overrides.setdefault("device", "cpu")
    return Settings(load_in_background=False, **overrides)


def _vectors(scifact_small: Any) -> np.ndarray:
    rows = np.concatenate([scifact_small.corpus["minilm"], scifact_small.queries["minilm"]])
    return np.ascontiguousarray(rows[:256], dtype=np.float32)


def _sample(app: Any, name: str) -> float:
    return float(app.state.metrics.registry.get_sample_value(name) or 0.0)


@pytest.mark.parametrize(
    ("device", "stitch"),
    [
        ("cpu", STITCH),
        # on a GPU: fixed tiles; the other bundled gated stitch (what the GPU run carries)
        pytest.param("cuda", "minilm-to-pml3", marks=pytest.mark.gpu),
    ],
)
def test_translations_are_the_same_bytes_alone_batched_and_micro_batched(
    device: str, stitch: str, scifact_small: Any
) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    x = _vectors(scifact_small)
    strings = b64(x)
    app = create_app(_settings(stitches=[str(MODELS / stitch)], device=device))

    async def main() -> dict[str, list[str]]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:

                async def translate(rows: list[str]) -> list[str]:
                    body = {"stitch": stitch, "input": rows, "encoding_format": "base64"}
                    r = await http.post("/v1/translate", json=body)
                    assert r.status_code == 200, r.text  # no 429 at the default limits
                    return [item["embedding"] for item in r.json()["data"]]

                out: dict[str, list[str]] = {"alone": []}
                for s in strings:  # one at a time: each forward holds one request
                    out["alone"] += await translate([s])
                out["batches of 7"] = []
                for i in range(0, len(strings), 7):
                    out["batches of 7"] += await translate(strings[i : i + 7])
                out["one batch"] = await translate(strings)
                # a batch of 1,024 (2 MB: the bulk path) with the 256 at rows 384-639
                big = strings[::-1] + strings[128:] + strings + strings[:128] + strings[::-1]
                assert len(big) == 1024
                out["in a batch of 1,024"] = (await translate(big))[384:640]

                async def client(k: int) -> list[tuple[int, str]]:  # 4 vectors, one per call
                    return [(i, (await translate([strings[i]]))[0]) for i in range(k, 256, 64)]

                answers = await asyncio.gather(*(client(k) for k in range(64)))
                out["64 concurrent clients"] = [s for _, s in sorted(p for a in answers for p in a)]
                return out

    before = _sample(app, "lead_microbatch_requests_count")
    out = asyncio.run(main())
    for way, answers in out.items():
        assert answers == out["alone"], way
    forwards = _sample(app, "lead_microbatch_requests_count") - before
    requests = _sample(app, "lead_microbatch_requests_sum")
    # 256 + 37 sequential small requests, each its own forward (the 256-vector one, 0.5 MB,
    # runs whole in a worker thread), then 256 concurrent ones, which shared forwards
    assert requests == 256 + 37 + 256
    assert forwards < requests, "the concurrent requests never shared a forward"


def _route(app: Any) -> Any:
    return app.state.registry.route_for_id(STITCH)


def _shared_forwards(
    calls: Callable[[Route, MicroBatcher], list[Awaitable[Any]]],
) -> tuple[list[Any], Any, Metrics]:
    """Await ``calls(route, batcher)`` together, on a fresh app's route and a batcher that
    does not wait for more: (their results or exceptions, the app, the batcher's metrics)."""
    app = create_app(_settings())
    metrics = Metrics()
    batcher = MicroBatcher(max_vectors=256, max_wait_s=0.0, metrics=metrics)

    async def main() -> list[Any]:
        async with app.router.lifespan_context(app):
            return await asyncio.gather(*calls(_route(app), batcher), return_exceptions=True)

    try:
        return asyncio.run(main()), app, metrics
    finally:
        batcher.close()


def test_a_bad_request_in_a_shared_forward_fails_alone(scifact_small: Any) -> None:
    x = _vectors(scifact_small)[:6]
    zero = x[:3].copy()
    zero[1] = 0.0
    (good, bad, normalized), app, metrics = _shared_forwards(
        lambda route, batcher: [
            batcher.translate(route, x[:3], normalize=False),
            batcher.translate(route, zero, normalize=False),
            batcher.translate(route, x[3:], normalize=True),  # another key: own forward
        ]
    )
    route = _route(app)
    assert isinstance(bad, ZeroVectorError)
    assert bad.param == "input[1]"  # its own row, not the shared batch's row 4
    np.testing.assert_array_equal(good, route.translate(x[:3]))
    np.testing.assert_array_equal(normalized, route.translate(x[3:], normalize=True))
    histogram = metrics.registry.get_sample_value
    assert histogram("lead_microbatch_requests_count") == 2  # [good, zero] shared one
    assert histogram("lead_microbatch_requests_sum") == 3


def test_a_lone_request_does_not_wait_and_arriving_ones_join(scifact_small: Any) -> None:
    x = _vectors(scifact_small)
    app = create_app(_settings())
    metrics = Metrics()
    batcher = MicroBatcher(max_vectors=256, max_wait_s=60.0, metrics=metrics)

    async def main() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        async with app.router.lifespan_context(app):
            route = _route(app)
            # nobody on the way: the 60 s gathering wait does not apply
            lone = await asyncio.wait_for(batcher.translate(route, x[:1], normalize=False), 10)
            # one request on its way: the next waits for it, and they share the forward
            with batcher.arriving():
                first = asyncio.create_task(batcher.translate(route, x[1:2], normalize=False))
                await asyncio.sleep(0.05)
                assert not first.done(), "did not wait for the request on its way"
                second = batcher.translate(route, x[2:3], normalize=False)
                both = asyncio.gather(first, second)
            pair = await asyncio.wait_for(both, 10)
            return lone, pair[0], pair[1]

    lone, first, second = asyncio.run(main())
    batcher.close()
    route = _route(app)
    np.testing.assert_array_equal(np.concatenate([lone, first, second]), route.translate(x[:3]))
    histogram = metrics.registry.get_sample_value
    assert histogram("lead_microbatch_requests_count") == 2
    assert histogram("lead_microbatch_requests_bucket", {"le": "2.0"}) == 2  # 1, then 2


def test_an_arrival_that_never_submits_ends_the_wait(scifact_small: Any) -> None:
    x = _vectors(scifact_small)
    app = create_app(_settings())
    batcher = MicroBatcher(max_vectors=256, max_wait_s=60.0)

    async def main() -> np.ndarray:
        async with app.router.lifespan_context(app):
            route = _route(app)
            with batcher.arriving():  # e.g. a request whose body turns out invalid
                task = asyncio.create_task(batcher.translate(route, x[:1], normalize=False))
                await asyncio.sleep(0.05)
            return await asyncio.wait_for(task, 10)

    y = asyncio.run(main())
    batcher.close()
    np.testing.assert_array_equal(y, _route(app).translate(x[:1]))


@pytest.mark.parametrize("micro_batching", [True, False])
def test_batch_sizes_are_in_metrics_and_batching_can_be_switched_off(
    micro_batching: bool, make_client: Any, queries: Any
) -> None:
    client = make_client(micro_batching=micro_batching)
    r = client.post(
        "/v1/translate", json={"stitch": "minilm-to-mpnet", "input": b64(queries["minilm"][:3])}
    )
    assert r.status_code == 200, r.text
    text = client.get("/metrics").text
    counted = 'lead_microbatch_vectors_bucket{le="4.0"} 1.0' in text
    assert counted == micro_batching
    assert "# TYPE lead_microbatch_requests histogram" in text


def test_each_request_of_a_shared_forward_counts_its_own_rescaled_rows(
    scifact_small: Any,
) -> None:
    """``rescaled_inputs`` comes from the forward's own unit-length check: split back per
    request like the vectors, not the whole batch's count."""
    x = _vectors(scifact_small)[:9]
    parts = [x[:3].copy(), x[3:6].copy(), x[6:9].copy()]
    parts[1][[0, 2]] *= 3.0  # two rows off unit length
    parts[2][1] *= 0.5  # one
    answers, app, metrics = _shared_forwards(
        lambda route, batcher: [batcher.run(route, part, normalize=False) for part in parts]
    )
    shared = metrics.registry.get_sample_value("lead_microbatch_requests_sum")
    assert (
        shared == 3 and metrics.registry.get_sample_value("lead_microbatch_requests_count") == 1
    ), "the three requests did not share one forward"
    assert [a.rescaled_inputs for a in answers] == [0, 2, 1]
    assert answers[0].rescaled is None or not answers[0].rescaled.any()
    np.testing.assert_array_equal(answers[1].rescaled, [True, False, True])
    route = _route(app)
    for part, answer in zip(parts, answers, strict=True):
        alone = route.run(part)
        assert alone.rescaled_inputs == answer.rescaled_inputs
        assert alone.vectors.tobytes() == answer.vectors.tobytes()


def test_a_failing_retry_does_not_strand_the_rest_of_the_batch(
    scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared forward fails (a LeadError), the requests run again alone, and one of
    those raises something else (a bug, a device error): its caller gets that error, the
    others their answers; nobody waits forever."""
    x = _vectors(scifact_small)[:3]
    app = create_app(_settings())
    original = Route.run

    def run(
        self: Route, rows: np.ndarray, *, normalize: bool = False, scored: bool = False
    ) -> Translation:
        if len(rows) > 1:
            raise ZeroVectorError("shared forward refused", row=0, param="input[0]")
        if np.array_equal(rows, x[1:2]):
            raise RuntimeError("device lost")
        return original(self, rows, normalize=normalize, scored=scored)

    batcher = MicroBatcher(max_vectors=256, max_wait_s=0.0)

    async def main() -> list[Any]:
        async with app.router.lifespan_context(app):
            route = _route(app)
            monkeypatch.setattr(Route, "run", run)
            jobs = [batcher.translate(route, x[i : i + 1], normalize=False) for i in range(3)]
            return await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 10)

    first, second, third = asyncio.run(main())
    batcher.close()
    monkeypatch.setattr(Route, "run", original)
    assert isinstance(second, RuntimeError)
    route = _route(app)
    np.testing.assert_array_equal(first, route.translate(x[:1]))
    np.testing.assert_array_equal(third, route.translate(x[2:3]))


def test_bulk_requests_do_not_starve_small_ones(
    scifact_small: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small (query-time) and bulk requests have their own shares of the byte budget: while
    a bulk request larger than the whole budget is in flight, single vectors are served."""
    x = _vectors(scifact_small)
    app = create_app(_settings(max_translate_bytes_in_flight=256 * 1024))
    release = threading.Event()
    original = Route.run

    def held(
        self: Route, rows: np.ndarray, *, normalize: bool = False, scored: bool = False
    ) -> Translation:
        if len(rows) > 100:  # the bulk request: held until the small ones have answered
            assert release.wait(10), "the test never released the bulk request"
        return original(self, rows, normalize=normalize, scored=scored)

    monkeypatch.setattr(Route, "run", held)
    bulk = {"stitch": STITCH, "input": b64(x), "encoding_format": "base64"}  # ~0.5 MB
    small = {"stitch": STITCH, "input": b64(x[:1]), "encoding_format": "base64"}

    async def main() -> tuple[int, list[int]]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                big = asyncio.create_task(http.post("/v1/translate", json=bulk))
                for _ in range(500):
                    if app.state.limiter.in_flight:
                        break
                    await asyncio.sleep(0.01)
                statuses = [(await http.post("/v1/translate", json=small)).status_code]
                statuses += [
                    r.status_code
                    for r in await asyncio.gather(
                        *(http.post("/v1/translate", json=small) for _ in range(8))
                    )
                ]
                release.set()
                return (await big).status_code, statuses

    big, statuses = asyncio.run(main())
    assert big == 200
    assert statuses == [200] * 9
