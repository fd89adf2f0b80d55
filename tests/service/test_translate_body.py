"""The typed decoder of POST /v1/translate (service.translate_body): in step with the OpenAPI
model, the answers and errors of a plain parse, and bounded work on hostile bodies."""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

import msgspec
import numpy as np
import orjson
import pydantic
import pytest
import torch
from fastapi.exceptions import RequestValidationError
from service_helpers import b64

from lead.errors import InvalidInputError, InvalidJSONError, LeadError, LimitExceededError
from lead.stitches import OrthogonalStitch, StitchInfo
from service.encoding import check_vector_count, decode_vectors
from service.errors import kind_of
from service.registry import StitchRegistry
from service.schemas import TranslateOptions, TranslateRequest
from service.translate_body import (
    TranslateBody,
    TranslateFields,
    Vector,
    decode_body,
    decode_request,
)

MAX_VECTORS = 2048


def _vectors(n: int, d: int) -> np.ndarray:
    return np.random.default_rng(n * 100 + d).standard_normal((n, d)).astype(np.float32)


@pytest.fixture(scope="module")
def registry() -> StitchRegistry:
    """Stitch "s" (model a → b, d = 6: base64 without padding) and "p" (c → d, d = 5:
    with padding)."""
    registry = StitchRegistry(torch.device("cpu"))
    for stitch_id, d, models in (("s", 6, ("a", "b")), ("p", 5, ("c", "d"))):
        info = StitchInfo(source_model=models[0], target_model=models[1])
        registry.register(stitch_id, OrthogonalStitch(d, d, info=info), origin="local")
    return registry


def _plain(body: bytes, registry: StitchRegistry, max_vectors: int) -> tuple[Any, np.ndarray]:
    """The contract spelled out with a plain parse, as the route read bodies before the
    typed decoder: the standard library's JSON (NaN and Infinity included), the OpenAPI
    model's options, the stitch, the count, decode_vectors."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",)}]) from None
    if not isinstance(payload, dict):
        raise InvalidInputError("not an object", param="body")
    if "input" not in payload:
        raise RequestValidationError([{"type": "missing", "loc": ("body", "input")}])
    try:
        options = TranslateOptions.model_validate(
            {k: v for k, v in payload.items() if k != "input"}
        )
    except pydantic.ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        raise RequestValidationError([{"type": "invalid", "loc": ("body", *loc)}]) from None
    if options.stitch is not None:
        route = registry.route_for_id(options.stitch, inverse=options.direction == "inverse")
    else:
        assert options.source_model is not None and options.target_model is not None
        route = registry.route(options.source_model, options.target_model, strict=options.strict)
    items = payload["input"]
    if isinstance(items, list):
        check_vector_count(len(items), max_vectors)
    return options.model_dump(), decode_vectors(items, route.d_src)


def _typed(body: bytes, registry: StitchRegistry, max_vectors: int) -> tuple[Any, np.ndarray]:
    fields, x, _ = decode_request(body, registry, max_vectors)
    out = msgspec.structs.asdict(fields)
    out.pop("input", None)
    return out, x


def _outcome(
    decode: Callable[..., tuple[Any, np.ndarray]],
    body: bytes,
    registry: StitchRegistry,
    max_vectors: int = MAX_VECTORS,
) -> tuple[Any, ...]:
    """("ok", fields, vectors), or the error as the client sees it: status, code, param."""
    try:
        fields, x = decode(body, registry, max_vectors)
    except RequestValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return 400, "invalid_json"
        return 422, "validation_error", tuple(first["loc"])
    except LeadError as exc:
        kind = kind_of(exc)
        return kind.status, kind.code, exc.param
    return "ok", fields, x.tobytes()


def test_the_typed_decoder_has_the_fields_of_the_openapi_model() -> None:
    """Same fields, types (enums included), defaults, required-ness; input's items are float
    arrays or strings on both sides."""
    typed = {field.name: field for field in msgspec.structs.fields(TranslateFields)}
    assert set(typed) == set(TranslateOptions.model_fields)
    for name, field in typed.items():
        documented = TranslateOptions.model_fields[name]
        assert not field.required and not documented.is_required(), name
        assert field.default == documented.default, name
        assert field.type == documented.annotation, name
    body_fields = {field.name: field for field in msgspec.structs.fields(TranslateBody)}
    assert set(body_fields) == set(TranslateRequest.model_fields) == {*typed, "input"}
    assert body_fields["input"].required and TranslateRequest.model_fields["input"].is_required()
    branches = get_args(TranslateRequest.model_fields["input"].annotation)
    # each branch is Annotated[list[...], Field(min_length=1)]: minItems in the schema
    assert all(get_origin(branch) is Annotated for branch in branches)
    documented_items = {get_args(get_args(branch)[0])[0] for branch in branches}
    floats = [item for item in documented_items if item is not str]
    assert len(floats) == 1 and get_args(get_args(floats[0])[0])[0] is float  # StrictFloat
    assert set(get_args(Vector)) == {str, list[float]}


_BODIES: dict[str, Any] = {
    "floats": {"stitch": "s", "input": [[1.5, 2, -3e-3, 0, 1, 2]]},
    "base64": {"source_model": "a", "target_model": "b", "input": b64(_vectors(2, 6))},
    "all options": {
        "stitch": "s",
        "input": [[1, 2, 3, 4, 5, 6]],
        "encoding_format": "base64",
        "normalize": True,
        "strict": False,
        "direction": "forward",
    },
    "empty input": {"stitch": "s", "input": []},
    "input not a list": {"stitch": "s", "input": "AAAA"},
    "floats and strings": {
        "stitch": "s",
        "input": [[1, 2, 3, 4, 5, 6], "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"],
    },
    "a boolean among the floats": {"stitch": "s", "input": [[1, True, 3, 4, 5, 6]]},
    "a string among the floats": {"stitch": "s", "input": [[1, "2", 3, 4, 5, 6]]},
    "null among the floats": {"stitch": "s", "input": [[1, None, 3, 4, 5, 6]]},
    "nested too deep": {"stitch": "s", "input": [[[1], [2], [3], [4], [5], [6]]]},
    "an object as a vector": {"stitch": "s", "input": [{"x": 1}]},
    "a string flag": {"stitch": "s", "input": [[1, 2, 3, 4, 5, 6]], "normalize": "true"},
    "an integer flag": {"stitch": "s", "input": [[1, 2, 3, 4, 5, 6]], "strict": 1},
    "unknown encoding": {"stitch": "s", "input": [[1, 2, 3, 4, 5, 6]], "encoding_format": "hex"},
    "unknown direction": {"stitch": "s", "input": [[1, 2, 3, 4, 5, 6]], "direction": "back"},
    "unknown field": {"stitch": "s", "input": [[1, 2, 3, 4, 5, 6]], "dimensions": 6},
    "stitch and models": {"stitch": "s", "source_model": "a", "target_model": "b", "input": []},
    "no stitch": {"source_model": "a", "input": [[1, 2, 3, 4, 5, 6]]},
    "the same model twice": {"source_model": "a", "target_model": "a", "input": [[1] * 6]},
    "inverse by models": {
        "source_model": "a",
        "target_model": "b",
        "direction": "inverse",
        "input": [[1, 2, 3, 4, 5, 6]],
    },
    "a number as stitch": {"stitch": 7, "input": [[1, 2, 3, 4, 5, 6]]},
    "no input": {"stitch": "s"},
    "not an object": [{"stitch": "s"}],
}


@pytest.mark.parametrize("case", list(_BODIES))
def test_the_typed_decoder_and_the_openapi_model_accept_the_same_bodies(
    registry: StitchRegistry, case: str
) -> None:
    body = orjson.dumps(_BODIES[case])
    try:
        TranslateRequest.model_validate_json(body)
        documented = True
    except pydantic.ValidationError:
        documented = False
    typed = _outcome(_typed, body, registry)
    assert (typed[0] == "ok") is documented, typed
    assert typed == _outcome(_plain, body, registry)


_ROW = "[1, 2, 3, 4, 5, 6]"
_PADDED = '"AACAPwAAAEAAAEBAAACAQAAAoEA="'  # [1, 2, 3, 4, 5] as float32, padded base64
_NON_FINITE = (422, "non_finite_input", "input[1]")
#: case → (body, the answer when the case pins it; all must match the plain parse)
_TEXT_BODIES: dict[str, tuple[str, tuple[Any, ...] | None]] = {
    # not JSON, but Python's json.dumps writes them: the plain parse names the vector
    "NaN": (f'{{"stitch": "s", "input": [{_ROW}, [1, NaN, 3, 4, 5, 6]]}}', _NON_FINITE),
    "-Infinity": (f'{{"input": [{_ROW}, [1, 2, -Infinity, 4, 5, 6]], "stitch": "s"}}', _NON_FINITE),
    "1e999": (f'{{"stitch": "s", "input": [{_ROW}, [1, 1e999, 3, 4, 5, 6]]}}', _NON_FINITE),
    "NaN, then a wrong dimension": (
        '{"stitch": "s", "input": [[NaN, 2, 3, 4, 5, 6], [1, 2]]}',
        (422, "shape_mismatch", "input[1]"),
    ),
    "NaN, then an unknown stitch": (
        '{"input": [[NaN, 2, 3, 4, 5, 6]], "stitch": "nope"}',
        (404, "stitch_not_found", "stitch"),
    ),
    "NaN, not JSON after": (
        '{"stitch": "s", "input": [[NaN, 2, 3, 4, 5, 6]]',
        (400, "invalid_json"),
    ),
    "truncated": ('{"stitch": "s", "input": [[1, 2', (400, "invalid_json")),
    "a bad option after a bad vector": (
        '{"input": [[1, true]], "normalize": "yes", "stitch": "s"}',
        (422, "validation_error", ("body", "normalize")),
    ),
    "a bad vector after a bad option": (
        '{"stitch": "s", "normalize": "yes", "input": [[1, true]]}',
        (422, "validation_error", ("body", "normalize")),
    ),
    "a bad vector, then an unknown stitch": (
        '{"input": [[1, true]], "stitch": "nope"}',
        (404, "stitch_not_found", "stitch"),
    ),
    "too many, then an unknown stitch": (
        '{"input": [[1], [2], [3]], "stitch": "nope"}',
        (404, "stitch_not_found", "stitch"),
    ),
    "too many, then a bad option": (
        '{"input": [[1], [2], [3]], "stitch": "s", "strict": 0}',
        (422, "validation_error", ("body", "strict")),
    ),
    "too many": ('{"input": [[1], [2], [3]], "stitch": "s"}', (422, "limit_exceeded", "input")),
    "too many, then not JSON": ('{"input": [[1], [2], [3]], "stitch": "s"', (400, "invalid_json")),
    "a boolean in row 1": (
        f'{{"stitch": "s", "input": [{_ROW}, [1, 2, 3, 4, 5, false]]}}',
        (400, "invalid_input", "input[1]"),
    ),
    "a boolean, and a ragged row before it": (
        '{"stitch": "s", "input": [[1, 2], [1, 2, 3, 4, 5, true]]}',
        (422, "shape_mismatch", "input[0]"),
    ),
    "the key twice": (f'{{"stitch": "nope", "input": [{_ROW}], "stitch": "s"}}', None),
    "an escape in the stitch id": (f'{{"stitch": "\\u0073", "input": [{_ROW}]}}', None),
    "a lone surrogate": (f'{{"stitch": "\\ud800", "input": [{_ROW}]}}', None),
    "a huge integer": ('{"stitch": "s", "input": [[1, 2, 3, 4, 5, 1' + "0" * 400 + "]]}", None),
    "padded base64": (f'{{"stitch": "p", "input": [{_PADDED}]}}', None),
    "padding inside a batch": (f'{{"stitch": "p", "input": [{_PADDED}, {_PADDED}]}}', None),
    "UTF-16": (f'{{"stitch": "s", "input": [{_ROW}]}}', (400, "invalid_json")),
}


@pytest.mark.parametrize("case", list(_TEXT_BODIES))
def test_bodies_get_the_answer_of_a_plain_parse(registry: StitchRegistry, case: str) -> None:
    """Whatever the typed decoder meets first, the answer is the first problem in the order
    of the checks: JSON, fields, stitch, count, vectors."""
    text, expected = _TEXT_BODIES[case]
    body = text.encode("utf-16" if case == "UTF-16" else "utf-8")
    got = _outcome(_typed, body, registry, max_vectors=2)
    assert got == _outcome(_plain, body, registry, max_vectors=2)
    if expected is not None:
        assert got == expected


@pytest.mark.parametrize("d", [6, 5])  # base64 without padding, with padding
def test_random_corruptions_get_the_answer_of_a_plain_parse(
    registry: StitchRegistry, d: int
) -> None:
    """Random corruptions of compact and pretty bodies: the same vectors, or the same error
    naming the same path; and every body the plain parse accepts, the typed decoder decodes
    by itself."""
    rng = np.random.default_rng(d)
    x = _vectors(4, d)
    stitch, models = ("s", ("a", "b")) if d == 6 else ("p", ("c", "d"))
    bodies = [
        orjson.dumps({"stitch": stitch, "input": b64(x), "normalize": True}),
        orjson.dumps({"input": x.tolist(), "encoding_format": "base64", "stitch": stitch}),
        json.dumps(
            {"source_model": models[0], "target_model": models[1], "input": b64(x)}, indent=1
        ).encode(),
    ]
    alphabet = b'"[],:{} \\Atrue0-.e/+=5'
    seen: set[Any] = set()
    for body in bodies:
        for _ in range(400):
            corrupt = bytearray(body)
            for _ in range(int(rng.integers(1, 3))):
                at = int(rng.integers(0, len(corrupt)))
                corrupt[at] = alphabet[int(rng.integers(len(alphabet)))]
            got = _outcome(_typed, bytes(corrupt), registry, max_vectors=5)
            assert got == _outcome(_plain, bytes(corrupt), registry, max_vectors=5), corrupt
            if got[0] == "ok":
                decode_body(bytes(corrupt), 5)  # the typed decoder alone, no plain parse
            seen.add(got[0] if got[0] == "ok" else got[1])
    assert seen >= {"ok", "invalid_json", "validation_error", "decode_error", "shape_mismatch"}


@pytest.mark.parametrize("item", [b"[]", b'""', b"[0.5]", b'"ab"'])
def test_the_decoder_stops_at_the_first_vector_beyond_the_limit(item: bytes) -> None:
    """Millions of tiny vectors cost no memory: msgspec refuses the array at vector 2,049,
    whatever comes after it (a list with Meta(max_length=...) is checked only once built)."""
    body = b'{"stitch":"s","input":[' + b",".join([item] * 2_000_000) + b"]}"
    decode_body(b'{"stitch":"s","input":[]}', MAX_VECTORS)  # the decoder is built
    tracemalloc.start()
    try:
        with pytest.raises(msgspec.ValidationError, match="at most length 2048"):
            decode_body(body, MAX_VECTORS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20  # the 2 million items would take 16 MB of pointers alone


@pytest.mark.parametrize(
    "prefix",
    [b'{"stitch":"s","input":[[1,true],', b'{"stitch":"s","input":[[NaN],', b'{"input":[['],
    ids=["a boolean first", "NaN first", "nested in one vector"],
)
def test_hostile_bodies_are_refused_before_a_plain_parse(
    registry: StitchRegistry, prefix: bytes
) -> None:
    """A body that the typed decoder refuses early is counted before it is parsed plainly
    (which would build 2 million lists: a second and hundreds of megabytes)."""
    body = prefix + b",".join([b"[]"] * 2_000_000) + b"]}"
    decode_body(b'{"stitch":"s","input":[]}', MAX_VECTORS)  # the decoder is built
    # the last one lacks a closing bracket: not JSON, which comes before its count
    expected = InvalidJSONError if prefix == b'{"input":[[' else LimitExceededError
    start = time.perf_counter()
    tracemalloc.start()
    try:
        with pytest.raises(expected) as info:
            decode_request(body, registry, MAX_VECTORS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if expected is LimitExceededError:
        assert info.value.param == "input" and "at least" in info.value.message
    else:
        assert info.value.param == "body" and "not valid JSON" in info.value.message
    assert peak < 4 * 2**20  # a plain parse: over 100 MB
    assert time.perf_counter() - start < 5  # ~10 ms; generous for loaded machines


MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
_HTTP_CASES: dict[str, Callable[[list[str]], dict[str, Any]]] = {
    "good": lambda v: {"stitch": "minilm-to-mpnet", "input": v[:3], "encoding_format": "base64"},
    "padded last item": lambda v: {"stitch": "minilm-to-mpnet", "input": [v[0][:-4] + "AA=="]},
    "padded third item": lambda v: {
        "stitch": "minilm-to-mpnet",
        "input": [v[0], v[1], v[2][:-4] + "AAA="],
    },
    "unknown stitch, good array": lambda v: {"stitch": "nope", "input": v[:2]},
    "unknown stitch, bad vectors": lambda v: {"stitch": "nope", "input": [v[0][:-4], [True]]},
    "too many": lambda v: {"stitch": "minilm-to-mpnet", "input": v[:1] * 2049},
    "wrong dimension": lambda v: {
        "source_model": MINILM,
        "target_model": MPNET,
        "input": b64(np.ones((2, 768))),
    },
}
_HTTP_ANSWERS = {
    "good": (200, None, None),
    "padded last item": (400, "decode_error", "input[0]"),
    "padded third item": (400, "decode_error", "input[2]"),
    "unknown stitch, good array": (404, "stitch_not_found", "stitch"),
    "unknown stitch, bad vectors": (404, "stitch_not_found", "stitch"),
    "too many": (422, "limit_exceeded", "input"),
    "wrong dimension": (422, "shape_mismatch", "input[0]"),
}


@pytest.mark.parametrize("case", list(_HTTP_CASES))
def test_compact_and_pretty_bodies_get_the_same_answer(
    client: Any, queries: Any, case: str
) -> None:
    payload = _HTTP_CASES[case](b64(queries["minilm"][:3]))
    for body in (orjson.dumps(payload), json.dumps(payload, indent=1).encode()):
        r = client.post("/v1/translate", content=body, headers={"content-type": "application/json"})
        error = r.json().get("error", {})
        assert (r.status_code, error.get("code"), error.get("param")) == _HTTP_ANSWERS[case]
    assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"ids": [f"doc-{i}" for i in range(3000)]}, "ids", "Extra inputs"),
        ({"metadata": [{"i": i} for i in range(3000)]}, "metadata", "Extra inputs"),
        ({"normalize": [[1]] * 3000}, "normalize", "options are short"),
        ({"normalize": "yes"}, "normalize", "valid boolean"),
    ],
    ids=["unknown field of strings", "unknown field of objects", "long option", "bad option"],
)
def test_a_bad_field_is_named_before_the_vectors_are_counted(
    registry: StitchRegistry, extra: dict[str, Any], param: str, words: str
) -> None:
    """The count before a plain parse sees every array and string of the body: a field's
    own arrays and strings must not turn its error into too many vectors."""
    body = orjson.dumps({"stitch": "s", "input": b64(_vectors(1500, 6)), **extra})
    with pytest.raises(RequestValidationError) as info:
        decode_request(body, registry, MAX_VECTORS)
    (error,) = info.value.errors()
    assert error["loc"] == ("body", param)
    assert words in error["msg"]


@pytest.mark.parametrize(
    "option", [b'"direction":"\xff"', b'"normalize":1e999', b'"stitch":"\xff\xfe"'], ids=str
)
def test_an_option_msgspec_cannot_build_is_a_clean_4xx(
    registry: StitchRegistry, option: bytes
) -> None:
    body = b'{"stitch":"s",' + option + b',"input":[[1,2,3,4,5,6]]}'
    with pytest.raises((RequestValidationError, LeadError)) as info:
        decode_request(body, registry, MAX_VECTORS)
    error = info.value
    assert isinstance(error, RequestValidationError) or kind_of(error)[0] in (400, 422)


def test_a_base64_row_of_float64_is_named_as_such() -> None:
    """A row of 384 float64 values was "768 dimensions (3072 bytes)", with no word of why
    (a new user's trial)."""
    import base64

    from lead.errors import ShapeMismatchError

    row = np.linspace(-1, 1, 384)  # float64
    as_float64 = [base64.b64encode(row.astype("<f8").tobytes()).decode("ascii")]
    with pytest.raises(ShapeMismatchError, match=r"\(float64 values\? send float32\)"):
        decode_vectors(as_float64, 384)
    with pytest.raises(ShapeMismatchError) as caught:  # another size: no such guess
        decode_vectors(b64(row[None, :300].astype(np.float32)), 384)
    assert "float64" not in caught.value.message
