// The miniflow playground: the trip workflow of the design article, in WebAssembly, in the browser.
import init, { Engine, MemoryStore } from "./pkg/miniflow.js";
import { runSaga } from "./saga.js";

const STORAGE_KEY = "miniflow-playground-v1";
const LEASE_MS = 30_000;
const CITIES = ["成都", "西安", "杭州", "大理", "青岛"];

/** The trip workflow: a requested trip locks a budget, once. */
const tripWorkflow = {
  init: () => ({ requested: false }),
  evolve: (trip, event) => (event.kind === "trip_requested" ? { ...trip, requested: true } : trip),
  decide: (trip, event) =>
    event.kind === "trip_requested" && !trip.requested
      ? [{ kind: "lock_budget", payload: { trip_id: event.workflow_id, city: event.payload.city } }]
      : [],
};

let app;

function fresh() {
  return {
    store: new MemoryStore(),
    clock: Date.UTC(2026, 0, 1, 9, 0, 0),
    supplier: { results: {}, effects: [] },
    trips: 0,
    failNext: false,
    log: [],
  };
}

function load() {
  const saved = localStorage.getItem(STORAGE_KEY);
  if (!saved) return fresh();
  try {
    const data = JSON.parse(saved);
    return { ...data, store: MemoryStore.fromSnapshot(data.snapshot) };
  } catch (error) {
    console.warn("discarding an unreadable saved playground:", error);
    return fresh();
  }
}

function save() {
  const { store, ...rest } = app;
  localStorage.setItem(STORAGE_KEY, JSON.stringify({ ...rest, snapshot: store.exportSnapshot() }));
}

/** A supplier that remembers results by idempotency key: a repeat gets the first answer back. */
function supply(delivery) {
  const known = app.supplier.results[delivery.command_id];
  if (known) return { reference: known, replayed: true };
  const reference = `REF-${app.supplier.effects.length + 1}`;
  app.supplier.results[delivery.command_id] = reference;
  app.supplier.effects.push({ command_id: delivery.command_id, reference, at: app.clock });
  return { reference, replayed: false };
}

function note(text) {
  app.log.unshift(`${time(app.clock)} ${text}`);
  app.log.length = Math.min(app.log.length, 40);
}

function claim(limit) {
  return app.store.claim({ worker: "browser", limit, leaseTtlMs: LEASE_MS }, app.clock);
}

const actions = {
  request() {
    app.trips += 1;
    const trip = `trip-${String(app.trips).padStart(3, "0")}`;
    const city = CITIES[(app.trips - 1) % CITIES.length];
    const handled = engine.handle(app.store, trip, { kind: "trip_requested", payload: { city } }, app.clock);
    note(`${trip} requested (${city}): committed event ${handled.seq} with ${handled.command_ids.join(", ")}`);
  },
  deliver() {
    const due = claim(20);
    if (due.length === 0) note("nothing is due");
    for (const delivery of due) {
      if (app.failNext) {
        app.failNext = false;
        const settled = app.store.fail(delivery.command_id, delivery.token, { error: "422 refused by the supplier", retryable: false }, undefined, app.clock);
        note(`${delivery.command_id} attempt ${delivery.attempt}: refused for good → ${settled.outcome}`);
        continue;
      }
      const { reference, replayed } = supply(delivery);
      app.store.complete(delivery.command_id, delivery.token, app.clock);
      note(`${delivery.command_id} attempt ${delivery.attempt}: ${reference}${replayed ? " (replayed, no new effect)" : ""} → done`);
    }
  },
  crash() {
    const [delivery] = claim(1);
    if (!delivery) return note("nothing is due");
    const { reference } = supply(delivery);
    note(`${delivery.command_id} attempt ${delivery.attempt}: supplier did ${reference}, then the worker crashed before the ack; the lease runs out in ${LEASE_MS / 1000} s`);
  },
  advance() {
    app.clock += 30_000;
    note("clock +30 s");
  },
  failNext() {
    app.failNext = !app.failNext;
    note(app.failNext ? "the next delivery will be refused for good" : "the next delivery will succeed");
  },
  retry() {
    const dead = app.store.deadLetters();
    if (dead.length === 0) note("no dead command");
    for (const row of dead) {
      app.store.retry(row.command_id, app.clock);
      note(`${row.command_id} put back by hand`);
    }
  },
  reset() {
    localStorage.removeItem(STORAGE_KEY);
    app = fresh();
    note("reset");
  },
};

function time(ms) {
  return new Date(ms).toISOString().slice(11, 19);
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function render() {
  const rows = [];
  for (let n = 1; n <= app.trips; n += 1) rows.push(...app.store.commands(`trip-${String(n).padStart(3, "0")}`));
  const outbox = document.getElementById("outbox");
  outbox.replaceChildren(
    ...rows.map((row) => {
      const tr = document.createElement("tr");
      const expired = row.status === "leased" && row.lease.expires_at <= app.clock;
      const lease = row.status === "leased" ? `${row.lease.owner} #${row.lease.token} until ${time(row.lease.expires_at)}${expired ? " (expired)" : ""}` : "–";
      const next = row.status === "pending" || row.status === "leased" ? time(row.available_at) : "–";
      tr.append(cell(row.command_id), cell(row.kind), cell(row.status, row.status), cell(String(row.attempts)), cell(lease), cell(next), cell(row.last_error ?? "–"));
      return tr;
    }),
  );
  const events = [];
  for (let n = 1; n <= app.trips; n += 1) events.push(...app.store.load(`trip-${String(n).padStart(3, "0")}`));
  document.getElementById("events").replaceChildren(
    ...events.map((e) => Object.assign(document.createElement("li"), { textContent: `${e.workflow_id} #${e.seq} ${e.kind} ${JSON.stringify(e.payload)}` })),
  );
  document.getElementById("effects").replaceChildren(
    ...app.supplier.effects.map((e) => Object.assign(document.createElement("li"), { textContent: `${e.reference} for ${e.command_id} at ${time(e.at)}` })),
  );
  document.getElementById("log").replaceChildren(...app.log.map((line) => Object.assign(document.createElement("li"), { textContent: line })));
  document.getElementById("clock").textContent = time(app.clock);
  document.getElementById("pending").textContent = String(app.store.pending().length);
  document.getElementById("dead").textContent = String(app.store.deadLetters().length);
  document.getElementById("side-effects").textContent = String(app.supplier.effects.length);
  document.getElementById("fail-next").classList.toggle("armed", app.failNext);
}

function act(name) {
  try {
    actions[name]();
  } catch (error) {
    note(`error ${error.code ?? ""}: ${error.message}`);
  }
  save();
  render();
}

await init();
const engine = new Engine(tripWorkflow);
app = load();
for (const [id, name] of Object.entries({ request: "request", deliver: "deliver", crash: "crash", advance: "advance", "fail-next": "failNext", retry: "retry", reset: "reset" })) {
  document.getElementById(id).addEventListener("click", () => act(name));
}
/** The saga's report, with each command's status marked up like the outbox table's. */
function renderSaga(lines) {
  const status = / (pending|leased|done|dead|cancelled)(?= attempts=)| withdrawn → (cancelled)/;
  document.getElementById("saga").replaceChildren(
    ...lines.flatMap((line) => {
      const match = status.exec(line);
      if (!match) return [`${line}\n`];
      const word = match[1] ?? match[2];
      const at = match.index + match[0].length - word.length;
      const span = Object.assign(document.createElement("span"), { className: `status ${word}`, textContent: word });
      return [line.slice(0, at), span, `${line.slice(at + word.length)}\n`];
    }),
  );
}

document.getElementById("run-saga").addEventListener("click", () => renderSaga(runSaga()));
render();
const status = document.getElementById("status");
status.textContent = "ready";
status.dataset.ready = "true";
