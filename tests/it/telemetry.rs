//! Spans and metrics: what a subscriber and a recorder see of a commit and its deliveries. Each case
//! runs in a child process of its own, where it installs the global subscriber or recorder, so no
//! other test's spans or counts mix in.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::child;
use miniflow::prelude::*;
use miniflow::telemetry as names;
use miniflow::{
    json, ClaimRequest, Clock, Command, Commit, Decision, Delivery, Dispatcher, Engine, Event,
    EventRecord, ManualClock, Outcome, RetryPolicy, Seq, SqliteStore, Timer, Timestamp,
    TraceContext, Workflow, WorkflowId,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn commit(store: &mut SqliteStore, workflow: &str, kinds: &[&str], trace: Option<&TraceContext>) {
    let id = WorkflowId::new(workflow).unwrap();
    let last = store.load(&id).unwrap().last().map_or(Seq::ZERO, |e| e.seq);
    let decision: Decision = kinds
        .iter()
        .map(|kind| Command::new(*kind, json!({})))
        .collect::<Vec<_>>()
        .into();
    let mut commit = Commit::new(id, last, Event::new("start", json!({})), decision, T0).unwrap();
    if let Some(trace) = trace {
        commit = commit.traced(trace.clone());
    }
    store.append_with_commands(&commit).unwrap();
}

// ----------------------------------------------------------------------------------------------------
// Spans

/// A span as a subscriber saw it: its name, its fields (as last recorded) and its parent.
#[derive(Debug, Clone)]
struct Seen {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<usize>,
}

impl Seen {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

/// Collects every span in order; a span's index is kept in its extensions.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<Seen>>>);

struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Collect {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let span = ctx.span(id).expect("a new span");
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Index>().map(|i| i.0));
        let mut seen = self.0.lock().unwrap();
        span.extensions_mut().insert(Index(seen.len()));
        seen.push(Seen {
            name: attrs.metadata().name(),
            fields,
            parent,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        values.record(&mut Fields(&mut self.0.lock().unwrap()[index].fields));
    }
}

/// The spans of a commit and its deliveries follow the messaging conventions, name the workflow,
/// carry the producer's trace context, and nest: receive → process → the handler's own span, and
/// the failure's settle span inside its process span.
#[test]
fn spans_follow_the_messaging_conventions_and_nest() {
    let child = child::spawn("telemetry::child_spans", "spans", &[]);
    let out = child::wait_ok(child, "the span child");
    assert!(out.contains("spans checked"), "{out}");
}

#[test]
fn child_spans() {
    if child::role().as_deref() != Some("spans") {
        return;
    }
    let collect = Collect::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(collect.clone()))
        .expect("the only subscriber of this process");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spans.db");
    let mut store = SqliteStore::open(&path).unwrap();
    let producer: TraceContext = PRODUCER.parse().unwrap();
    commit(&mut store, "trip-7", &["book", "charge"], Some(&producer));
    let stats = Dispatcher::sqlite(&path, |d: &Delivery| {
        let _own = tracing::info_span!("handler", kind = %d.kind).entered();
        match d.kind.as_str() {
            "book" => Outcome::Done,
            _ => Outcome::permanent("card refused"),
        }
    })
    .name("w")
    .run_until_idle()
    .unwrap();
    assert_eq!((stats.completed, stats.dead), (1, 1));

    let seen = collect.0.lock().unwrap().clone();
    let named = |name: &str| -> Vec<(usize, &Seen)> {
        seen.iter()
            .enumerate()
            .filter(|(_, s)| s.name == name)
            .collect()
    };
    let print = || format!("{seen:#?}");
    for span in seen.iter().filter(|s| s.name != "handler") {
        assert_eq!(span.field("messaging.system"), "miniflow", "{span:?}");
        assert!(
            span.field("miniflow.workflow.id").contains("trip-7"),
            "{span:?}"
        );
    }

    let send = named("send");
    assert_eq!(send.len(), 1, "{}", print());
    let send = send[0].1;
    assert_eq!(send.field("messaging.operation.type"), "send");
    assert_eq!(send.field("messaging.batch.message_count"), "2");
    assert_eq!(send.field("miniflow.traceparent"), PRODUCER);
    assert_eq!(send.field("miniflow.event.seq"), "1");
    assert_eq!(send.field("error.type"), "", "it committed");

    let receive = named("receive");
    assert_eq!(receive.len(), 1, "idle polls make no span: {}", print());
    let (receive_at, receive) = receive[0];
    assert_eq!(receive.field("messaging.operation.type"), "receive");
    assert_eq!(receive.field("messaging.batch.message_count"), "2");
    assert_eq!(receive.field("messaging.client.id"), "w-0");

    let process = named("process");
    assert_eq!(process.len(), 2, "{}", print());
    for (_, span) in &process {
        assert_eq!(span.parent, Some(receive_at), "{span:?}");
        assert_eq!(span.field("messaging.operation.type"), "process");
        assert_eq!(span.field("miniflow.attempt"), "1");
        assert_eq!(span.field("miniflow.traceparent"), PRODUCER);
    }
    let by_id = |id: &str| {
        *process
            .iter()
            .find(|(_, s)| s.field("messaging.message.id") == id)
            .unwrap_or_else(|| panic!("no process span of {id}: {}", print()))
    };
    let (book_at, book) = by_id("trip-7:1:0");
    let (charge_at, charge) = by_id("trip-7:1:1");
    assert_eq!(book.field("messaging.destination.name"), "book");
    assert_eq!(book.field("error.type"), "");
    assert_eq!(charge.field("messaging.destination.name"), "charge");
    assert_eq!(charge.field("error.type"), "permanent");

    let handlers = named("handler");
    let parents: Vec<Option<usize>> = handlers.iter().map(|(_, s)| s.parent).collect();
    assert_eq!(
        parents,
        [Some(book_at), Some(charge_at)],
        "the handler runs inside its process span"
    );

    let settle = named("settle");
    let fail = settle
        .iter()
        .find(|(_, s)| s.field("messaging.operation.name") == "fail")
        .unwrap_or_else(|| panic!("no fail span: {}", print()));
    assert_eq!(fail.1.parent, Some(charge_at));
    assert_eq!(fail.1.field("error.type"), "dead");
    assert_eq!(fail.1.field("messaging.message.id"), "trip-7:1:1");
    let complete = settle
        .iter()
        .find(|(_, s)| s.field("messaging.operation.name") == "complete")
        .unwrap_or_else(|| panic!("no complete span: {}", print()));
    assert_eq!(
        complete.1.parent,
        Some(receive_at),
        "acks are settled for the batch"
    );
    assert_eq!(complete.1.field("messaging.batch.message_count"), "1");
    assert_eq!(complete.1.field("error.type"), "");
    println!("spans checked");
}

// ----------------------------------------------------------------------------------------------------
// Metrics

/// One series a recorder holds: its name, its labels and its value.
type Series = (
    String,
    Vec<(String, String)>,
    metrics_util::debugging::DebugValue,
);

/// Every counter, gauge and histogram a run records, read from a global debugging recorder.
struct Recorded(Vec<Series>);

impl Recorded {
    fn take(snapshotter: &metrics_util::debugging::Snapshotter) -> Self {
        Self(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| {
                    let key = key.key();
                    let labels = key
                        .labels()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect();
                    (key.name().to_owned(), labels, value)
                })
                .collect(),
        )
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a metrics_util::debugging::DebugValue> + 'a {
        self.0.iter().filter_map(move |(n, l, value)| {
            let wanted = labels
                .iter()
                .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v));
            (n == name && wanted).then_some(value)
        })
    }

    /// The sum of the counters called `name` with (at least) `labels`.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.matching(name, labels)
            .map(|value| match value {
                metrics_util::debugging::DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// This snapshot and a `later` one, as one: a snapshot takes what was recorded since the last
    /// (counters and gauges are reset by it, histograms drained).
    fn then(mut self, later: Recorded) -> Self {
        self.0.extend(later.0);
        self
    }

    /// The gauge called `name` with (at least) `labels`, if it was ever set (its latest value).
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).last().map(|value| match value {
            metrics_util::debugging::DebugValue::Gauge(v) => v.into_inner(),
            other => panic!("{name} is not a gauge: {other:?}"),
        })
    }

    /// Every value recorded in the histograms called `name` with (at least) `labels`.
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.matching(name, labels)
            .flat_map(|value| match value {
                metrics_util::debugging::DebugValue::Histogram(values) => {
                    values.iter().map(|v| v.into_inner()).collect::<Vec<_>>()
                }
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .collect()
    }
}

/// A workflow whose `start` sets an alarm; the alarm decides nothing.
struct Alarm;

impl Workflow for Alarm {
    type State = ();
    fn evolve(&self, _: &mut (), _: &EventRecord) {}
    fn decide(&self, _: &(), event: &EventRecord) -> Decision {
        match event.kind.as_str() {
            "start" => {
                Decision::new().timer(Timer::after("alarm", Duration::from_secs(1), json!({})))
            }
            _ => Decision::none(),
        }
    }
}

/// After a run with a success, a retry, a dead letter, a stale ack, a conflict, a timer and a purge,
/// a recorder holds each count, under the documented names and labels.
#[test]
fn a_recorder_counts_retries_dead_letters_stale_acks_conflicts_timers_and_purges() {
    let child = child::spawn("telemetry::child_metrics", "metrics", &[]);
    let out = child::wait_ok(child, "the metrics child");
    assert!(out.contains("metrics checked"), "{out}");
}

#[test]
fn child_metrics() {
    if child::role().as_deref() != Some("metrics") {
        return;
    }
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this process");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.db");
    let mut store = SqliteStore::open(&path).unwrap();
    commit(&mut store, "w", &["ok", "flaky", "doomed"], None);
    let clock = Arc::new(ManualClock::new(T0));
    let policy = RetryPolicy::default()
        .initial_delay(Duration::from_secs(1))
        .jitter(0.0);
    let flaky_calls = Arc::new(Mutex::new(0));
    let calls = flaky_calls.clone();
    let deliver = move |d: &Delivery| match d.kind.as_str() {
        "flaky" => {
            let mut calls = calls.lock().unwrap();
            *calls += 1;
            if *calls == 1 {
                Outcome::retry("503")
            } else {
                Outcome::Done
            }
        }
        "doomed" => Outcome::permanent("422"),
        _ => Outcome::Done,
    };
    let dispatcher = |clock: &Arc<ManualClock>| {
        Dispatcher::sqlite(&path, deliver.clone())
            .clock(clock.clone())
            .retry_policy(policy.clone())
            .workflow(Engine::new(Alarm))
    };
    // `ok` done, `flaky` back for a retry, `doomed` dead (and its `command_failed` timer fired).
    dispatcher(&clock).run_until_idle().unwrap();
    clock.advance(Duration::from_secs(2));
    let stats = dispatcher(&clock).run_until_idle().unwrap();
    assert_eq!(stats.completed, 1, "the retry of flaky");

    // A stale ack: the handler stalls past its lease and a rival takes the command over.
    commit(&mut store, "slow", &["stalls"], None);
    let (rival_clock, rival_path) = (clock.clone(), path.clone());
    Dispatcher::sqlite(&path, move |_: &Delivery| {
        rival_clock.advance(Duration::from_secs(61));
        let mut rival = SqliteStore::open(&rival_path).unwrap();
        let request = ClaimRequest::new("rival").lease_ttl(Duration::from_secs(60));
        assert_eq!(rival.claim(&request, rival_clock.now()).unwrap().len(), 1);
        Outcome::Done
    })
    .clock(clock.clone())
    .lease_ttl(Duration::from_secs(60))
    .run_until_idle()
    .unwrap();

    // A commit that lost its race, a timer that fired, and a purge.
    let stale = Commit::new(
        WorkflowId::new("w").unwrap(),
        Seq::ZERO,
        Event::new("late", json!({})),
        Decision::none(),
        T0,
    )
    .unwrap();
    assert!(store.append_with_commands(&stale).is_err());
    Engine::new(Alarm)
        .handle(
            &mut store,
            &WorkflowId::new("alarm").unwrap(),
            Event::new("start", json!({})),
            clock.now(),
        )
        .unwrap();
    clock.advance(Duration::from_secs(2));
    dispatcher(&clock).run_until_idle().unwrap();
    let purged = store.purge_done(Duration::ZERO, clock.now(), 100).unwrap();
    assert_eq!(purged, 2, "ok and flaky are done");
    // A finished workflow, retired.
    commit(&mut store, "finished", &[], None);
    let retired = store
        .purge_finished(Duration::ZERO, clock.now(), 100)
        .unwrap();
    assert!(retired >= 1, "{retired}");

    // The gauges: set by hand from the stats, then by a dispatcher as it delivers the last command.
    commit(&mut store, "later", &["waiting"], None);
    let mut gauges = miniflow::OutboxGauges::default();
    gauges.record(&store.stats(clock.now()).unwrap());
    let by_hand = Recorded::take(&snapshotter);
    let depth = |seen: &Recorded, status: &str, kind: &str| {
        seen.gauge(names::OUTBOX_DEPTH, &[("status", status), ("kind", kind)])
    };
    assert_eq!(depth(&by_hand, "pending", "waiting"), Some(1.0));
    assert_eq!(depth(&by_hand, "dead", "doomed"), Some(1.0));
    assert_eq!(depth(&by_hand, "leased", "stalls"), Some(1.0));
    assert_eq!(
        depth(&by_hand, "pending", "ok"),
        None,
        "done kinds are not counted"
    );
    let waited = (clock.now().as_millis() - T0.as_millis()) as f64 / 1_000.0;
    assert_eq!(
        by_hand.gauge(names::OUTBOX_LAG, &[("kind", "waiting")]),
        Some(waited)
    );
    assert_eq!(
        by_hand.gauge(names::OUTBOX_LAG, &[("kind", "stalls")]),
        Some(0.0),
        "not due"
    );
    Dispatcher::sqlite(&path, |_: &Delivery| Outcome::Done)
        .clock(clock.clone())
        .report_stats(Duration::from_millis(10))
        .run_until_idle()
        .unwrap();
    let after = Recorded::take(&snapshotter);
    assert_eq!(depth(&after, "pending", "waiting"), Some(0.0), "delivered");
    assert_eq!(
        after.gauge(names::OUTBOX_LAG, &[("kind", "waiting")]),
        Some(0.0)
    );
    assert_eq!(depth(&after, "dead", "doomed"), Some(1.0));

    let seen = by_hand.then(after);
    let dump = || format!("{:#?}", seen.0);
    let kind = |k: &'static str| [("kind", k)];
    assert_eq!(
        seen.counter(names::DELIVERY_ATTEMPTS, &kind("ok")),
        1,
        "{}",
        dump()
    );
    assert_eq!(seen.counter(names::DELIVERY_ATTEMPTS, &kind("flaky")), 2);
    assert_eq!(seen.counter(names::COMPLETED, &kind("ok")), 1);
    assert_eq!(seen.counter(names::COMPLETED, &kind("flaky")), 1);
    assert_eq!(seen.counter(names::RETRIES, &kind("flaky")), 1);
    assert_eq!(seen.counter(names::RETRIES, &kind("ok")), 0);
    assert_eq!(seen.counter(names::DEAD_LETTERS, &kind("doomed")), 1);
    assert_eq!(seen.counter(names::LOST_LEASES, &kind("stalls")), 1);
    assert_eq!(seen.counter(names::COMPLETED, &kind("stalls")), 0);
    assert_eq!(seen.counter(names::COMMIT_CONFLICTS, &[]), 1);
    // The failure feedback of `doomed` and the alarm.
    assert_eq!(seen.counter(names::TIMERS_DUE, &[]), 2);
    assert_eq!(seen.counter(names::TIMERS_FIRED, &[]), 2);
    assert_eq!(seen.counter(names::ROWS_PURGED, &[]), 2);
    assert_eq!(seen.counter(names::WORKFLOWS_RETIRED, &[]), retired as u64);

    let attempts = seen.histogram(names::DELIVERY_ATTEMPT, &kind("flaky"));
    assert_eq!(attempts, [1.0, 2.0]);
    // flaky's retry was due 1 s after its failure and claimed 2 s after it.
    let delays = seen.histogram(names::CLAIM_DELAY, &kind("flaky"));
    assert_eq!(delays, [0.0, 1.0], "{}", dump());
    let outcomes: Vec<(&str, usize)> = ["done", "retry", "permanent"]
        .into_iter()
        .map(|outcome| {
            let labels = [("outcome", outcome)];
            (
                outcome,
                seen.histogram(names::DELIVERY_DURATION, &labels).len(),
            )
        })
        .collect();
    assert_eq!(outcomes, [("done", 4), ("retry", 1), ("permanent", 1)]);
    for (name, _, _) in &seen.0 {
        assert!(
            names::METRICS.iter().any(|m| m.name == name.as_str()),
            "{name} is not documented"
        );
    }

    // The writer's groups: one request holds the writer while three queue behind it, and the three
    // are committed together, in one transaction.
    Recorded::take(&snapshotter);
    let writer = store
        .writer()
        .expect("a SQLite store writes through its writer")
        .clone();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let (answer, answered) = std::sync::mpsc::channel();
    let (inside, entered) = std::sync::mpsc::channel();
    let done = answer.clone();
    writer.submit(
        move |_| {
            inside.send(()).unwrap();
            held.recv().unwrap();
            Ok(())
        },
        move |r| done.send(r).unwrap(),
    );
    entered.recv().unwrap();
    for _ in 0..3 {
        let done = answer.clone();
        writer.submit(|_| Ok(()), move |r| done.send(r).unwrap());
    }
    release.send(()).unwrap();
    for _ in 0..4 {
        answered.recv().unwrap().unwrap();
    }
    let groups = Recorded::take(&snapshotter);
    assert_eq!(groups.histogram(names::WRITER_GROUP_SIZE, &[]), [1.0, 3.0]);
    let took = groups.histogram(names::WRITER_TRANSACTION, &[]);
    assert!(took.len() == 2 && took.iter().all(|s| *s > 0.0), "{took:?}");
    println!("metrics checked");
}

/// The README's metrics table is `telemetry::METRICS`, row by row: names, types, units, labels and
/// help texts cannot drift from what the hosts record and describe.
#[test]
fn the_readme_documents_every_metric_as_recorded() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md")).unwrap();
    let rows: Vec<String> = readme
        .lines()
        .filter(|l| l.starts_with("| `miniflow_"))
        .map(str::to_owned)
        .collect();
    let expected: Vec<String> = names::METRICS
        .iter()
        .map(|m| {
            let labels = if m.labels.is_empty() {
                "—".to_owned()
            } else {
                m.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let kind = format!("{:?}", m.kind).to_lowercase();
            format!(
                "| `{}` | {kind} | {} | {labels} | {} |",
                m.name, m.unit, m.help
            )
        })
        .collect();
    assert_eq!(rows, expected);
}
