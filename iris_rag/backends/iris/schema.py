"""The IRIS schema (schema IrisRag) as numbered migration steps, and the per-dimension vector tables.

Written from InterSystems' IRIS SQL reference (VECTOR, TO_VECTOR, VECTOR_COSINE, CREATE INDEX ... AS HNSW)
and the working schema of intersystems-community/iris-vector-rag; not yet run against a live IRIS server
(README, "Stores"). Column names carry a prefix where a plain one (title, content, key, type, level...)
might be an IRIS SQL reserved word. Every statement is a constant or built only from integers and the
identifiers below: values always travel as `?` parameters.

Steps 1 to 5 are kept as they ran: their string columns took IRIS's default collation, SQLUPPER, under which
`=`, IN, keys, GROUP BY and DISTINCT ignore case and trailing spaces ('README.md' and 'readme.md' one
document). Step 6 sets EXACT on every column an id, a term or a name lives in (GSQL_collation_tabledef and
RSQL_altertable: ALTER TABLE ... ALTER COLUMN ... COLLATE, after which the table's indexes must be built
again); tables made later declare it.
"""

from __future__ import annotations

SCHEMA = "IrisRag"

# A vector table per embedding dimension: an IRIS VECTOR column and its HNSW index have one fixed length.
MAX_DIMENSION = 8192


def vector_table(dimension: int) -> str:
    """The table holding the chunk vectors of every collection of this dimension."""
    dimension = int(dimension)
    if not 0 < dimension <= MAX_DIMENSION:
        msg = f"an IRIS vector table needs a dimension in 1..{MAX_DIMENSION}, got {dimension}"
        raise ValueError(msg)
    return f"{SCHEMA}.Vectors{dimension}"


# Each table's columns compared as written (COLLATE EXACT): ids, terms, model and tool names.
EXACT_COLUMNS: dict[str, tuple[str, ...]] = {
    "Collections": ("id", "embedding_model"),
    "Documents": ("collection_id", "doc_id"),
    "Chunks": ("collection_id", "chunk_id", "document_id"),
    "Postings": ("collection_id", "term"),
    "Versions": ("collection_id",),
    "EmbeddingCache": ("model_name", "collection_id", "document_id"),
    "Calls": ("tool", "technique", "error_code", "principal"),
    "ColbertTokens": ("collection_id", "chunk_id", "document_id"),
    "ColbertFrequencies": ("collection_id",),
    "NodeTreeDocuments": ("collection_id", "document_id"),
    "NodeTreeNodes": ("collection_id", "document_id", "node_kind"),
    "Changes": ("collection_id", "document_id"),
}
VECTOR_EXACT_COLUMNS = ("collection_id", "chunk_id", "document_id")
EXACT_COLLATION_STEP = 6


def collection_spelling(table: str) -> str:
    """Each row's collection_id as its collection's own row spells it (run while both are still SQLUPPER).

    Under SQLUPPER a write to 'notes' reached the collection 'Notes'; under EXACT the two would part.
    """
    return (
        f"UPDATE {table} SET collection_id = (SELECT c.id FROM {SCHEMA}.Collections c "
        f"WHERE c.id = {table}.collection_id) WHERE collection_id IN (SELECT id FROM {SCHEMA}.Collections)"
    )


def exact_collation(table: str, columns: tuple[str, ...]) -> list[str]:
    """Set EXACT on a table's columns, then build its indexes again (their subscripts were upper-cased)."""
    altered = [f"ALTER TABLE {table} ALTER COLUMN {column} COLLATE EXACT" for column in columns]
    return [*altered, f"BUILD INDEX FOR TABLE {table}"]


def vector_table_ddl(dimension: int) -> list[str]:
    """The vector table of a dimension with its HNSW index (cosine), as IRIS SQL."""
    table = vector_table(dimension)
    return [
        f"""CREATE TABLE {table} (
    collection_id VARCHAR(512) COLLATE EXACT NOT NULL,
    chunk_row     BIGINT NOT NULL,
    chunk_id      VARCHAR(1200) COLLATE EXACT NOT NULL,
    document_id   VARCHAR(1024) COLLATE EXACT NOT NULL,
    raw_vector    VARBINARY({4 * int(dimension)}) NOT NULL,
    embedding     VECTOR(FLOAT, {int(dimension)}) NOT NULL,
    PRIMARY KEY (collection_id, chunk_row)
)""",
        f"CREATE INDEX VecChunkIdx{int(dimension)} ON {table} (collection_id, chunk_id)",
        f"CREATE INDEX HnswCosine{int(dimension)} ON {table} (embedding) AS HNSW(Distance='Cosine')",
    ]


# (version, description, statements): applied once each, in order, recorded in IrisRag.Migrations.
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (
        1,
        "collections, documents, chunks, keyword postings, versions, embedding cache and call log",
        [
            f"""CREATE TABLE {SCHEMA}.Collections (
    id              VARCHAR(512) NOT NULL PRIMARY KEY,
    embedding_model VARCHAR(1024) NOT NULL,
    dimension       INTEGER NOT NULL,
    description     VARCHAR(4000) NOT NULL,
    created_at      VARCHAR(40) NOT NULL,
    updated_at      VARCHAR(40) NOT NULL,
    next_row        BIGINT NOT NULL,
    chunk_total     BIGINT NOT NULL,
    titled_chunks   BIGINT NOT NULL,
    title_tokens    BIGINT NOT NULL,
    content_tokens  BIGINT NOT NULL
)""",
            f"""CREATE TABLE {SCHEMA}.Documents (
    collection_id VARCHAR(512) NOT NULL,
    doc_id        VARCHAR(1024) NOT NULL,
    doc_order     BIGINT NOT NULL,
    doc_title     VARCHAR(32000) NOT NULL,
    doc_content   LONGVARCHAR NOT NULL,
    doc_chars     BIGINT NOT NULL,
    chunk_total   INTEGER NOT NULL,
    meta_json     LONGVARCHAR NOT NULL,
    created_at    VARCHAR(40) NOT NULL,
    updated_at    VARCHAR(40) NOT NULL,
    PRIMARY KEY (collection_id, doc_id)
)""",
            f"CREATE INDEX DocOrderIdx ON {SCHEMA}.Documents (collection_id, doc_order)",
            f"""CREATE TABLE {SCHEMA}.Chunks (
    collection_id  VARCHAR(512) NOT NULL,
    chunk_row      BIGINT NOT NULL,
    chunk_id       VARCHAR(1200) NOT NULL,
    document_id    VARCHAR(1024) NOT NULL,
    chunk_index    INTEGER NOT NULL,
    chunk_text     VARCHAR(100000) NOT NULL,
    start_char     BIGINT NOT NULL,
    end_char       BIGINT NOT NULL,
    title_length   INTEGER NOT NULL,
    content_length INTEGER NOT NULL,
    titled         INTEGER NOT NULL,
    PRIMARY KEY (collection_id, chunk_row)
)""",
            f"CREATE UNIQUE INDEX ChunkIdIdx ON {SCHEMA}.Chunks (collection_id, chunk_id)",
            f"CREATE INDEX ChunkDocIdx ON {SCHEMA}.Chunks (collection_id, document_id)",
            # The inverted index: each chunk's stemmed terms with their counts and the chunk's field lengths.
            f"""CREATE TABLE {SCHEMA}.Postings (
    collection_id  VARCHAR(512) NOT NULL,
    term           VARCHAR(512) NOT NULL,
    chunk_row      BIGINT NOT NULL,
    title_tf       INTEGER NOT NULL,
    content_tf     INTEGER NOT NULL,
    title_length   INTEGER NOT NULL,
    content_length INTEGER NOT NULL,
    PRIMARY KEY (collection_id, term, chunk_row)
)""",
            f"CREATE INDEX PostingChunkIdx ON {SCHEMA}.Postings (collection_id, chunk_row)",
            # Versions never repeat, even for a collection deleted and created again: a table of its own.
            f"""CREATE TABLE {SCHEMA}.Versions (
    collection_id VARCHAR(512) NOT NULL PRIMARY KEY,
    data_version  BIGINT NOT NULL
)""",
            f"""CREATE TABLE {SCHEMA}.EmbeddingCache (
    model_name VARCHAR(1024) NOT NULL,
    text_hash  VARBINARY(64) NOT NULL,
    raw_vector VARBINARY(32768) NOT NULL,
    PRIMARY KEY (model_name, text_hash)
)""",
            f"""CREATE TABLE {SCHEMA}.Calls (
    ts          DOUBLE NOT NULL,
    tool        VARCHAR(200) NOT NULL,
    technique   VARCHAR(200),
    duration_ms DOUBLE NOT NULL,
    success     INTEGER NOT NULL,
    error_code  VARCHAR(200),
    principal   VARCHAR(512)
)""",
            f"CREATE INDEX CallTimeIdx ON {SCHEMA}.Calls (ts)",
        ],
    ),
]

MIGRATIONS.append(
    (
        2,
        "rag_colbert: each chunk's word-piece ids and int8 token codes, and word-piece chunk counts",
        [
            f"""CREATE TABLE {SCHEMA}.ColbertTokens (
    collection_id VARCHAR(512) NOT NULL,
    chunk_id      VARCHAR(1200) NOT NULL,
    document_id   VARCHAR(1024) NOT NULL,
    token_count   INTEGER NOT NULL,
    dimension     INTEGER NOT NULL,
    scale         DOUBLE NOT NULL,
    token_ids     VARBINARY(65536) NOT NULL,
    codes         VARBINARY(1048576) NOT NULL,
    PRIMARY KEY (collection_id, chunk_id)
)""",
            f"CREATE INDEX ColbertDocIdx ON {SCHEMA}.ColbertTokens (collection_id, document_id)",
            f"""CREATE TABLE {SCHEMA}.ColbertFrequencies (
    collection_id VARCHAR(512) NOT NULL,
    token_id      INTEGER NOT NULL,
    chunks        INTEGER NOT NULL,
    PRIMARY KEY (collection_id, token_id)
)""",
        ],
    )
)

MIGRATIONS.append(
    (
        3,
        "rag_noderag: each document's node tree, leaves with their vectors",
        [
            f"""CREATE TABLE {SCHEMA}.NodeTreeDocuments (
    collection_id VARCHAR(512) NOT NULL,
    document_id   VARCHAR(1024) NOT NULL,
    node_total    INTEGER NOT NULL,
    leaf_total    INTEGER NOT NULL,
    tree_depth    INTEGER NOT NULL,
    PRIMARY KEY (collection_id, document_id)
)""",
            # The columns of NODE_COLUMNS in their order, prefixed where a plain name may be reserved.
            f"""CREATE TABLE {SCHEMA}.NodeTreeNodes (
    collection_id   VARCHAR(512) NOT NULL,
    document_id     VARCHAR(1024) NOT NULL,
    write_order     BIGINT NOT NULL,
    node_id         INTEGER NOT NULL,
    node_kind       VARCHAR(20) NOT NULL,
    node_level      INTEGER NOT NULL,
    heading_level   INTEGER NOT NULL,
    node_label      VARCHAR(32000) NOT NULL,
    parent_id       INTEGER,
    children_json   VARCHAR(3000000) NOT NULL,
    prev_id         INTEGER,
    next_id         INTEGER,
    node_position   INTEGER NOT NULL,
    start_char      INTEGER NOT NULL,
    end_char        INTEGER NOT NULL,
    key_sentence_id INTEGER,
    is_code         INTEGER NOT NULL,
    raw_vector      VARBINARY(32768),
    PRIMARY KEY (collection_id, document_id, node_id)
)""",
            f"CREATE INDEX NodeOrderIdx ON {SCHEMA}.NodeTreeNodes (collection_id, write_order)",
        ],
    )
)

MIGRATIONS.append(
    (
        4,
        "each data version logs the documents it changed",
        # As SQLite's collection_changes and PostgreSQL's migration 14: a process holding derived state of
        # version v (NodeRAG's leaf matrix) reads only the documents changed since. Versions moved before
        # this step have no rows: a reader sees the gap and loads whole.
        [
            f"""CREATE TABLE {SCHEMA}.Changes (
    collection_id VARCHAR(512) NOT NULL,
    data_version  BIGINT NOT NULL,
    document_id   VARCHAR(1024) NOT NULL,
    PRIMARY KEY (collection_id, data_version, document_id)
)""",
        ],
    )
)

MIGRATIONS.append(
    (
        5,
        "each cached embedding names the document it was made for, deleted with it",
        # As SQLite's version 10 and PostgreSQL's migration 16: rows cached before have no owner and stay.
        [
            f"ALTER TABLE {SCHEMA}.EmbeddingCache ADD collection_id VARCHAR(512)",
            f"ALTER TABLE {SCHEMA}.EmbeddingCache ADD document_id VARCHAR(1024)",
            f"ALTER TABLE {SCHEMA}.EmbeddingCache ADD source_hash VARBINARY(64)",
            f"CREATE INDEX EmbeddingCacheDocIdx ON {SCHEMA}.EmbeddingCache (collection_id, document_id)",
        ],
    )
)

MIGRATIONS.append(
    (
        EXACT_COLLATION_STEP,
        "ids, terms and names compared as written (COLLATE EXACT), not upper-cased",
        # The vector tables of every dimension too: the store adds their statements (they vary by store).
        [
            *(
                collection_spelling(f"{SCHEMA}.{t}")
                for t, columns in EXACT_COLUMNS.items()
                if "collection_id" in columns
            ),
            *(s for t, columns in EXACT_COLUMNS.items() for s in exact_collation(f"{SCHEMA}.{t}", columns)),
        ],
    )
)

MIGRATIONS.append(
    (
        7,
        "each call record keeps the caller's request_id and session_id",
        # As SQLite's version 7 and PostgreSQL's calls: ids of at most 128 characters (common.json), compared
        # as written; older records have none.
        [
            f"ALTER TABLE {SCHEMA}.Calls ADD request_id VARCHAR(512) COLLATE EXACT",
            f"ALTER TABLE {SCHEMA}.Calls ADD session_id VARCHAR(512) COLLATE EXACT",
        ],
    )
)

MIGRATIONS_TABLE_DDL = f"""CREATE TABLE {SCHEMA}.Migrations (
    step        INTEGER NOT NULL PRIMARY KEY,
    description VARCHAR(1000) NOT NULL,
    applied_at  VARCHAR(40) NOT NULL
)"""
