"""Credentials out of anything a caller or a log sees: URL userinfo, key/token query parameters, secrets."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

MASK = "***"

# scheme://user:password@host -> scheme://***@host; to the last @ before the path (libpq takes ?, # and @
# in a password as they are), and after a mistyped scheme too (postgres//, postgresql:/).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*(?::/+|//))[^/\s]*@")
# ?api_key=... / &token=... (any parameter whose name says it carries a credential)
_SECRET_PARAMETER = re.compile(
    r"(?i)([?&;](?:[a-z0-9_-]*(?:key|token|secret|password|passwd|pwd|auth|signature|sig|credential)"
    r"[a-z0-9_-]*)=)[^&;#\s\"'<>]+"
)

# libpq key=value connection strings: "host=db password=secret" -> "host=db password=***"
_DSN_PASSWORD = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\"]+)")

# A URL's scheme and slashes, however mistyped: postgresql://, postgres//, postgresql:/, postgresql:
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*(?::/*|//+)")
# Where URL parsers cut: unencoded in a password, one makes the driver quote a piece of the password
_URL_DELIMITERS = re.compile(r"[@/:?#]")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """The text with URL credentials and the given secret values replaced by ***."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):  # a piece after its whole
        # Short values would mask ordinary words; real keys and passwords are longer.
        if len(secret) >= 4:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    text = _DSN_PASSWORD.sub(rf"\1{MASK}", text)
    return _SECRET_PARAMETER.sub(rf"\1{MASK}", text)


def url_userinfo(url: str) -> tuple[str, str]:
    """The user name and password before a URL's last @, read as leniently as a typo needs.

    A mistyped scheme (postgres//user:pw@host, user:pw@host) or an unencoded @, /, ? or # in the password
    still yields them: a driver that refuses such a URL quotes it in its error.
    """
    head, at, _ = url.rpartition("@")
    if not at:
        return "", ""
    scheme = _SCHEME.match(head)
    # "user:pw" alone: its "user:" is no scheme
    if scheme is not None and ("/" in scheme.group() or ":" in head[scheme.end() :]):
        head = head[scheme.end() :]
    user, colon, password = head.partition(":")
    return user, password if colon else ""


def with_pieces(secret: str) -> list[str]:
    """A secret from a URL and its pieces between URL delimiters, each to mask.

    libpq cuts user:PGP@SSW0RD@host at the first @ and then names the host 'SSW0RD@host'.
    """
    return [secret, *_URL_DELIMITERS.split(secret)] if secret else []


class RedactingFilter(logging.Filter):
    """Masks credentials in every record a handler writes, whichever library logged it.

    httpx logs each request's URL at INFO, userinfo and query parameters included.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Always True: the record is written, its message, traceback and stack masked."""
        message = record.getMessage()
        masked = redact(message, self._secrets)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self._secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self._secrets)
        return True


def redact_logs(secrets: Iterable[str] = ()) -> None:
    """From now on every handler of the root logger masks credentials and these secrets (not earlier ones)."""
    secrets = list(secrets)
    for handler in logging.getLogger().handlers:
        for earlier in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(earlier)
        handler.addFilter(RedactingFilter(secrets))
