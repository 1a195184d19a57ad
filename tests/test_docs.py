"""The docs against the code: README's generated tool reference, its tables of settings and error codes,
the server's instructions, and Markdown that renders as written; stale docs fail here."""

import itertools
import re
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_tool_reference_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_tool_reference.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_setting_is_in_env_template_and_readme() -> None:
    from iris_rag.settings import Settings

    template = (ROOT / ".env.template").read_text(encoding="utf-8")
    # A row of the Configuration table, not a mention anywhere (RAG_INGEST_ROOTS had only the latter).
    documented = configuration_variables()
    for field in Settings.model_fields.values():
        alias = str(field.validation_alias)
        assert f"\n{alias}=" in template, alias
        assert alias in documented, alias


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_code_fence_in_the_docs_is_closed() -> None:
    """A fence left open renders the rest of the file as code, its headings included."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark")
    for path in markdown_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        for token in parser.parse("\n".join(lines)):
            if token.type != "fence" or token.map is None:
                continue
            start, end = token.map
            closing = lines[end - 1].strip()
            where = f"{path.relative_to(ROOT)}:{start + 1}"
            closed = (
                end - start > 1 and closing.startswith(token.markup) and not closing.strip(token.markup[0])
            )
            assert closed, f"{where}: the {token.markup} fence opened here is never closed"
            # A section heading in code is a fence closed too late (a shell comment is one #).
            headings = [line for line in lines[start + 1 : end - 1] if re.match(r"#{2,6} ", line)]
            assert not headings, f"{where}: the fence opened here holds the heading {headings[0]!r}"


def readme_table(header: str) -> list[str]:
    """The first cells of the README table whose header row is `header`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index(f"\n{header}\n")
    rows = itertools.takewhile(lambda line: line.startswith("|"), readme[start + 1 :].splitlines())
    return [row.split("|")[1] for row in list(rows)[2:]]


def test_every_error_code_a_client_can_get_has_a_row_in_the_readme_error_table() -> None:
    # The front end's list (errors.ts) holds the worker's codes (tests/test_error_codes.py checks that) and
    # its own. MALFORMED_REQUEST and METHOD_NOT_FOUND, the worker's answers to a front end that is wrong,
    # reach the client as they are: documented too, not exempt.
    source = (ROOT / "mcp-server" / "src" / "errors.ts").read_text(encoding="utf-8")
    block = source[source.index("ERROR_HINTS = {") : source.index("} as const;")]
    codes = set(re.findall(r"^\s+([A-Z_]+):", block, flags=re.MULTILINE))
    documented = {
        code for cell in readme_table("| code | when |") for code in re.findall(r"`([A-Z_]+)`", cell)
    }
    assert codes - documented == set(), "add rows to README's error table (Errors)"
    assert documented - codes == set(), "README's error table names codes errors.ts does not know"


def test_every_variable_of_the_env_template_has_a_row_in_the_readme_configuration_table() -> None:
    template = (ROOT / ".env.template").read_text(encoding="utf-8")
    # Set lines, and commented-out ones (`# OPENBLAS_NUM_THREADS=1`), not prose that quotes a value.
    variables = set(re.findall(r"^(?:# )?([A-Z][A-Z0-9_]+)=\S*$", template, flags=re.MULTILINE))
    variables |= set(re.findall(r"^([A-Z][A-Z0-9_]+)=", template, flags=re.MULTILINE))
    assert variables - configuration_variables() == set(), "add rows to README's Configuration table"


def configuration_variables() -> set[str]:
    """The variables README's Configuration table has a row for."""
    cells = readme_table("| variable | default | meaning |")
    return {name for cell in cells for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}


def test_the_server_instructions_quote_each_technique_as_the_readme_measures_it() -> None:
    """What every client's model reads at initialize: each nDCG@10 they give a tool is README's."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    instructions = (ROOT / "iris_rag" / "schemas" / "instructions.md").read_text(encoding="utf-8")
    quoted: list[tuple[str, str]] = []
    tool = None
    # A figure belongs to the tool named last before it ("rag_hybrid_ifind ... 0.739 ...; rag_basic 0.664").
    for token in re.findall(r"\brag_\w+|\b0\.\d{3}\b", instructions):
        if token.startswith("rag_"):
            tool = token
        elif tool is not None:
            quoted.append((tool, token))
    assert quoted
    for tool, figure in quoted:
        paragraph = re.search(rf"^\*\*`{tool}`\*\*.*?\n\n", readme, flags=re.MULTILINE | re.DOTALL)
        assert paragraph is not None, tool
        measured = re.search(r"nDCG@10 (0\.\d{4})", paragraph.group())
        assert measured is not None, tool
        assert figure == str(Decimal(measured[1]).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP)), tool


def test_the_tool_reference_gives_each_arguments_limits() -> None:
    """Array sizes and patterns too, not only scalar ranges (documents ≤ 1000 and ids were missing)."""
    from iris_rag.schemas import tool_specs

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for spec in tool_specs():
        section = readme.split(f"\n### `{spec['name']}`: ", 1)[1].split("\n### ", 1)[0]
        for name, schema in spec["inputSchema"].get("properties", {}).items():
            row = next(line for line in section.splitlines() if line.startswith(f"| `{name}`"))
            for key in ("minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum"):
                assert key not in schema or f" {schema[key]}" in row, (spec["name"], name, key)
            assert "pattern" not in schema or "pattern" in row or "whitespace" in row, (spec["name"], name)


def test_every_result_file_the_benchmarks_doc_cites_is_in_the_repository() -> None:
    """bench/results/ is git-ignored, so a cited run's JSON stays on one machine unless it is force-added.

    A path with a shell variable (a loop's output name) is not checked; `{a,b}` stands for both files.
    """

    def expand(path: str) -> list[str]:
        braces = re.search(r"\{([^{}$]*)\}", path)
        if braces is None:
            return [path]
        before, after = path[: braces.start()], path[braces.end() :]
        return [name for part in braces[1].split(",") for name in expand(before + part + after)]

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    cited = {
        name
        for m in re.finditer(r"bench/results/[\w./{},-]*?\.(?:json|txt)\b", text)
        for name in expand(m[0])
    }
    listed = subprocess.run(
        ["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert len(cited) > 50
    missing = sorted(cited - set(listed.split()))
    assert not missing, f"cited by docs/benchmarks.md but not committed (git add -f): {missing}"
