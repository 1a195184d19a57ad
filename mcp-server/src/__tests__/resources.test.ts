import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { parseResourceUri, RESOURCE_TEMPLATES } from "../resources.js";

describe("rag://podcast/{name}", () => {
  it("names a podcast by the worker's own names only", () => {
    assert.deepEqual(parseResourceUri("rag://podcast/sci-vitamin-d-20261125-035805-f0ec3f"), { kind: "podcast", name: "sci-vitamin-d-20261125-035805-f0ec3f" });
    // Never a path, an escape, a query or an upper-case name: those are no podcast.
    for (const uri of ["rag://podcast/", "rag://podcast/../x", "rag://podcast/..%2Fx", "rag://podcast/a/b", "rag://podcast/a?x=1", "rag://podcast/Abc", "rag://podcast/-a"]) {
      assert.equal(parseResourceUri(uri), undefined, uri);
    }
  });

  it("is listed as an audio/wav template", () => {
    const template = RESOURCE_TEMPLATES.find((t) => t.uriTemplate === "rag://podcast/{name}");
    assert.equal(template?.mimeType, "audio/wav");
  });
});
