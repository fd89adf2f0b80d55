"""JSON bodies parsed off the event loop (service.json_body): the same values and errors as
FastAPI's own parse, large arrays parsed in pieces, and the loop free meanwhile."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel

from service import json_body
from service.jobs.schemas import AlignRequest, JobCreate


def _rows(n: int, d: int) -> list[list[float]]:
    return np.random.default_rng(n + d).standard_normal((n, d)).astype(np.float32).tolist()


def _big() -> dict[str, Any]:
    return {
        "source": _rows(600, 384),  # ~4.6 MB: pieces of _PIECE_BYTES
        "target": [["x" * 40] for _ in range(20_000)],
        "empty": [],
        "nested": {"alphas": [0.1, 1.0], "name": "é\u2028"},
        "count": 3,
        "none": None,
    }


@pytest.mark.parametrize(
    "body",
    [
        orjson.dumps(_big()),
        json.dumps(_big(), indent=1).encode(),  # whitespace everywhere
        b"  \n" + orjson.dumps(_big()),
        orjson.dumps(_big())[:-1] + b',"count":4}',  # a repeated key: the last one counts
        orjson.dumps([_rows(600, 384)]),  # not an object: parsed whole
        b"{}",
    ],
    ids=["compact", "indented", "leading-space", "repeated-key", "top-level-array", "empty"],
)
def test_parsed_values_equal_json_loads(body: bytes) -> None:
    assert len(body) < 3 or len(body) > json_body._PIECE_BYTES
    assert json_body._loads(body, body.decode()) == json.loads(body)


def test_a_large_array_is_parsed_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    loads = json.loads

    def counting(text: bytes | str) -> Any:
        calls.append(len(text))
        return loads(text)

    monkeypatch.setattr(json_body.json, "loads", counting)
    body = orjson.dumps({"source": _rows(600, 384), "k": 1})
    assert json_body._loads(body, body.decode())["source"] == loads(body)["source"]
    assert len(calls) > 5
    assert max(calls) < 2 * json_body._PIECE_BYTES  # no call parsed the whole array


def test_json_that_only_the_stdlib_reads_is_parsed_whole() -> None:
    # NaN literals are not JSON (msgspec refuses them); json.loads reads them, so that the
    # model can refuse them by name, as before
    body = json.dumps({**_big(), "count": math.nan}).encode()
    assert math.isnan(json_body._loads(body, body.decode())["count"])


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"", "json_invalid"),  # as on /v1/translate (was 422 "Field required")
        (b'{"source": [[1.0, 2.0]', "json_invalid"),
        (orjson.dumps({"source": _rows(600, 384)})[:-2], "json_invalid"),
        (b'{"folds": "x"}', "int_type"),
        (b'{"seed": ' + b"9" * 5000 + b"}", "json_invalid"),  # was a 500 (ValueError)
        (b'{"source": [[' + b"1" * 5000 + b"]]" + b" " * 300_000 + b"}", "json_invalid"),
    ],
    ids=["empty", "truncated", "truncated-large", "wrong-type", "5000 digits", "large-5000"],
)
def test_errors_are_fastapis(body: bytes, kind: str) -> None:
    with pytest.raises(RequestValidationError) as error:
        json_body._validate(AlignRequest, body)
    first = error.value.errors()[0]
    assert first["type"] == kind
    assert first["loc"][0] == "body"


_PAD = b" " * 300_000  # beyond _PIECE_BYTES: the body is parsed in pieces


@pytest.mark.parametrize(
    ("body", "reason", "at"),
    [
        (b'{"dataset": "\\ud800"}', "surrogate", b"\\ud800"),
        (b'{"dataset": "ok", "options": {"\\udfff": 1}}', "surrogate", b"\\udfff"),
        (b'{"dataset": "\\ud83d x"}', "surrogate", b"\\ud83d"),
        (b'{"source": [["\\ud800"]]' + _PAD + b"}", "surrogate", b"\\ud800"),
        (b'{"dataset": "a\xffb"}', "not UTF-8 text", b"\xff"),
        (b'{"source": [[1.0]], "dataset": "\xff"}' + _PAD, "not UTF-8 text", b"\xff"),
        (b"\xef\xbb\xbf" + b'{"dataset": "x"}', "BOM", None),
        ('{"dataset": "x"}'.encode("utf-16"), "looks like UTF-16", None),
        ('{"dataset": "x"}'.encode("utf-16-le"), "looks like UTF-16", None),
        ('{"dataset": "x"}'.encode("utf-32"), "looks like UTF-16 or UTF-32", None),
        (b" \n\t ", "only whitespace", None),
    ],
    ids=[
        *("value", "key", "high-alone", "large", "utf-8", "utf-8-large", "bom", "utf-16"),
        *("utf-16-without-bom", "utf-32", "whitespace"),
    ],
)
def test_text_that_is_not_unicode_is_invalid_json(
    body: bytes, reason: str, at: bytes | None
) -> None:
    """A lone surrogate escape got past the parse and failed later (a 500: hashing a job,
    SQLite, pydantic); bytes were sniffed for UTF-16 and a BOM, which /v1/translate refuses;
    a large body's bad byte was counted from its piece."""
    with pytest.raises(RequestValidationError) as error:
        json_body._validate(AlignRequest, body)
    first = error.value.errors()[0]
    assert first["type"] == "json_invalid"
    assert reason in first["ctx"]["error"], first
    if at is not None:
        assert first["loc"] == ("body", body.index(at))
        assert f"byte {body.index(at)}" in first["ctx"]["error"]


def test_surrogate_pairs_and_escaped_backslashes_are_text() -> None:
    body = b'{"dataset": "\\ud83d\\ude00 \\\\ud800 \\u00e9"}'
    assert json_body._validate(AlignRequest, body).dataset == "\U0001f600 \\ud800 \u00e9"


def test_the_event_loop_runs_while_a_large_body_is_parsed() -> None:
    class Pairs(BaseModel):
        source: list[list[float]]

    body = orjson.dumps({"source": _rows(3000, 384)})

    class Request:
        async def body(self) -> bytes:
            return body

    async def main() -> tuple[int, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        before = ticks
        parsed = await json_body.json_body(Pairs)(Request())  # type: ignore[arg-type]
        ticker.cancel()
        return ticks - before, len(parsed.source)

    started = time.perf_counter()
    ticks, rows = asyncio.run(main())
    assert rows == 3000
    # the loop kept turning during the parse (on the loop, it would turn once)
    assert ticks > 10, (ticks, time.perf_counter() - started)


def test_a_mistyped_field_names_the_closest_one() -> None:
    with pytest.raises(RequestValidationError) as error:
        json_body._validate(AlignRequest, b'{"datset": "ds_x"}')
    unknown = [e for e in error.value.errors() if e["type"] == "extra_forbidden"]
    assert unknown and unknown[0]["loc"] == ("body", "datset")
    assert unknown[0]["msg"].endswith("did you mean 'dataset'?")


def test_a_long_run_of_backslashes_is_scanned_in_linear_time() -> None:
    """The surrogate scan tried every start within a run of backslashes: quadratic, and it
    holds the interpreter (80 KB held the event loop for 30 s; an adversarial pass). Four
    million backslashes take milliseconds now; quadratically they would take days."""
    import threading

    run = b"\\\\" * 2_000_000
    bodies = [
        b'{"dataset": "' + run + b'\\u0041"}',  # valid: a \u escape after escaped backslashes
        b'{"dataset": "' + run + b'\\ud800"}',  # a lone surrogate after them
    ]
    found: list[int | None] = []
    scan = threading.Thread(target=lambda: found.extend(map(json_body._lone_surrogate, bodies)))
    scan.start()
    scan.join(60)
    assert not scan.is_alive(), "the scan of a run of backslashes does not end"
    assert found == [None, len(bodies[1]) - 8]


def test_a_syntax_error_names_its_byte_and_a_typo_comes_first() -> None:
    body = '{"dataset": "ééé", x}'.encode()
    with pytest.raises(RequestValidationError) as error:
        json_body._validate(AlignRequest, body)
    first = error.value.errors()[0]
    assert first["loc"] == ("body", body.index(b"x"))  # bytes, not characters
    assert f"(byte {body.index(b'x')})" in first["ctx"]["error"]
    # a mistyped field explains the missing one: its hint comes first (it was "and 2 more")
    with pytest.raises(RequestValidationError) as error:
        json_body._validate(JobCreate, b'{"source_model": "a", "target_model": "b", "datset": "x"}')
    assert error.value.errors()[0]["msg"].endswith("did you mean 'dataset'?")
