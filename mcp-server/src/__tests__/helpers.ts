/** Shared test fixtures: the real tool specs, read from the Python package that serves them. */
import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { loadConfig } from "../config.js";
import type { ToolSpec } from "../tools.js";

export const config = loadConfig();

let specs: ToolSpec[] | undefined;

/** tool_specs() exactly as the worker's `describe` serves them, without starting a worker. */
export function realToolSpecs(): ToolSpec[] {
  specs ??= JSON.parse(
    execFileSync(config.python, ["-c", "import json; from iris_rag.schemas import tool_specs; print(json.dumps(tool_specs()))"], {
      cwd: config.repoRoot,
      encoding: "utf8",
    }),
  ) as ToolSpec[];
  return specs;
}

export function toolSpec(name: string): ToolSpec {
  const spec = realToolSpecs().find((tool) => tool.name === name);
  if (!spec) throw new Error(`no tool ${name} in tool_specs()`);
  return spec;
}

/** A fresh data directory, so a test never touches ./data or another test's store. */
export const freshDataDir = (): string => mkdtempSync(join(tmpdir(), "iris-rag-test-"));
