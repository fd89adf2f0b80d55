"""Open a vector store by its URI: the registry of store kinds, by scheme.

Each kind is a class imported only when its scheme is used (so ``qdrant-client`` or
``psycopg`` are needed only for their stores); nothing here is resolved from text beyond
the scheme itself.
"""

from __future__ import annotations

from pathlib import Path

from lead.errors import InvalidInputError
from lead.migrate.stores import Source, Target, parse_store_uri

__all__ = ["open_source", "open_target"]


def open_source(uri: str) -> Source:
    """Open the store named by ``uri`` for reading (see the module docstring).

    Raises
    ------
    InvalidInputError
        A bad URI, or a store kind whose client library is not installed.
    StoreNotFoundError
        No such table, column, collection or file.
    StoreError
        The store cannot be reached or refuses the credentials.
    """
    parsed = parse_store_uri(uri)
    if parsed.scheme == "postgresql":
        from lead.migrate.pgvector import PgVectorSource

        return PgVectorSource(parsed)
    if parsed.scheme == "qdrant":
        from lead.migrate.qdrant import QdrantSource

        return QdrantSource(parsed)
    from lead.migrate.files import open_file_source

    return open_file_source(parsed)


def open_target(uri: str) -> Target:
    """The target named by ``uri`` (created by :meth:`Target.open`).

    Raises
    ------
    InvalidInputError
        A bad URI, or a store kind whose client library is not installed.
    StoreError
        The store cannot be reached or refuses the credentials.
    """
    parsed = parse_store_uri(uri)
    if parsed.scheme == "postgresql":
        from lead.migrate.pgvector import PgVectorTarget

        return PgVectorTarget(parsed)
    if parsed.scheme == "qdrant":
        from lead.migrate.qdrant_target import QdrantTarget

        return QdrantTarget(parsed)
    from lead.migrate.parquet_target import ParquetTarget

    path = Path(parsed.path)
    if path.suffix.lower() in (".npy", ".safetensors"):
        raise InvalidInputError(
            f"{path}: a file target is a Parquet folder; name it without .npy / "
            ".safetensors (read it back with pyarrow, or as the source of lead migrate)",
            param="target",
        )
    return ParquetTarget(path, parsed.params)
