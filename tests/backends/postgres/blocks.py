"""The keyword postings of a PostgreSQL collection read back out of their blocks, one tuple each."""

from __future__ import annotations

from typing import Any

import numpy as np

_TYPES = (">i8", ">i4", ">i4", ">i4", ">i4")


def posting_rows(connection: Any, collection_id: str) -> list[tuple[str, int, int, int, int, int]]:
    """(term, chunk_row, title_tf, content_tf, title_length, content_length) of every posting, sorted."""
    blocks = connection.execute(
        "SELECT term, chunk_rows, title_tf, content_tf, title_length, content_length FROM keyword_blocks "
        "WHERE collection_id = %s",
        (collection_id,),
    ).fetchall()
    rows: list[tuple[str, int, int, int, int, int]] = []
    for block in blocks:
        values = list(block.values()) if isinstance(block, dict) else list(block)
        columns = [np.frombuffer(bytes(values[1 + i]), dtype=kind) for i, kind in enumerate(_TYPES)]
        for n in range(len(columns[0])):
            row, title_tf, content_tf, title_length, content_length = (int(c[n]) for c in columns)
            rows.append((str(values[0]), row, title_tf, content_tf, title_length, content_length))
    return sorted(rows)


def block_layout(connection: Any, collection_id: str) -> dict[str, list[tuple[int, list[int]]]]:
    """Each term's blocks in order: (first_row, the chunk rows it holds)."""
    blocks = connection.execute(
        "SELECT term, first_row, chunk_rows FROM keyword_blocks WHERE collection_id = %s "
        "ORDER BY term, first_row",
        (collection_id,),
    ).fetchall()
    layout: dict[str, list[tuple[int, list[int]]]] = {}
    for block in blocks:
        values = list(block.values()) if isinstance(block, dict) else list(block)
        rows = np.frombuffer(bytes(values[2]), dtype=">i8").tolist()
        layout.setdefault(str(values[0]), []).append((int(values[1]), rows))
    return layout


def undo_packing(connection: Any) -> None:
    """Take the database back to before migration 13: a keyword_postings row per posting, no blocks."""
    connection.execute(
        """CREATE TABLE keyword_postings (
               collection_id TEXT NOT NULL, term TEXT NOT NULL,
               chunk_row BIGINT NOT NULL REFERENCES chunks(row_id) ON DELETE CASCADE,
               title_tf INTEGER NOT NULL, content_tf INTEGER NOT NULL,
               title_length INTEGER NOT NULL, content_length INTEGER NOT NULL,
               PRIMARY KEY (collection_id, term, chunk_row)
                   INCLUDE (title_tf, content_tf, title_length, content_length))"""
    )
    connection.execute("CREATE INDEX keyword_postings_by_chunk ON keyword_postings(chunk_row)")
    collections = [row[0] for row in connection.execute("SELECT DISTINCT collection_id FROM keyword_blocks")]
    with connection.cursor() as cursor:
        for collection_id in collections:
            cursor.executemany(
                "INSERT INTO keyword_postings VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(collection_id, *row) for row in posting_rows(connection, collection_id)],
            )
    connection.execute("DROP TABLE keyword_blocks")
    connection.execute("DELETE FROM schema_migrations WHERE version = 13")
