//! W3C trace context (`traceparent`, `tracestate`): the trace a command was committed in, stored with
//! it and handed to its handler, so one trace runs from the producer through the outbox to the
//! receiver.
//!
//! The core only parses, validates and formats the context and derives child span IDs; it never makes
//! random IDs (it has no randomness) and never talks to a tracing system. Hosts create root contexts
//! and record spans.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::Error;

/// A W3C trace context (<https://www.w3.org/TR/trace-context/>): the `traceparent` (trace ID, parent
/// span ID, flags) and the vendors' optional `tracestate`.
///
/// Attach one to a commit ([`crate::Commit::traced`], [`crate::Engine::handle_traced`]); every
/// command of the commit stores it ([`crate::OutboxRow::trace_context`]) and each delivery hands it
/// to the handler ([`crate::Delivery::trace_context`]), which continues the trace (e.g. sends a
/// `traceparent` header made with [`TraceContext::child`]).
///
/// ```
/// use miniflow_core::TraceContext;
///
/// let producer: TraceContext = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse()?;
/// assert_eq!(producer.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(producer.sampled());
///
/// // The span of one delivery: same trace, a span ID derived from what it is.
/// let delivery = producer.child("trip-001:1:0#1");
/// assert_eq!(delivery.trace_id(), producer.trace_id());
/// assert_ne!(delivery.span_id(), producer.span_id());
/// assert_eq!(delivery, producer.child("trip-001:1:0#1"), "the same seed gives the same span");
///
/// let bad = "00-00000000000000000000000000000000-00f067aa0ba902b7-01".parse::<TraceContext>();
/// assert!(bad.unwrap_err().to_string().contains("traceparent"));
/// # Ok::<(), miniflow_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "TraceContextText", into = "TraceContextText")]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
    state: Option<String>,
}

/// The longest `tracestate` kept, in bytes (the W3C limit a vendor must propagate).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// The most list members a `tracestate` may hold.
const MAX_TRACESTATE_MEMBERS: usize = 32;
/// The `sampled` bit of the trace flags.
const SAMPLED: u8 = 0x01;

impl TraceContext {
    /// A context of trace `trace_id` whose parent span is `span_id`, with the W3C trace `flags` (bit 0:
    /// sampled), without `tracestate`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (field `traceparent`) for an all-zero trace or span ID, which W3C
    /// declares invalid.
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Result<Self, Error> {
        let context = Self {
            trace_id,
            span_id,
            flags,
            state: None,
        };
        if trace_id == [0; 16] {
            return Err(invalid_parent(
                &context.traceparent(),
                "the trace ID is all zeros",
            ));
        }
        if span_id == [0; 8] {
            return Err(invalid_parent(
                &context.traceparent(),
                "the parent ID is all zeros",
            ));
        }
        Ok(context)
    }

    /// Parses a `traceparent` header value and, if given, a `tracestate` header value. A `traceparent`
    /// of a later version is read by the rules of version `00` and formatted as version `00`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming `traceparent` or `tracestate`, the value and what is wrong with
    /// it; never a panic, whatever the input.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, Error> {
        let context = parse_traceparent(traceparent)?;
        context.with_tracestate(tracestate)
    }

    /// This context with `tracestate` (`None`, or a header value that is empty or only spaces and
    /// commas, leaves it without).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (field `tracestate`) for a value longer than [`MAX_TRACESTATE_LEN`]
    /// bytes, with more than 32 members, or with a member that is not `key=value` by the W3C rules.
    pub fn with_tracestate(mut self, tracestate: Option<&str>) -> Result<Self, Error> {
        self.state = match tracestate {
            None => None,
            Some(text) => check_tracestate(text)?,
        };
        Ok(self)
    }

    /// The 16-byte trace ID.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The 8-byte ID of the span this context was taken in (the parent of what continues it).
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace ID as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span ID as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the producer recorded its part of the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The `traceparent` header value: `00-{trace id}-{span id}-{flags}`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.span_id_hex(),
            self.flags
        )
    }

    /// The `tracestate` header value, if the context has one.
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// A context for a span below this one: the same trace, flags and `tracestate`, and a span ID
    /// derived from this context and `seed` (the first 8 bytes of SHA-256 over the trace ID, the span
    /// ID and the seed). Seed it with what names the child uniquely — a command ID and its attempt —
    /// and the same delivery gets the same span ID on every host, without a random number generator.
    pub fn child(&self, seed: impl AsRef<[u8]>) -> Self {
        let digest = Sha256::new()
            .chain_update(self.trace_id)
            .chain_update(self.span_id)
            .chain_update(seed.as_ref())
            .finalize();
        let mut span_id = [0; 8];
        span_id.copy_from_slice(&digest[..8]);
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        Self {
            span_id,
            ..self.clone()
        }
    }

    /// This context with `span_id` as its span (a child made by a tracing system).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (field `traceparent`) for an all-zero span ID.
    pub fn with_span_id(&self, span_id: [u8; 8]) -> Result<Self, Error> {
        let mut child = Self::new(self.trace_id, span_id, self.flags)?;
        child.state.clone_from(&self.state);
        Ok(child)
    }
}

impl fmt::Display for TraceContext {
    /// The `traceparent` header value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent())
    }
}

impl FromStr for TraceContext {
    type Err = Error;

    /// Parses a `traceparent` header value (see [`TraceContext::parse`]).
    fn from_str(traceparent: &str) -> Result<Self, Error> {
        parse_traceparent(traceparent)
    }
}

/// How a [`TraceContext`] is written in JSON: its two header values.
#[derive(Serialize, Deserialize)]
struct TraceContextText {
    traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
}

impl TryFrom<TraceContextText> for TraceContext {
    type Error = Error;

    fn try_from(text: TraceContextText) -> Result<Self, Error> {
        TraceContext::parse(&text.traceparent, text.tracestate.as_deref())
    }
}

impl From<TraceContext> for TraceContextText {
    fn from(context: TraceContext) -> Self {
        Self {
            traceparent: context.traceparent(),
            tracestate: context.state,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The value of one lowercase hex digit.
fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// `text` as bytes, two lowercase hex digits each; `None` unless it is exactly `N` bytes' worth.
fn unhex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = hex_digit(pair[0])? << 4 | hex_digit(pair[1])?;
    }
    Some(out)
}

/// The offending value in an error: at most 80 characters of it.
fn shown(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

fn invalid_parent(text: &str, reason: &str) -> Error {
    Error::invalid("traceparent", shown(text), reason)
}

fn parse_traceparent(text: &str) -> Result<TraceContext, Error> {
    let bytes = text.as_bytes();
    let fail = |reason: &str| Err(invalid_parent(text, reason));
    if bytes.len() < 55 {
        return fail(
            "must be 55 characters: 00-{32 hex trace ID}-{16 hex parent ID}-{2 hex flags}",
        );
    }
    let Some(version) = unhex::<1>(&bytes[..2]) else {
        return fail("the version is not two lowercase hex digits");
    };
    match version[0] {
        0xff => return fail("version ff is invalid"),
        0x00 if bytes.len() != 55 => return fail("a version 00 value is exactly 55 characters"),
        // A later version may append fields after a dash; its first fields read as version 00.
        _ if bytes.len() > 55 && bytes[55] != b'-' => {
            return fail("fields after the flags must follow a dash")
        }
        _ => {}
    }
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return fail("the fields must be separated by dashes");
    }
    let Some(trace_id) = unhex::<16>(&bytes[3..35]) else {
        return fail("the trace ID is not 32 lowercase hex digits");
    };
    let Some(span_id) = unhex::<8>(&bytes[36..52]) else {
        return fail("the parent ID is not 16 lowercase hex digits");
    };
    let Some([flags]) = unhex::<1>(&bytes[53..55]) else {
        return fail("the flags are not two lowercase hex digits");
    };
    if trace_id == [0; 16] {
        return fail("the trace ID is all zeros");
    }
    if span_id == [0; 8] {
        return fail("the parent ID is all zeros");
    }
    Ok(TraceContext {
        trace_id,
        span_id,
        flags,
        state: None,
    })
}

/// The `tracestate` to keep: `None` for an empty list, the value without surrounding blanks otherwise.
fn check_tracestate(text: &str) -> Result<Option<String>, Error> {
    let fail = |reason: String| Err(Error::invalid("tracestate", shown(text), reason));
    let trimmed = text.trim_matches([' ', '\t']);
    if trimmed.len() > MAX_TRACESTATE_LEN {
        return fail(format!(
            "is {} bytes, the limit is {MAX_TRACESTATE_LEN}",
            trimmed.len()
        ));
    }
    let mut members = 0;
    for member in trimmed.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        members += 1;
        if members > MAX_TRACESTATE_MEMBERS {
            return fail(format!("has more than {MAX_TRACESTATE_MEMBERS} members"));
        }
        let Some((key, value)) = member.split_once('=') else {
            return fail(format!("member {member:?} is not key=value"));
        };
        if !valid_key(key) {
            return fail(format!(
                "key {key:?} must start with a lowercase letter or digit and hold only a-z, 0-9, _, -, *, / and one @"
            ));
        }
        if !valid_value(value) {
            return fail(format!(
                "value {value:?} must be 1 to 256 printable ASCII characters without , or = and not end with a space"
            ));
        }
    }
    Ok((members > 0).then(|| trimmed.to_owned()))
}

fn valid_key(key: &str) -> bool {
    let allowed = |c: char| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-' | '*' | '/');
    let part = |p: &str, max: usize| {
        !p.is_empty()
            && p.len() <= max
            && p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && p.chars().all(allowed)
    };
    match key.split_once('@') {
        None => part(key, 256),
        Some((tenant, system)) => part(tenant, 241) && part(system, 14),
    }
}

fn valid_value(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 256
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn refused(traceparent: &str, tracestate: Option<&str>) -> (&'static str, String) {
        match TraceContext::parse(traceparent, tracestate) {
            Err(Error::InvalidInput { field, reason, .. }) => (field, reason),
            other => panic!("{traceparent:?} / {tracestate:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn a_traceparent_reads_and_formats_back() {
        let context =
            TraceContext::parse(PARENT, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.traceparent(), PARENT);
        assert_eq!(context.to_string(), PARENT);
        assert_eq!(context.span_id_hex(), "00f067aa0ba902b7");
        assert_eq!(context.flags(), 1);
        assert_eq!(
            context.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        let unsampled: TraceContext = PARENT.replace("-01", "-00").parse().unwrap();
        assert!(!unsampled.sampled());
        // A later version is read as 00, extra fields and all, and written as 00.
        let later = TraceContext::parse(
            &format!("{}-what-comes-next", PARENT.replacen("00", "cc", 1)),
            None,
        )
        .unwrap();
        assert_eq!(later.traceparent(), PARENT);
        // Blank tracestates are no tracestate.
        assert_eq!(
            TraceContext::parse(PARENT, Some(" , "))
                .unwrap()
                .tracestate(),
            None
        );
    }

    #[test]
    fn bad_traceparents_are_refused_naming_the_field_and_never_panic() {
        let cases = [
            ("", "55 characters"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "55 characters",
            ),
            (&PARENT.replacen("00", "ff", 1), "version ff"),
            (&PARENT.replacen("00", "0g", 1), "version"),
            (&format!("{PARENT}-x"), "exactly 55"),
            (
                &PARENT.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32)),
                "trace ID is all zeros",
            ),
            (
                &PARENT.replace("00f067aa0ba902b7", &"0".repeat(16)),
                "parent ID is all zeros",
            ),
            (&PARENT.replace("4bf9", "4BF9"), "trace ID is not"),
            (&PARENT.replace("00f0", "00fz"), "parent ID is not"),
            (&PARENT.replace("-01", "-1x"), "flags"),
            (&PARENT.replacen('-', "_", 1), "dashes"),
            (
                &format!("{}xyz", PARENT.replacen("00", "01", 1)),
                "follow a dash",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é",
                "flags",
            ),
            (&"é".repeat(40), "version"),
        ];
        for (text, reason) in cases {
            let (field, why) = refused(text, None);
            assert_eq!(field, "traceparent", "{text:?}");
            assert!(why.contains(reason), "{text:?}: {why}");
        }
        let long = "x".repeat(10_000);
        let message = long.parse::<TraceContext>().unwrap_err().to_string();
        assert!(message.len() < 300, "the value is shortened: {message}");
    }

    #[test]
    fn bad_tracestates_are_refused_naming_the_field() {
        let many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE_LEN));
        for state in [
            "novalue",
            "Upper=1",
            "k=a,b",
            "k=",
            "k=del\u{7f}",
            "k=tab\t1",
            &many,
            &long,
            "@x=1",
            "a@b@c=1",
        ] {
            let (field, _) = refused(PARENT, Some(state));
            assert_eq!(field, "tracestate", "{state:?}");
        }
        for state in ["k=v", "tenant@sys=v", " a=1 , b=2", "a-b*c/d_e=x y"] {
            assert!(
                TraceContext::parse(PARENT, Some(state)).is_ok(),
                "{state:?}"
            );
        }
    }

    #[test]
    fn children_keep_the_trace_and_derive_their_span_from_the_seed() {
        let parent = TraceContext::parse(PARENT, Some("k=v")).unwrap();
        let a = parent.child("w:1:0#1");
        let b = parent.child("w:1:0#2");
        assert_eq!(a.trace_id(), parent.trace_id());
        assert_eq!(a.tracestate(), Some("k=v"));
        assert_eq!(a.flags(), parent.flags());
        assert_ne!(a.span_id(), parent.span_id());
        assert_ne!(a.span_id(), b.span_id());
        assert_eq!(a, parent.child("w:1:0#1"));
        let grandchild = a.child("w:1:0#1");
        assert_ne!(
            grandchild.span_id(),
            a.span_id(),
            "the parent's span is part of the seed"
        );
        assert!(parent.with_span_id([0; 8]).is_err());
        assert_eq!(parent.with_span_id([1; 8]).unwrap().span_id(), [1; 8]);
        assert!(TraceContext::new([0; 16], [1; 8], 1).is_err());
    }

    #[test]
    fn json_holds_the_two_header_values_and_is_checked_when_read() {
        let context = TraceContext::parse(PARENT, Some("k=v")).unwrap();
        let json = serde_json::to_value(&context).unwrap();
        assert_eq!(
            json,
            serde_json::json!({ "traceparent": PARENT, "tracestate": "k=v" })
        );
        assert_eq!(
            serde_json::from_value::<TraceContext>(json).unwrap(),
            context
        );
        let bad = serde_json::json!({ "traceparent": "00-nonsense" });
        let error = serde_json::from_value::<TraceContext>(bad)
            .unwrap_err()
            .to_string();
        assert!(error.contains("traceparent"), "{error}");
    }
}
