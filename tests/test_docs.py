"""The README's tool reference is generated from the schemas; stale docs fail here."""

import subprocess
import sys

from tests.conftest import ROOT


def test_tool_reference_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_tool_reference.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_setting_is_in_env_template_and_readme() -> None:
    from iris_rag.settings import Settings

    template = (ROOT / ".env.template").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for field in Settings.model_fields.values():
        alias = str(field.validation_alias)
        assert f"\n{alias}=" in template, alias
        assert f"`{alias}`" in readme, alias
