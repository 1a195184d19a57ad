"""Method table and the one place where exceptions become error responses."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from iris_rag.access import Principal, principal_scope
from iris_rag.backends import connection_failure
from iris_rag.cancellation import check_cancelled, current_token
from iris_rag.errors import MethodNotFoundError, RagError
from iris_rag.monitor import correlation_of
from iris_rag.service import RagService
from iris_rag.worker.protocol import TIMEOUT_REASON

logger = logging.getLogger(__name__)

# Cheap methods served on their own thread, so that slow queries never hold them up.
CONTROL = frozenset(
    {"describe", "health_check", "probe_health", "metrics", "list_collections", "record_call", "shutdown"}
)
# `cancel` is answered by the reader thread itself (worker/server.py), never queued behind work.

# Makes the answer of an outcome; returns the error code the answer carries in its place when the outcome
# cannot go out as it is (RESULT_TOO_LARGE), else None (the worker's: its answer line).
Encoder = Callable[[bool, dict[str, Any]], str | None]


class Dispatcher:
    """Calls the service method a request names and shapes its outcome."""

    def __init__(self, service: RagService) -> None:
        self.service = service
        # Tool-backing methods are recorded by the monitor; the others are plumbing.
        self.monitored = set(service.methods())
        self.methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            **service.methods(),
            "describe": service.describe,
            "record_call": service.record_call,
            # GET /health's check: rag_health_check's answer, not recorded (a probe is no client's call).
            "probe_health": service.health_check,
            "podcast_file": service.podcast_file,
            "shutdown": lambda _params: {"shutting_down": True},
        }

    def call(
        self,
        method: str,
        params: dict[str, Any],
        principal: Principal | None = None,
        encode: Encoder | None = None,
        *,
        sent_at: float | None = None,
        claim_record: Callable[[], bool] | None = None,
    ) -> tuple[bool, dict[str, Any]]:
        """Run one method for `principal` (None: the local user): (True, result) or (False, error).

        `encode` makes the answer before the call is recorded: a call is recorded as its caller got it, with
        the time it waited from `sent_at` (when the front end took it, its queue included). `claim_record`
        says whether the record is still this run's to write: a time-out or cancel records the call when the
        caller is answered (WorkerServer.cancel), and the run that ends later must not record it again.
        """
        with principal_scope(principal):
            return self._call(method, params, encode, sent_at, claim_record)

    def record_answered(
        self, method: str, params: dict[str, Any], principal: Principal | None, code: str, waited_ms: float
    ) -> None:
        """Record a call whose caller was answered `code` by the front end (a time-out or a cancel) now."""
        if method in self.monitored:
            with principal_scope(principal):
                self._record(method, params, waited_ms, code, self._correlation(method, params))

    def _correlation(self, method: str, params: dict[str, Any]) -> dict[str, str]:
        """The caller's request_id and session_id: echoed in the answer, stored with the call record."""
        if method not in self.monitored:
            return {}
        return correlation_of(params.get("arguments") if method == "execute" else params)

    def _call(
        self,
        method: str,
        params: dict[str, Any],
        encode: Encoder | None,
        sent_at: float | None,
        claim_record: Callable[[], bool] | None,
    ) -> tuple[bool, dict[str, Any]]:
        started = time.perf_counter()
        error_code: str | None = None
        correlation = self._correlation(method, params)
        try:
            handler = self.methods.get(method)
            if handler is None:
                msg = f"unknown method {method!r}; known: {', '.join(sorted(self.methods))}"
                raise MethodNotFoundError(msg)
            # A request cancelled while it waited for a thread does not start at all.
            check_cancelled()
            outcome: tuple[bool, dict[str, Any]] = (True, _echo(handler(params), correlation))
        except RagError as exc:
            # A store failure wrapped by the pipeline (RETRIEVAL_FAILED) whose cause is a lost server.
            failure: RagError = connection_failure(exc, self.service.settings.llm_secrets) or exc
            error_code = failure.code
            outcome = (False, failure.to_dict())
        except Exception as exc:
            lost = connection_failure(exc, self.service.settings.llm_secrets)
            if lost is not None:
                error_code = lost.code
                outcome = (False, lost.to_dict())
            else:
                logger.exception("unexpected error in %s", method)
                error_code = "INTERNAL_ERROR"
                outcome = (False, {"code": error_code, "message": f"{type(exc).__name__}: {exc}"})
        if not outcome[0] and correlation:
            outcome = (False, _echo_error(outcome[1], correlation))
        if encode is not None:
            error_code = encode(*outcome) or error_code
        token = current_token()
        if token is not None and token.cancelled:
            # Cancelled without a cancel request recording it (shutdown): as the caller got it, whatever the
            # work did after.
            error_code = "TIMEOUT_EXCEEDED" if token.reason == TIMEOUT_REASON else "REQUEST_CANCELLED"
        if method in self.monitored and (claim_record is None or claim_record()):
            waited_ms = caller_waited_ms(sent_at, (time.perf_counter() - started) * 1000)
            self._record(method, params, waited_ms, error_code, correlation)
        return outcome

    def _record(
        self,
        method: str,
        params: dict[str, Any],
        duration_ms: float,
        error_code: str | None,
        correlation: dict[str, str],
    ) -> None:
        try:
            tool, technique = self.service.tool_for(method, params)
            self.service.monitor.record(
                tool, technique, duration_ms, error_code is None, error_code, **correlation
            )
        except Exception:
            # Monitoring must never turn a served answer into a failure.
            logger.exception("could not record a %s call", method)


def caller_waited_ms(sent_at: float | None, run_ms: float) -> float:
    """How long the caller has waited, from when the front end took the call (sent_at, a UNIX time).

    So the time it queued (MAX_CONCURRENT_REQUESTS) counts, as rag_metrics' durations promise; never less
    than the run itself (a clock set back meanwhile), and the run alone when the request carried no time.
    """
    if sent_at is None:
        return run_ms
    return max(run_ms, (time.time() - sent_at) * 1000)


def _echo(result: dict[str, Any], correlation: dict[str, str]) -> dict[str, Any]:
    """The result with the caller's request_id and session_id (a new dict: a cached result is shared)."""
    return {**result, **correlation} if correlation else result


def _echo_error(error: dict[str, Any], correlation: dict[str, str]) -> dict[str, Any]:
    """The error with them in its details and its partial result (the client's structuredContent)."""
    details = {**error.get("details", {}), **correlation}
    partial = details.get("partial_result")
    if isinstance(partial, dict):
        details["partial_result"] = {**partial, **correlation}
    return {**error, "details": details}
