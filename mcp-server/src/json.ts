export type JsonObject = Record<string, unknown>;

/** A plain JSON object (not an array, not null). */
export const isObject = (value: unknown): value is JsonObject =>
  typeof value === "object" && value !== null && !Array.isArray(value);
