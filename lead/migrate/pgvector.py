"""PostgreSQL + pgvector stores: read a ``vector`` / ``halfvec`` column, write a new one.

URI: ``postgresql://user[:password]@host:port/db?table=T&column=C&id=ID`` (``table`` may be
``schema.table``; ``column`` defaults to ``embedding``, ``id`` to ``id``). A target takes
``type=vector`` (default) or ``type=halfvec`` for a column it creates. Every other query
parameter (``host=/path/to/socket``, ``sslmode``, ...) goes to libpq through psycopg 3.

Vectors travel as binary ``COPY`` both ways, parsed and built with NumPy (no Python object
per value): the source is read in one ``COPY (SELECT id, C ... ORDER BY id) TO STDOUT``
stream, resumed after the last id a target checkpointed. A source may be a table, a view,
a materialized view or a foreign table. The target is a new table
``(id PRIMARY KEY, C vector(d))``, or a new column of an existing table (the source's own,
say) filled by ``UPDATE ... FROM`` a staged batch; its id column must be unique, and hold
every source id (checked before anything is written). Each batch lands in one transaction
with its checkpoint row in ``lead_migrations`` (same schema as the target), the first one
also creating the table or column, so a run killed or refused at any point resumes exactly
after the last committed batch, and one that wrote nothing leaves nothing. The writer holds
a session advisory lock on the target table for the run: a second apply into it is refused.

Binary formats: PostgreSQL's ``COPY BINARY`` (https://www.postgresql.org/docs/current/sql-copy.html),
pgvector's ``vector_send`` / ``halfvec_send`` (int16 dim, int16 unused, then big-endian
float32 / float16 values; https://github.com/pgvector/pgvector).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from lead.errors import InvalidInputError, ShapeMismatchError, StoreNotFoundError
from lead.migrate._pg import (
    INT_IDS,
    VALUE,
    PgStore,
    column_type,
    connect,
    duplicate_value,
    ident,
    lead_error,
    psycopg_error,
    relation_kind,
    store_errors,
    table_params,
)
from lead.migrate.pgcopy import CopyParser, fetch_copy
from lead.migrate.pgvector_target import CHECKPOINTS, PARTITIONS, PgVectorTarget
from lead.migrate.stores import (
    Batch,
    SourceInfo,
    StoreURI,
    first_zero_row,
    ordered_texts,
    with_params,
    zero_row_error,
)

__all__ = ["CHECKPOINTS", "PARTITIONS", "PgVectorSource", "PgVectorTarget"]

_TEXT_IDS = {"text", "varchar", "bpchar", "uuid", "name"}
_TEXTS = {"text", "varchar", "bpchar"}
#: what a source may be: a table, a view, a materialized view or a foreign table
_READABLE = ("r", "p", "v", "m", "f")


class PgVectorSource(PgStore):
    """A pgvector column of a table, view, materialized view or foreign table, read in id
    order (see the module docstring).

    Raises
    ------
    StoreError
        PostgreSQL cannot be reached, refuses the credentials or the query.
    StoreNotFoundError
        No such table, column or id column.
    InvalidInputError
        The column is not ``vector`` / ``halfvec``; the id column is not an integer or
        text; ``table`` is missing from the URI; a URI libpq cannot parse.
    """

    @store_errors
    def __init__(self, parsed: StoreURI) -> None:
        self.parsed = parsed
        self.where = parsed.uri
        table, self.schema, self.table, self.column, self.id_column = table_params(parsed)
        self.name = f"{table}.{self.column}"
        self.conn = connect(parsed)
        try:
            self._describe(parsed, table)
        except BaseException:
            self.conn.close()
            raise

    def _describe(self, parsed: StoreURI, table: str) -> None:
        if relation_kind(self.conn, self.schema, self.table) not in _READABLE:
            raise StoreNotFoundError(f"{parsed.uri}: no table {table!r}", param="table")
        kind = column_type(self.conn, self.schema, self.table, self.column)
        if kind is None:
            raise StoreNotFoundError(
                f"{parsed.uri}: table {table!r} has no column {self.column!r}", param="column"
            )
        if kind[0] not in VALUE:
            raise InvalidInputError(
                f"column {self.name} is {kind[0]}, not a pgvector vector or halfvec",
                param="column",
            )
        id_kind = column_type(self.conn, self.schema, self.table, self.id_column)
        if id_kind is None:
            raise StoreNotFoundError(
                f"{parsed.uri}: table {table!r} has no id column {self.id_column!r} "
                "(name it with ?id=COLUMN)",
                param="id",
            )
        if id_kind[0] not in INT_IDS and id_kind[0] not in _TEXT_IDS:
            raise InvalidInputError(
                f"id column {table}.{self.id_column} is {id_kind[0]}; ids must be integers or text",
                param="id",
            )
        self.vector_type, self.id_type = kind[0], id_kind[0]
        self._tbl = ident(self.schema, self.table)
        self._col, self._id = ident(self.column), ident(self.id_column)
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
            id_kind="int" if self.id_type in INT_IDS else "str",
            null_rows=int(nulls),
            vector_type=self.vector_type,
        )

    def _query(self, template: str, params: Any = None) -> Any:
        from psycopg import sql

        query = sql.SQL(template).format(tbl=self._tbl, col=self._col, id=self._id)
        return self.conn.execute(query, params)

    @store_errors
    def check(self, *, skip_null: bool = False, zero_rows: bool = False) -> None:
        """Refuse NULL vectors (unless ``skip_null``), NULL or duplicate ids, mixed
        dimensions and, with ``zero_rows``, vectors of L2 norm 0 (one query; pgvector
        itself refuses NaN and infinity).

        Raises
        ------
        InvalidInputError
            Naming the first offending id and the column.
        ZeroVectorError
            With ``zero_rows``: the first all-zero vector, naming its id.
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
        dup = duplicate_value(self.conn, self.schema, self.table, self.id_column)
        if dup is not None:
            raise InvalidInputError(
                f"id {dup} appears more than once in {self.table}.{self.id_column}; "
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

        if zero_rows:
            self._check_zero_rows()

    def _check_zero_rows(self) -> None:
        """Refuse the first vector without a direction: all its values below float32's
        smallest normal number (:func:`~lead.migrate.stores.first_zero_row`, what the
        translator refuses). Such a vector's L2 norm is below that number times
        sqrt(dim): only the rows under that bound (few; pgvector computes the norm) are
        streamed here and checked exactly. A bound of the smallest normal itself missed
        vectors of subnormal values (1e-39 in each of 384: norm 2e-38), which stopped a run
        midway.
        """
        from psycopg import sql

        norm = sql.SQL("vector_norm" if self.vector_type == "vector" else "l2_norm")
        bound = float(np.finfo(np.float32).tiny) * math.sqrt(max(self.info.dim, 1))
        small = sql.SQL("{norm}({col}) < {bound}").format(
            norm=norm, col=self._col, bound=sql.Literal(bound)
        )
        for batch in self._streamed(4096, None, None, small):
            zero = first_zero_row(batch.vectors)
            if zero is not None:
                raise zero_row_error(batch.ids[zero], self.name, self.column)

    def _select(
        self, after: Any, limit: int | None = None, until: Any = None, extra: Any = None
    ) -> Any:
        from psycopg import sql

        ident = self._ident_sql()
        where = sql.SQL("{col} IS NOT NULL").format(col=self._col)
        if extra is not None:  # a further condition (sql.Composable)
            where = sql.SQL("{} AND {}").format(where, extra)
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

        cast = "bigint" if self.id_type in INT_IDS else "text"
        return sql.SQL("{}::" + cast).format(self._id)

    def batches(self, batch_size: int, after: Any = None, until: Any = None) -> Iterator[Batch]:
        """Rows with a vector in id order, after id ``after`` and up to id ``until`` (None:
        the end); one COPY stream, parsed with NumPy in batches of ``batch_size`` rows.
        Uses its own connection (it runs in the read-ahead thread)."""
        return self._streamed(batch_size, after, until)

    def _streamed(
        self, batch_size: int, after: Any, until: Any, extra: Any = None
    ) -> Iterator[Batch]:
        """:meth:`batches` of the rows that also meet ``extra`` (sql.Composable, or None)."""
        from psycopg import sql

        parser = CopyParser(
            self.info.id_kind == "int", VALUE[self.vector_type], self.info.dim, self.name
        )
        copy_sql = sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(
            self._select(after, until=until, extra=extra)
        )
        conn = connect(self.parsed)
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
        except psycopg_error() as error:
            if not stopped:
                raise lead_error(error, f"reading {self.where}") from None
        finally:
            conn.close()

    @store_errors
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

    @store_errors
    def fetch(self, ids: np.ndarray) -> np.ndarray:
        """Vectors of ``ids`` (in that order) as float32 (len(ids), dim).

        Raises
        ------
        InvalidInputError
            An id missing from the table, or whose vector is NULL.
        """
        return fetch_copy(
            self.conn,
            self._tbl,
            self._col,
            self._ident_sql(),
            ids,
            self.name,
            self.info.id_kind == "int",
            VALUE[self.vector_type],
            self.info.dim,
        )

    @store_errors
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

    @store_errors
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

        kind = column_type(self.conn, self.schema, self.table, column)
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
            text=ident(column),
            tbl=self._tbl,
            keys=sql.Literal(keys),
        )
        found = dict(self.conn.execute(query).fetchall())
        return ordered_texts(np.asarray(keys, dtype=object), found, self.table, column)

    def close(self) -> None:
        self.conn.close()
