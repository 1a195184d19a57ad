"""The error taxonomy: every failure a caller can see carries one of these codes."""

from __future__ import annotations

from typing import Any, ClassVar


class RagError(Exception):
    """Base of every expected failure; `code` travels to the client unchanged."""

    code: ClassVar[str] = "INTERNAL_ERROR"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        """Serialize as the wire's error object."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            error["details"] = self.details
        return error


class InvalidQueryError(RagError):
    """The query is empty, blank or too long."""

    code = "INVALID_QUERY"


class InvalidParametersError(RagError):
    """An argument other than the query is of the wrong type, out of range or unknown."""

    code = "INVALID_PARAMETERS"


class MissingRequiredFieldError(RagError):
    """A required argument (other than the query) is absent; details.missing names them."""

    code = "MISSING_REQUIRED_FIELD"


class PipelineNotFoundError(RagError):
    """No technique is registered under the requested name."""

    code = "PIPELINE_NOT_FOUND"


class CollectionNotFoundError(RagError):
    """The collection does not exist."""

    code = "COLLECTION_NOT_FOUND"


class DocumentNotFoundError(RagError):
    """The document does not exist in the collection."""

    code = "DOCUMENT_NOT_FOUND"


class EmbeddingMismatchError(RagError):
    """The collection was built with another embedding model than the one loaded."""

    code = "EMBEDDING_MISMATCH"


class RetrievalFailedError(RagError):
    """Retrieval itself failed (store or model error)."""

    code = "RETRIEVAL_FAILED"


class GenerationFailedError(RagError):
    """The generator failed; details.partial_result still holds the retrieved documents."""

    code = "GENERATION_FAILED"


class LlmServiceUnavailableError(GenerationFailedError):
    """The LLM server could not be reached (connection refused, DNS, time-out); a GENERATION_FAILED kind.

    details.partial_result still holds the retrieved documents, as for any generation failure.
    """

    code = "LLM_SERVICE_UNAVAILABLE"


class EmbeddingServiceUnavailableError(RagError):
    """No embeddings can be made: the local model failed to load, or the embedding API cannot be reached."""

    code = "EMBEDDING_SERVICE_UNAVAILABLE"


# The name the local model's code has always raised; the same error (the spec's code since issue 16).
ModelUnavailableError = EmbeddingServiceUnavailableError


class DatabaseConnectionFailedError(RagError):
    """The store cannot be opened, reached or written.

    The PostgreSQL server (at start or during a call), a malformed RAG_POSTGRES_URL, a store with a newer
    release's schema, or SQLite's file: its folder (RAG_DATA_DIR) or disk cannot be written (at start or
    during a call), it is damaged, or it was removed or replaced under the running server.
    """

    code = "DATABASE_CONNECTION_FAILED"


class MalformedRequestError(RagError):
    """A bridge line that is not a valid request envelope."""

    code = "MALFORMED_REQUEST"


class MethodNotFoundError(RagError):
    """A bridge request names a method the worker does not have."""

    code = "METHOD_NOT_FOUND"


class TimeoutExceededError(RagError):
    """The request ran past its time limit."""

    code = "TIMEOUT_EXCEEDED"


class IndexNotBuiltError(RagError):
    """The collection was ingested before a technique's index existed; `iris-rag reindex` builds it."""

    code = "INDEX_NOT_BUILT"


class SqlRejectedError(RagError):
    """A SQL statement failed the read-only guard or its execution limits; details.reason says why."""

    code = "SQL_REJECTED"


class ResultTooLargeError(RagError):
    """The answer is longer than one bridge line may be (MAX_ANSWER_BYTES): the caller should ask for less."""

    code = "RESULT_TOO_LARGE"


class RequestCancelledError(RagError):
    """The request was cancelled (by the client, or by the front end when it timed out) before it finished."""

    code = "REQUEST_CANCELLED"


class UnauthorizedError(RagError):
    """The call carries no valid API key (HTTP mode with RAG_AUTH_FILE)."""

    code = "UNAUTHORIZED"


class ForbiddenError(RagError):
    """The caller's key lacks the scope the tool needs, or may not write the collection it names."""

    code = "FORBIDDEN"
