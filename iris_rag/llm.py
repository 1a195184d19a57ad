"""Technique-internal LLM calls (query rewrites, hypothetical documents), separate from answer generation.

A technique asks `TechniqueLLM.produce()` for a text and names a fallback that builds it without an LLM.
When LLM_PROVIDER=openai the configured OpenAI-compatible server (LLM_BASE_URL, LLM_MODEL, LLM_API_KEY,
LLM_TIMEOUT_S, LLM_MAX_RETRIES: the same settings as the answer generator) writes it and the source is
"llm"; otherwise, or when the call fails or returns nothing, the fallback runs and the source is the
fallback's name, with the failure kept in `error`. Retrieval never fails because a helper call did:
the response says which path ran.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iris_rag.cancellation import check_cancelled
from iris_rag.errors import GenerationFailedError
from iris_rag.redaction import redact
from iris_rag.settings import Settings

if TYPE_CHECKING:
    from openai import OpenAI

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Produced:
    """A text a technique needed, and which path made it: "llm" or the named fallback."""

    text: str
    source: str
    error: str | None = None

    def report(self) -> dict[str, Any]:
        """The fields a technique puts in technique_specific (error only when the LLM failed)."""
        return {"source": self.source, **({"llm_error": self.error} if self.error else {})}


def openai_client(settings: Settings) -> OpenAI:
    """The one OpenAI-compatible client every LLM user builds (answers, technique prompts, SQL, extraction).

    LLM_BASE_URL, LLM_API_KEY, LLM_TIMEOUT_S and LLM_MAX_RETRIES apply to every call alike.
    """
    return openai_compatible_client(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
    )


def openai_compatible_client(
    *, base_url: str | None, api_key: str | None, timeout_s: float, max_retries: int
) -> OpenAI:
    """An OpenAI-compatible client: the LLM's (above) or the embedding API's (EMBEDDING_BASE_URL...)."""
    from openai import OpenAI

    base, query = endpoint_url(base_url, with_key=bool(api_key)) if base_url else (None, {})
    return OpenAI(
        api_key=api_key or "not-set",
        base_url=base,
        default_query=query or None,
        timeout=timeout_s,
        max_retries=max_retries,
    )


def reply_text(completion: Any, *, max_tokens: int, remedy: str = "") -> str:
    """A chat completion's text, stripped; GenerationFailedError when it holds none (null, "" or blank).

    A reasoning model can spend all of max_tokens thinking and reply "" with finish_reason "length": the
    message says so, with the remedy the caller can apply (remedy: "; raise options.max_tokens", say).
    """
    choice = completion.choices[0] if completion.choices else None
    text = (choice.message.content or "").strip() if choice is not None else ""
    if text:
        return text
    msg = "the LLM returned no text"
    if choice is not None and choice.finish_reason == "length":
        msg += (
            f' (finish_reason "length": it spent all max_tokens ({max_tokens}) before writing any, as a '
            f"reasoning model does when it thinks that long{remedy})"
        )
    raise GenerationFailedError(msg)


def endpoint_url(base_url: str, *, with_key: bool) -> tuple[str, dict[str, str]]:
    """A base URL as a client joins paths to it, and the query parameters every request carries instead.

    The query comes off: the OpenAI client appends a path to the whole URL (/v1?k=v: /v1/?k=vchat/...).
    With a key, so does user:password@: httpx would send it as Basic auth in place of the key's Bearer.
    """
    import httpx

    url = httpx.URL(base_url)
    bare = url.copy_with(query=None, fragment=None, **({"userinfo": b""} if with_key else {}))
    return str(bare), dict(url.params.multi_items())


class TechniqueLLM:
    """The configured OpenAI-compatible server, for a technique's own prompts; absent without LLM_PROVIDER."""

    def __init__(self, settings: Settings) -> None:
        self.model_name: str | None = None
        self._client: Any = None
        self._secrets = settings.llm_secrets
        if settings.llm_provider == "openai":
            self.model_name = settings.llm_model
            self._client = openai_client(settings)

    @property
    def available(self) -> bool:
        """Whether an LLM is configured."""
        return self._client is not None

    def complete(self, system: str, user: str, *, max_tokens: int, temperature: float = 0.0) -> str:
        """One chat completion's text; raises on any failure or an empty reply."""
        if self._client is None:
            msg = "no LLM is configured (LLM_PROVIDER=none)"
            raise RuntimeError(msg)
        completion = self._client.chat.completions.create(
            model=self.model_name,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            temperature=temperature,
            max_tokens=max_tokens,
        )
        return reply_text(completion, max_tokens=max_tokens)

    def produce(
        self,
        system: str,
        user: str,
        *,
        max_tokens: int,
        fallback_name: str,
        fallback: Callable[[], str],
        clean: Callable[[str], str] = str.strip,
    ) -> Produced:
        """The LLM's text (cleaned) when one is configured and answers; otherwise the fallback's."""
        error: str | None = None
        check_cancelled()  # an LLM call can take seconds: not for a request that is already cancelled
        if self.available:
            try:
                text = clean(self.complete(system, user, max_tokens=max_tokens))
            except Exception as exc:
                error = redact(f"{type(exc).__name__}: {exc}", self._secrets)
                logger.warning("technique LLM call failed, using the %s fallback: %s", fallback_name, error)
            else:
                check_cancelled()
                if text:
                    return Produced(text, "llm")
                error = "the LLM's reply was empty after cleaning"
            check_cancelled()
        return Produced(fallback(), fallback_name, error)


def strip_label(text: str) -> str:
    """An LLM reply without a leading label ("Rewritten query:", "Passage:") or surrounding quotes."""
    text = text.strip()
    label, sep, rest = text.partition(":")
    words = label.lower().split()
    if sep and rest.strip() and 0 < len(words) <= 3 and words[-1] in _LABELS:
        text = rest.strip()
    return text.strip("\"'`\u201c\u201d ").strip()


def first_line(text: str) -> str:
    """The first non-empty line of an LLM reply, label and quotes removed (for one-line answers)."""
    for line in text.splitlines():
        cleaned = strip_label(" ".join(line.split()))
        if cleaned:
            return cleaned
    return ""


_LABELS = frozenset(
    {"query", "question", "rewrite", "rewritten", "reformulation", "passage", "document", "search"}
)
