//! Writing to stdout and stderr without ever panicking: `println!` panics when the reader of a pipe has
//! gone (`conveyor stats | head -3`), and a panic in the middle of a redrive or of the Lambda runner would
//! abandon work half-way for the sake of a line nobody reads any more.
//!
//! # Design note: a closed pipe
//!
//! Every line the CLI prints goes through [`out!`](crate::out) / [`outln!`](crate::outln) (stdout) and
//! [`errln!`](crate::errln) (stderr). When a write fails because the reader is gone (`EPIPE`), that stream
//! is marked closed and everything later written to it is dropped, quietly: the command still finishes
//! what it was doing (a redrive is not left half-way, the Lambda runner keeps deleting what succeeded),
//! and the exit code is the command's own: 0 when it succeeded. That is what `| head` users expect (no
//! `Broken pipe` noise, no failure), without the conventional death by `SIGPIPE` (exit 141), which would
//! stop a state-changing command at an arbitrary point. Any other write error (a full disk) is kept and
//! turned into exit code 1 by `main`, after the work is done.
//!
//! # Design note: text from producers
//!
//! Failure reasons, bodies, `last_error` and progress come from whoever sent the job. Written raw, an
//! escape sequence in them would rewrite the operator's terminal (move the cursor, hide lines, set the
//! clipboard through OSC 52). So every write here shows control characters other than a newline and a
//! tab as `\u001b`-style escapes: readable on a terminal, and the same JSON escape inside a JSON
//! string (serde_json already escapes C0 controls; this catches DEL and the C1 controls it leaves raw).

use std::fmt;
use std::io::{self, Write as _};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout's reader is gone (or stdout failed): later output is dropped.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
/// Set once stderr's reader is gone (or stderr failed).
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);
/// The first write error that was not a closed pipe, reported by `main` at exit.
static WRITE_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Writes to stdout; a closed pipe ends stdout's output quietly. Use [`out!`](crate::out).
pub(crate) fn write_stdout(args: fmt::Arguments<'_>) {
    let text = terminal_safe(args);
    unless_closed(&STDOUT_CLOSED, "stdout", || {
        io::stdout().lock().write_all(text.as_bytes())
    });
}

/// Writes to stderr; a closed pipe ends stderr's output quietly. Use [`errln!`](crate::errln).
pub(crate) fn write_stderr(args: fmt::Arguments<'_>) {
    let text = terminal_safe(args);
    unless_closed(&STDERR_CLOSED, "stderr", || {
        io::stderr().lock().write_all(text.as_bytes())
    });
}

/// `args` with every control character but a newline and a tab escaped (see the design note).
fn terminal_safe(args: fmt::Arguments<'_>) -> String {
    let text = args.to_string();
    if !text.chars().any(escaped) {
        return text;
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if escaped(c) {
            safe.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            safe.push(c);
        }
    }
    safe
}

fn escaped(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// Flushes stdout (whose lines may still sit in its buffer) with the same rules as a write.
pub(crate) fn flush_stdout() {
    unless_closed(&STDOUT_CLOSED, "stdout", || io::stdout().lock().flush());
}

/// Runs `operation` on `stream` unless it is closed, and records its failure.
fn unless_closed(closed: &AtomicBool, stream: &str, operation: impl FnOnce() -> io::Result<()>) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    if let Err(error) = operation() {
        failed(closed, stream, &error);
    }
}

/// The first write error other than a closed pipe, if any.
pub(crate) fn write_error() -> Option<String> {
    WRITE_ERROR.lock().ok().and_then(|error| error.clone())
}

fn failed(closed: &AtomicBool, stream: &str, error: &io::Error) {
    closed.store(true, Ordering::Relaxed);
    if error.kind() == io::ErrorKind::BrokenPipe {
        return;
    }
    if let Ok(mut first) = WRITE_ERROR.lock() {
        first.get_or_insert_with(|| format!("writing to {stream} failed: {error}"));
    }
}

/// `print!` that never panics (see the module's design note).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdio::write_stdout(format_args!($($arg)*)) };
}

/// `println!` that never panics (see the module's design note).
#[macro_export]
macro_rules! outln {
    () => { $crate::stdio::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdio::write_stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that never panics (see the module's design note).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::stdio::write_stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

#[cfg(test)]
mod tests {
    use super::terminal_safe;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        let osc52 = "\u{1b}]52;c;ZXZpbA==\u{7}";
        assert_eq!(
            terminal_safe(format_args!("reason: {osc52}\n")),
            "reason: \\u001b]52;c;ZXZpbA==\\u0007\n"
        );
        assert_eq!(
            terminal_safe(format_args!("a\rb\u{9b}2J\u{7f}")),
            "a\\u000db\\u009b2J\\u007f"
        );
        assert_eq!(terminal_safe(format_args!("tab\there\n")), "tab\there\n");
        // Inside a JSON string the escape is JSON's own: the value reads back unchanged.
        let json = serde_json::to_string(&"\u{9b}x").unwrap_or_default();
        let safe = terminal_safe(format_args!("{json}"));
        assert_eq!(
            serde_json::from_str::<String>(&safe).ok().as_deref(),
            Some("\u{9b}x")
        );
    }
}
