"""One SQL dialect over two backends: a SQLite file or a PostgreSQL database.

Statements use ``?`` placeholders on both backends (rewritten to ``%s`` for psycopg) and
rows are dicts of column names. Each thread opens its own connection on first use (neither
``sqlite3`` nor psycopg connections are shared between threads); single statements run in
autocommit mode and :meth:`Database.transaction` groups several into one transaction:
``BEGIN IMMEDIATE`` on SQLite (one writer at a time), ``BEGIN`` on PostgreSQL (READ
COMMITTED: statements that read before they write lock their rows with
:attr:`Database.for_update`).
"""

from __future__ import annotations

import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lead.errors import StoreError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "Connection",
    "Database",
    "PostgresDatabase",
    "Result",
    "SqliteDatabase",
    "open_database",
]

Row = dict[str, Any]


@dataclass
class Result:
    """The rows a statement returned (fetched at once) and the count of rows it changed."""

    rows: list[Row] = field(default_factory=list)
    rowcount: int = -1

    def fetchone(self) -> Row | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Row]:
        return self.rows


class Connection(ABC):
    """One thread's connection: ``execute`` runs a statement with ``?`` placeholders."""

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result: ...


class _SqliteConnection(Connection):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.raw = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        cursor = self.raw.execute(sql, tuple(params))
        rows = cursor.fetchall() if cursor.description else []
        return Result(rows, cursor.rowcount)


class _PostgresConnection(Connection):
    def __init__(self, conn: psycopg.Connection[Row]) -> None:
        self.raw = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        assert "%" not in sql, sql  # would need escaping for psycopg
        cursor = self.raw.execute(sql.replace("?", "%s"), tuple(params))
        rows = cursor.fetchall() if cursor.description else []
        return Result(rows, cursor.rowcount)


class Database(ABC):
    """Per-thread connections to one database; see the module docstring."""

    backend: ClassVar[str]
    for_update: ClassVar[str]  # appended to a SELECT that locks the rows it reads
    for_share: ClassVar[str]  # ... against changes, not against other readers
    skip_locked: ClassVar[str]  # ... and skips rows that another transaction holds
    now: ClassVar[str]  # the database clock in Unix seconds (float), one for all replicas
    location: str  # where the data lives, for messages and logs: never a password

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: dict[threading.Thread, Connection] = {}

    @abstractmethod
    def _connect(self) -> Connection: ...

    @abstractmethod
    def _usable(self, conn: Connection) -> bool: ...

    @abstractmethod
    def _close(self, conn: Connection) -> None: ...

    @abstractmethod
    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """This thread's connection inside one transaction, rolled back on an exception."""

    @abstractmethod
    def unique_violation(self, exc: BaseException) -> str | None:
        """The constraint or column named by a unique-constraint violation, else None."""

    def connection(self) -> Connection:
        """This thread's connection (autocommit: each statement is its own transaction)."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or not self._usable(conn):
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                for thread in [t for t in self._open if not t.is_alive()]:
                    self._close(self._open.pop(thread))  # threads of a pool come and go
                old = self._open.pop(threading.current_thread(), None)
                if old is not None:
                    self._close(old)
                self._open[threading.current_thread()] = conn
        return conn

    def close(self) -> None:
        """Close every connection (at shutdown, when no thread uses the database)."""
        with self._lock:
            for conn in self._open.values():
                self._close(conn)
            self._open.clear()
        self._local = threading.local()


class SqliteDatabase(Database):
    """A SQLite file in WAL mode (created when missing)."""

    backend = "sqlite"
    for_update = ""  # BEGIN IMMEDIATE already holds the only write lock
    for_share = ""
    skip_locked = ""
    now = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.location = str(self.path)

    def _connect(self) -> Connection:
        # check_same_thread=False only so that close() can close it from another thread
        conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = lambda cursor, row: {
            d[0]: value for d, value in zip(cursor.description, row, strict=True)
        }
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        return _SqliteConnection(conn)

    def _usable(self, conn: Connection) -> bool:
        return True

    def _close(self, conn: Connection) -> None:
        assert isinstance(conn, _SqliteConnection)
        conn.raw.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def unique_violation(self, exc: BaseException) -> str | None:
        text = str(exc)
        if isinstance(exc, sqlite3.IntegrityError) and text.startswith("UNIQUE constraint"):
            return text
        return None


class PostgresDatabase(Database):
    """A PostgreSQL database reached through psycopg 3.

    Raises
    ------
    StoreError
        If the server cannot be reached or refuses the credentials (the message names the
        host, port and database, never the password).
    """

    backend = "postgresql"
    for_update = " FOR UPDATE"
    for_share = " FOR SHARE"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    now = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"

    def __init__(self, url: str) -> None:
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError:
            raise StoreError(
                "a PostgreSQL job database needs psycopg: pip install 'psycopg[binary]'"
            ) from None
        super().__init__()
        self._url = url
        try:
            info = conninfo_to_dict(url)
        except psycopg.Error:  # the message could quote the URL, password and all
            raise StoreError("the job database URL is not a valid PostgreSQL URL") from None
        self._password = str(info.get("password") or "")
        user = f"{info['user']}@" if info.get("user") else ""
        port = f":{info['port']}" if info.get("port") else ""
        self.location = f"postgresql://{user}{info.get('host', '')}{port}/{info.get('dbname', '')}"
        self.connection()  # fail now, with a clear message, when the server is unreachable

    def _connect(self) -> Connection:
        import psycopg
        from psycopg.rows import dict_row

        try:
            conn = psycopg.connect(
                self._url, autocommit=True, row_factory=dict_row, connect_timeout=10
            )
        except psycopg.Error as exc:
            reason = " ".join(str(exc).split())  # one line (libpq adds a hint line)
            if self._password:
                reason = reason.replace(self._password, "***")
            raise StoreError(
                f"cannot connect to the job database {self.location}: {reason}"
            ) from None
        return _PostgresConnection(conn)

    def _usable(self, conn: Connection) -> bool:
        assert isinstance(conn, _PostgresConnection)
        return not (conn.raw.closed or conn.raw.broken)

    def _close(self, conn: Connection) -> None:
        assert isinstance(conn, _PostgresConnection)
        conn.raw.close()

    def raw(self) -> psycopg.Connection[Row]:
        """This thread's ``psycopg.Connection`` (for what the common dialect lacks: COPY,
        server-side cursors, binary parameters)."""
        conn = self.connection()
        assert isinstance(conn, _PostgresConnection)
        return conn.raw

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        conn = self.connection()
        assert isinstance(conn, _PostgresConnection)
        with conn.raw.transaction():
            yield conn

    def unique_violation(self, exc: BaseException) -> str | None:
        import psycopg.errors

        if isinstance(exc, psycopg.errors.UniqueViolation):
            return str(exc.diag.constraint_name or exc)
        return None


def open_database(target: Path | str) -> Database:
    """A PostgreSQL database for a ``postgresql://`` or ``postgres://`` URL, else the
    SQLite file at ``target``."""
    if isinstance(target, str) and target.startswith(("postgresql://", "postgres://")):
        return PostgresDatabase(target)
    return SqliteDatabase(Path(target))
