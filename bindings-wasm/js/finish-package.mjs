// Finishes a package wasm-bindgen generated (scripts/build-js runs it on bindings-wasm/pkg/nodejs and
// bindings-wasm/pkg/web): what the Rust attributes cannot say.
//
// - The errors wasm-bindgen's glue throws itself get a `code` and a message in JS terms, like every
//   other miniflow error: a call on an object after its `free()` is USED_AFTER_FREE (checked before
//   the call enters the module), an argument of the wrong class INVALID_INPUT; a `free()` from one of
//   the object's own callbacks frees it once the call returns.
// - The built-in event kinds are exported as constants (`TIMER_FIRED`, …; their types come from the
//   crate's TypeScript section).
// - The declarations compile for any ES2022 project: `[Symbol.dispose]` (which needs the
//   esnext.disposable lib) is left out of them — the method is still there at run time — and `Engine`
//   is generic over its workflow's state and events, so `replay().state` has the state's type and
//   `handle` / `start` take the workflow's own events.
//
// The generated code comes from the pinned wasm-bindgen version; each edit checks that it found what
// it changes, so a new version that moved things fails the build instead of shipping an unfinished
// package.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [dir, target] = process.argv.slice(2);
if (!dir || !["nodejs", "web"].includes(target)) throw new Error("usage: finish-package.mjs <dir> <nodejs|web>");

const KINDS = {
  TIMER_FIRED: "timer_fired",
  COMMAND_COMPLETED: "command_completed",
  COMMAND_FAILED: "command_failed",
  COMMAND_RESOLVED: "command_resolved",
  SCHEDULE_FIRED: "schedule_fired",
};

function edit(file, change) {
  const path = join(dir, file);
  writeFileSync(path, change(readFileSync(path, "utf8")));
}

/** `text` with `from` replaced by `to`, which must occur exactly `times` times. */
function replace(text, from, to, times = 1) {
  const found = text.split(from).length - 1;
  if (found !== times) throw new Error(`expected ${times} × ${JSON.stringify(from)} in the generated code, found ${found}`);
  return text.split(from).join(to);
}

const glue = `
/** wasm-bindgen's own errors, with a code and a message in JS terms. */
function miniflowGlueError(message) {
  const known = {
    "null pointer passed to rust": [
      "USED_AFTER_FREE",
      "this object was used after its free(): it holds no data any more; create a new one",
    ],
    "recursive use of an object detected which would lead to unsafe aliasing in rust": [
      "REENTRANT_CALL",
      "this object is in use by a call that has not returned yet (a callback called back into it): call it after that call returns",
    ],
  };
  const [code, text] = known[message] ?? ["INTERNAL", message];
  const error = new Error(text);
  error.code = code;
  return error;
}

/** The pointer of \`object\`, checked here: a freed object refused before the call enters the module
 * (a refusal thrown from inside it would leave a little of its stack behind, every time). */
function miniflowLive(object) {
  if (object.__wbg_ptr === 0) throw miniflowGlueError("null pointer passed to rust");
  return object.__wbg_ptr;
}
`;
const constants = Object.entries(KINDS)
  .map(([name, kind]) => (target === "web" ? `export const ${name} = "${kind}";` : `exports.${name} = "${kind}";`))
  .join("\n");

/** `text` with every match of `pattern` replaced by `to`: at least `least` of them. */
function replaceAll(text, pattern, to, least) {
  const found = text.match(pattern)?.length ?? 0;
  if (found < least) throw new Error(`expected at least ${least} × ${pattern} in the generated code, found ${found}`);
  return text.replace(pattern, to);
}

edit("miniflow.js", (js) => {
  const thrown = "throw new Error(getStringFromWasm0(arg0, arg1));";
  js = replace(js, thrown, "throw miniflowGlueError(getStringFromWasm0(arg0, arg1));");
  // Every object passed into the module is checked alive first (see miniflowLive).
  js = replaceAll(js, /([(,] ?)(this|store)\.__wbg_ptr(?=[,)])/g, "$1miniflowLive($2)", 20);
  // An object passed as an argument is of the expected class, or INVALID_INPUT.
  js = replace(
    js,
    "throw new Error(`expected instance of ${klass.name}`);",
    "throw Object.assign(new Error(`expected a ${klass.name} here, got ${instance === null ? \"null\" : typeof instance === \"object\" ? instance.constructor?.name ?? \"an object\" : typeof instance}`), { code: \"INVALID_INPUT\" });",
  );
  // free() may be called while a call of the object runs (from one of its callbacks): it frees the
  // object once that call returns (wasm-bindgen's delayed free, as its finalizers do), instead of
  // throwing from inside the module after giving up the object (which left it half freed).
  js = replaceAll(js, /(free\(\) \{\n        const ptr = this\.__destroy_into_raw\(\);\n        wasm\.\w+\(ptr, )0\);/g, "$11);", 2);
  return `${js}${glue}\n${constants}\n`;
});

edit("miniflow.d.ts", (dts) => {
  const withoutDispose = replace(dts, "    [Symbol.dispose](): void;\n", "", 3);
  const generic = replace(withoutDispose, "export class Engine {", "export class Engine<S = unknown, E extends EventShape = AnyEvent> {");
  // `handle` and `start` take the workflow's own events, typed.
  return replace(generic, "workflowId: string, event: EventInput, now?: number): Handled;", "workflowId: string, event: EventInputOf<E>, now?: number): Handled;", 2);
});
