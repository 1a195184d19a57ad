"""Who is calling, and which collections that caller may see and change.

In HTTP mode the front end authenticates each call (RAG_AUTH_FILE) and sends its principal with the bridge
request; the worker keeps it in a context variable for the thread serving the call, as it does the cancel
token. Without one (stdio, the CLI, tests) the caller is the local user, who owns every collection.

A collection outside the caller's grants is answered exactly as one that does not exist: reads raise the
same COLLECTION_NOT_FOUND, listings and the "known collections" of error messages leave it out. Writing to
it is FORBIDDEN whether or not it exists, so not even a write tells the two apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from iris_rag.errors import CollectionNotFoundError, ForbiddenError, MalformedRequestError

ALL_COLLECTIONS = "*"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its id, scopes (read, write, admin) and granted collections (None: all)."""

    id: str
    scopes: frozenset[str]
    collections: frozenset[str] | None

    @property
    def admin(self) -> bool:
        """Admins see every collection and everyone's metrics."""
        return "admin" in self.scopes

    def can_see(self, collection_id: str) -> bool:
        """Whether the collection is granted (admins and '*' grants see all)."""
        return self.admin or self.collections is None or collection_id in self.collections

    @property
    def every_collection(self) -> bool:
        """Whether nothing is hidden from this caller (what shared, collection-less data needs)."""
        return self.admin or self.collections is None

    @classmethod
    def from_wire(cls, raw: Any) -> Principal:
        """The principal object of a bridge request: {id, scopes, collections: [..] | "*"}."""
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            msg = "a request's principal must be an object with a string 'id'"
            raise MalformedRequestError(msg)
        scopes, collections = raw.get("scopes", []), raw.get("collections", [])
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            msg = "a principal's scopes must be a list of strings"
            raise MalformedRequestError(msg)
        if collections == ALL_COLLECTIONS:
            granted = None
        elif isinstance(collections, list) and all(isinstance(c, str) for c in collections):
            granted = None if ALL_COLLECTIONS in collections else frozenset(collections)
        else:
            msg = "a principal's collections must be a list of strings or '*'"
            raise MalformedRequestError(msg)
        return cls(raw["id"], frozenset(scopes), granted)


_current: ContextVar[Principal | None] = ContextVar("iris_rag_principal", default=None)


def current_principal() -> Principal | None:
    """The caller of the request this thread serves; None for the local user."""
    return _current.get()


@contextmanager
def principal_scope(principal: Principal | None) -> Iterator[None]:
    """Serve the enclosed work on behalf of `principal`."""
    reset = _current.set(principal)
    try:
        yield
    finally:
        _current.reset(reset)


def can_see(collection_id: str) -> bool:
    """Whether the current caller may read the collection."""
    principal = _current.get()
    return principal is None or principal.can_see(collection_id)


def visible(collection_ids: Iterable[str]) -> list[str]:
    """The ids the current caller may see, in order."""
    return [c for c in collection_ids if can_see(c)]


def sees_everything() -> bool:
    """Whether the current caller is shown every collection (the local user, an admin, a '*' grant)."""
    principal = _current.get()
    return principal is None or principal.every_collection


def collection_not_found(name: str, known: Iterable[str], hint: str = "") -> CollectionNotFoundError:
    """The one answer for a collection that does not exist or is not the caller's: the same either way."""
    shown = visible(known)
    msg = f"collection {name!r} does not exist (known: {', '.join(shown) or 'none'}){hint}"
    return CollectionNotFoundError(msg, {"collection_id": name, "known_collections": shown})


def require_writable(collection_id: str | None) -> None:
    """Refuse a write to a collection outside the caller's grants (None: data shared by every collection)."""
    principal = _current.get()
    if principal is None:
        return
    if "write" not in principal.scopes and not principal.admin:
        msg = "this key has no 'write' scope"
        raise ForbiddenError(msg, {"principal": principal.id})
    if collection_id is None:
        if not principal.every_collection:
            msg = "only a key granted every collection may write shared data (give a collection_id)"
            raise ForbiddenError(msg, {"principal": principal.id})
    elif not principal.can_see(collection_id):
        msg = f"this key may not write to collection {collection_id!r}"
        raise ForbiddenError(msg, {"principal": principal.id, "collection_id": collection_id})
