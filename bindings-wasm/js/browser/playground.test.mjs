// Browser test of the playground: Debian's Chromium, driven by playwright-core, loads the page from
// 127.0.0.1 and clicks through what it teaches: the guided first run (one transaction, a lost ack drawn
// as ✕, nothing due under the lease and why, the redelivery with the same key and the duplicate
// dropped, the counters), the supplier without idempotency (two effects), the time-travel slider
// (restoring a past state, branching from it, surviving a reload), dead letters, the saga as per-trip
// timelines, the phone layout at 390 px (no sideways overflow, stacked panels), the favicon and CJK
// glyphs that are not boxes. Saves desktop and phone screenshots under test-output/.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, mkdirSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const www = fileURLToPath(new URL("../../www", import.meta.url));
const output = fileURLToPath(new URL("../test-output", import.meta.url));
const browserPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const DESKTOP = { width: 1280, height: 900 };
const PHONE = { width: 390, height: 844 };

async function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on("error", reject);
  });
}

async function serve(directory) {
  const port = await freePort();
  const server = spawn("python3", ["-m", "http.server", String(port), "--bind", "127.0.0.1", "--directory", directory], { stdio: "ignore" });
  const url = `http://127.0.0.1:${port}/`;
  for (let i = 0; i < 100; i += 1) {
    try {
      if ((await fetch(url)).ok) return { url, stop: () => server.kill() };
    } catch {
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  server.kill();
  throw new Error(`the static server on ${url} did not start`);
}

let server;
let context;
let page;
/** Page errors, console errors and failed requests, checked after every test. */
const problems = [];

before(async () => {
  server = await serve(www);
  context = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "miniflow-chromium-")), {
    executablePath: browserPath,
    headless: true,
    viewport: DESKTOP,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  page = context.pages()[0] ?? (await context.newPage());
  page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  page.on("console", (message) => message.type() === "error" && problems.push(`console error: ${message.text()}`));
  page.on("response", (response) => response.status() >= 400 && problems.push(`HTTP ${response.status()} for ${response.url()}`));
  await open();
});

after(async () => {
  await context?.close();
  server?.stop();
});

async function open() {
  await page.goto(server.url);
  await page.waitForSelector("#status[data-ready=true]", { timeout: 15_000 });
}

const noProblems = () => assert.deepEqual(problems.splice(0), [], "no page errors, console errors or failed requests");
const text = async (testid) => (await page.textContent(`[data-testid=${testid}]`)).replace(/\s+/g, " ").trim();
/** What a user reads in an element: its rendered text, whitespace collapsed. */
const read = async (selector) => (await page.innerText(selector)).replace(/\s+/g, " ").trim();
const click = (testid) => page.click(`[data-testid=${testid}]`);
async function counters() {
  const [deliveries, sideEffects, duplicates, pending, dead, clock] = await Promise.all(
    ["deliveries", "side-effects", "duplicates", "pending", "dead", "clock"].map(text),
  );
  return { deliveries: Number(deliveries), sideEffects: Number(sideEffects), duplicates: Number(duplicates), pending: Number(pending), dead: Number(dead), clock };
}
/** The one control the guided run highlights, by its action (or null). */
async function highlighted() {
  const actions = await page.$$eval(".next[data-action]", (elements) => elements.map((e) => e.dataset.action));
  assert.ok(actions.length <= 1, `at most one highlighted control, got ${actions}`);
  return actions[0] ?? null;
}
const tourState = (step) => page.getAttribute(`[data-testid=tour-${step}]`, "data-state");
/** The elements inside `selector` that reach past its left or right edge. */
const outside = (selector) =>
  page.$eval(selector, (root) => {
    const { left, right } = root.getBoundingClientRect();
    return [...root.querySelectorAll("*")]
      .filter((e) => e.getClientRects().length && (e.getBoundingClientRect().left < left - 0.5 || e.getBoundingClientRect().right > right + 0.5))
      .map((e) => `${e.tagName.toLowerCase()}.${e.className}: ${e.textContent.slice(0, 40)}`);
  });
async function reset() {
  await click("reset");
  assert.equal(await page.$$eval("[data-testid=seq-group]", (groups) => groups.length), 0, "reset empties the sequence view");
}

test("the guided run: one transaction, a lost ack drawn as ✕, why nothing is due, the same key redelivered and the duplicate dropped, then two effects without idempotency", async () => {
  await page.setViewportSize(DESKTOP);
  await reset();
  // Empty panels say what will fill them.
  for (const id of ["sequence", "transactions", "calls", "effects"]) {
    assert.match(await read(`[data-testid=${id}]`), /yet/, `the empty ${id} panel explains itself`);
  }
  assert.equal(await highlighted(), "request");
  assert.equal(await tourState(1), "current");

  // 1. One transaction: event #1 and command trip-001:1:0, in one box, drawn as one commit.
  await click("request");
  const box = await read("[data-testid=tx-trip-001-1]");
  assert.match(box, /event trip-001 #1 trip_requested city 成都/);
  assert.match(box, /\+ command trip-001:1:0 lock_budget pending/);
  assert.equal(await page.textContent("[data-testid=tx-trip-001-1] .seq-badge"), "#1");
  assert.equal(await page.textContent("[data-testid=tx-trip-001-1] .cid-seq"), "1", "the command ID carries its event's seq");
  const commit = await read("[data-testid=seq-group]:last-child .seq-msg");
  assert.equal(commit, "commit event trip-001 #1 trip_requested + command trip-001:1:0, in one transaction");
  assert.deepEqual(await counters(), { deliveries: 0, sideEffects: 0, duplicates: 0, pending: 1, dead: 0, clock: "09:00:00" });
  assert.equal(await tourState(1), "done");
  assert.equal(await highlighted(), "crash");

  // 2. The supplier does the work, the ack is lost: a red ✕ on the worker → outbox arrow.
  await click("crash");
  const crosses = await page.$$eval("[data-testid=lost-ack]", (elements) =>
    elements.map((e) => {
      const message = e.closest(".seq-msg");
      return { text: e.textContent, color: getComputedStyle(e).color, from: message.dataset.from, to: message.dataset.to, label: message.innerText.replace(/\s+/g, " ").trim() };
    }),
  );
  assert.deepEqual(crosses, [{ text: "✕", color: "rgb(192, 57, 43)", from: "worker", to: "outbox", label: "ack lost: the worker crashed ✕" }]);
  assert.deepEqual(await counters(), { deliveries: 1, sideEffects: 1, duplicates: 0, pending: 1, dead: 0, clock: "09:00:00" });
  assert.match(await read("[data-testid=outbox]"), /trip-001:1:0 lock_budget leased 1 worker, token 1, until 09:00:30/);
  assert.equal(await highlighted(), "deliver");
  assert.equal(await tourState(3), "current");

  // 3. Deliver says why nothing is due.
  await click("deliver");
  assert.match(await text("explain"), /^Nothing is due: trip-001:1:0 is leased until 09:00:30 \(it is 09:00:00\)/);
  assert.equal(await read("[data-testid=nothing-due]"), "OUTBOX nothing due: trip-001:1:0 is leased until 09:00:30");
  assert.deepEqual(await counters(), { deliveries: 1, sideEffects: 1, duplicates: 0, pending: 1, dead: 0, clock: "09:00:00" });
  assert.equal(await highlighted(), "advance");

  // 4. The lease runs out.
  await click("advance");
  assert.match(await text("explain"), /the lease of trip-001:1:0 ran out/);
  assert.equal((await counters()).clock, "09:00:30");
  assert.equal(await highlighted(), "deliver");
  assert.equal(await tourState(5), "current");

  // 5. Redelivered with the same key: the supplier answers REF-1 again and drops the duplicate.
  await click("deliver");
  assert.equal(await read("[data-testid=duplicate]"), "same key trip-001:1:0 → REF-1, duplicate dropped");
  assert.deepEqual(await counters(), { deliveries: 2, sideEffects: 1, duplicates: 1, pending: 0, dead: 0, clock: "09:00:30" });
  const calls = await page.$$eval("[data-testid=call]", (items) => items.map((li) => [li.dataset.outcome, li.innerText.replace(/\s+/g, " ").trim()]));
  assert.deepEqual(calls, [
    ["effect", "delivery 1 key trip-001:1:0 attempt 1 → REF-1 new effect"],
    ["duplicate", "delivery 2 key trip-001:1:0 attempt 2 → REF-1 duplicate dropped"],
  ]);
  assert.deepEqual(await page.$$eval("[data-testid=effect]", (items) => items.map((li) => li.innerText)), ["REF-1 budget locked for trip-001:1:0 at 09:00:00"]);
  for (const step of [1, 2, 3, 4, 5]) assert.equal(await tourState(step), "done", `step ${step} is done`);

  // A command ID under the pointer lights up everywhere it is shown.
  await page.hover("[data-testid=tx-trip-001-1] .cid");
  const lit = await page.$$eval('[data-cmd="trip-001:1:0"]', (ids) => ids.map((e) => e.classList.contains("lit")));
  assert.ok(lit.length >= 8 && lit.every(Boolean), `every trip-001:1:0 lit up: ${lit}`);
  await page.mouse.move(0, 0);

  // 6. The contrast: the same story against a supplier that ignores the key makes two effects.
  assert.equal(await highlighted(), "idempotency");
  await click("idempotency-switch");
  assert.equal(await page.isChecked("[data-testid=no-idempotency]"), true);
  assert.equal(await highlighted(), "request");
  for (const step of ["request", "crash", "advance", "deliver"]) await click(step);
  assert.equal(await read("[data-testid=second-effect]"), "key ignored → REF-3, a second side effect for trip-002:1:0");
  assert.deepEqual(await counters(), { deliveries: 4, sideEffects: 3, duplicates: 1, pending: 0, dead: 0, clock: "09:01:00" });
  const twice = await page.$$eval("[data-testid=effect].twice", (items) => items.map((li) => li.innerText.replace(/\s+/g, " ").trim()));
  assert.deepEqual(twice, [
    "REF-2 budget locked for trip-002:1:0 at 09:00:30 2 effects for one command",
    "REF-3 budget locked for trip-002:1:0 at 09:01:00 2 effects for one command",
  ]);
  assert.equal(await page.getAttribute("#counter-effects", "class"), "counter alarm", "the side-effect counter turns red");
  assert.deepEqual(await outside("[data-testid=sequence]"), [], "every message and note stays inside the sequence view");
  assert.equal(await tourState(6), "done");
  assert.equal(await highlighted(), null, "the tour is over");
  assert.match(await text("next"), /^Done Tour complete/);

  // The desktop screenshot: the whole story, with the saga's timelines.
  await click("run-saga");
  await page.waitForSelector("[data-testid=saga-trip-003]");
  await page.evaluate(() => window.scrollTo(0, 0));
  mkdirSync(output, { recursive: true });
  await page.screenshot({ path: join(output, "playground-desktop.png"), fullPage: true });
  noProblems();
});

test("without idempotency from the start, one redelivery makes two side effects and drops nothing", async () => {
  await page.setViewportSize(DESKTOP);
  await reset();
  await click("idempotency-switch");
  for (const step of ["request", "crash", "advance", "deliver"]) await click(step);
  assert.deepEqual(await counters(), { deliveries: 2, sideEffects: 2, duplicates: 0, pending: 0, dead: 0, clock: "09:00:30" });
  assert.deepEqual(await page.$$eval("[data-testid=effect]", (items) => items.map((li) => li.innerText.split(" at ")[0])), [
    "REF-1 budget locked for trip-001:1:0",
    "REF-2 budget locked for trip-001:1:0",
  ]);
  assert.equal(await page.$$eval("[data-testid=duplicate]", (e) => e.length), 0);
  // Switched back, the same story drops the duplicate again.
  await click("idempotency-switch");
  for (const step of ["request", "crash", "advance", "deliver"]) await click(step);
  assert.deepEqual(await counters(), { deliveries: 4, sideEffects: 3, duplicates: 1, pending: 0, dead: 0, clock: "09:01:00" });
  noProblems();
});

test("switched to no idempotency first, the tour asks for it back before it promises a dropped duplicate", async () => {
  await page.setViewportSize(DESKTOP);
  await reset();
  await click("idempotency-switch");
  assert.equal(await highlighted(), "idempotency");
  assert.match(await read("[data-testid=next]"), /off first/);
  await click("idempotency-switch");
  assert.equal(await highlighted(), "request");
  // A tour walked past "nothing is due" ends saying which step it skipped.
  for (const step of ["request", "crash", "advance", "deliver", "idempotency-switch", "request", "crash", "advance", "deliver"]) await click(step);
  assert.match(await text("next"), /^Done Tour complete, but you skipped “Deliver” \(the command is still leased/);
  noProblems();
});

test("the page runs where storage is refused or full, and a damaged saved state is discarded, not drawn", async () => {
  await page.setViewportSize(DESKTOP);
  const steps = ["request", "crash", "advance", "deliver", "request", "crash", "advance", "deliver"];
  // Site data blocked: every touch of localStorage throws.
  const blocked = await context.newPage();
  await blocked.addInitScript(() => {
    Object.defineProperty(window, "localStorage", { get: () => { throw new DOMException("blocked", "SecurityError"); } });
  });
  const blockedErrors = [];
  blocked.on("pageerror", (error) => blockedErrors.push(error.message));
  await blocked.goto(server.url);
  await blocked.waitForSelector("#status[data-ready=true]", { timeout: 15_000 });
  await blocked.click("[data-testid=request]");
  assert.equal(await blocked.textContent("[data-testid=pending]"), "1", "it runs, unsaved");
  assert.deepEqual(blockedErrors, []);
  await blocked.close();
  // Storage full: saving fails every time, and the slider keeps every step all the same.
  const full = await context.newPage();
  await full.addInitScript(() => {
    Storage.prototype.setItem = () => { throw new DOMException("full", "QuotaExceededError"); };
  });
  await full.goto(server.url);
  await full.waitForSelector("#status[data-ready=true]", { timeout: 15_000 });
  await full.click("[data-testid=reset]");
  for (const step of steps) await full.click(`[data-testid=${step}]`);
  assert.equal(await full.getAttribute("#time-travel", "max"), String(steps.length), "one point per step");
  await full.close();
  // A saved state whose tour and explanation are damaged is drawn with fresh ones, not left on
  // "loading"; an unreadable one is discarded.
  await reset();
  await page.evaluate(() => dispatchEvent(new Event("pagehide"))); // saves now, not a moment later
  await page.evaluate(() => {
    const saved = JSON.parse(localStorage.getItem("miniflow-playground-v2"));
    const state = JSON.parse(saved.history[saved.cursor].state);
    Object.assign(state, { tour: null, explain: null });
    saved.history[saved.cursor].state = JSON.stringify(state);
    localStorage.setItem("miniflow-playground-v2", JSON.stringify(saved));
  });
  await open();
  assert.equal(await highlighted(), "request");
  await page.evaluate(() => localStorage.setItem("miniflow-playground-v2", JSON.stringify({ history: [null], cursor: 0, logs: {} })));
  await open();
  assert.equal(await highlighted(), "request");
  assert.equal(await text("pending"), "0");
  noProblems();
});

test("the time-travel slider restores the state after any past action; acting there drops the later steps; the state survives a reload", async () => {
  await page.setViewportSize(DESKTOP);
  await reset();
  for (const step of ["request", "crash", "deliver", "advance", "deliver"]) await click(step);
  const slider = "[data-testid=time-travel]";
  assert.equal(await page.getAttribute(slider, "max"), "5");
  assert.match(await text("time-travel-label"), /^5 \/ 5 · 09:00:30 · after Deliver · delivery 2 \(redelivery\)$/);
  assert.equal(await page.isHidden("[data-testid=time-travel-past]"), true);

  // Back three steps with the keyboard: the state right after the crash.
  await page.focus(slider);
  for (let i = 0; i < 3; i += 1) await page.keyboard.press("ArrowLeft");
  assert.match(await text("time-travel-label"), /^2 \/ 5 · 09:00:00 · after Crash before ack · delivery 1$/);
  assert.deepEqual(await counters(), { deliveries: 1, sideEffects: 1, duplicates: 0, pending: 1, dead: 0, clock: "09:00:00" });
  assert.match(await read("[data-testid=outbox]"), /trip-001:1:0 lock_budget leased 1 worker, token 1, until 09:00:30/);
  assert.equal(await page.$$eval("[data-testid=seq-group]", (g) => g.length), 2);
  assert.equal(await page.$$eval("[data-testid=duplicate]", (e) => e.length), 0);
  assert.equal(await page.$$eval("[data-testid=lost-ack]", (e) => e.length), 1);
  assert.equal(await text("time-travel-past"), "You are looking at the past. The next action continues from here and drops the 3 later steps. Back to the latest");
  assert.equal(await highlighted(), "deliver", "the guide follows the restored state");

  // Forward to the latest again.
  await click("time-travel-latest");
  assert.deepEqual(await counters(), { deliveries: 2, sideEffects: 1, duplicates: 1, pending: 0, dead: 0, clock: "09:00:30" });

  // Back to the very start: every panel is empty again.
  await page.focus(slider);
  await page.keyboard.press("Home");
  assert.match(await text("time-travel-label"), /^0 \/ 5 · 09:00:00 · after nothing yet \(start\)$/);
  assert.match(await read("[data-testid=transactions]"), /No transaction yet/);

  // To the state after the request, and deliver normally from there: a new branch.
  await page.keyboard.press("ArrowRight");
  assert.deepEqual(await counters(), { deliveries: 0, sideEffects: 0, duplicates: 0, pending: 1, dead: 0, clock: "09:00:00" });
  await click("deliver");
  assert.equal(await page.getAttribute(slider, "max"), "2", "the later steps were dropped");
  assert.deepEqual(await counters(), { deliveries: 1, sideEffects: 1, duplicates: 0, pending: 0, dead: 0, clock: "09:00:00" });
  assert.equal(await page.isHidden("[data-testid=time-travel-past]"), true);

  // The history and the store survive a reload.
  await page.reload();
  await page.waitForSelector("#status[data-ready=true]");
  assert.equal(await page.getAttribute(slider, "max"), "2");
  assert.deepEqual(await counters(), { deliveries: 1, sideEffects: 1, duplicates: 0, pending: 0, dead: 0, clock: "09:00:00" });
  await page.focus(slider);
  await page.keyboard.press("ArrowLeft");
  assert.deepEqual(await counters(), { deliveries: 0, sideEffects: 0, duplicates: 0, pending: 1, dead: 0, clock: "09:00:00" }, "the restored past after a reload");
  assert.deepEqual(await page.$$eval("[data-testid=seq-group]", (groups) => groups.map((g) => g.querySelector(".seq-step b").textContent)), ["Request trip-001 (成都)"]);
  await page.keyboard.press("ArrowRight");
  assert.deepEqual(await page.$$eval("[data-testid=seq-group]", (groups) => groups.map((g) => g.querySelector(".seq-step b").textContent)), ["Request trip-001 (成都)", "Deliver · delivery 1"]);
  noProblems();
});

test("a delivery refused for good ends dead, and a retry by hand delivers it", async () => {
  await page.setViewportSize(DESKTOP);
  await reset();
  await click("request");
  await click("fail-next");
  assert.equal(await page.getAttribute("[data-testid=fail-next]", "aria-pressed"), "true");
  await click("deliver");
  assert.equal((await counters()).dead, 1);
  assert.match(await read("[data-testid=outbox]"), /trip-001:1:0 lock_budget dead 1 – – 422 refused by the supplier/);
  assert.match(await read("[data-testid=calls]"), /delivery 1 key trip-001:1:0 attempt 1 422 refused by the supplier refused/);
  await click("deliver");
  assert.match(await text("explain"), /^Nothing is due: 1 dead command waits for a person/);
  await click("retry");
  assert.deepEqual(await counters(), { deliveries: 1, sideEffects: 0, duplicates: 0, pending: 1, dead: 0, clock: "09:00:00" });
  await click("deliver");
  assert.deepEqual(await counters(), { deliveries: 2, sideEffects: 1, duplicates: 0, pending: 0, dead: 0, clock: "09:00:00" });
  noProblems();
});

test("the saga is drawn as per-trip timelines: commits with what they wrote, results flowing back, the deadline, withdrawals", async () => {
  await page.setViewportSize(DESKTOP);
  assert.match(await read("[data-testid=saga]"), /^Press “Run the trip booking saga”/);
  await click("run-saga");
  const trip = (id) => read(`[data-testid=saga-${id}]`);
  const entries = (id, kind) => page.$$eval(`[data-testid=saga-${id}] [data-entry=${kind}]`, (items) => items.map((li) => li.innerText.replace(/\s+/g, " ").trim()));

  const one = await trip("trip-001");
  for (const fact of [
    "trip-001 成都 cancelled",
    "0.0 min ● #1 trip_requested · 成都 + command trip-001:1:0 lock_budget + command trip-001:1:1 book_flight (reports its result) + command trip-001:1:2 book_hotel (reports its result) + timer hotel_deadline, fires at 30.0 min",
    "0.0 min → trip-001:1:1 book_flight attempt 1: done → FL-001",
    "0.0 min → trip-001:1:2 book_hotel attempt 1: 503 hotel busy → retry at 1.0 min",
    "1.0 min → trip-001:1:2 book_hotel attempt 2: 422 hotel fully booked → dead",
    "1.0 min → trip-001:3:1 cancel_flight FL-001 attempt 1: done",
    "flight FL-001, hotel –",
  ]) {
    assert.ok(one.includes(fact), `trip-001's timeline lacks "${fact}":\n${one}`);
  }
  // The flight's reference flows back as command_completed; the dead hotel booking as command_failed,
  // whose commit releases the budget, cancels the flight with its reference and stops the deadline.
  assert.deepEqual(await entries("trip-001", "result"), [
    "0.0 min ↩ #2 command_completed: trip-001:1:1 book_flight → FL-001 fed back to the trip by trip-001:1:1:completed",
  ]);
  assert.deepEqual(await entries("trip-001", "failure"), [
    "1.0 min ↩ #3 command_failed: trip-001:1:2 book_hotel — 422 hotel fully booked fed back to the trip by trip-001:1:2:failed1 + command trip-001:3:0 release_budget + command trip-001:3:1 cancel_flight FL-001 ⊘ timer hotel_deadline cancelled",
  ]);

  // trip-002: the deadline fires while the hotel is still retrying; the trip withdraws the booking.
  const two = await trip("trip-002");
  assert.ok(two.includes("30.0 min ◷ trip-002:1:t0 hotel_deadline fired"), two);
  assert.deepEqual(await entries("trip-002", "deadline"), [
    "30.0 min ◷ #3 timer_fired: hotel_deadline + command trip-002:3:0 release_budget + command trip-002:3:1 cancel_flight FL-002 ⊘ trip-002:1:2 book_hotel withdrawn → cancelled (its next attempt was due at 35.0 min)",
  ]);
  assert.deepEqual(await entries("trip-002", "withdrawn"), ["⊘ trip-002:1:2 book_hotel withdrawn → cancelled (its next attempt was due at 35.0 min)"]);
  assert.equal((await entries("trip-002", "attempt")).filter((a) => a.includes("book_hotel attempt")).length, 6, "six hotel attempts, then none");
  assert.ok(!/cancel_hotel/.test(two), "the withdrawn hotel was never booked, so nothing cancels it");
  assert.ok(two.includes("trip-002:1:2 book_hotel cancelled 6 attempts"), two);
  assert.ok(two.includes("Cancelled: the hotel did not confirm within 30 minutes."), two);

  // trip-003: the hotel books on its second try; its result stops the deadline.
  const three = await trip("trip-003");
  for (const fact of ["trip-003 杭州 booked", "flight FL-003, hotel HT-003", "budget released no", "trip-003:1:t0 hotel_deadline cancelled"]) {
    assert.ok(three.includes(fact), `trip-003's timeline lacks "${fact}":\n${three}`);
  }
  assert.deepEqual((await entries("trip-003", "result")).map((r) => r.replace(/ fed back to the trip by \S+/, "")), [
    "0.0 min ↩ #2 command_completed: trip-003:1:1 book_flight → FL-003",
    "1.0 min ↩ #3 command_completed: trip-003:1:2 book_hotel → HT-003 ⊘ timer hotel_deadline cancelled",
  ]);

  const results = await page.$$eval("[data-testid=saga] [data-entry=result]", (items) => items.length);
  assert.equal(results, 4, "one command_completed per completed booking");
  assert.equal(await read("[data-testid=saga-totals]"), "pending 0 dead 1 (without their command_failed: 0) withdrawn 1 finished at 30.0 min");
  // A withdrawn command is marked up like the outbox's cancelled rows.
  const cancelled = await page.$$eval("[data-testid=saga-trip-002] .status.cancelled", (spans) => spans.map((s) => getComputedStyle(s).textDecorationLine));
  assert.ok(cancelled.length >= 2 && cancelled.every((d) => d === "line-through"), `cancelled is struck through: ${cancelled}`);
  noProblems();
});

test("at 390 px nothing overflows sideways and the panels stack; phone screenshot", async () => {
  await page.setViewportSize(PHONE);
  await reset();
  for (const step of ["request", "crash", "deliver", "advance", "deliver"]) await click(step);
  await click("run-saga");
  await page.waitForSelector("[data-testid=saga-trip-003]");
  const overflow = await page.evaluate(() => ({
    page: document.documentElement.scrollWidth,
    viewport: window.innerWidth,
    outside: [...document.querySelectorAll("body *")]
      .filter((e) => e.getClientRects().length && e.getBoundingClientRect().right > window.innerWidth + 0.5)
      .map((e) => `${e.tagName.toLowerCase()}.${e.className}: ${e.textContent.slice(0, 40)}`),
  }));
  assert.equal(overflow.viewport, 390);
  assert.equal(overflow.page, 390, "no horizontal scrolling");
  assert.deepEqual(overflow.outside, [], "no element reaches past the right edge");
  assert.deepEqual(await outside("[data-testid=sequence]"), [], "every message and note stays inside the sequence view");
  const box = async (selector) => page.locator(selector).boundingBox();
  const [transactions, supplier] = [await box("section:has(> [data-testid=transactions])"), await box("section:has(> [data-testid=calls])")];
  assert.ok(supplier.y >= transactions.y + transactions.height && supplier.x === transactions.x, "transactions and supplier are stacked");
  const [first, second] = [await box("[data-testid=saga-trip-001]"), await box("[data-testid=saga-trip-002]")];
  assert.ok(second.y >= first.y + first.height, "the trips' timelines are stacked");
  assert.equal(await page.$eval("[data-testid=outbox] thead", (e) => getComputedStyle(e).display), "none", "the outbox table turns into cards");
  assert.equal(await page.$eval("[data-testid=outbox] td", (e) => getComputedStyle(e).display), "grid");
  await page.evaluate(() => window.scrollTo(0, 0));
  mkdirSync(output, { recursive: true });
  await page.screenshot({ path: join(output, "playground-phone.png"), fullPage: true });
  noProblems();
});

test("the favicon is served, and CJK city names and the page's symbols draw as glyphs, not boxes", async () => {
  await page.setViewportSize(DESKTOP);
  await open();
  const icon = await page.getAttribute("link[rel=icon]", "href");
  const response = await page.request.get(new URL(icon, server.url).href);
  assert.equal(response.status(), 200);
  assert.equal(response.headers()["content-type"], "image/svg+xml");
  assert.match(await response.text(), /^<svg /);

  await reset();
  await click("request");
  // Draws each character with the font the page gives the city name; a character no font has draws as
  // the same empty box as an unassigned code point (U+0378).
  const drawn = await page.$eval("[data-testid=tx-trip-001-1] .payload", (element) => {
    const font = getComputedStyle(element).fontFamily;
    const ink = (character) => {
      const canvas = document.createElement("canvas");
      canvas.width = 48;
      canvas.height = 48;
      const g = canvas.getContext("2d");
      g.font = `32px ${font}`;
      g.fillText(character, 4, 38);
      return canvas.toDataURL();
    };
    const missing = ink("\u0378");
    return { font, city: element.textContent, glyphs: Object.fromEntries([..."成都✕↩◷⊘●→✓①"].map((c) => [c, ink(c) !== missing])), distinct: ink("成") !== ink("都") };
  });
  assert.match(drawn.city, /成都/);
  assert.match(drawn.font, /WenQuanYi Micro Hei/, "the font stack names a CJK fallback");
  assert.ok(Object.values(drawn.glyphs).every(Boolean), `every character has a glyph: ${JSON.stringify(drawn.glyphs)}`);
  assert.ok(drawn.distinct, "成 and 都 draw differently");
  noProblems();
});
