"""The pgvector target: a new table, or a new column of an existing table (see
:mod:`lead.migrate.pgvector` for the URI and the formats).

:meth:`PgVectorTarget.open` only checks, under a session advisory lock on the target table
that a second apply cannot take (the partition workers of ``--engine ray`` write under
their driver's): a new table needs a vector column not named like the id column; a new
column needs an existing table whose id column is unique and holds every source id. A
table is created, with its checkpoint row in ``lead_migrations`` (beside the target), in
the transaction of the first batch; a column once the source's ids passed, before the
source is read (the source may be that very table: :meth:`PgVectorTarget.create_column`).
A run refused by its checks leaves the database as it was; each batch then lands with its
checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from lead.errors import ConflictError, InvalidInputError, StoreNotFoundError
from lead.migrate._pg import (
    INT_IDS,
    KINDS,
    VALUE,
    PgStore,
    column_type,
    columns,
    connect,
    duplicate_value,
    ident,
    lock_in_transaction,
    relation_kind,
    schema_exists,
    split,
    store_errors,
    table_params,
    try_lock,
)
from lead.migrate.pgcopy import copy_rows, fetch_copy
from lead.migrate.stores import (
    MigrationSpec,
    Progress,
    Source,
    SourceInfo,
    StoreURI,
    check_same_migration,
    parse_store_uri,
    with_params,
)

__all__ = ["CHECKPOINTS", "PARTITIONS", "PgVectorTarget"]

#: the checkpoint of each target, in a table of this name beside it
CHECKPOINTS = "lead_migrations"
#: the partition plan and done-markers of runs that fill a target in partitions (``--engine ray``)
PARTITIONS = "lead_migration_partitions"
_TABLES = ("r", "p")
_OWN_COLUMNS = {
    CHECKPOINTS: {"target", "spec", "position", "rows_written", "done"},
    PARTITIONS: {"target", "partition", "after", "until", "rows", "position", "done"},
}


class PgVectorTarget(PgStore):
    """A new table, or a new column of an existing table, filled batch by batch.

    See the module docstring. ``type=halfvec`` in the URI stores half precision.

    Raises
    ------
    InvalidInputError
        ``table`` is missing from the URI, ``type`` is not vector or halfvec; a URI libpq
        cannot parse.
    StoreError
        PostgreSQL cannot be reached or refuses the credentials.
    """

    @store_errors
    def __init__(self, parsed: StoreURI) -> None:
        self.parsed = parsed
        self.where = parsed.uri
        table, self.schema, self.table, self.column, self.id_column = table_params(parsed)
        self.vector_type = parsed.params.get("type", "vector")
        if self.vector_type not in VALUE:
            raise InvalidInputError(
                f"type={self.vector_type!r}: use vector or halfvec", param="type"
            )
        self.key = f"{self.schema}.{self.table}.{self.column}"
        # the URI as given: halfvec named too, so that what apply prints is this target
        shown_type = None if self.vector_type == "vector" else self.vector_type
        self.uri = self.where = with_params(
            parsed.uri, table=table, column=self.column, type=shown_type
        )
        self.conn = connect(parsed)
        self.new_table = True
        self.id_kind = "int"
        self.dim = 0
        #: the checkpoint spec of a target :meth:`open` found new: created with the first write
        self._pending: dict[str, Any] | None = None
        self._ids_checked = False
        self._locked = False
        #: a ``real`` column for each row's confidence (``--confidence-column``), or None
        self.confidence_column: str | None = None

    def _sql(self, template: str, **extra: Any) -> Any:
        from psycopg import sql

        names = {
            "tbl": ident(self.schema, self.table),
            "col": ident(self.column),
            "id": ident(self.id_column),
            "ckpt": ident(self.schema, CHECKPOINTS),
            **extra,
        }
        return sql.SQL(template).format(**names)

    @store_errors
    def lock(self) -> None:
        """Hold the target's table for this connection's session: a second writer is
        refused. Taken by :meth:`open` (and by the driver of a partitioned run, when it
        records the plan); the partition workers write under their driver's lock.

        Raises
        ------
        ConflictError
            Another apply holds it.
        """
        if self._locked:
            return
        if not try_lock(self.conn, f"lead.migrate {self.schema}.{self.table}"):
            raise ConflictError(
                f"another apply is writing {self.schema}.{self.table} ({self.uri}); wait "
                "for it to finish, or stop it, then run this again",
                param="target",
            )
        self._locked = True

    def _bookkeeping(self, name: str) -> bool:
        """Whether LEAD's table ``name`` is beside the target (refusing another one)."""
        kind = relation_kind(self.conn, self.schema, name)
        if kind is None:
            return False
        missing = sorted(_OWN_COLUMNS[name] - columns(self.conn, self.schema, name))
        if kind not in _TABLES or missing:
            what = f"no column {missing[0]!r}" if kind in _TABLES else f"a {KINDS.get(kind, kind)}"
            raise ConflictError(
                f"{self.schema}.{name} is not LEAD's bookkeeping table ({what}), but LEAD "
                f"keeps {self.uri}'s checkpoint there; rename it, or choose a target in "
                "another schema",
                param="target",
            )
        return True

    def _checkpoint(self) -> tuple[dict[str, Any], Progress] | None:
        if not self._bookkeeping(CHECKPOINTS):
            return None
        row = self.conn.execute(
            self._sql("SELECT spec, position, rows_written, done FROM {ckpt} WHERE target = %s"),
            (self.key,),
        ).fetchone()
        if row is None:
            return None
        return row[0], Progress(row[1], int(row[2]), bool(row[3]))

    @store_errors
    def open(
        self, spec: MigrationSpec, source: SourceInfo, *, partitioned: bool = False
    ) -> Progress:
        """Check a new table or column, or resume the same migration; writes nothing.

        A new target is created, with its checkpoint, in the transaction of the first
        write (:meth:`write`, :meth:`finish`, or a partitioned run's plan), so a run that
        fails before it leaves the database as it was. New-column mode checks that the
        table's id column is unique and, when the source is a table of the same database,
        that every source id is a row of it (:meth:`check_source` checks other sources).

        ``partitioned``: the caller fills the target partition by partition
        (:mod:`lead.migrate.partitions`); without it, :meth:`lock` is taken, and a target
        that such a run left unfinished is refused.

        Raises
        ------
        ConflictError
            Another apply is writing the table; the table / column exists without this
            migration's checkpoint, or with another migration's (naming the setting that
            differs), or is a view; the column was redeclared since; an unfinished
            partitioned run opened without ``partitioned``; a ``lead_migrations`` table
            that is not LEAD's.
        StoreNotFoundError
            No such schema.
        InvalidInputError
            The ids of ``source`` and the target table's id column differ in kind; a
            target id column that is not unique, or lacks a source id (naming it); a new
            table whose vector column is named like its id column.
        """
        self.dim, self.id_kind = spec.dim, spec.id_kind
        want = spec.as_dict()
        want["vector_type"] = self.vector_type
        if not partitioned:
            self.lock()
        if not schema_exists(self.conn, self.schema):
            raise StoreNotFoundError(
                f"{self.uri}: no schema {self.schema!r}; create it first", param="table"
            )
        self._bookkeeping(PARTITIONS)
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
        self._check_new(spec, source)
        want["new_table"] = self.new_table
        self._pending = want
        return Progress()

    def _check_new(self, spec: MigrationSpec, source: SourceInfo) -> None:
        kind = relation_kind(self.conn, self.schema, self.table)
        if kind is not None and kind not in _TABLES:
            raise ConflictError(
                f"{self.uri}: {self.schema}.{self.table} is a {KINDS.get(kind, kind)}, not a "
                "table; choose a new table",
                param="target",
            )
        if kind is not None and column_type(self.conn, self.schema, self.table, self.column):
            raise ConflictError(
                f"{self.uri} exists already and was not made by a LEAD migration; choose a "
                "new table or column",
                param="target",
            )
        self.new_table = kind is None
        conf = self.confidence_column
        if conf is not None and conf in (self.column, self.id_column):
            raise InvalidInputError(
                f"{self.uri}: the confidence column cannot be named like the vector or the "
                f"id column ({conf!r})",
                param="confidence_column",
            )
        if (
            conf is not None
            and kind is not None
            and column_type(self.conn, self.schema, self.table, conf)
        ):
            raise ConflictError(
                f"{self.uri}: {self.table} has a column {conf!r} already; choose another "
                "--confidence-column",
                param="confidence_column",
            )
        if self.new_table:
            if self.column == self.id_column:
                raise InvalidInputError(
                    f"{self.uri}: the vector column cannot be named like the id column "
                    f"{self.id_column!r}; choose another column=",
                    param="column",
                )
            return
        id_type = column_type(self.conn, self.schema, self.table, self.id_column)
        if id_type is None:
            raise StoreNotFoundError(
                f"{self.uri}: table {self.table!r} has no id column {self.id_column!r} "
                "(name it with ?id=COLUMN)",
                param="id",
            )
        if (spec.id_kind == "int") != (id_type[0] in INT_IDS):
            raise InvalidInputError(
                f"the source's ids are {spec.id_kind}, {self.table}.{self.id_column} "
                f"is {id_type[0]}",
                param="id",
            )
        dup = duplicate_value(self.conn, self.schema, self.table, self.id_column)
        if dup is not None:
            raise InvalidInputError(
                f"id {dup!r} is more than one row of {self.table}.{self.id_column}; a new "
                "column needs unique ids there (add a unique index, or migrate into a new "
                "table)",
                param="id",
            )
        self._check_same_database_ids(source)

    def _check_same_database_ids(self, source: SourceInfo) -> None:
        """When the source is a table of this database (same URI), find a source id that
        is not a row of the target table in one anti-join."""
        from psycopg import sql

        try:
            found = parse_store_uri(source.uri)
        except InvalidInputError:
            return
        if found.scheme != "postgresql" or found.uri != self.parsed.uri:
            return
        schema, table = split(found.params.get("table", ""))
        column, id_column = found.params.get("column", "embedding"), found.params.get("id", "id")
        if (schema, table, id_column) != (self.schema, self.table, self.id_column):
            cast = "" if self.id_kind == "int" else "::text"
            row = self.conn.execute(
                sql.SQL(
                    "SELECT s.{sid}, count(*) OVER () FROM {src} s WHERE s.{scol} IS NOT NULL "
                    f"AND NOT EXISTS (SELECT 1 FROM {{tbl}} t WHERE t.{{id}}{cast} = "
                    f"s.{{sid}}{cast}) ORDER BY s.{{sid}} LIMIT 1"
                ).format(
                    src=ident(schema, table),
                    scol=ident(column),
                    sid=ident(id_column),
                    tbl=ident(self.schema, self.table),
                    id=ident(self.id_column),
                )
            ).fetchone()
            if row is not None:
                raise self._not_rows(row[0], f"{int(row[1])} such ids")
        self._ids_checked = True

    @store_errors
    def check_source(self, source: Source, batch_size: int = 65536) -> None:
        """New-column mode: refuse, before anything is written, a source id that is not a
        row of the target table (reading the source's ids once; one anti-join per batch).
        Nothing to do for a new table, a resumed target, or a source :meth:`open` checked.

        Raises
        ------
        InvalidInputError
            Naming the first such id, in source order, and how many the batch has.
        """
        from psycopg import sql

        if self._pending is None or self.new_table or self._ids_checked:
            return
        int_ids = self.id_kind == "int"
        query = sql.SQL(
            "SELECT u.k, count(*) OVER () FROM unnest(%s::{arr}) WITH ORDINALITY AS u(k, n) "
            "WHERE NOT EXISTS (SELECT 1 FROM {tbl} t WHERE t.{id}{cast} = u.k) "
            "ORDER BY u.n LIMIT 1"
        ).format(
            arr=sql.SQL("bigint[]" if int_ids else "text[]"),
            tbl=ident(self.schema, self.table),
            id=ident(self.id_column),
            cast=sql.SQL("" if int_ids else "::text"),
        )
        for batch in source.batches(batch_size):
            keys = [int(i) for i in batch.ids] if int_ids else [str(i) for i in batch.ids]
            row = self.conn.execute(query, (keys,)).fetchone()
            if row is not None:
                raise self._not_rows(row[0], f"{int(row[1])} such ids in a batch of {len(keys)}")
        self._ids_checked = True

    @store_errors
    def create_column(self) -> None:
        """New-column mode: add the column (and its checkpoint) that :meth:`open` found
        new now, not with the first batch. The source may be this very table: its read
        streams under a lock that ``ALTER TABLE ... ADD COLUMN`` waits for, while the read
        waits for the run to take its rows (a hang, with the README's own example)."""
        if self._pending is not None and not self.new_table:
            with self.writing():
                pass

    def _not_rows(self, first: Any, count: str) -> InvalidInputError:
        return InvalidInputError(
            f"id {first!r} of the source is not a row of {self.schema}.{self.table} "
            f"({count}); a new column holds vectors of the table's own rows: "
            "migrate into a new table instead",
            param="id",
        )

    def _check_target_column(self) -> None:
        kind = column_type(self.conn, self.schema, self.table, self.column)
        if kind is None:
            raise ConflictError(
                f"{self.uri}: the checkpoint says LEAD made this column, but it is gone; "
                f"delete its row from {CHECKPOINTS} to start again",
                param="target",
            )
        if kind != (self.vector_type, self.dim):
            shown = f"{kind[0]}({kind[1]})" if kind[1] > 0 else kind[0]
            raise ConflictError(
                f"{self.uri} is declared {shown} now, but this migration writes "
                f"{self.vector_type}({self.dim}); restore the column, or delete its row "
                f"from {CHECKPOINTS} and the column to start again",
                param="target",
            )

    def _partitioned(self) -> bool:
        if not self._bookkeeping(PARTITIONS):
            return False
        row = self.conn.execute(
            self._sql("SELECT 1 FROM {parts} WHERE target = %s LIMIT 1", parts=self.parts_table),
            (self.key,),
        ).fetchone()
        return row is not None

    @property
    def parts_table(self) -> Any:
        """The identifier of the partitions table (:data:`PARTITIONS`) beside the target."""
        return ident(self.schema, PARTITIONS)

    def bookkeeping_lock(self, cursor: Any) -> None:
        """Wait, inside the cursor's transaction, until no other run is creating LEAD's
        tables in the target's schema (``CREATE TABLE IF NOT EXISTS`` is not safe when
        run at once)."""
        lock_in_transaction(cursor, f"lead.migrate bookkeeping {self.schema}")

    @contextmanager
    def writing(self) -> Iterator[Any]:
        """A cursor of the target's connection inside a transaction; a target that
        :meth:`open` found new is created first, with its checkpoint, in that transaction.

        Raises
        ------
        ConflictError
            The table or column was created by someone else since :meth:`open`.
        """
        from psycopg.types.json import Jsonb

        with self.conn.transaction(), self.conn.cursor() as cursor:
            if self._pending is not None:
                self.bookkeeping_lock(cursor)
                cursor.execute(
                    self._sql(
                        "CREATE TABLE IF NOT EXISTS {ckpt} (target text PRIMARY KEY, spec jsonb"
                        " NOT NULL, position jsonb, rows_written bigint NOT NULL DEFAULT 0,"
                        " done boolean NOT NULL DEFAULT false, updated_at timestamptz DEFAULT"
                        " now())"
                    )
                )
                id_sql = "bigint" if self.id_kind == "int" else "text"
                type_sql = f"{self.vector_type}({int(self.dim)})"
                cursor.execute(
                    self._sql(
                        f"CREATE TABLE {{tbl}} ({{id}} {id_sql} PRIMARY KEY, {{col}} {type_sql})"
                    )
                    if self.new_table
                    else self._sql(f"ALTER TABLE {{tbl}} ADD COLUMN {{col}} {type_sql}")
                )
                if self.confidence_column is not None:
                    cursor.execute(
                        self._sql(
                            "ALTER TABLE {tbl} ADD COLUMN {conf} real",
                            conf=ident(self.confidence_column),
                        )
                    )
                cursor.execute(
                    self._sql("INSERT INTO {ckpt} (target, spec) VALUES (%s, %s)"),
                    (self.key, Jsonb(self._pending)),
                )
            yield cursor
        self._pending = None

    @store_errors
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
        InvalidInputError
            New-column mode: an id that is not a row of the table, or is more than one,
            naming it.
        """
        data = copy_rows(ids, vectors, VALUE[self.vector_type], self.id_kind == "int")
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
        match = f"t.{{id}}{cast} = s.id"
        cursor.execute(
            self._sql(f"UPDATE {{tbl}} t SET {{col}} = s.v FROM lead_stage s WHERE {match}")
        )
        if cursor.rowcount != len(ids):
            self._refuse_batch(cursor, match)
        cursor.execute("TRUNCATE lead_stage")  # the next batch of this transaction starts empty

    def _refuse_batch(self, cursor: Any, match: str) -> None:
        """Name a staged id that is no row of the table, or more than one."""
        missing = cursor.execute(
            self._sql(
                "SELECT s.id, count(*) OVER () FROM lead_stage s WHERE NOT EXISTS "
                f"(SELECT 1 FROM {{tbl}} t WHERE {match}) ORDER BY s.id LIMIT 1"
            )
        ).fetchone()
        if missing is not None:
            raise self._not_rows(missing[0], f"{int(missing[1])} such ids in this batch")
        (twice,) = cursor.execute(
            self._sql(
                f"SELECT s.id FROM lead_stage s JOIN {{tbl}} t ON {match} GROUP BY s.id "
                "HAVING count(*) > 1 ORDER BY s.id LIMIT 1"
            )
        ).fetchone()
        raise InvalidInputError(
            f"id {twice!r} is more than one row of {self.table}.{self.id_column}; a new "
            "column needs unique ids there",
            param="id",
        )

    def write_confidence(self, cursor: Any, ids: np.ndarray, confidence: np.ndarray) -> None:
        """Stage the rows' confidences and UPDATE them into :attr:`confidence_column`,
        inside the caller's transaction (after :meth:`write_rows` wrote the rows)."""
        id_sql = "bigint" if self.id_kind == "int" else "text"
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS lead_confidence (id {id_sql}, c real) "
            "ON COMMIT DELETE ROWS"
        )
        with cursor.copy("COPY lead_confidence (id, c) FROM STDIN") as copy:
            keys = ids.tolist()
            scores = np.asarray(confidence, dtype=np.float32).tolist()
            for key, value in zip(keys, scores, strict=True):
                copy.write_row((key, value))
        cast = "" if self.id_kind == "int" else "::text"
        cursor.execute(
            self._sql(
                f"UPDATE {{tbl}} t SET {{conf}} = s.c FROM lead_confidence s "
                f"WHERE t.{{id}}{cast} = s.id",
                conf=ident(self.confidence_column or ""),
            )
        )
        cursor.execute("TRUNCATE lead_confidence")

    @store_errors
    def write(
        self,
        ids: np.ndarray,
        vectors: np.ndarray,
        progress: Progress,
        confidence: np.ndarray | None = None,
    ) -> None:
        """COPY the rows (or stage and UPDATE them) and move the checkpoint, in one
        transaction (the first one also creates the target, see :meth:`open`); with
        :attr:`confidence_column`, the rows' ``confidence`` lands in the same transaction."""
        from psycopg.types.json import Jsonb

        if (confidence is None) != (self.confidence_column is None):
            raise InvalidInputError(
                f"{self.uri}: confidences go with --confidence-column, and only with it",
                param="confidence_column",
            )
        with self.writing() as cursor:
            self.write_rows(cursor, ids, vectors)
            if confidence is not None:
                self.write_confidence(cursor, ids, confidence)
            cursor.execute(
                self._sql(
                    "UPDATE {ckpt} SET position = %s, rows_written = %s, updated_at = now() "
                    "WHERE target = %s"
                ),
                (Jsonb(progress.position), progress.rows_written, self.key),
            )

    @store_errors
    def finish(self, progress: Progress) -> None:
        from psycopg.types.json import Jsonb

        with self.writing() as cursor:
            cursor.execute(
                self._sql(
                    "UPDATE {ckpt} SET done = true, position = %s, rows_written = %s, "
                    "updated_at = now() WHERE target = %s"
                ),
                (Jsonb(progress.position), progress.rows_written, self.key),
            )

    @store_errors
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

        kind = column_type(self.conn, self.schema, self.table, self.column)
        id_kind = column_type(self.conn, self.schema, self.table, self.id_column)
        if kind is None or id_kind is None or kind[0] not in VALUE:
            raise StoreNotFoundError(f"{self.uri}: no such vector column", param="column")
        int_ids = id_kind[0] in INT_IDS
        dim = kind[1]
        ident_sql = sql.SQL("{}::" + ("bigint" if int_ids else "text")).format(
            ident(self.id_column)
        )
        return fetch_copy(
            self.conn,
            ident(self.schema, self.table),
            ident(self.column),
            ident_sql,
            ids,
            self.key,
            int_ids,
            VALUE[kind[0]],
            dim,
        )

    def close(self) -> None:
        self.conn.close()
