"""PostgreSQL plumbing of the pgvector stores: connecting, the catalog, errors and locks.

Every ``psycopg.Error`` that leaves a public method of a pgvector store becomes one
:class:`~lead.errors.LeadError` (:func:`store_errors`), whose message names the store by its
safe URI (:attr:`~lead.migrate.stores.StoreURI.uri`) and never holds a password. Catalog
look-ups go by name through ``pg_class`` / ``pg_namespace``, so a table or schema name may
hold any character (quotes, dots, capitals).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from lead.errors import (
    ConflictError,
    InvalidInputError,
    LeadError,
    StoreError,
    StoreNotFoundError,
)
from lead.migrate.stores import SECRET_PARAMS, Closing, StoreURI, require

__all__ = [
    "INT_IDS",
    "KINDS",
    "VALUE",
    "PgStore",
    "column_type",
    "columns",
    "connect",
    "duplicate_value",
    "errors_of",
    "has_unique_index",
    "ident",
    "lead_error",
    "lock_in_transaction",
    "psycopg_error",
    "relation_kind",
    "schema_exists",
    "split",
    "store_errors",
    "try_lock",
]

#: integer id column types, and how binary COPY sends them
INT_IDS = {"int8": ">i8", "int4": ">i4", "int2": ">i2"}
#: pgvector column types, and how binary COPY sends a value
VALUE = {"vector": ">f4", "halfvec": ">f2"}
#: What a ``pg_class.relkind`` is, as error messages say it.
KINDS = {
    "r": "table",
    "p": "partitioned table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
    "i": "index",
    "S": "sequence",
    "c": "composite type",
    "t": "TOAST table",
    "I": "partitioned index",
}


class PgStore(Closing):
    """A pgvector store: ``where`` names it in error messages (no password)."""

    where: str


_S = TypeVar("_S", bound=PgStore)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def store_errors(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Decorate a method of a :class:`PgStore`: a ``psycopg.Error`` it raises becomes the
    :class:`LeadError` of :func:`lead_error`."""

    @functools.wraps(method)
    def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except psycopg_error() as error:
            raise lead_error(error, self.where) from None

    return wrapper


@contextmanager
def errors_of(where: str) -> Iterator[None]:
    """``with errors_of(uri):`` raises a ``psycopg.Error`` as :func:`lead_error`'s."""
    try:
        yield
    except psycopg_error() as error:
        raise lead_error(error, where) from None


def psycopg_error() -> type[Exception]:
    psycopg = require("psycopg", "pgvector")
    error: type[Exception] = psycopg.Error
    return error


def lead_error(error: Exception, where: str) -> LeadError:
    """The :class:`LeadError` for a ``psycopg.Error`` raised while working on ``where``.

    A missing schema or table is :class:`StoreNotFoundError`; a table or column that
    exists already, or a unique key taken, :class:`ConflictError`; anything else
    (privileges, a lost connection, the server's refusals) :class:`StoreError`.
    """
    from psycopg import errors

    text = _primary(error)
    if isinstance(error, errors.InvalidSchemaName | errors.UndefinedTable):
        return StoreNotFoundError(f"{where}: {text}", param="table")
    if isinstance(error, errors.DuplicateTable | errors.DuplicateColumn | errors.UniqueViolation):
        return ConflictError(f"{where}: {text}; another run may be creating it", param="target")
    if isinstance(error, errors.InsufficientPrivilege):
        return StoreError(f"{where}: {text}; connect as a role that may do this", param="uri")
    return StoreError(f"{where}: {text}")


def _primary(error: Exception) -> str:
    diag = getattr(error, "diag", None)
    primary = getattr(diag, "message_primary", None)
    if primary:
        return str(primary)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def connect(parsed: StoreURI) -> Any:
    """An autocommit connection to the database of ``parsed``.

    Raises
    ------
    InvalidInputError
        A URI libpq cannot parse (an unknown parameter, a bad value, an invalid
        percent-encoding), naming what is wrong and no secret.
    StoreError
        PostgreSQL cannot be reached or refuses the credentials.
    """
    psycopg = require("psycopg", "pgvector")
    try:
        return psycopg.connect(parsed.connect, autocommit=True)
    except psycopg.ProgrammingError as error:  # the URI, refused before connecting
        raise InvalidInputError(
            f"{parsed.uri}: {_scrub(str(error).strip(), parsed)}", param="uri"
        ) from None
    except psycopg.Error as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = _scrub(lines[-1] if lines else "refused", parsed)
        raise StoreError(f"cannot connect to {parsed.uri}: {reason}", param="uri") from None


def _scrub(text: str, parsed: StoreURI) -> str:
    """``text`` without the URI's password and secret parameters."""
    text = re.sub(
        r'invalid percent-encoded token: ".*?"',
        "invalid percent-encoding ('%' must start %XX; write a '%' as %25)",
        text.replace(parsed.connect, parsed.uri),
    )
    try:
        parts = urlsplit(parsed.connect)
        password = parts.password
    except ValueError:
        return text.replace(parsed.connect, parsed.uri)
    secrets = {password or "", unquote(password or "")}
    secrets |= {v for k, v in parse_qsl(parts.query) if k.lower() in SECRET_PARAMS}
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


def table_params(parsed: StoreURI) -> tuple[str, str, str, str, str]:
    """(table as given, schema, table, vector column, id column) of a pgvector URI.

    Raises
    ------
    InvalidInputError
        No ``table`` in the URI.
    """
    table = parsed.params.get("table")
    if not table:
        raise InvalidInputError(f"{parsed.uri}: add ?table=NAME to the URI", param="table")
    schema, name = split(table)
    return (
        table,
        schema,
        name,
        parsed.params.get("column", "embedding"),
        parsed.params.get("id", "id"),
    )


def split(table: str) -> tuple[str, str]:
    """``schema.table`` (or ``table``, in ``public``) as (schema, table)."""
    schema, _, name = table.rpartition(".")
    return schema or "public", name


def ident(*names: str) -> Any:
    from psycopg import sql

    return sql.Identifier(*names)


def schema_exists(conn: Any, schema: str) -> bool:
    row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


def relation_kind(conn: Any, schema: str, name: str) -> str | None:
    """The ``relkind`` of a relation (``r`` table, ``v`` view, ...), None when there is none."""
    row = conn.execute(
        "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, name),
    ).fetchone()
    return None if row is None else str(row[0])


def column_type(conn: Any, schema: str, table: str, column: str) -> tuple[str, int] | None:
    """(type name, declared dimension or -1) of a column, None when there is none."""
    row = conn.execute(
        "SELECT t.typname, a.atttypmod FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND a.attnum > 0 "
        "AND NOT a.attisdropped",
        (schema, table, column),
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def columns(conn: Any, schema: str, table: str) -> set[str]:
    """The names of a relation's columns."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
        (schema, table),
    ).fetchall()
    return {str(row[0]) for row in rows}


def has_unique_index(conn: Any, schema: str, table: str, column: str) -> bool:
    """Whether a unique index (a primary key, say) on ``column`` alone makes it unique."""
    row = conn.execute(
        "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND i.indisunique "
        "AND i.indnkeyatts = 1 AND i.indpred IS NULL",
        (schema, table, column),
    ).fetchone()
    return row is not None


def duplicate_value(conn: Any, schema: str, table: str, column: str) -> Any:
    """A value ``column`` holds more than once (None: its values are unique)."""
    if has_unique_index(conn, schema, table, column):
        return None
    from psycopg import sql

    row = conn.execute(
        sql.SQL(
            "SELECT {col} FROM {tbl} WHERE {col} IS NOT NULL GROUP BY {col} "
            "HAVING count(*) > 1 ORDER BY {col} LIMIT 1"
        ).format(col=ident(column), tbl=ident(schema, table))
    ).fetchone()
    return None if row is None else row[0]


def try_lock(conn: Any, key: str) -> bool:
    """Take the session advisory lock named ``key`` (a hash of it) on ``conn`` unless
    another session holds it; held until ``conn`` closes."""
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()
    return bool(row[0])


def lock_in_transaction(conn: Any, key: str) -> None:
    """Wait for the transaction advisory lock named ``key``; released at commit / rollback."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
