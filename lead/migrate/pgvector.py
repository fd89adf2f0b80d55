"""PostgreSQL + pgvector stores: read a ``vector`` / ``halfvec`` column, write a new one.

URI: ``postgresql://user[:password]@host:port/db?table=T&column=C&id=ID`` (``table`` may be
``schema.table``; ``column`` defaults to ``embedding``, ``id`` to ``id``). A target takes
``type=vector`` (default) or ``type=halfvec`` for a column it creates. Every other query
parameter (``host=/path/to/socket``, ``sslmode``, ...) goes to libpq through psycopg 3.

Vectors travel as binary ``COPY`` both ways, parsed and built with NumPy (no Python object
per value): the source is read in one ``COPY (SELECT id, C ... ORDER BY id) TO STDOUT``
stream, resumed after the last id a target checkpointed. The target is a new table
``(id PRIMARY KEY, C vector(d))``, or a new column of an existing table (the source's own,
say) filled by ``UPDATE ... FROM`` a staged batch. Each batch lands in one transaction
with its checkpoint row in ``lead_migrations`` (same schema as the target), so a run
killed at any point resumes exactly after the last committed batch.

Binary formats: PostgreSQL's ``COPY BINARY`` (https://www.postgresql.org/docs/current/sql-copy.html),
pgvector's ``vector_send`` / ``halfvec_send`` (int16 dim, int16 unused, then big-endian
float32 / float16 values; https://github.com/pgvector/pgvector).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from lead.errors import (
    ConflictError,
    InvalidInputError,
    ShapeMismatchError,
    StoreError,
    StoreNotFoundError,
)
from lead.migrate.pgcopy import CopyParser, copy_rows
from lead.migrate.stores import (
    Batch,
    Closing,
    MigrationSpec,
    Progress,
    SourceInfo,
    StoreURI,
    check_same_migration,
    ordered_texts,
    require,
    with_params,
)

__all__ = ["PgVectorSource", "PgVectorTarget"]

_INT_IDS = {"int8": ">i8", "int4": ">i4", "int2": ">i2"}
_TEXT_IDS = {"text", "varchar", "bpchar", "uuid", "name"}
_TEXTS = {"text", "varchar", "bpchar"}
_VALUE = {"vector": ">f4", "halfvec": ">f2"}
CHECKPOINTS = "lead_migrations"
#: the partition plan and done-markers of runs that fill a target in partitions (``--engine ray``)
PARTITIONS = "lead_migration_partitions"


def _connect(parsed: StoreURI) -> Any:
    psycopg = require("psycopg", "pgvector")
    try:
        return psycopg.connect(parsed.connect, autocommit=True)
    except psycopg.OperationalError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "refused"
        raise StoreError(f"cannot connect to {parsed.uri}: {reason}", param="uri") from None


def _psycopg_error() -> type[Exception]:
    psycopg = require("psycopg", "pgvector")
    error: type[Exception] = psycopg.Error
    return error


def _split(table: str) -> tuple[str, str]:
    schema, _, name = table.rpartition(".")
    return schema or "public", name


def _ident(*names: str) -> Any:
    from psycopg import sql

    return sql.Identifier(*names)


def _column_type(conn: Any, schema: str, table: str, column: str) -> tuple[str, int] | None:
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


def _table_exists(conn: Any, schema: str, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, table),
    ).fetchone()
    return row is not None


class PgVectorSource(Closing):
    """A pgvector column read in id order (see the module docstring).

    Raises
    ------
    StoreError
        PostgreSQL cannot be reached or refuses the credentials.
    StoreNotFoundError
        No such table, column or id column.
    InvalidInputError
        The column is not ``vector`` / ``halfvec``; the id column is not an integer or
        text; ``table`` is missing from the URI.
    """

    def __init__(self, parsed: StoreURI) -> None:
        self.parsed = parsed
        table = parsed.params.get("table")
        if not table:
            raise InvalidInputError(f"{parsed.uri}: add ?table=NAME to the URI", param="table")
        self.schema, self.table = _split(table)
        self.column = parsed.params.get("column", "embedding")
        self.id_column = parsed.params.get("id", "id")
        self.name = f"{table}.{self.column}"
        self.conn = _connect(parsed)
        try:
            self._describe(parsed, table)
        except BaseException:
            self.conn.close()
            raise

    def _describe(self, parsed: StoreURI, table: str) -> None:
        if not _table_exists(self.conn, self.schema, self.table):
            raise StoreNotFoundError(f"{parsed.uri}: no table {table!r}", param="table")
        kind = _column_type(self.conn, self.schema, self.table, self.column)
        if kind is None:
            raise StoreNotFoundError(
                f"{parsed.uri}: table {table!r} has no column {self.column!r}", param="column"
            )
        if kind[0] not in _VALUE:
            raise InvalidInputError(
                f"column {self.name} is {kind[0]}, not a pgvector vector or halfvec",
                param="column",
            )
        id_kind = _column_type(self.conn, self.schema, self.table, self.id_column)
        if id_kind is None:
            raise StoreNotFoundError(
                f"{parsed.uri}: table {table!r} has no id column {self.id_column!r} "
                "(name it with ?id=COLUMN)",
                param="id",
            )
        if id_kind[0] not in _INT_IDS and id_kind[0] not in _TEXT_IDS:
            raise InvalidInputError(
                f"id column {table}.{self.id_column} is {id_kind[0]}; ids must be integers or text",
                param="id",
            )
        self.vector_type, self.id_type = kind[0], id_kind[0]
        self._tbl = _ident(self.schema, self.table)
        self._col, self._id = _ident(self.column), _ident(self.id_column)
        rows, nulls = self._query(
            "SELECT count(*), count(*) FILTER (WHERE {col} IS NULL) FROM {tbl}"
        ).fetchone()
        dim = kind[1]
        if dim <= 0:  # a column declared without a dimension: read one
            first = self._query(
                "SELECT vector_dims({col}) FROM {tbl} WHERE {col} IS NOT NULL LIMIT 1"
            ).fetchone()
            dim = int(first[0]) if first else 0
        self._declared_dim = kind[1] > 0
        self.info = SourceInfo(
            uri=with_params(parsed.uri, table=table, column=self.column, id=self.id_column),
            rows=int(rows),
            dim=int(dim),
            id_kind="int" if self.id_type in _INT_IDS else "str",
            null_rows=int(nulls),
            vector_type=self.vector_type,
        )

    def _query(self, template: str, params: Any = None) -> Any:
        from psycopg import sql

        query = sql.SQL(template).format(tbl=self._tbl, col=self._col, id=self._id)
        return self.conn.execute(query, params)

    def check(self, *, skip_null: bool = False) -> None:
        """Refuse NULL vectors (unless ``skip_null``), NULL or duplicate ids, mixed dimensions.

        Raises
        ------
        InvalidInputError
            Naming the first offending id and the column.
        """
        if self.info.null_rows and not skip_null:
            (first,) = self._query(
                "SELECT {id} FROM {tbl} WHERE {col} IS NULL ORDER BY {id} LIMIT 1"
            ).fetchone()
            raise InvalidInputError(
                f"{self.info.null_rows} rows of {self.name} are NULL (the first: id {first}); "
                "fill them, or pass --skip-null to leave them out of the target",
                param=self.column,
            )
        if self._query("SELECT 1 FROM {tbl} WHERE {id} IS NULL LIMIT 1").fetchone():
            raise InvalidInputError(
                f"{self.table}.{self.id_column} holds NULL ids; every row needs an id",
                param=self.id_column,
            )
        if not self._has_unique_id():
            dup = self._query(
                "SELECT {id} FROM {tbl} GROUP BY {id} HAVING count(*) > 1 LIMIT 1"
            ).fetchone()
            if dup is not None:
                raise InvalidInputError(
                    f"id {dup[0]} appears more than once in {self.table}.{self.id_column}; "
                    "ids must be unique",
                    param=self.id_column,
                )
        if not self._declared_dim:
            other = self._query(
                "SELECT {id}, vector_dims({col}) FROM {tbl} "
                "WHERE {col} IS NOT NULL AND vector_dims({col}) <> %s LIMIT 1",
                (self.info.dim,),
            ).fetchone()
            if other is not None:
                raise ShapeMismatchError(
                    f"the vector of id {other[0]} in {self.name} has dimension {other[1]}, "
                    f"the others {self.info.dim}",
                    expected=self.info.dim,
                    got=int(other[1]),
                    param=self.column,
                )

    def _has_unique_id(self) -> bool:
        row = self.conn.execute(
            "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = i.indkey[0] WHERE i.indrelid = %s::regclass AND i.indisunique "
            "AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = %s",
            (f'"{self.schema}"."{self.table}"', self.id_column),
        ).fetchone()
        return row is not None

    def _select(self, after: Any, limit: int | None = None, until: Any = None) -> Any:
        from psycopg import sql

        ident = self._ident_sql()
        where = sql.SQL("{col} IS NOT NULL").format(col=self._col)
        if after is not None:
            where = sql.SQL("{} AND {} > {}").format(where, self._id, sql.Literal(after))
        if until is not None:
            where = sql.SQL("{} AND {} <= {}").format(where, self._id, sql.Literal(until))
        query = sql.SQL("SELECT {ident}, {col} FROM {tbl} WHERE {where} ORDER BY {id}").format(
            ident=ident, col=self._col, tbl=self._tbl, where=where, id=self._id
        )
        if limit is not None:
            query = sql.SQL("{} LIMIT {}").format(query, sql.Literal(limit))
        return query

    def _ident_sql(self) -> Any:
        """The id as it travels: bigint for integer ids, text otherwise."""
        from psycopg import sql

        cast = "bigint" if self.id_type in _INT_IDS else "text"
        return sql.SQL("{}::" + cast).format(self._id)

    def batches(self, batch_size: int, after: Any = None, until: Any = None) -> Iterator[Batch]:
        """Rows with a vector in id order, after id ``after`` and up to id ``until`` (None:
        the end); one COPY stream, parsed with NumPy in batches of ``batch_size`` rows.
        Uses its own connection (it runs in the read-ahead thread)."""
        from psycopg import sql

        parser = CopyParser(
            self.info.id_kind == "int", _VALUE[self.vector_type], self.info.dim, self.name
        )
        copy_sql = sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(
            self._select(after, until=until)
        )
        conn = _connect(self.parsed)
        stopped = False
        try:
            with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
                try:
                    for chunk in copy:
                        parser.feed(chunk)
                        while parser.rows_ready() >= batch_size:
                            yield parser.take(batch_size)
                    while parser.rows_ready():
                        yield parser.take(batch_size)
                except GeneratorExit:
                    # the consumer stopped early: have the server stop streaming the rest
                    # of the table instead of reading it to the end
                    stopped = True
                    conn.cancel_safe()
                    raise
        except _psycopg_error() as error:
            if not stopped:
                raise StoreError(f"reading {self.name} failed: {error}") from None
        finally:
            conn.close()

    def id_quantiles(self, count: int) -> list[Any]:
        """The ids that cut the rows with a vector into ``count`` ranges of about equal size
        (``percentile_disc`` over the id column, in the order :meth:`batches` reads); at
        most ``count - 1`` distinct ids, ascending (int, or str for text ids)."""
        fractions = [k / count for k in range(1, count)]
        if not fractions:
            return []
        (cuts,) = self._query(
            "SELECT percentile_disc(%s::float8[]) WITHIN GROUP (ORDER BY {id}) FROM {tbl} "
            "WHERE {col} IS NOT NULL",
            (fractions,),
        ).fetchone()
        kind = int if self.info.id_kind == "int" else str
        return list(dict.fromkeys(kind(c) for c in cuts or [] if c is not None))

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Vectors of ``ids`` (in that order) as float32 (len(ids), dim).

        Raises
        ------
        InvalidInputError
            An id missing from the table, or whose vector is NULL.
        """
        return _fetch_copy(
            self.conn,
            self._tbl,
            self._col,
            self._ident_sql(),
            ids,
            self.name,
            self.info.id_kind == "int",
            _VALUE[self.vector_type],
            self.info.dim,
        )

    def sample_ids(self, n: int, seed: int) -> np.ndarray:
        """Up to ``n`` ids with a vector, a seeded random sample (ordered by a hash)."""
        from psycopg import sql

        query = sql.SQL(
            "SELECT {ident} FROM {tbl} WHERE {col} IS NOT NULL "
            "ORDER BY md5({id}::text || {seed}) LIMIT {n}"
        ).format(
            ident=self._ident_sql(),
            tbl=self._tbl,
            col=self._col,
            id=self._id,
            seed=sql.Literal(str(seed)),
            n=sql.Literal(int(n)),
        )
        values = [row[0] for row in self.conn.execute(query).fetchall()]
        return np.asarray(values, dtype=np.int64 if self.info.id_kind == "int" else object)

    def texts(self, ids: np.ndarray, column: str) -> list[str]:
        """The text column ``column`` of the same table for these ids, in that order (one
        query).

        Raises
        ------
        StoreNotFoundError
            The table has no column ``column``.
        InvalidInputError
            ``column`` is not ``text`` / ``varchar`` / ``char``; an id not in the table, or
            whose text is NULL, naming it.
        """
        from psycopg import sql

        kind = _column_type(self.conn, self.schema, self.table, column)
        if kind is None:
            raise StoreNotFoundError(
                f"{self.parsed.uri}: table {self.table!r} has no column {column!r}",
                param="text_column",
            )
        if kind[0] not in _TEXTS:
            raise InvalidInputError(
                f"column {self.table}.{column} is {kind[0]}, not text", param="text_column"
            )
        int_ids = self.info.id_kind == "int"
        keys = [int(i) for i in ids] if int_ids else [str(i) for i in ids]
        query = sql.SQL("SELECT {ident}, {text} FROM {tbl} WHERE {ident} = ANY({keys})").format(
            ident=self._ident_sql(),
            text=_ident(column),
            tbl=self._tbl,
            keys=sql.Literal(keys),
        )
        found = dict(self.conn.execute(query).fetchall())
        return ordered_texts(np.asarray(keys, dtype=object), found, self.table, column)

    def close(self) -> None:
        self.conn.close()


def _fetch_copy(
    conn: Any,
    table: Any,
    column: Any,
    ident: Any,
    ids: np.ndarray,
    name: str,
    int_ids: bool,
    value: str,
    dim: int,
) -> np.ndarray:
    """Vectors of ``ids`` in that order, by one binary COPY.

    Raises
    ------
    InvalidInputError
        An id without a vector (missing, or NULL).
    """
    from psycopg import sql

    keys = [int(i) for i in ids] if int_ids else [str(i) for i in ids]
    query = sql.SQL(
        "COPY (SELECT {ident}, {col} FROM {tbl} WHERE {ident} = ANY({keys}) "
        "AND {col} IS NOT NULL) TO STDOUT (FORMAT BINARY)"
    ).format(ident=ident, col=column, tbl=table, keys=sql.Literal(keys))
    parser = CopyParser(int_ids, value, dim, name)
    with conn.cursor() as cursor, cursor.copy(query) as copy:
        for chunk in copy:
            parser.feed(chunk)
    found = parser.take(parser.rows_ready()) if parser.rows_ready() else None
    index = {} if found is None else {k: i for i, k in enumerate(found.ids.tolist())}
    missing = [k for k in keys if k not in index]
    if missing:
        raise InvalidInputError(
            f"{len(missing)} ids have no vector in {name} (the first: {missing[0]!r})",
            param="ids",
        )
    assert found is not None
    return found.vectors[[index[k] for k in keys]]


class PgVectorTarget(Closing):
    """A new table, or a new column of an existing table, filled batch by batch.

    See the module docstring. ``type=halfvec`` in the URI stores half precision.
    """

    def __init__(self, parsed: StoreURI) -> None:
        self.parsed = parsed
        table = parsed.params.get("table")
        if not table:
            raise InvalidInputError(f"{parsed.uri}: add ?table=NAME to the URI", param="table")
        self.schema, self.table = _split(table)
        self.column = parsed.params.get("column", "embedding")
        self.id_column = parsed.params.get("id", "id")
        self.vector_type = parsed.params.get("type", "vector")
        if self.vector_type not in _VALUE:
            raise InvalidInputError(
                f"type={self.vector_type!r}: use vector or halfvec", param="type"
            )
        self.key = f"{self.schema}.{self.table}.{self.column}"
        self.uri = with_params(parsed.uri, table=table, column=self.column)
        self.conn = _connect(parsed)
        self.new_table = True
        self.id_kind = "int"
        self.dim = 0

    def _sql(self, template: str, **extra: Any) -> Any:
        from psycopg import sql

        names = {
            "tbl": _ident(self.schema, self.table),
            "col": _ident(self.column),
            "id": _ident(self.id_column),
            "ckpt": _ident(self.schema, CHECKPOINTS),
            **extra,
        }
        return sql.SQL(template).format(**names)

    def _checkpoint(self) -> tuple[dict[str, Any], Progress] | None:
        if not _table_exists(self.conn, self.schema, CHECKPOINTS):
            return None
        row = self.conn.execute(
            self._sql("SELECT spec, position, rows_written, done FROM {ckpt} WHERE target = %s"),
            (self.key,),
        ).fetchone()
        if row is None:
            return None
        return row[0], Progress(row[1], int(row[2]), bool(row[3]))

    def open(
        self, spec: MigrationSpec, source: SourceInfo, *, partitioned: bool = False
    ) -> Progress:
        """Create the table or column with its checkpoint, or resume the same migration.

        ``partitioned``: the caller fills the target partition by partition
        (:mod:`lead.migrate.partitions`); without it, a target that such a run left
        unfinished is refused.

        Raises
        ------
        ConflictError
            The table / column exists without this migration's checkpoint, or with another
            migration's (naming the setting that differs); an unfinished partitioned run
            opened without ``partitioned``.
        InvalidInputError
            ``source`` ids are text and the existing target table's id column is not.
        """
        from psycopg.types.json import Jsonb

        self.dim, self.id_kind = spec.dim, spec.id_kind
        want = spec.as_dict()
        want["vector_type"] = self.vector_type
        found = self._checkpoint()
        if found is not None:
            have, progress = found
            check_same_migration(self.uri, want, have, ignore=("new_table",))
            self.new_table = bool(have.get("new_table", True))
            self._check_target_column()
            if not partitioned and not progress.done and self._partitioned():
                raise ConflictError(
                    f"{self.uri} is being filled in partitions by `--engine ray`; resume it "
                    "with --engine ray",
                    param="target",
                )
            return progress
        exists = _table_exists(self.conn, self.schema, self.table)
        if exists and _column_type(self.conn, self.schema, self.table, self.column):
            raise ConflictError(
                f"{self.uri} exists already and was not made by a LEAD migration; choose a "
                "new table or column",
                param="target",
            )
        self.new_table = not exists
        id_sql = "bigint" if spec.id_kind == "int" else "text"
        type_sql = f"{self.vector_type}({int(spec.dim)})"
        with self.conn.transaction():
            self.conn.execute(
                self._sql(
                    "CREATE TABLE IF NOT EXISTS {ckpt} (target text PRIMARY KEY,"
                    " spec jsonb NOT NULL, position jsonb, rows_written bigint NOT NULL DEFAULT 0,"
                    " done boolean NOT NULL DEFAULT false, updated_at timestamptz DEFAULT now())"
                )
            )
            if self.new_table:
                self.conn.execute(
                    self._sql(
                        f"CREATE TABLE {{tbl}} ({{id}} {id_sql} PRIMARY KEY, {{col}} {type_sql})"
                    )
                )
            else:
                id_type = _column_type(self.conn, self.schema, self.table, self.id_column)
                if id_type is None:
                    raise StoreNotFoundError(
                        f"{self.uri}: table {self.table!r} has no id column "
                        f"{self.id_column!r} (name it with ?id=COLUMN)",
                        param="id",
                    )
                if (spec.id_kind == "int") != (id_type[0] in _INT_IDS):
                    raise InvalidInputError(
                        f"the source's ids are {spec.id_kind}, {self.table}.{self.id_column} "
                        f"is {id_type[0]}",
                        param="id",
                    )
                self.conn.execute(self._sql(f"ALTER TABLE {{tbl}} ADD COLUMN {{col}} {type_sql}"))
            want["new_table"] = self.new_table
            self.conn.execute(
                self._sql("INSERT INTO {ckpt} (target, spec) VALUES (%s, %s)"),
                (self.key, Jsonb(want)),
            )
        return Progress()

    def _check_target_column(self) -> None:
        kind = _column_type(self.conn, self.schema, self.table, self.column)
        if kind is None:
            raise ConflictError(
                f"{self.uri}: the checkpoint says LEAD made this column, but it is gone; "
                f"delete its row from {CHECKPOINTS} to start again",
                param="target",
            )

    def _partitioned(self) -> bool:
        if not _table_exists(self.conn, self.schema, PARTITIONS):
            return False
        row = self.conn.execute(
            self._sql("SELECT 1 FROM {parts} WHERE target = %s LIMIT 1", parts=self.parts_table),
            (self.key,),
        ).fetchone()
        return row is not None

    @property
    def parts_table(self) -> Any:
        """The identifier of the partitions table (:data:`PARTITIONS`) beside the target."""
        return _ident(self.schema, PARTITIONS)

    def write_rows(self, cursor: Any, ids: np.ndarray, vectors: np.ndarray) -> None:
        """COPY the rows into the new table (or stage and UPDATE them into the new column),
        inside the caller's transaction.

        Parameters
        ----------
        cursor : psycopg.Cursor
            A cursor of ``self.conn`` inside a transaction.
        ids : ndarray of shape (m,)
            int64, or object (str).
        vectors : ndarray of shape (m, dim), float32

        Raises
        ------
        StoreError
            New-column mode: an id that is not a row of the table.
        """
        data = copy_rows(ids, vectors, _VALUE[self.vector_type], self.id_kind == "int")
        if self.new_table:
            with cursor.copy(
                self._sql("COPY {tbl} ({id}, {col}) FROM STDIN (FORMAT BINARY)")
            ) as copy:
                copy.write(data)
            return
        id_sql = "bigint" if self.id_kind == "int" else "text"
        type_sql = f"{self.vector_type}({self.dim})"
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS lead_stage (id {id_sql}, v {type_sql}) "
            "ON COMMIT DELETE ROWS"
        )
        with cursor.copy("COPY lead_stage (id, v) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(data)
        cast = "" if self.id_kind == "int" else "::text"
        cursor.execute(
            self._sql(
                f"UPDATE {{tbl}} t SET {{col}} = s.v FROM lead_stage s WHERE t.{{id}}{cast} = s.id"
            )
        )
        updated = cursor.rowcount
        cursor.execute("TRUNCATE lead_stage")  # the next batch of this transaction starts empty
        if updated != len(ids):
            raise StoreError(
                f"{self.uri}: {len(ids) - updated} of {len(ids)} ids of this batch are not "
                f"rows of {self.table}",
            )

    def write(self, ids: np.ndarray, vectors: np.ndarray, progress: Progress) -> None:
        """COPY the rows (or stage and UPDATE them) and move the checkpoint, in one transaction."""
        from psycopg.types.json import Jsonb

        with self.conn.transaction(), self.conn.cursor() as cursor:
            self.write_rows(cursor, ids, vectors)
            cursor.execute(
                self._sql(
                    "UPDATE {ckpt} SET position = %s, rows_written = %s, updated_at = now() "
                    "WHERE target = %s"
                ),
                (Jsonb(progress.position), progress.rows_written, self.key),
            )

    def finish(self, progress: Progress) -> None:
        from psycopg.types.json import Jsonb

        self.conn.execute(
            self._sql(
                "UPDATE {ckpt} SET done = true, position = %s, rows_written = %s, "
                "updated_at = now() WHERE target = %s"
            ),
            (Jsonb(progress.position), progress.rows_written, self.key),
        )

    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Translated vectors of ``ids`` (float32, in that order).

        Raises
        ------
        StoreNotFoundError
            No such table or column.
        InvalidInputError
            An id without a translated vector.
        """
        from psycopg import sql

        kind = _column_type(self.conn, self.schema, self.table, self.column)
        id_kind = _column_type(self.conn, self.schema, self.table, self.id_column)
        if kind is None or id_kind is None or kind[0] not in _VALUE:
            raise StoreNotFoundError(f"{self.uri}: no such vector column", param="column")
        int_ids = id_kind[0] in _INT_IDS
        dim = kind[1]
        ident = sql.SQL("{}::" + ("bigint" if int_ids else "text")).format(_ident(self.id_column))
        return _fetch_copy(
            self.conn,
            _ident(self.schema, self.table),
            _ident(self.column),
            ident,
            ids,
            self.key,
            int_ids,
            _VALUE[kind[0]],
            dim,
        )

    def close(self) -> None:
        self.conn.close()
