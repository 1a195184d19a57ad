/**
 * The text content of a technique tool's result: what a model reads (the answer, then the sources numbered
 * as the answer cites them, with ids, titles, scores and a snippet), at about a third of the JSON's size.
 * The whole result, scores and timings included, is in structuredContent.
 */
import { isObject, type JsonObject } from "./json.js";

/** Characters of each source's best passage shown; rag_get_document returns the whole text. */
const SNIPPET_CHARS = 160;

interface Source {
  citation: number;
  documentId: string;
  title: string;
  score: number;
  chunkIds: string[];
  snippet: string;
}

const str = (value: unknown): string => (typeof value === "string" ? value : "");
const num = (value: unknown): number => (typeof value === "number" ? value : 0);

/** The text cut at a word boundary near `limit`, whitespace collapsed. */
export function snippet(text: string, limit = SNIPPET_CHARS): string {
  const flat = text.replace(/\s+/g, " ").trim();
  if (flat.length <= limit) return flat;
  const cut = flat.slice(0, limit);
  const space = cut.lastIndexOf(" ");
  return `${(space > limit * 0.6 ? cut.slice(0, space) : cut).trimEnd()} …`;
}

/** Sources numbered by document in order of first appearance: the generator's citation numbers. */
function sources(documents: unknown[]): Source[] {
  const byDocument = new Map<string, Source>();
  for (const item of documents) {
    if (!isObject(item)) continue;
    const documentId = str(item.id);
    const known = byDocument.get(documentId);
    if (known) {
      known.chunkIds.push(str(item.chunk_id));
      continue;
    }
    byDocument.set(documentId, {
      citation: byDocument.size + 1,
      documentId,
      title: str(item.title),
      score: num(item.similarity_score),
      chunkIds: [str(item.chunk_id)],
      snippet: snippet(str(item.content)),
    });
  }
  return [...byDocument.values()];
}

/** Labels for options.cot_steps by source: whose steps they are, in a few words (the note says it at length). */
const STEPS_LABEL: Record<string, string> = {
  llm: "Steps (the LLM's own):",
  extractive: "Steps (extractive evidence chain, not model reasoning):",
};

/** options.cot_steps as numbered lines citing chunk ids; empty when the result has none. */
function steps(value: unknown): string {
  if (!isObject(value) || !Array.isArray(value.steps)) return "";
  const lines = value.steps.filter(isObject).map((step) => {
    const ids = Array.isArray(step.chunk_ids) ? step.chunk_ids.map(str).filter(Boolean) : [];
    return `${num(step.step)}. ${str(step.text)}${ids.length > 0 ? ` {${ids.join(", ")}}` : ""}`;
  });
  const label = STEPS_LABEL[str(value.source)] ?? "Steps:";
  return `\n\n${label}\n${lines.length > 0 ? lines.join("\n") : `(none: ${str(value.note)})`}`;
}

export function renderTechniqueResult(result: JsonObject): string {
  const metadata = isObject(result.metadata) ? result.metadata : {};
  const performance = isObject(result.performance) ? result.performance : {};
  const answer = typeof result.answer === "string" ? result.answer : "(no answer generated: options.generate is false)";
  const found = Array.isArray(result.retrieved_documents) ? sources(result.retrieved_documents) : [];
  const header = `Passages (${str(result.technique)}, collection ${str(metadata.collection_id)}, ${Math.round(num(performance.total_time_ms))} ms):`;
  const lines = found.map(
    (s) =>
      `[${s.citation}] ${s.title || "(untitled)"} | document ${s.documentId} | chunks ${s.chunkIds.join(", ")} | score ${s.score.toFixed(3)}\n    ${s.snippet}`,
  );
  const omitted = typeof metadata.sources_omitted === "number" ? metadata.sources_omitted : null;
  const body =
    found.length > 0
      ? lines.join("\n")
      : omitted !== null
        ? `(${omitted} passages retrieved, left out: options.include_sources is false)`
        : "(no passages retrieved)";
  return `${answer}${steps(result.cot_steps)}\n\n${header}\n${body}${indexNote(metadata)}`;
}

/** INDEX_BUILD=background: the model must know that the search did not cover every document yet. */
function indexNote(metadata: JsonObject): string {
  const specific = isObject(metadata.technique_specific) ? metadata.technique_specific : {};
  const build = isObject(specific.index_build) ? specific.index_build : {};
  const note = str(build.note);
  return note ? `\n\nNote: ${note}` : "";
}
