/**
 * Credentials out of worker text the front end passes on (the stderr tail of a worker that failed): the same
 * patterns as iris_rag/redaction.py, for what the worker printed before it could redact anything itself.
 */
const MASK = "***";

/**
 * scheme://user:password@host -> scheme://***@host; to the last @ before the path (libpq takes ?, # and @ in a
 * password as they are), and after a mistyped scheme too (postgres//, postgresql:/).
 */
const USERINFO = /\b([a-z][a-z0-9+.-]*(?::\/+|\/\/))[^/\s]*@/gi;
/** ?api_key=... / &token=...: any parameter whose name says it carries a credential. */
const SECRET_PARAMETER = /([?&;](?:[a-z0-9_-]*(?:key|token|secret|password|passwd|pwd|auth|signature|sig|credential)[a-z0-9_-]*)=)[^&;#\s"'<>]+/gi;
/** libpq key=value connection strings: "host=db password=secret" -> "host=db password=***" */
const DSN_PASSWORD = /(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'"]+)/gi;

export const redactCredentials = (text: string): string =>
  text.replace(USERINFO, `$1${MASK}@`).replace(DSN_PASSWORD, `$1${MASK}`).replace(SECRET_PARAMETER, `$1${MASK}`);
