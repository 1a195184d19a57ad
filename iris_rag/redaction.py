"""Credentials out of anything a caller or a log sees: URL userinfo, key/token query parameters, secrets."""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

# scheme://user:password@host -> scheme://***@host
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]+@")
# ?api_key=... / &token=... (any parameter whose name says it carries a credential)
_SECRET_PARAMETER = re.compile(
    r"(?i)([?&;](?:[a-z0-9_-]*(?:key|token|secret|password|passwd|pwd|auth|signature|sig|credential)"
    r"[a-z0-9_-]*)=)[^&;#\s\"'<>]+"
)

# libpq key=value connection strings: "host=db password=secret" -> "host=db password=***"
_DSN_PASSWORD = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\"]+)")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """The text with URL credentials and the given secret values replaced by ***."""
    for secret in secrets:
        # Short values would mask ordinary words; real keys and passwords are longer.
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    text = _DSN_PASSWORD.sub(rf"\1{MASK}", text)
    return _SECRET_PARAMETER.sub(rf"\1{MASK}", text)
