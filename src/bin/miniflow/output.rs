//! What the tool prints, and how it stops: tables whose cells cannot forge rows or take over the
//! terminal, JSON lists one element per line, times for people (RFC 3339, or the number itself when
//! it has none), and passwords left out of every message.

use std::borrow::Cow;
use std::io::{self, Write};
use std::time::{Duration, UNIX_EPOCH};

use miniflow::{Error, InvalidInput, OutboxRow, Timestamp};

/// Why the tool stops early.
pub enum Stop {
    /// What went wrong, for the operator.
    Failed(String),
    /// Writing the output failed; a closed pipe (`| head`) ends the tool quietly.
    Output(io::Error),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Self {
        Stop::Output(e)
    }
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e.to_string())
    }
}

impl From<InvalidInput> for Stop {
    fn from(e: InvalidInput) -> Self {
        Stop::Failed(e.to_string())
    }
}

impl From<String> for Stop {
    fn from(message: String) -> Self {
        Stop::Failed(message)
    }
}

/// What a command returns.
pub type Done = Result<(), Stop>;

/// The latest time RFC 3339 can write (four-digit years): the last millisecond of the year 9999.
/// The latest `--now` the tool takes.
pub const LATEST: Timestamp = Timestamp::from_millis(253_402_300_799_999);

/// `t` for a person: RFC 3339 in UTC with milliseconds; a time past [`LATEST`] (which only a
/// damaged or hand-edited store holds) as its number of milliseconds, saying so.
pub fn when(t: Timestamp) -> String {
    if t > LATEST {
        return format!(
            "{} ms since the Unix epoch (past the year 9999)",
            t.as_millis()
        );
    }
    let at = UNIX_EPOCH + Duration::from_millis(t.as_millis());
    humantime::format_rfc3339_millis(at).to_string()
}

/// `text` with every password left out: a URL's (`scheme://user:***@host`), and the value of every
/// setting whose name ends in `password` (`password=***`, `sslpassword=***`, quoted or not, in a
/// URL's query or a `key=value` string).
pub fn redact(text: &str) -> String {
    let text = miniflow::redact_password(text);
    const KEY: &str = "password";
    let (lower, bytes) = (text.to_ascii_lowercase(), text.as_bytes());
    let (mut out, mut kept, mut at) = (String::with_capacity(text.len()), 0, 0);
    while let Some(found) = lower[at..].find(KEY) {
        let mut start = at + found + KEY.len();
        at = start;
        while bytes.get(start).is_some_and(u8::is_ascii_whitespace) {
            start += 1;
        }
        if bytes.get(start) != Some(&b'=') {
            continue;
        }
        start += 1;
        while bytes.get(start).is_some_and(u8::is_ascii_whitespace) {
            start += 1;
        }
        let end = if bytes.get(start) == Some(&b'\'') {
            // Quoted, up to the closing quote that no backslash escapes.
            let mut end = start + 1;
            while end < bytes.len() && !(bytes[end] == b'\'' && bytes[end - 1] != b'\\') {
                end += 1;
            }
            (end + 1).min(bytes.len())
        } else {
            text[start..]
                .find(|c: char| c == '&' || c == '\'' || c.is_whitespace())
                .map_or(text.len(), |len| start + len)
        };
        if text[start..end] == *"***" {
            at = end;
            continue;
        }
        out.push_str(&text[kept..start]);
        out.push_str("***");
        (kept, at) = (end, end);
    }
    out.push_str(&text[kept..]);
    out
}

/// Whether a character is shown escaped in a table: control characters (which move the cursor,
/// recolour the terminal or start a new line) and the invisible marks that reorder text on screen.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` for a table cell: every [`hidden`] character escaped (`\n`, `\u{1b}`), so a field cannot
/// forge a row or take over the terminal.
pub fn cell(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            shown.extend(c.escape_debug());
        } else {
            shown.push(c);
        }
    }
    Cow::Owned(shown)
}

/// Pretty JSON for a person: serde_json escapes the C0 controls; the other [`hidden`] characters
/// (which can only be inside strings) become `\uXXXX` escapes too, so the text means the same JSON.
pub fn pretty_json(text: serde_json::Result<String>) -> Result<String, Stop> {
    let text = text.map_err(|e| e.to_string())?;
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if hidden(c) && c > '\u{7e}' {
            shown.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            shown.push(c);
        }
    }
    Ok(shown)
}

/// Prints one JSON value (from `serde_json::to_string`) on its own line.
pub fn json_line(out: &mut impl Write, text: serde_json::Result<String>) -> Done {
    let text = text.map_err(|e| e.to_string())?;
    writeln!(out, "{text}")?;
    Ok(())
}

/// A JSON array written as it goes, one element per line: `[`, the elements separated by commas,
/// `]`; `[]` when it stays empty.
pub struct JsonList<'a, W: Write> {
    out: &'a mut W,
    empty: bool,
}

impl<'a, W: Write> JsonList<'a, W> {
    pub fn new(out: &'a mut W) -> Self {
        Self { out, empty: true }
    }

    pub fn push(&mut self, text: serde_json::Result<String>) -> Done {
        let text = text.map_err(|e| e.to_string())?;
        let before = if self.empty { "[\n" } else { ",\n" };
        self.empty = false;
        write!(self.out, "{before}{text}")?;
        Ok(())
    }

    pub fn end(self) -> Done {
        writeln!(self.out, "{}", if self.empty { "[]" } else { "\n]" })?;
        Ok(())
    }
}

pub fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// A value of a row as stored (`show --raw`) as text: text as it is, NULL as `NULL`, anything else
/// as its JSON.
pub fn text_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "NULL".to_owned(),
        other => other.to_string(),
    }
}

/// A row the store holds but cannot read (edited by hand, or damaged).
pub struct Unreadable {
    /// Its ID as stored (`workflow_id:event_seq:idx`).
    pub command_id: String,
    /// Its stored status.
    pub status: String,
    /// Why it cannot be read.
    pub error: String,
}

impl Unreadable {
    /// The JSON report of the row: `{"unreadable": {…}}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "unreadable": {
            "command_id": self.command_id,
            "status": self.status,
            "error": self.error,
        }})
    }
}

/// Prints the rows that read, then the ones that do not: in a section of their own in a table, as
/// `{"unreadable": {…}}` elements after the rows in JSON. With unreadable rows the tool ends with
/// status 1 after printing everything.
pub fn print_rows(
    out: &mut impl Write,
    rows: &[OutboxRow],
    unreadable: &[Unreadable],
    json: bool,
) -> Done {
    if json {
        let mut list = JsonList::new(out);
        for row in rows {
            list.push(serde_json::to_string(row))?;
        }
        for row in unreadable {
            list.push(serde_json::to_string(&row.to_json()))?;
        }
        list.end()?;
    } else {
        writeln!(
            out,
            "{:<40} {:<16} {:<8} {:>8}  last error",
            "command", "kind", "status", "attempts"
        )?;
        for row in rows {
            writeln!(
                out,
                "{:<40} {:<16} {:<8} {:>8}  {}",
                cell(&row.command_id.to_string()),
                cell(&row.kind),
                row.status.to_string(),
                row.attempts,
                cell(row.last_error.as_deref().unwrap_or("-")),
            )?;
        }
        writeln!(out, "({})", plural(rows.len(), "command"))?;
        if !unreadable.is_empty() {
            writeln!(out)?;
            print_unreadable_table(out, unreadable)?;
        }
    }
    unreadable_found(unreadable)
}

/// The unreadable section of a table.
pub fn print_unreadable_table(out: &mut impl Write, unreadable: &[Unreadable]) -> Done {
    writeln!(
        out,
        "unreadable ({}; `miniflow show --raw DB ID` prints what is stored):",
        plural(unreadable.len(), "command")
    )?;
    writeln!(out, "{:<40} {:<8}  error", "command", "status")?;
    for row in unreadable {
        writeln!(
            out,
            "{:<40} {:<8}  {}",
            cell(&row.command_id),
            cell(&row.status),
            cell(&row.error)
        )?;
    }
    Ok(())
}

/// Ends the tool with status 1 when there is any unreadable row.
pub fn unreadable_found(unreadable: &[Unreadable]) -> Done {
    if unreadable.is_empty() {
        return Ok(());
    }
    Err(Stop::Failed(format!(
        "{} could not be read (listed as unreadable); `miniflow show --raw DB ID` prints what \
         is stored",
        plural(unreadable.len(), "command")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_is_shown_and_those_past_the_year_9999_as_their_number() {
        assert_eq!(when(Timestamp::EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(when(LATEST), "9999-12-31T23:59:59.999Z");
        let past = Timestamp::from_millis(LATEST.as_millis() + 1);
        assert_eq!(
            when(past),
            "253402300800000 ms since the Unix epoch (past the year 9999)"
        );
        assert_eq!(
            when(Timestamp::from_millis(u64::MAX)),
            "18446744073709551615 ms since the Unix epoch (past the year 9999)"
        );
    }

    #[test]
    fn passwords_are_left_out_of_every_form() {
        for (given, shown) in [
            ("mysql://u:s3cret@h/x", "mysql://u:***@h/x"),
            ("host=h password=s3cret", "host=h password=***"),
            (
                "host=h password = s3cret port=1",
                "host=h password = *** port=1",
            ),
            (
                "host=h PASSWORD='s3 \\' cret' x=1",
                "host=h PASSWORD=*** x=1",
            ),
            ("sslpassword=s3cret host=h", "sslpassword=*** host=h"),
            (
                "redis://h/?password=s3cret&db=1",
                "redis://h/?password=***&db=1",
            ),
            (
                "error: unexpected argument 'password=s3cret' found",
                "error: unexpected argument 'password=***' found",
            ),
            (
                "a password is best left to PGPASSWORD",
                "a password is best left to PGPASSWORD",
            ),
            ("password=", "password=***"),
        ] {
            assert_eq!(redact(given), shown, "{given:?}");
        }
    }
}
