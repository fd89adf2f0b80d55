"""The body of ``POST /v1/translate``, decoded in one typed step (msgspec).

:func:`decode_request` turns the raw body into its fields, the route they name and
``input`` as one float32 array. The body is decoded in one ``msgspec.json`` call into a
strict Struct (:class:`TranslateBody`): the JSON syntax, unknown and missing fields, the
type of every field and of every value in ``input`` (no boolean, string or ``null`` among
the numbers), the rule that names the stitch and the number of vectors are all the
decoder's; no byte of the body is scanned by hand (but for the counts below, of large or
refused bodies only). Then the stitch is looked up and the
vectors become one array (:func:`service.encoding.decode_vectors`: base64 strings joined and
decoded in one pybase64 call, float arrays through NumPy; the dimension and finiteness
checked). :class:`service.schemas.TranslateRequest` documents the same body in the OpenAPI
schema; a test keeps the two in step.

The vector limit is checked while decoding. msgspec checks a list's
``Meta(max_length=...)`` only once it has built every item (a 60 MB body of 20 million
empty vectors took 4.9 s and 1.4 GB before the refusal), so ``input`` is typed instead as an
array-like Struct of ``max_vectors`` optional fields (:class:`Vectors`, built by
:func:`_decoder`): msgspec fills them in order and refuses the array at the first item
beyond them (that body: 0.3 ms, no memory).

Errors. The typed decoder stops at the first problem in the order of the keys. A body it
refuses is parsed plainly and checked as it was before the typed decoder
(:func:`_decode_plainly`), so that the errors stay the same and come in the same order:
the JSON (``NaN`` and ``Infinity`` are read by the standard library: they are not JSON, but
Python's ``json.dumps`` writes them, and the finiteness check then names the vector), an
object, ``input`` present, the fields (:class:`service.schemas.TranslateOptions`), the
stitch, the number of vectors, each vector. A plain parse builds every item (the 60 MB body
above with a ``NaN`` up front: 2.9 s and 1.4 GB in the standard library), so it comes after
:func:`service.limits.refuse_too_many_vectors` (a count of brackets and quotes, on refused
bodies only), which refuses such a body in tens of milliseconds.

The vectors' length is checked after the decode, which builds every number first: a body
larger than a few dozen bytes a vector has its commas counted before it is decoded
(:func:`service.limits.refuse_too_many_numbers`: more numbers than ``max_vectors`` vectors
of the largest served dimension can hold is a 422 ``limit_exceeded`` in milliseconds, not
a second of decoding that holds every other request).
"""

from __future__ import annotations

import difflib
import functools
import json
import sys
from typing import Any, Literal, cast

import msgspec
import numpy as np
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from lead.errors import InvalidInputError
from service.encoding import EncodingFormat, check_vector_count, decode_vectors
from service.errors import echo, suggest_fields
from service.json_body import encoding_problem
from service.limits import VectorLimit, refuse_too_many_numbers, refuse_too_many_vectors
from service.registry import StitchRegistry
from service.routing import Route
from service.schemas import TranslateOptions, stitch_naming_error

__all__ = [
    "TranslateBody",
    "TranslateFields",
    "Vector",
    "Vectors",
    "check_options",
    "decode_body",
    "decode_request",
    "find_route",
]

#: One vector of ``input``: base64 of little-endian float32, or numbers.
Vector = str | list[float]


class TranslateFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything in a translate body but ``input``: the typed twin of
    :class:`~service.schemas.TranslateOptions`."""

    stitch: str | None = None
    source_model: str | None = None
    target_model: str | None = None
    encoding_format: EncodingFormat = "float"
    normalize: bool = False
    strict: bool = False
    direction: Literal["forward", "inverse"] = "forward"
    return_confidence: bool = False

    def __post_init__(self) -> None:
        problem = stitch_naming_error(
            self.stitch, self.source_model, self.target_model, self.direction
        )
        if problem is not None:
            raise ValueError(problem)  # msgspec raises it as a ValidationError


class Vectors(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """``input``: a JSON array of at most as many vectors as the subclass has fields
    (``v0``, ``v1``, …, each a :data:`Vector` or unset; see :func:`_decoder`)."""

    def items(self) -> list[Vector]:
        """The vectors, in order (the fields up to the first unset one)."""
        values = msgspec.structs.astuple(self)
        try:
            return list(values[: values.index(msgspec.UNSET)])
        except ValueError:  # every field set
            return list(values)


class TranslateBody(TranslateFields, kw_only=True):
    """A decoded translate body."""

    input: Vectors


@functools.lru_cache(maxsize=4)
def _decoder(max_vectors: int) -> msgspec.json.Decoder[TranslateBody]:
    """The decoder of bodies with at most ``max_vectors`` vectors (built once per limit:
    a few milliseconds for 2,048)."""
    fields = [(f"v{i}", Vector | msgspec.UnsetType, msgspec.UNSET) for i in range(max_vectors)]
    vectors = msgspec.defstruct(
        "Vectors", fields, bases=(Vectors,), array_like=True, forbid_unknown_fields=True
    )
    body = msgspec.defstruct(
        "TranslateBody",
        [("input", vectors)],
        bases=(TranslateBody,),
        kw_only=True,
        forbid_unknown_fields=True,
    )
    return cast(msgspec.json.Decoder[TranslateBody], msgspec.json.Decoder(body))


def decode_body(body: bytes, max_vectors: int) -> TranslateBody:
    """The typed decode: ``body`` as a :class:`TranslateBody`, in one msgspec call.

    Raises
    ------
    msgspec.DecodeError
        ``body`` is not JSON.
    msgspec.ValidationError
        A field is missing, unknown or of the wrong type, the stitch is named both or
        neither way, or ``input`` holds more than ``max_vectors`` vectors or a value that
        is not a vector (a boolean, a string or ``null`` among the numbers, ...).
    """
    return _decoder(max_vectors).decode(body)


def decode_request(
    body: bytes, registry: StitchRegistry, max_vectors: int
) -> tuple[TranslateFields, np.ndarray, Route]:
    """Decode a translate request body and look up the route it names.

    Parameters
    ----------
    body : bytes
        The raw request body (UTF-8 JSON).
    registry : StitchRegistry
        The served stitches.
    max_vectors : int
        The most vectors ``input`` may hold.

    Returns
    -------
    fields : TranslateFields
        The options (``normalize``, ``encoding_format``, …).
    x : ndarray of shape (n, d_src), float32
        The vectors of ``input``; writable, C-contiguous and finite.
    route : Route
        The stitch (or chain) to apply.

    Raises
    ------
    RequestValidationError
        Invalid JSON (400 ``invalid_json``), a missing or unknown field, an option of the
        wrong type, the stitch named both or neither way (422 ``validation_error``).
    InvalidInputError
        The body is not a JSON object; ``input`` is not a non-empty list of vectors, mixes
        arrays and strings, or holds a value that is not a number.
    LimitExceededError
        More than ``max_vectors`` vectors.
    StitchNotFoundError, NotReadyError, NotInvertibleError
        As :meth:`StitchRegistry.route_for_id` and :meth:`StitchRegistry.route`.
    DecodeError, ShapeMismatchError, NonFiniteError
        As :func:`~service.encoding.decode_vectors`, naming ``input[i]``.
    """
    if len(body) > _NUMBERS_COUNTED_FROM * max_vectors:  # a few numbers a vector at least
        dim = registry.largest_dim()
        if dim:  # (none served: the route's error follows)
            limit = VectorLimit(max_vectors, "input", "in one request")
            refuse_too_many_numbers(body, limit, dim)
    try:
        request = decode_body(body, max_vectors)
    except (msgspec.MsgspecError, RecursionError):
        return _decode_plainly(body, registry, max_vectors)
    route = find_route(registry, request)
    # the decoder let only numbers into the float arrays: no scan for booleans
    return request, decode_vectors(request.input.items(), route.d_src, check_bools=False), route


def _decode_plainly(
    body: bytes, registry: StitchRegistry, max_vectors: int
) -> tuple[TranslateFields, np.ndarray, Route]:
    """A body that the typed decoder refused, parsed plainly and checked as before it, to
    raise the first problem in the order of the checks (``tests/service/
    test_translate_body.py`` checks that the typed decoder refuses no more than this)."""
    _refuse_bad_fields(body)
    refuse_too_many_vectors(body, VectorLimit(max_vectors, "input", "in one request"))
    options, items = _parse_options(_parse_json(body))
    route = find_route(registry, options)
    if isinstance(items, list):
        check_vector_count(len(items), max_vectors)
    x = decode_vectors(items, route.d_src)
    return TranslateFields(**options.model_dump()), x, route


def _refuse_bad_fields(body: bytes) -> None:
    """Raise the error of the options before the vectors are counted: the count sees every
    array and string of the body, and an unknown field holding many (``"ids": [...]``) or an
    option of the wrong type (``"normalize": [[1], ...]``) is that field's error, not too
    many vectors. The top-level values are checked for syntax only (``msgspec.Raw``); an
    option's value is built only when it is short (options are short strings and booleans).
    A body that is not a JSON object with ``input`` is left to the checks that follow."""
    try:
        top = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except (msgspec.MsgspecError, RecursionError):
        return
    if "input" not in top:
        return
    fields: dict[str, Any] = {}
    for key, raw in top.items():
        if key == "input":
            continue
        if key not in TranslateOptions.model_fields:
            error = {"type": "extra_forbidden", "loc": ("body", key), "input": None}
            error = {**error, "msg": "Extra inputs are not permitted"}
            raise RequestValidationError(suggest_fields([error], _FIELDS))
        if len(raw) > _MAX_OPTION_BYTES:
            message = f"Value error, {len(raw)} bytes of JSON: options are short strings, booleans"
            error = {"type": "value_error", "loc": ("body", key), "input": None}
            raise RequestValidationError([{**error, "msg": message}])
        try:
            fields[key] = msgspec.json.decode(raw)
        except (msgspec.MsgspecError, RecursionError):  # e.g. 1e999, invalid UTF-8
            return  # the plain parse that follows names it
    check_options(fields)


#: Bodies of more bytes than this many per allowed vector have their numbers counted
#: (:func:`service.limits.refuse_too_many_numbers`, which counts only beyond 2 bytes a value).
_NUMBERS_COUNTED_FROM = 64

#: The longest JSON value an option may have (a Hub id ``org/name@revision`` is far shorter).
_MAX_OPTION_BYTES = 4096
#: The fields of a translate body: its options and ``input`` (for the closest-name hint).
_FIELDS = (*TranslateOptions.model_fields, "input")


def _parse_json(body: bytes) -> Any:
    try:  # float_hook: a number beyond the float range (1e999) is infinite, named as such
        return msgspec.json.Decoder(float_hook=float).decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        error = str(exc) if isinstance(exc, msgspec.DecodeError) else "nested too deeply"
        problem = encoding_problem(body)
        if problem is not None:
            error = problem[0]
        elif error == "Input data was truncated":  # msgspec's words for a text cut short
            error = f"the body ends (byte {len(body)}) before its JSON text is complete"
        if error.startswith("Integer value out of range"):  # beyond int_max_str_digits
            raise InvalidInputError(
                f"input holds an integer of more than {sys.get_int_max_str_digits()} digits, "
                "far beyond float32's range",
                param="input",
            ) from None
    # NaN / Infinity (not JSON, but Python's json.dumps writes them): parsed by the standard
    # library, so that the finiteness check can name the vector (422)
    try:
        return json.loads(body.decode("utf-8"))  # bytes would be sniffed for UTF-16/32
    except (ValueError, RecursionError):
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body",),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": error},
                }
            ]
        ) from None


def _parse_options(payload: Any) -> tuple[TranslateOptions, Any]:
    if not isinstance(payload, dict):
        raise InvalidInputError("request body must be a JSON object", param="body")
    if "input" not in payload:
        close = difflib.get_close_matches("input", [str(key) for key in payload], n=1)
        hint = f"; the body has {echo(close[0])}: did you mean 'input'?" if close else ""
        raise RequestValidationError(
            [
                {
                    "type": "missing",
                    "loc": ("body", "input"),
                    "msg": f"Field required{hint}",
                    "input": None,
                }
            ]
        )
    fields = {key: value for key, value in payload.items() if key != "input"}
    return check_options(fields), payload["input"]


def check_options(fields: dict[str, Any], where: str = "body") -> TranslateOptions:
    """The options of a translate request (a JSON body's fields but ``input``, or an Arrow
    request's query parameters), validated.

    Raises
    ------
    RequestValidationError
        As FastAPI would (422 ``validation_error``), naming ``<where>.<field>``.
    """
    try:
        return TranslateOptions.model_validate(fields)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        located = [{**error, "loc": (where, *error["loc"])} for error in errors]
        raise RequestValidationError(suggest_fields(located, _FIELDS)) from None


def find_route(registry: StitchRegistry, options: TranslateFields | TranslateOptions) -> Route:
    """The route that ``options`` name: a stitch by id (``direction``), else the models.

    Raises
    ------
    StitchNotFoundError, NotReadyError, NotInvertibleError, InvalidInputError
        As :meth:`StitchRegistry.route_for_id` and :meth:`StitchRegistry.route`.
    NoConfidenceError
        With ``return_confidence``, as :meth:`StitchRegistry.check_confidence`.
    """
    if options.stitch is not None:
        route = registry.route_for_id(options.stitch, inverse=options.direction == "inverse")
    else:
        assert options.source_model is not None and options.target_model is not None
        route = registry.route(options.source_model, options.target_model, strict=options.strict)
    if options.return_confidence:  # before the vectors are decoded
        registry.check_confidence(route)
    return route
