"""JSON request bodies parsed and validated in a worker thread, off the event loop.

FastAPI parses a body declared as a pydantic model on the event loop: a 32 MB job of inline
pairs held it for about 2 s, and every query-time translate request waited as long.
:func:`json_body` reads the body on the loop (I/O only) and hands the parse and the model's
validation to the thread pool, raising what FastAPI raises (the same
:class:`~fastapi.exceptions.RequestValidationError`, locations under ``body``), so that
the error envelope does not change; :func:`json_request_body` documents the body in the
OpenAPI schema as FastAPI would have.

A worker thread still holds the interpreter while C code parses: ``json.loads`` of the
32 MB body in one call took 0.45 s, and the event loop waited for it. So a large array
member is split into its elements first (``msgspec.Raw``: a scan, no objects) and parsed
in pieces of about :data:`_PIECE_BYTES` by ``json.loads`` itself, letting the loop run in
between; what ``msgspec`` cannot read (a ``NaN`` literal, which ``json.loads`` accepts and
the models refuse by name) is parsed whole by ``json.loads``, with its errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from service.errors import suggest_fields

__all__ = ["encoding_problem", "json_body", "json_request_body", "json_value_problem"]

ModelT = TypeVar("ModelT", bound=BaseModel)


#: Bytes of array elements that one ``json.loads`` call parses (~4 ms).
_PIECE_BYTES = 256 * 1024

#: A ``\\uD800``-``\\uDFFF`` escape (group 2: its third hex digit, 8-B for a high one)
#: after a whole run of backslashes (group 1; odd: the last one starts the escape). The run
#: is matched from its start only and possessively: ``(\\+)`` alone tried every start
#: within a run, quadratic in its length (80 KB of backslashes held the interpreter, and
#: with it the event loop, for 30 s: an adversarial pass).
_SURROGATE_ESCAPE = re.compile(rb"(?<!\\)(\\++)u[dD]([89a-fA-F])[0-9a-fA-F]{2}")
_BLANK = re.compile(rb"[ \t\r\n]*")  # JSON's whitespace (matched, not copied as strip does)
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ELEMENTS = msgspec.json.Decoder(list[msgspec.Raw])


def _loads_array(text: bytes) -> list[Any]:
    try:
        elements = _ELEMENTS.decode(text)
    except msgspec.DecodeError:
        return list(json.loads(text))  # says why (its position is then within the member)
    values: list[Any] = []
    start, size = 0, 0
    for end, element in enumerate(elements, 1):
        size += len(element)
        if size >= _PIECE_BYTES or end == len(elements):
            values += json.loads(b"[" + b",".join(map(bytes, elements[start:end])) + b"]")
            start, size = end, 0
    return values


def _loads(body: bytes, text: str) -> Any:
    """``json.loads(text)`` (``text``: ``body`` decoded), the large arrays of a JSON object
    parsed in pieces."""
    if len(body) > _PIECE_BYTES and body.lstrip()[:1] == b"{":
        try:
            members = _MEMBERS.decode(body)
        except msgspec.DecodeError:
            pass  # not strict JSON: json.loads reads it, or says why not
        else:
            values = {key: bytes(raw) for key, raw in members.items()}
            return {
                key: _loads_array(text) if text[:1] == b"[" else json.loads(text)
                for key, text in values.items()
            }
    return json.loads(text)  # as Starlette's Request.json, which FastAPI calls


def _invalid_json(reason: str, loc: tuple[Any, ...], doc: Any = None) -> RequestValidationError:
    """FastAPI's error for a body that is not JSON (``service.errors``: a 400 ``invalid_json``
    quoting ``reason``)."""
    error = {"type": "json_invalid", "loc": loc, "msg": "JSON decode error", "input": {}}
    return RequestValidationError([{**error, "ctx": {"error": reason}}], body=doc)


def encoding_problem(body: bytes) -> tuple[str, tuple[str, int] | tuple[str]] | None:
    """Why ``body`` is not a JSON text in UTF-8 before any syntax (RFC 8259, section 8.1),
    and its location (``("body", byte)``); None when it may be one. For the message of a body that
    failed to parse, where a parser's own words ("Input data was truncated", "Expecting
    property name") would not say it.

    Empty or only whitespace; a byte order mark; UTF-16 or UTF-32 (a NUL byte among the
    first four: a JSON text in UTF-8 starts with an ASCII character, and NUL is none that
    JSON allows).
    """
    if _BLANK.fullmatch(body):
        return ("the body is empty" if not body else "the body holds only whitespace"), ("body",)
    if body.startswith(b"\xef\xbb\xbf"):
        reason = "the body starts with a byte order mark (BOM): send UTF-8 without one"
        return reason, ("body", 0)
    if body.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in body[:4]:
        reason = "the body is not UTF-8 (it looks like UTF-16 or UTF-32): send JSON in UTF-8"
        return reason, ("body", 0)
    return None


def _lone_surrogate(body: bytes) -> int | None:
    """The byte offset of the first ``\\uD800``-``\\uDFFF`` escape of a JSON text that is
    not half of a surrogate pair (``json.loads`` turns it into a string that is not
    Unicode, which fails later, far from the request: a 500), or None."""
    escapes = [
        (match.end() - 6, match.group(2) in b"89abAB")  # (offset, a high surrogate)
        for match in _SURROGATE_ESCAPE.finditer(body)
        if len(match.group(1)) % 2  # an odd run of backslashes: the last one escapes
    ]
    i = 0
    while i < len(escapes):
        at, high = escapes[i]
        if high and i + 1 < len(escapes) and escapes[i + 1] == (at + 6, False):
            i += 2  # a pair: one character
            continue
        return at
    return None


def _validate(model: type[ModelT], body: bytes) -> ModelT:
    try:
        text = body.decode("utf-8")  # JSON exchanged between systems is UTF-8 (RFC 8259)
        data = _loads(body, text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        problem = encoding_problem(body)
        if problem is not None:
            raise _invalid_json(*problem) from None
        if isinstance(error, UnicodeDecodeError):
            reason = f"not UTF-8 text: byte {error.start} ({error.reason})"
            raise _invalid_json(reason, ("body", error.start)) from None
        byte = len(error.doc[: error.pos].encode()) if isinstance(error.doc, str) else error.pos
        reason = f"{error.msg} (byte {byte})"
        raise _invalid_json(reason, ("body", byte), error.doc) from error
    except RecursionError:
        raise _invalid_json("arrays or objects nested too deeply", ("body",)) from None
    except ValueError as error:  # an integer of more digits than the interpreter converts
        raise _invalid_json(json_value_problem(error), ("body",)) from None
    at = _lone_surrogate(body) if b"\\u" in body else None
    if at is not None:
        reason = f"a \\u escape at byte {at} is half of a UTF-16 surrogate pair: not Unicode text"
        raise _invalid_json(reason, ("body", at))
    try:
        return model.model_validate(data)
    except ValidationError as error:
        errors = [
            {**item, "loc": ("body", *item["loc"])} for item in error.errors(include_url=False)
        ]
        raise RequestValidationError(
            suggest_fields(errors, model.model_fields), body=data
        ) from error


def json_value_problem(error: ValueError) -> str:
    """What ``json.loads`` found wrong, for a client: an integer of more digits than the
    interpreter converts is named without CPython's advice to its programmer (``use
    sys.set_int_max_str_digits()``)."""
    return str(error).split(";")[0].replace("Exceeds", "an integer exceeds")


def json_body(model: type[ModelT]) -> Callable[[Request], Awaitable[ModelT]]:
    """A dependency that yields the request body validated as ``model``.

    Parameters
    ----------
    model : type of pydantic.BaseModel
        The body's model; declare it in the route's ``openapi_extra`` with
        :func:`json_request_body` and among the extra OpenAPI models.

    Returns
    -------
    callable
        An ``async`` dependency for ``Depends``.

    Raises
    ------
    fastapi.exceptions.RequestValidationError
        The body is empty (``missing``), not JSON (``json_invalid``) or not a valid
        ``model``; a :class:`~lead.errors.LeadError` that a validator raises passes through.
    """

    async def dependency(request: Request) -> ModelT:
        body = await request.body()
        return await run_in_threadpool(_validate, model, body)

    return dependency


def json_request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route whose body :func:`json_body` reads: a required
    ``application/json`` body of ``model``'s schema (a component of its name)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"content": {"application/json": {"schema": schema}}, "required": True}}
