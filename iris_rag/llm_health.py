"""The LLM's health: a cheap GET of the server's /models, cached briefly so rag_health_check stays fast.

A server with no /models (404, 405, 501) may be an LLM server that lacks it, or no LLM server at all (a
base URL missing /v1, another web server): a one-token chat completion, asked through the answers' client
(TechniqueLLM.probe), tells which; only a chat completion in reply is healthy, not any 2xx page.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from iris_rag.errors import LlmServiceUnavailableError
from iris_rag.llm import TechniqueLLM, endpoint_url
from iris_rag.redaction import redact
from iris_rag.settings import Settings

OPENAI_BASE_URL = "https://api.openai.com/v1"
# One probe per this many seconds, whatever the number of health checks.
PROBE_CACHE_S = 30.0
# Long enough for a reachable server on a busy machine, short enough to keep health answering fast.
PROBE_TIMEOUT_S = 2.0
# Servers that answer but have no /models endpoint: asked for a one-token chat completion instead.
_NO_MODELS_ENDPOINT = frozenset({404, 405, 501})


@dataclass(frozen=True, slots=True)
class LlmStatus:
    """One probe's verdict: healthy, degraded (answers with an error) or unhealthy (unreachable)."""

    status: str
    error: str | None
    details: dict[str, Any]
    checked_at: float


class LlmProbe:
    """Probes the configured OpenAI-compatible server; no probe when LLM_PROVIDER is none."""

    def __init__(self, settings: Settings, cache_s: float = PROBE_CACHE_S) -> None:
        self.settings = settings
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._last: LlmStatus | None = None

    def check(self) -> LlmStatus:
        """The cached verdict if recent, else a new probe (one at a time)."""
        with self._lock:
            last = self._last
            if last is None or time.monotonic() - last.checked_at >= self.cache_s:
                last = self._last = self._probe()
            return last

    def _probe(self) -> LlmStatus:
        settings = self.settings
        secrets = settings.llm_secrets
        base_url = settings.llm_base_url or OPENAI_BASE_URL
        info: dict[str, Any] = {
            "provider": settings.llm_provider,
            "model": settings.generator_name,
        }
        now = time.monotonic()
        if settings.llm_provider != "openai":
            return LlmStatus("healthy", None, {**info, "probed": False}, now)
        info |= {"base_url": redact(base_url, secrets), "probed": True}
        api_key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else ""
        base, query = endpoint_url(base_url, with_key=bool(api_key))  # as the answers' client sends it
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = min(PROBE_TIMEOUT_S, settings.llm_timeout_s)
        started = time.perf_counter()
        asked = "GET /models"
        try:
            response = httpx.get(base.rstrip("/") + "/models", params=query, headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            unreachable = redact(f"the LLM server is unreachable: {type(exc).__name__}: {exc}", secrets)
            return LlmStatus("unhealthy", unreachable, info, time.monotonic())
        http_status = response.status_code
        error: str | None = None
        if not response.is_success:
            error = f"the LLM server answered {asked} with HTTP {http_status}"
        if http_status in _NO_MODELS_ENDPOINT:
            # As answers ask it, through the one LLM client: healthy only if a chat completion comes back.
            asked = "POST /chat/completions"
            answered, failure = TechniqueLLM(settings).probe(timeout)
            http_status = answered if answered is not None else http_status
            if isinstance(failure, LlmServiceUnavailableError):
                return LlmStatus("unhealthy", failure.message, info, time.monotonic())
            error = None
            if failure is not None:
                status = f"HTTP {answered}: " if answered is not None else ""
                error = (
                    f"the LLM server answered GET /models with HTTP {response.status_code} and {asked} with "
                    f"{status}{failure.message}; is LLM_BASE_URL an OpenAI-compatible /v1 URL?"
                )
        info |= {
            "probe": asked,
            "http_status": http_status,
            "probe_ms": round((time.perf_counter() - started) * 1000, 3),
            "cached_for_s": self.cache_s,
        }
        if error is None:
            return LlmStatus("healthy", None, info, time.monotonic())
        return LlmStatus("degraded", redact(error, secrets), info, time.monotonic())
