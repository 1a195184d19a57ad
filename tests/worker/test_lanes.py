"""The front end and the worker agree on which methods skip the work queue (the control lane)."""

from __future__ import annotations

import re

from iris_rag.worker.dispatch import CONTROL
from tests.conftest import ROOT


def test_front_end_control_methods_are_the_workers() -> None:
    source = (ROOT / "mcp-server" / "src" / "bridge.ts").read_text(encoding="utf-8")
    match = re.search(r"const CONTROL_METHODS = new Set\(\[([^\]]*)\]\)", source)
    assert match, "bridge.ts defines CONTROL_METHODS"
    front_end = set(re.findall(r'"([a-z_]+)"', match.group(1)))
    # `cancel` is answered by the worker's reader thread itself, never queued.
    assert front_end == CONTROL | {"cancel"}
