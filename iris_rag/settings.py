"""Configuration: environment variables over one .env file, read once at start and passed down."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from dotenv import dotenv_values
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from iris_rag.redaction import url_userinfo, with_pieces

PACKAGED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def checkout_root() -> Path | None:
    """The repository root when this iris_rag is a source checkout's, None when it is an installed package."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def default_data_dir() -> Path:
    """RAG_DATA_DIR's default: the repository's ./data in a source checkout, else the user's data folder.

    In a checkout the front end runs the worker at the repository root, and the CLI takes the same folder
    from wherever it starts. An installed package's worker runs in site-packages, and an MCP host starts it
    from any directory, so there the data lives where XDG puts an application's: $XDG_DATA_HOME/iris-rag
    (~/.local/share/iris-rag).
    """
    root = checkout_root()
    if root is not None:
        return root / "data"
    base = os.environ.get("XDG_DATA_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".local" / "share") / "iris-rag"


def dotenv_file(start: Path | None = None) -> Path:
    """The .env file read under the environment: the repository root's, or for a package the start folder's.

    In a checkout the front end runs the worker at the repository root whatever folder its client starts it
    from, and the CLI reads the same file from any folder; an installed package has no such folder.
    """
    return (checkout_root() or start or Path.cwd()) / ".env"


def read_dotenv(path: Path) -> dict[str, str]:
    """The KEY=value lines of a .env file (none when it does not exist), taken literally.

    No ${VAR} expansion: the front end reads the same file so (mcp-server/src/config.ts parseDotenv).
    """
    if not path.exists():
        return {}
    try:
        with path.open(encoding="utf-8") as stream:
            values = dotenv_values(stream=stream, interpolate=False)
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"could not read {path}: {exc.strerror if isinstance(exc, OSError) else exc.reason}"
        raise SettingsError(msg) from None
    return {name: value for name, value in values.items() if value is not None}


def dotenv_under(environ: Mapping[str, str], dotenv: Mapping[str, str]) -> dict[str, str]:
    """The .env values the environment leaves to the file: those it has unset or empty.

    The environment wins; the file's own empty values are left out, as empty means the default.
    """
    return {
        name: value for name, value in dotenv.items() if value.strip() and not environ.get(name, "").strip()
    }


# The torch device types that compute (torch.device takes these and a few that do not: meta, lazy, ...).
TORCH_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hpu", "mtia", "xla", "ipu", "privateuseone")
TORCH_DEVICE = re.compile(rf"(?:{'|'.join(TORCH_DEVICE_TYPES)})(?::\d+)?")


class Settings(BaseSettings):
    """Every setting of the worker; see .env.template for the documented list."""

    # An empty variable means its default, as .env.template's empty values do.
    model_config = SettingsConfigDict(
        frozen=True, extra="ignore", populate_by_name=True, env_ignore_empty=True
    )

    # Store
    store: Literal["sqlite", "postgres", "iris"] = Field("sqlite", validation_alias="RAG_STORE")
    # A secret: its password never reaches a log or a reply (llm_secrets carries it to redaction).
    postgres_url: SecretStr | None = Field(None, validation_alias="RAG_POSTGRES_URL")
    # RAG_STORE=iris: InterSystems IRIS through intersystems-irispython (the iris extra).
    iris_host: str | None = Field(None, validation_alias="IRIS_HOST")
    iris_port: int = Field(1972, ge=1, le=65535, validation_alias="IRIS_PORT")
    iris_namespace: str = Field("USER", min_length=1, validation_alias="IRIS_NAMESPACE")
    iris_username: str = Field("_SYSTEM", validation_alias="IRIS_USERNAME")
    iris_password: SecretStr | None = Field(None, validation_alias="IRIS_PASSWORD")
    iris_connect_timeout_s: float = Field(10.0, gt=0, le=300, validation_alias="IRIS_CONNECT_TIMEOUT_S")
    data_dir: Path = Field(default_factory=default_data_dir, validation_alias="RAG_DATA_DIR")
    default_collection: str = Field("default", validation_alias="RAG_DEFAULT_COLLECTION")
    # SQLite's vector search: live chunks from which an unfiltered search goes through the in-memory inverted
    # file (0: always exact), and the share of its lists a query probes (more: better recall, slower).
    sqlite_ann_min_chunks: int = Field(20_000, ge=0, validation_alias="SQLITE_ANN_MIN_CHUNKS")
    sqlite_ann_probe_share: float = Field(0.1, gt=0, le=1, validation_alias="SQLITE_ANN_PROBE_SHARE")

    # Embeddings
    embedding_model: str = Field(
        PACKAGED_MODEL_NAME,
        validation_alias="EMBEDDING_MODEL",
        description="The packaged all-MiniLM-L6-v2, or a path to a local sentence-transformers model.",
    )
    embedding_batch_size: int = Field(64, ge=1, le=4096, validation_alias="EMBEDDING_BATCH_SIZE")
    embedding_device: str = Field("cpu", validation_alias="EMBEDDING_DEVICE")
    # An OpenAI-compatible /embeddings endpoint instead of the local model (EMBEDDING_MODEL names its model).
    embedding_provider: Literal["local", "openai"] = Field("local", validation_alias="EMBEDDING_PROVIDER")
    embedding_base_url: str | None = Field(None, validation_alias="EMBEDDING_BASE_URL")
    embedding_api_key: SecretStr | None = Field(None, validation_alias="EMBEDDING_API_KEY")
    embedding_dimensions: int | None = Field(None, ge=1, le=16_384, validation_alias="EMBEDDING_DIMENSIONS")
    embedding_timeout_s: float = Field(30.0, gt=0, validation_alias="EMBEDDING_TIMEOUT_S")
    embedding_max_retries: int = Field(2, ge=0, le=10, validation_alias="EMBEDDING_MAX_RETRIES")
    # auto: ONNX Runtime when the model was exported at install time (scripts/setup.sh), else torch.
    embedding_backend: Literal["auto", "onnx", "torch"] = Field("auto", validation_alias="EMBEDDING_BACKEND")
    embedding_onnx_dir_setting: str = Field("", validation_alias="EMBEDDING_ONNX_DIR")
    # auto finding no export: serve on torch and export in the background for the next start.
    embedding_onnx_export: bool = Field(True, validation_alias="EMBEDDING_ONNX_EXPORT")

    # NodeRAG's sentence vectors: embedded apart (title > headings + sentence), or pooled from the chunk's own
    # forward pass when rag_colbert is served (faster ingest; docs/benchmarks.md, issue 15).
    noderag_leaf_vectors: Literal["encoded", "pooled"] = Field(
        "encoded", validation_alias="NODERAG_LEAF_VECTORS"
    )
    # Technique indexes (ColBERT tokens, NodeRAG trees, the GraphRAG graph): built after the ingest commits
    # its core, by one background builder (iris_rag/ingestion/background.py), or inside the ingest as before.
    index_build: Literal["background", "inline"] = Field("background", validation_alias="INDEX_BUILD")

    # Chunking
    chunk_size: int = Field(1000, ge=100, le=20000, validation_alias="CHUNK_SIZE")
    chunk_overlap: int = Field(150, ge=0, le=5000, validation_alias="CHUNK_OVERLAP")
    max_document_chars: int = Field(5_000_000, ge=1, validation_alias="MAX_DOCUMENT_CHARS")

    # Files rag_ingest's paths may read: only under these folders (empty: none), this many bytes a call.
    ingest_roots: str = Field("", validation_alias="RAG_INGEST_ROOTS")
    ingest_max_bytes: int = Field(200_000_000, ge=1, validation_alias="RAG_INGEST_MAX_BYTES")

    # Generation
    llm_provider: Literal["none", "openai"] = Field("none", validation_alias="LLM_PROVIDER")
    llm_model: str = Field("gpt-4o-mini", validation_alias="LLM_MODEL")
    llm_api_key: SecretStr | None = Field(None, validation_alias="LLM_API_KEY")
    llm_base_url: str | None = Field(None, validation_alias="LLM_BASE_URL")
    llm_timeout_s: float = Field(30.0, gt=0, validation_alias="LLM_TIMEOUT_S")
    llm_max_retries: int = Field(2, ge=0, le=10, validation_alias="LLM_MAX_RETRIES")
    # The defaults of options.temperature and options.max_tokens when a call gives none.
    llm_temperature: float = Field(0.0, ge=0, le=2, validation_alias="LLM_TEMPERATURE")
    llm_max_tokens: int = Field(1024, ge=1, le=8192, validation_alias="LLM_MAX_TOKENS")
    # Characters of passages one prompt carries (about 12,000 tokens): passages past it are not sent, and
    # rag_sqlrag's rows are rendered up to it, so no call sends more than a model's context takes.
    llm_context_chars: int = Field(48_000, ge=1000, le=2_000_000, validation_alias="LLM_CONTEXT_CHARS")

    # Result cache: a technique call repeated on unchanged data is answered from memory.
    cache_enabled: bool = Field(False, validation_alias="CACHE_ENABLED")
    cache_ttl_s: float = Field(300.0, gt=0, validation_alias="CACHE_TTL_SECONDS")

    # Techniques
    techniques: str = Field(
        "all",
        validation_alias="RAG_TECHNIQUES",
        description="Comma-separated techniques to serve, or all; only these build ingest-time indexes.",
    )

    # SQLRAG: statements running at once; more wait (up to their time limit) for a free slot.
    sql_max_concurrent: int = Field(2, ge=1, le=64, validation_alias="SQL_MAX_CONCURRENT")

    # Worker
    worker_threads: int = Field(4, ge=1, le=64, validation_alias="WORKER_THREADS")
    # The front end's limit, read here too so the worker never admits more work than the front end allows.
    max_concurrent_requests: int = Field(8, ge=1, validation_alias="MAX_CONCURRENT_REQUESTS")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", validation_alias="LOG_LEVEL"
    )

    @field_validator("data_dir", mode="before")
    @classmethod
    def _empty_data_dir_is_the_default(cls, value: object) -> object:
        # RAG_DATA_DIR= (empty) means the default, as an empty setting does elsewhere; not the current folder.
        return default_data_dir() if isinstance(value, str) and not value.strip() else value

    @field_validator("data_dir")
    @classmethod
    def _relative_data_dir_is_the_checkouts(cls, value: Path) -> Path:
        # The worker runs at the repository root: the CLI, started anywhere, must open the same store.
        root = checkout_root()
        return root / value if root is not None and not value.is_absolute() else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level_in_any_case(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("embedding_device")
    @classmethod
    def _embedding_device_is_a_torch_device(cls, value: str) -> str:
        # torch refuses a bad one only when the model loads, and every call then failed without naming it.
        if not TORCH_DEVICE.fullmatch(value):
            msg = f"must be a torch device: {', '.join(TORCH_DEVICE_TYPES)}, each optionally :N (cuda:1)"
            raise ValueError(msg)
        return value

    @field_validator("default_collection")
    @classmethod
    def _default_collection_is_a_collection_id(cls, value: str) -> str:
        # Imported here: the store module brings NumPy, which the launcher's start does without.
        from iris_rag.stores.base import COLLECTION_ID

        # No ingest could create another id, so every call naming no collection would fail.
        if not COLLECTION_ID.match(value):
            msg = "must be a collection id: 1-64 letters, digits, '_', '.', '-', not starting with '.' or '-'"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _check_overlap(self) -> Settings:
        if self.chunk_overlap >= self.chunk_size:
            msg = f"CHUNK_OVERLAP ({self.chunk_overlap}) must be smaller than CHUNK_SIZE ({self.chunk_size})"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _check_store(self) -> Settings:
        if self.store == "postgres" and not (self.postgres_url and self.postgres_url.get_secret_value()):
            msg = "RAG_STORE=postgres needs RAG_POSTGRES_URL (postgresql://user:password@host:5432/database)"
            raise ValueError(msg)
        if self.store == "iris" and not (self.iris_host and self.iris_host.strip()):
            msg = (
                "RAG_STORE=iris needs IRIS_HOST (and IRIS_PORT, IRIS_NAMESPACE, IRIS_USERNAME, IRIS_PASSWORD)"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _check_embedding_provider(self) -> Settings:
        if self.embedding_provider == "openai" and self.embedding_model == PACKAGED_MODEL_NAME:
            msg = (
                "EMBEDDING_PROVIDER=openai needs EMBEDDING_MODEL set to the endpoint's model "
                "(e.g. text-embedding-3-small)"
            )
            raise ValueError(msg)
        return self

    @property
    def embedding_model_id(self) -> str:
        """The embedding model as collections record it (the mismatch guard and the vector cache key).

        The local model: EMBEDDING_MODEL. An embedding API: `openai:MODEL`, with `@DIMENSIONS` when
        EMBEDDING_DIMENSIONS shortens its vectors, so a collection never mixes vectors of another kind.
        """
        if self.embedding_provider == "local":
            return self.embedding_model
        size = f"@{self.embedding_dimensions}" if self.embedding_dimensions else ""
        return f"{self.embedding_provider}:{self.embedding_model}{size}"

    @cached_property
    def database_path(self) -> Path:
        """The embedded store's SQLite file."""
        return self.data_dir / "iris_rag.sqlite3"

    @property
    def embedding_onnx_dir(self) -> Path | None:
        """EMBEDDING_ONNX_DIR, or None (empty: the default beside the installed packages)."""
        return Path(self.embedding_onnx_dir_setting) if self.embedding_onnx_dir_setting.strip() else None

    @property
    def served_techniques(self) -> list[str] | None:
        """The techniques RAG_TECHNIQUES names, or None for all of them."""
        names = [name.strip() for name in self.techniques.split(",") if name.strip()]
        return None if not names or "all" in names else names

    @property
    def llm_secrets(self) -> list[str]:
        """Credentials to redact: the LLM's and embedding API's keys and URLs', the database passwords."""
        keys = (self.llm_api_key, self.embedding_api_key)
        secrets = [key.get_secret_value() for key in keys if key]
        for url in (self.llm_base_url, self.embedding_base_url):
            if not url:
                continue
            user, password = url_userinfo(url)
            secrets += [user] if user else []
            secrets += with_pieces(password)
            secrets += [
                value
                for name, value in parse_qsl(_query(url))
                if value
                and any(word in name.lower() for word in ("key", "token", "secret", "password", "auth"))
            ]
        if self.postgres_url:
            secrets += with_pieces(url_userinfo(self.postgres_url.get_secret_value())[1])
        if self.iris_password and self.iris_password.get_secret_value():
            secrets.append(self.iris_password.get_secret_value())
        return secrets

    @property
    def generator_name(self) -> str:
        """What model_info.llm_model reports."""
        return self.llm_model if self.llm_provider == "openai" else "extractive"


def _query(url: str) -> str:
    try:
        return urlsplit(url).query
    except ValueError:  # "Invalid IPv6 URL", say: a malformed URL's credentials are still looked for
        return ""


class SettingsError(ValueError):
    """Settings that are not valid, in one line naming each variable (never a value: one may be a key)."""


def load_settings() -> Settings:
    """The settings from the environment over .env; SettingsError, not pydantic's dump, when one is bad."""
    # The file's values go in by name where the environment has none (pydantic-settings' own env_file
    # would expand ${VAR}, which the front end does not); the environment source reads the rest.
    from_file: dict[str, Any] = {
        name.upper(): value for name, value in dotenv_under(os.environ, read_dotenv(dotenv_file())).items()
    }
    try:
        return Settings(**from_file)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}" if error["loc"] else error["msg"]
            for error in exc.errors(include_url=False, include_input=False, include_context=False)
        ]
        text = "; ".join(problem.replace("Value error, ", "") for problem in problems)
        msg = f"invalid configuration: {text} (see .env.template)"
        raise SettingsError(msg) from None
