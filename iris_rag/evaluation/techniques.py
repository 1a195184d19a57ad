"""What `--techniques` names: the registered pipelines plus eval-only variants with fixed parameters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from iris_rag.errors import InvalidParametersError, PipelineNotFoundError

# name → (registered technique it runs, technique_params). The one table of eval-only variants.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    # The keyword (BM25) leg of hybrid_ifind alone: the BM25 anchor.
    "keyword": ("hybrid_ifind", {"vector_weight": 0.0, "keyword_weight": 1.0, "fusion_method": "weighted"}),
    # The same leg with multifield BM25 (each field its own BM25, best + 0.5 x the other): BEIR's anchor.
    "keyword_multifield": (
        "hybrid_ifind",
        {
            "vector_weight": 0.0,
            "keyword_weight": 1.0,
            "fusion_method": "weighted",
            "keyword_scoring": "multifield",
        },
    ),
}


@dataclass(frozen=True)
class TechniqueSpec:
    """One evaluated technique: its report name, the pipeline it runs and the parameters it passes."""

    name: str
    base: str
    params: dict[str, Any] = field(default_factory=dict)


def available(registered: Iterable[str]) -> list[str]:
    """Every name `--techniques` accepts now: registered techniques, then variants of registered ones."""
    names = list(registered)
    return [*names, *(name for name, (base, _) in VARIANTS.items() if base in names)]


def resolve(
    requested: str, registered: Iterable[str], overrides: Mapping[str, dict[str, Any]] | None = None
) -> list[TechniqueSpec]:
    """Turn 'a,b,...' or 'all' into specs; `overrides` (by name) update a technique's parameters."""
    names = list(registered)
    valid = available(names)
    wanted = valid if requested.strip() == "all" else [n.strip() for n in requested.split(",") if n.strip()]
    overrides = overrides or {}
    unknown = [n for n in wanted if n not in valid]
    if unknown or not wanted:
        listed = ", ".join(map(repr, unknown)) or "none given"
        msg = f"unknown technique {listed}; valid: {', '.join(valid)}, all"
        raise PipelineNotFoundError(msg, {"available": valid})
    # Checked against what is evaluated, not what is registered: `iris-rag eval` serves only the former.
    unevaluated = [n for n in overrides if n not in wanted]
    if unevaluated:
        listed, evaluated = ", ".join(map(repr, unevaluated)), list(dict.fromkeys(wanted))
        msg = f"--params names {listed}, which --techniques does not ({', '.join(evaluated)})"
        msg += "; add it to --techniques"
        raise InvalidParametersError(msg, {"techniques": evaluated, "params": unevaluated})
    specs = []
    for name in dict.fromkeys(wanted):
        base, params = VARIANTS[name] if name in VARIANTS and name not in names else (name, {})
        specs.append(TechniqueSpec(name, base, {**params, **overrides.get(name, {})}))
    return specs


def parse_params(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`--params NAME=JSON` values (repeatable) → parameters by technique name; later ones win per key."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        name, _, text = item.partition("=")
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            msg = f"--params {item!r}: not NAME=<JSON object>: {exc}"
            raise InvalidParametersError(msg) from exc
        if not name.strip() or not isinstance(value, dict):
            msg = f"--params {item!r}: expected NAME=<JSON object>"
            raise InvalidParametersError(msg)
        overrides.setdefault(name.strip(), {}).update(value)
    return overrides
