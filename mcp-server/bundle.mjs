#!/usr/bin/env node
/**
 * `npm run bundle`: the front end as ONE file for the Python package, iris_rag/frontend/server.mjs, with no
 * node_modules at run time, and the licenses of the packages bundled into it beside it.
 *
 * The bundle sits two folders below the folder holding iris_rag/, as mcp-server/dist/index.js sits below
 * the repository root, so config.ts's REPO_ROOT finds the installed package's iris_rag/schemas/ and runs
 * the worker there (in an installed package that folder is site-packages).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { build } from "esbuild";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const outDir = join(root, "iris_rag", "frontend");
const outfile = join(outDir, "server.mjs");

mkdirSync(outDir, { recursive: true });
const result = await build({
  entryPoints: [join(root, "mcp-server", "src", "index.ts")],
  outfile,
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node20",
  metafile: true,
  // Stack traces in bug reports stay readable; the file is under a megabyte either way.
  minify: false,
  legalComments: "none",
  logLevel: "warning",
});

/** The package folder an input path lies in: node_modules/<name> or node_modules/@scope/<name>. */
function packageFolder(input) {
  const parts = input.split("/");
  const at = parts.lastIndexOf("node_modules");
  if (at < 0) return null;
  const length = parts[at + 1]?.startsWith("@") ? 3 : 2;
  return parts.slice(0, at + length).join("/");
}

// MIT and the like ask for their notice in every copy: the wheel carries the bundle, so it carries these.
const folders = [...new Set(Object.keys(result.metafile.inputs).map(packageFolder).filter(Boolean))].sort();
const notices = folders.map((folder) => {
  const manifest = JSON.parse(readFileSync(join(root, folder, "package.json"), "utf8"));
  const licenseFile = readdirSync(join(root, folder)).find((name) => /^(licen[cs]e|copying)/i.test(name));
  const text = licenseFile ? readFileSync(join(root, folder, licenseFile), "utf8").trim() : "(no license file in the package)";
  return `${manifest.name} ${manifest.version} (${manifest.license ?? "license not stated"})\n\n${text}\n`;
});
const header = "Third-party packages bundled into server.mjs (`npm run bundle`), with their licenses.\n";
writeFileSync(join(outDir, "THIRD_PARTY_LICENSES.txt"), [header, ...notices].join(`\n${"=".repeat(78)}\n\n`));

if (!existsSync(outfile)) throw new Error(`esbuild reported success but wrote no ${outfile}`);
console.error(`bundle: ${outfile} (${folders.length} packages bundled)`);
