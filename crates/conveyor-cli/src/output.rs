//! How results are printed: human-readable tables (the default, `--output table`), the same with every
//! table as tab-separated values for `cut` and `awk` (`--output text`, as in the AWS CLI), or one JSON
//! document (`--output json`).
//!
//! Results go to stdout; progress lines and warnings go to stderr, so `--output json` stays parseable.

use std::fmt::Write as _;

use clap::ValueEnum;

/// The output format chosen with `--output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Aligned tables and sentences for people.
    #[default]
    Table,
    /// As `table`, with each table as tab-separated values and no header row, for scripts.
    Text,
    /// One JSON document on stdout (one per line for streams), for scripts.
    Json,
}

/// When log lines are coloured (`--color`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Color {
    /// Only when stderr is a terminal and `NO_COLOR` is not set (<https://no-color.org>).
    #[default]
    Auto,
    /// Always, even into a file or a pipe (for `less -R`).
    Always,
    /// Never.
    Never,
}

impl Color {
    /// True when log lines written to stderr should carry ANSI colour codes.
    pub(crate) fn enabled(self) -> bool {
        use std::io::IsTerminal as _;
        match self {
            Color::Always => true,
            Color::Never => false,
            Color::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
                    && std::io::stderr().is_terminal()
            }
        }
    }
}

/// Prints one JSON document.
pub(crate) fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    crate::outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints what a command did: `value` as one JSON document with `--output json`, else `sentence` (on
/// stderr with `--output text`, see [`say`]).
pub(crate) fn print_done(format: Format, value: serde_json::Value, sentence: &str) -> anyhow::Result<()> {
    if format == Format::Json {
        return print_json(&value);
    }
    crate::sayln!(format, "{sentence}");
    Ok(())
}

/// Prints a sentence (a summary, a count, a note under a table, a hint): on stdout with `--output table`;
/// on stderr with `--output text`, whose stdout carries only tables' rows (for `cut` and `awk`, as in the
/// AWS CLI), and with `--output json`, whose stdout is one document. Use [`crate::sayln!`].
pub(crate) fn say(format: Format, line: std::fmt::Arguments<'_>) {
    match format {
        Format::Table => crate::stdio::write_stdout(format_args!("{line}\n")),
        Format::Text | Format::Json => crate::stdio::write_stderr(format_args!("{line}\n")),
    }
}

/// `sayln!(format, "...", args)`: a sentence, on stdout or stderr by format (see [`say`]).
#[macro_export]
macro_rules! sayln {
    ($format:expr, $($arg:tt)*) => { $crate::output::say($format, format_args!($($arg)*)) };
}

/// Prints `value` as one line (NDJSON): what a stream (`jobs watch`) prints per event, so a reader
/// can parse each line as it comes.
pub(crate) fn print_json_line(value: &serde_json::Value) -> anyhow::Result<()> {
    crate::outln!("{}", serde_json::to_string(value)?);
    Ok(())
}

/// Prints a progress line on stderr (in both formats: stdout carries only the result).
pub(crate) fn progress(line: &str) {
    crate::errln!("{line}");
}

/// A plain text table: a header row and left-aligned columns separated by two spaces. The last column is
/// not padded, so a long value there (a failure reason) does not push the others apart.
#[derive(Debug, Default)]
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub(crate) fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|title| (*title).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty, extra cells are dropped).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// Prints the table on stdout: aligned with its header, or as tab-separated values without it
    /// for `--output text` (a tab or line break inside a cell is shown as `\t`, `\n`).
    pub(crate) fn print(&self, format: Format) {
        if format != Format::Text {
            crate::out!("{}", self.render());
            return;
        }
        for row in &self.rows {
            let cells: Vec<String> = row
                .iter()
                .map(|cell| cell.replace('\t', "\\t").replace('\n', "\\n"))
                .collect();
            crate::outln!("{}", cells.join("\t"));
        }
    }

    /// The table as text, one line per row, ending in a newline.
    pub(crate) fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths = vec![0; columns];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut text = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (index, cell) in row.iter().enumerate() {
                if index + 1 == columns {
                    line.push_str(cell);
                } else {
                    let _ = write!(line, "{cell:<width$}  ", width = widths[index]);
                }
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }
}

pub(crate) use conveyor_core::runtime::{format_age, format_epoch_millis, format_time};

/// `text` safe to print on a terminal: control characters (escape sequences, OSC 52, carriage returns)
/// are shown escaped instead of being sent to the terminal.
pub(crate) fn sanitize(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_all_but_the_last_column() {
        let mut table = Table::new(&["id", "reason"]);
        table.row(vec!["a".to_owned(), "short".to_owned()]);
        table.row(vec!["longer-id".to_owned(), "a much longer reason".to_owned()]);
        assert_eq!(
            table.render(),
            "id         reason\na          short\nlonger-id  a much longer reason\n"
        );
    }
}
