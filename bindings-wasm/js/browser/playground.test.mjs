// Browser test of the playground: Debian's Chromium, driven by playwright-core, loads the page from
// 127.0.0.1, clicks through the crash-before-ack scenario, and checks the page shows one side effect
// and no pending command — also after a reload. Runs the trip booking saga and checks its report: a
// flight reference flowing back into the trip and out again in cancel_flight, and a hotel booking
// withdrawn (cancelled) while it was still retrying. Saves a screenshot under test-output/.
import test from "node:test";
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

test("the playground folds a redelivery after a crash before the ack into one side effect; its saga feeds results back and withdraws a retrying booking", async () => {
  const server = await serve(www);
  const context = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "miniflow-chromium-")), {
    executablePath: browserPath,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    const errors = [];
    page.on("pageerror", (error) => errors.push(error.message));
    await page.goto(server.url);
    await page.waitForSelector("#status[data-ready=true]", { timeout: 15_000 });
    const text = (id) => page.textContent(`[data-testid=${id}]`);
    const click = (id) => page.click(`[data-testid=${id}]`);

    await click("reset");
    await click("request");
    assert.equal(await text("pending"), "1");
    await click("crash"); // the supplier books, the ack is lost
    assert.equal(await text("side-effects"), "1");
    assert.match(await page.textContent("[data-testid=outbox]"), /leased/);
    await click("deliver"); // the lease still holds: nothing is due
    assert.equal(await text("pending"), "1");
    await click("advance"); // the lease runs out
    await click("deliver"); // redelivered with the same command ID: the supplier replays
    assert.equal(await text("side-effects"), "1", "the redelivery made no second effect");
    assert.equal(await text("pending"), "0");
    assert.match(await page.textContent("[data-testid=log]"), /replayed, no new effect/);

    await click("request");
    await click("fail-next");
    await click("deliver");
    assert.equal(await text("dead"), "1", "a permanent failure ends dead");
    await click("retry");
    await click("deliver");
    assert.equal(await text("dead"), "0");
    assert.equal(await text("side-effects"), "2");

    await click("run-saga");
    const saga = await text("saga");
    for (const line of [
      "trip-001:1:2 book_hotel attempt 2: 422 hotel fully booked → dead",
      "3 command_failed",
      "trip-001:1:t0 hotel_deadline cancelled",
      "state: cancelled (book_hotel failed: 422 hotel fully booked); budget released: true; flight cancelled: true",
      "trip-002:1:t0 fired: timer_fired",
      "trip-002:1:t0 hotel_deadline fired",
      "state: cancelled (the hotel did not confirm within 30 minutes); budget released: true; flight cancelled: true",
      "pending: 0",
      "dead: 1 (unexplained: 0)",
      // The flight's reference flows back: acked with completeWith, fed back once as command_completed,
      // kept in the trip's state, carried by cancel_flight.
      "trip-001:1:1 book_flight attempt 1: done → {\"reference\":\"FL-001\"}",
      "trip-001:1:1:completed fired: command_completed",
      '2 command_completed {"attempts":1,"command_id":"trip-001:1:1","kind":"book_flight","result":{"reference":"FL-001"}}',
      "trip-001:3:1 cancel_flight FL-001 attempt 1: done",
      "trip-002:3:1 cancel_flight FL-002 done attempts=1",
      "references: flight FL-002, hotel –",
      // trip-002's hotel, still retrying when the deadline fired, is withdrawn instead of booked later.
      "trip-002:1:2 book_hotel withdrawn → cancelled (its next attempt was due at 35.0 min)",
      "trip-002:1:2 book_hotel cancelled attempts=6 (503 hotel busy)",
      "withdrawn: trip-002:1:2 book_hotel after 6 attempts, never delivered again",
      "cancelled: 1",
      // trip-003's hotel books in time: its result stops the deadline.
      "trip-003:1:t0 hotel_deadline cancelled",
      "state: booked; budget released: false; flight cancelled: false",
      "references: flight FL-003, hotel HT-003",
    ]) {
      assert.ok(saga.includes(line), `the saga report lacks "${line}":\n${saga}`);
    }
    assert.ok(!/trip-002:\S+ cancel_hotel/.test(saga), "the withdrawn hotel was never booked, so nothing cancels it");
    assert.equal(saga.match(/fired: command_completed/g).length, 4, "one feedback per completed booking");
    // The cancelled command is visible: its status is marked up like the outbox table's.
    const marked = await page.$$eval("[data-testid=saga] .status.cancelled", (spans) =>
      spans.map((span) => [span.textContent, getComputedStyle(span).textDecorationLine]),
    );
    assert.deepEqual(marked, [["cancelled", "line-through"], ["cancelled", "line-through"]], "the withdrawal and the outbox row");

    await page.reload();
    await page.waitForSelector("#status[data-ready=true]");
    assert.equal(await text("side-effects"), "2", "the state survives a reload");
    assert.equal(await text("pending"), "0");
    mkdirSync(output, { recursive: true });
    await page.screenshot({ path: join(output, "playground.png"), fullPage: true });
    assert.deepEqual(errors, []);
  } finally {
    await context.close();
    server.stop();
  }
});
