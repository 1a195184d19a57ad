"""The PostgreSQL schema as numbered migration steps, applied once each, in order, under an advisory lock."""

from __future__ import annotations

import logging
from typing import Any

from psycopg import Connection
from psycopg.rows import tuple_row

from iris_rag.backends.postgres.keyword_blocks import BLOCK_POSTINGS, CREATE_TABLE_SQL, PACK_SQL
from iris_rag.errors import DatabaseConnectionFailedError

logger = logging.getLogger(__name__)

# Any fixed number: every process migrating this database takes the same transaction-level lock.
_ADVISORY_LOCK = 0x1815_5A6D
# Versions of change log kept per collection (step 14's trigger prunes older rows): a process further behind
# than this reloads its derived state whole.
CHANGE_LOG_VERSIONS = 10_000

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "documents, chunks with vectors, keyword postings, cache and call log",
        """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE collections (
    id              TEXT PRIMARY KEY,
    embedding_model TEXT NOT NULL,
    dimension       INTEGER NOT NULL,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE TABLE documents (
    row_id        BIGSERIAL UNIQUE,
    collection_id TEXT NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    id            TEXT NOT NULL,
    title         TEXT NOT NULL,
    content       TEXT NOT NULL,
    metadata      JSONB NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (collection_id, id)
);
CREATE TABLE chunks (
    row_id        BIGSERIAL PRIMARY KEY,
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    chunk_id      TEXT NOT NULL,
    chunk_index   INTEGER NOT NULL,
    content       TEXT NOT NULL,
    start_char    INTEGER NOT NULL,
    end_char      INTEGER NOT NULL,
    -- No dimension here: each collection has its own, and its own HNSW index over vector(dim).
    embedding     vector NOT NULL,
    title_length   INTEGER NOT NULL,
    content_length INTEGER NOT NULL,
    titled         BOOLEAN NOT NULL,
    UNIQUE (collection_id, chunk_id),
    FOREIGN KEY (collection_id, document_id) REFERENCES documents(collection_id, id) ON DELETE CASCADE
);
CREATE INDEX chunks_by_document ON chunks(collection_id, document_id);
-- The inverted index: each chunk's stemmed terms with their count in the title and in the content.
CREATE TABLE keyword_postings (
    collection_id TEXT NOT NULL,
    term          TEXT NOT NULL,
    chunk_row     BIGINT NOT NULL REFERENCES chunks(row_id) ON DELETE CASCADE,
    title_tf      INTEGER NOT NULL,
    content_tf    INTEGER NOT NULL,
    PRIMARY KEY (collection_id, term, chunk_row)
);
CREATE INDEX keyword_postings_by_chunk ON keyword_postings(chunk_row);
-- The collection's BM25 totals, kept in step by the writing transaction.
CREATE TABLE keyword_totals (
    collection_id  TEXT PRIMARY KEY,
    chunks         BIGINT NOT NULL,
    titled_chunks  BIGINT NOT NULL,
    title_tokens   BIGINT NOT NULL,
    content_tokens BIGINT NOT NULL
);
CREATE TABLE embedding_cache (
    model     TEXT NOT NULL,
    text_hash BYTEA NOT NULL,
    vector    BYTEA NOT NULL,
    PRIMARY KEY (model, text_hash)
);
CREATE TABLE calls (
    ts          DOUBLE PRECISION NOT NULL,
    tool        TEXT NOT NULL,
    technique   TEXT,
    duration_ms DOUBLE PRECISION NOT NULL,
    success     BOOLEAN NOT NULL,
    error_code  TEXT
);
CREATE INDEX calls_by_time ON calls(ts);
-- Versions never repeat, even for a collection deleted and created again: a table of its own.
CREATE TABLE collection_versions (
    collection_id TEXT PRIMARY KEY,
    version       BIGINT NOT NULL
);
CREATE FUNCTION bump_collection_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO collection_versions AS v
    VALUES (CASE WHEN TG_OP = 'DELETE' THEN OLD.collection_id ELSE NEW.collection_id END, 1)
    ON CONFLICT (collection_id) DO UPDATE SET version = v.version + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER documents_version AFTER INSERT OR UPDATE OR DELETE ON documents
    FOR EACH ROW EXECUTE FUNCTION bump_collection_version();
""",
    ),
    (
        2,
        "keyword postings carry their chunk's field lengths, covered by the primary key",
        # BM25 then reads a query's postings from the index alone (an index-only scan, no chunk lookups)
        # and scores them in the process: 4 ms for SciFact's median query instead of 32 in SQL.
        """
ALTER TABLE keyword_postings ADD COLUMN title_length INTEGER, ADD COLUMN content_length INTEGER;
UPDATE keyword_postings p SET title_length = k.title_length, content_length = k.content_length
    FROM chunks k WHERE k.row_id = p.chunk_row;
ALTER TABLE keyword_postings ALTER COLUMN title_length SET NOT NULL,
    ALTER COLUMN content_length SET NOT NULL;
ALTER TABLE keyword_postings DROP CONSTRAINT keyword_postings_pkey,
    ADD PRIMARY KEY (collection_id, term, chunk_row)
    INCLUDE (title_tf, content_tf, title_length, content_length);
""",
    ),
    (
        3,
        "each call record names its caller (HTTP mode)",
        "ALTER TABLE calls ADD COLUMN principal TEXT;",
    ),
    (
        4,
        "rag_colbert: token vectors per chunk, word-piece chunk frequencies",
        """
CREATE TABLE colbert_token_vectors (
    collection_id TEXT NOT NULL,
    chunk_id      TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    token_count   INTEGER NOT NULL,
    dimension     INTEGER NOT NULL,
    scale         DOUBLE PRECISION NOT NULL,
    token_ids     BYTEA NOT NULL,
    vectors       BYTEA NOT NULL,
    PRIMARY KEY (collection_id, chunk_id)
);
CREATE INDEX colbert_token_vectors_by_document ON colbert_token_vectors(collection_id, document_id);
CREATE TABLE colbert_token_df (
    collection_id TEXT NOT NULL,
    token_id      INTEGER NOT NULL,
    chunks        INTEGER NOT NULL,
    PRIMARY KEY (collection_id, token_id)
);
""",
    ),
    (
        5,
        "rag_noderag: each document's node tree, leaves with their vectors",
        """
CREATE TABLE node_tree_documents (
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    nodes         INTEGER NOT NULL,
    leaves        INTEGER NOT NULL,
    depth         INTEGER NOT NULL,
    PRIMARY KEY (collection_id, document_id)
);
CREATE TABLE node_tree_nodes (
    row_id          BIGSERIAL,  -- insertion order: leaves() returns the leaves as written
    collection_id   TEXT NOT NULL,
    document_id     TEXT NOT NULL,
    node_id         INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    level           INTEGER NOT NULL,
    heading_level   INTEGER NOT NULL,
    label           TEXT NOT NULL,
    parent_id       INTEGER,
    children        INTEGER[] NOT NULL,
    prev_id         INTEGER,
    next_id         INTEGER,
    position        INTEGER NOT NULL,
    start_char      INTEGER NOT NULL,
    end_char        INTEGER NOT NULL,
    key_sentence_id INTEGER,
    code            BOOLEAN NOT NULL,
    embedding       BYTEA,
    PRIMARY KEY (collection_id, document_id, node_id)
);
CREATE INDEX node_tree_nodes_in_order ON node_tree_nodes(collection_id, row_id);
""",
    ),
    (
        6,
        "rag_graphrag: entities, aliases, mentions, weighted relations with evidence, covered documents",
        """
CREATE TABLE kg_collections (
    collection_id TEXT PRIMARY KEY,
    extractor     TEXT NOT NULL,
    llm_model     TEXT,
    version       BIGINT NOT NULL DEFAULT 0,
    updated_at    TEXT NOT NULL
);
CREATE TABLE kg_documents (
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    extractor     TEXT NOT NULL,
    entities      INTEGER NOT NULL,
    relations     INTEGER NOT NULL,
    note          TEXT,
    PRIMARY KEY (collection_id, document_id)
);
CREATE TABLE kg_entities (
    id             BIGSERIAL PRIMARY KEY,
    collection_id  TEXT NOT NULL,
    key            TEXT NOT NULL,
    name           TEXT NOT NULL,
    type           TEXT NOT NULL,
    mention_count  INTEGER NOT NULL DEFAULT 0,
    document_count INTEGER NOT NULL DEFAULT 0,
    embedding      BYTEA,
    UNIQUE (collection_id, key)
);
CREATE TABLE kg_aliases (
    collection_id TEXT NOT NULL,
    alias         TEXT NOT NULL,
    entity_id     BIGINT NOT NULL,
    document_id   TEXT NOT NULL,
    surface       TEXT NOT NULL
);
CREATE INDEX kg_aliases_by_alias ON kg_aliases(collection_id, alias);
CREATE INDEX kg_aliases_by_document ON kg_aliases(collection_id, document_id);
CREATE INDEX kg_aliases_by_entity ON kg_aliases(entity_id);
CREATE TABLE kg_mentions (
    collection_id TEXT NOT NULL,
    entity_id     BIGINT NOT NULL,
    document_id   TEXT NOT NULL,
    chunk_id      TEXT NOT NULL,
    field         TEXT NOT NULL,
    start_char    INTEGER NOT NULL,
    end_char      INTEGER NOT NULL
);
CREATE INDEX kg_mentions_by_entity ON kg_mentions(entity_id);
CREATE INDEX kg_mentions_by_document ON kg_mentions(collection_id, document_id);
CREATE TABLE kg_relations (
    id            BIGSERIAL PRIMARY KEY,
    collection_id TEXT NOT NULL,
    source_id     BIGINT NOT NULL,
    target_id     BIGINT NOT NULL,
    type          TEXT NOT NULL,
    weight        INTEGER NOT NULL,
    UNIQUE (collection_id, source_id, target_id, type)
);
CREATE INDEX kg_relations_by_source ON kg_relations(source_id);
CREATE INDEX kg_relations_by_target ON kg_relations(target_id);
CREATE TABLE kg_evidence (
    relation_id   BIGINT NOT NULL,
    collection_id TEXT NOT NULL,
    document_id   TEXT NOT NULL,
    chunk_id      TEXT NOT NULL,
    count         INTEGER NOT NULL,
    field         TEXT NOT NULL,
    start_char    INTEGER NOT NULL,
    end_char      INTEGER NOT NULL
);
CREATE INDEX kg_evidence_by_relation ON kg_evidence(relation_id);
CREATE INDEX kg_evidence_by_document ON kg_evidence(collection_id, document_id);
""",
    ),
    (
        7,
        "rag_sqlrag: the registry of structured tables and documents views, and their schema",
        """
CREATE SCHEMA sqlrag;
CREATE TABLE structured_tables (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    source_name   TEXT NOT NULL,
    collection_id TEXT,
    columns       JSONB NOT NULL,
    row_count     BIGINT NOT NULL,
    source        TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL
);
""",
    ),
    (
        8,
        "collections: a description a user sets (rag_update_collection)",
        "ALTER TABLE collections ADD COLUMN description TEXT NOT NULL DEFAULT '';",
    ),
    (
        9,
        "each call record keeps the caller's request_id and session_id",
        "ALTER TABLE calls ADD COLUMN request_id TEXT, ADD COLUMN session_id TEXT;",
    ),
    (
        10,
        "the data version moves once per statement and collection, not once per document row",
        # A bulk load (COPY of many documents in one transaction) fired the row trigger once per document,
        # each update of the same version row walking the transaction's growing chain of its versions:
        # quadratic. Statement triggers over the changed rows bump each collection once per statement.
        """
DROP TRIGGER documents_version ON documents;
DROP FUNCTION bump_collection_version();
CREATE FUNCTION bump_collection_versions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO collection_versions AS v
    SELECT DISTINCT collection_id, 1 FROM changed_rows
    ON CONFLICT (collection_id) DO UPDATE SET version = v.version + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER documents_inserted AFTER INSERT ON documents REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bump_collection_versions();
CREATE TRIGGER documents_updated AFTER UPDATE ON documents REFERENCING NEW TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bump_collection_versions();
CREATE TRIGGER documents_deleted AFTER DELETE ON documents REFERENCING OLD TABLE AS changed_rows
    FOR EACH STATEMENT EXECUTE FUNCTION bump_collection_versions();
""",
    ),
    (
        11,
        "keyword terms: each term's chunk counts, kept in step by every write",
        # The keyword leg's IDF without counting a frequent term's postings (a million rows at 1M chunks),
        # and its bound on what those postings can add (MaxScore skips them where it cannot matter).
        """
CREATE TABLE keyword_terms (
    collection_id  TEXT NOT NULL,
    term           TEXT NOT NULL,
    chunks         BIGINT NOT NULL,
    title_chunks   BIGINT NOT NULL,
    content_chunks BIGINT NOT NULL,
    PRIMARY KEY (collection_id, term)
);
INSERT INTO keyword_terms
    SELECT collection_id, term, COUNT(*), COUNT(*) FILTER (WHERE title_tf > 0),
           COUNT(*) FILTER (WHERE content_tf > 0)
    FROM keyword_postings GROUP BY collection_id, term;
""",
    ),
    (
        12,
        "keyword totals count the collection's documents too, kept in step by every write",
        # get_collection counted a collection's documents on every request: 10-160 ms at 50,000.
        """
ALTER TABLE keyword_totals ADD COLUMN documents BIGINT NOT NULL DEFAULT 0;
UPDATE keyword_totals t
    SET documents = (SELECT COUNT(*) FROM documents d WHERE d.collection_id = t.collection_id);
""",
    ),
    (
        13,
        "keyword postings packed per term in blocks of chunk rows",
        # A row per (term, chunk) took 13.6 KB of disk a chunk with its indexes and about a microsecond a
        # posting to read: a frequent term's tens of thousands of postings were the keyword leg's tail.
        f"""
{CREATE_TABLE_SQL};
{PACK_SQL.format(source="keyword_postings", block=BLOCK_POSTINGS)};
DROP TABLE keyword_postings;
""",
    ),
    (
        14,
        "each data version logs the documents it changed",
        # A process holding a collection's derived state of version v (NodeRAG's leaf matrix, GraphRAG's
        # entity table) reads only the documents changed after v instead of the whole collection. Every
        # version from here on has its rows, so a gap (a version moved before this step, or pruned: the
        # last CHANGE_LOG_VERSIONS are kept) tells the reader to reload.
        f"""
CREATE TABLE collection_changes (
    collection_id TEXT NOT NULL,
    version       BIGINT NOT NULL,
    document_id   TEXT NOT NULL,
    PRIMARY KEY (collection_id, version, document_id)
);
CREATE OR REPLACE FUNCTION bump_collection_versions() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bumped RECORD;
BEGIN
    FOR bumped IN
        INSERT INTO collection_versions AS v
        SELECT DISTINCT collection_id, 1 FROM changed_rows
        ON CONFLICT (collection_id) DO UPDATE SET version = v.version + 1
        RETURNING v.collection_id, v.version
    LOOP
        INSERT INTO collection_changes
        SELECT DISTINCT bumped.collection_id, bumped.version, c.id FROM changed_rows c
        WHERE c.collection_id = bumped.collection_id;
        -- Pruned every 1,000 versions, by the primary key's range: a write pays nothing for it.
        IF bumped.version % 1000 = 0 THEN
            DELETE FROM collection_changes
            WHERE collection_id = bumped.collection_id AND version <= bumped.version - {CHANGE_LOG_VERSIONS};
        END IF;
    END LOOP;
    RETURN NULL;
END $$;
""",
    ),
    (
        15,
        "rag_sqlrag: documents views registered under names past 63 bytes are dropped, to be rebuilt apart",
        # PostgreSQL cut such names to their first 63 bytes, so collection ids sharing them (also one whose
        # name was those 63 bytes) had one view between them, reading one collection's documents for all.
        # Views hold no data: the first query of each collection builds its view again under a name that
        # fits (ensure_view). The names are ASCII (documents_ and the id's letters, digits and '_').
        """
DO $$
DECLARE
    cut RECORD;
BEGIN
    FOR cut IN
        SELECT name, left(name, 63) AS kept FROM structured_tables
        WHERE kind = 'documents_view' AND octet_length(name) > 63
    LOOP
        EXECUTE format('DROP VIEW IF EXISTS sqlrag.%I', cut.kept);
        DELETE FROM structured_tables WHERE kind = 'documents_view' AND name IN (cut.name, cut.kept);
    END LOOP;
END $$;
""",
    ),
    (
        16,
        "each cached embedding names the document it was made for, deleted with it",
        # The cache grew without end: a deleted document's vectors stayed. Rows cached before have no owner
        # (NULL) and stay.
        """
ALTER TABLE embedding_cache
    ADD COLUMN collection_id TEXT, ADD COLUMN document_id TEXT, ADD COLUMN source_hash BYTEA;
CREATE INDEX embedding_cache_by_document ON embedding_cache (collection_id, document_id);
""",
    ),
]


def migrate(connection: Connection[Any]) -> list[int]:
    """Apply the steps this database lacks, all in one transaction; the numbers applied.

    The advisory lock makes two processes starting together take turns: the second then finds the
    steps recorded and applies nothing. A database a newer release migrated further is refused, unchanged
    (DATABASE_CONNECTION_FAILED).
    """
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_LOCK,))
        connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        with connection.cursor(row_factory=tuple_row) as cursor:
            done = {row[0] for row in cursor.execute("SELECT version FROM schema_migrations")}
        known = MIGRATIONS[-1][0]
        if done and max(done) > known:
            msg = (
                f"the PostgreSQL store has schema version {max(done)}, written by a newer iris-rag (this "
                f"release reads up to {known}): upgrade iris-rag; the store was left as it is"
            )
            raise DatabaseConnectionFailedError(msg)
        missing = [version for version, _, _ in MIGRATIONS if version not in done]
        if done and missing:
            # Said before the work: the server answers nothing until the steps are committed.
            logger.warning("upgrading the PostgreSQL store to schema %d (migrations %s)", known, missing)
        applied: list[int] = []
        for version, description, statements in MIGRATIONS:
            if version in done:
                continue
            connection.execute(statements.encode())
            connection.execute(
                "INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                (version, description),
            )
            applied.append(version)
            logger.info("applied schema migration %d: %s", version, description)
    return applied
