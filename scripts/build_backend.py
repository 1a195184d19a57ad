"""The package's PEP 517 build backend: setuptools, after bundling the MCP front end into the package.

A wheel must carry iris_rag/frontend/server.mjs (`npm run bundle`) so that `iris-rag mcp` runs with Node
alone. The bundle is a build output, not committed, so the wheel build makes it: `uvx --from git+URL` and
`pip install git+URL` build from a bare clone, where nothing else would. With node_modules present (after
`npm ci`) that is esbuild alone, offline and under a second; without, `npm ci` first, from the npm
registry or its cache. An sdist carries the bundle and no TypeScript, so a wheel built from it uses the
bundle as it is. Editable installs (scripts/setup.sh) need no bundle: a checkout serves mcp-server/dist.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import (
    build_editable,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "iris_rag" / "frontend" / "server.mjs"
NODE_SOURCES = ROOT / "mcp-server" / "src"
ESBUILD = ROOT / "node_modules" / ".bin" / "esbuild"


class BundleError(RuntimeError):
    """The front end could not be bundled; the message says what to install or run."""


def _npm(*args: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        msg = (
            "building the iris-rag package bundles its MCP front end with npm, and npm is not on PATH: "
            "install Node.js 20+ with npm (https://nodejs.org), or build the bundle elsewhere "
            "(`npm ci && npm run bundle`) and copy iris_rag/frontend/ here"
        )
        raise BundleError(msg)
    print(f"iris-rag build: npm {' '.join(args)}", file=sys.stderr)
    # npm's own output goes to stderr: a build frontend may parse stdout.
    completed = subprocess.run([npm, *args], cwd=ROOT, stdout=sys.stderr, check=False)
    if completed.returncode != 0:
        msg = f"`npm {' '.join(args)}` failed (exit {completed.returncode}); its output is above"
        raise BundleError(msg)


def bundle_front_end() -> Path:
    """Build iris_rag/frontend/server.mjs from mcp-server/src, or check an sdist's copy is there."""
    if not NODE_SOURCES.is_dir():
        if not BUNDLE.is_file():
            msg = f"this source tree has neither mcp-server/src nor a built {BUNDLE.relative_to(ROOT)}"
            raise BundleError(msg)
        return BUNDLE
    if not ESBUILD.exists():
        _npm("ci", "--no-audit", "--no-fund", "--loglevel=error")
    # Always rebuilt from the sources: a bundle left from an earlier build may be stale.
    _npm("run", "--silent", "bundle")
    return BUNDLE


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, str | list[str]] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """Bundle the front end, then build the wheel with setuptools."""
    bundle_front_end()
    name: str = build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)
    return name


def build_sdist(sdist_directory: str, config_settings: dict[str, str | list[str]] | None = None) -> str:
    """Bundle the front end, then build the sdist with setuptools (it carries the bundle)."""
    bundle_front_end()
    name: str = build_meta.build_sdist(sdist_directory, config_settings)
    return name
