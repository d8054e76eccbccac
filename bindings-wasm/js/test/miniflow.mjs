// Loads the Node build of the package, as a user who installed it from bindings-wasm/pkg/nodejs would.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(import.meta.url);
export const miniflow = require("../../pkg/nodejs/miniflow.js");

/** The command and timer ID vectors shared by every host. */
export const vectors = JSON.parse(
  readFileSync(new URL("../../../core/tests/vectors/command_ids.json", import.meta.url), "utf8"),
);

/** Asserts that `fn` throws a miniflow error with `code` whose message contains `text`. */
export function throwsCode(assert, fn, code, text = "") {
  assert.throws(fn, (error) => {
    assert.ok(error instanceof Error, `expected an Error, got ${error}`);
    assert.equal(error.code, code, `code of: ${error.message}`);
    assert.ok(error.message.includes(text), `"${error.message}" does not mention "${text}"`);
    return true;
  });
}

/** The article's trip workflow, written in JS. */
export const tripWorkflow = {
  init: () => ({ city: null }),
  evolve: (trip, event) => (event.kind === "trip_requested" ? { ...trip, city: event.payload.city } : trip),
  decide: (trip, event) =>
    event.kind === "trip_requested" && trip.city === null
      ? [{ kind: "lock_budget", payload: { trip_id: event.workflow_id } }]
      : [],
};
