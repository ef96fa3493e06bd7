//! How results are printed: human-readable tables (the default) or one JSON document (`--output json`).
//!
//! Results go to stdout; progress lines and warnings go to stderr, so `--output json` stays parseable.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::ValueEnum;

/// The output format chosen with `--output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Tables and sentences for people.
    #[default]
    Text,
    /// One JSON document on stdout, for scripts.
    Json,
}

/// When log lines are coloured (`--color`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Color {
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
    pub fn enabled(self) -> bool {
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
pub fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    crate::outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints a progress line on stderr (in both formats: stdout carries only the result).
pub fn progress(line: &str) {
    crate::errln!("{line}");
}

/// A plain text table: a header row and left-aligned columns separated by two spaces. The last column is
/// not padded, so a long value there (a failure reason) does not push the others apart.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|title| (*title).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty, extra cells are dropped).
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row, ending in a newline.
    pub fn render(&self) -> String {
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

/// A time as `2026-11-29T14:37:31.815Z` (UTC, milliseconds).
pub fn format_time(time: SystemTime) -> String {
    let millis = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    format_epoch_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

/// Epoch milliseconds as `2026-11-29T14:37:31.815Z`.
pub fn format_epoch_millis(millis: u64) -> String {
    let seconds = millis / 1000;
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    let rest = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        millis % 1000
    )
}

/// Days since 1970-01-01 as a (year, month, day) date (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A duration as people read it: `45s`, `12m 5s`, `3h 2m`, `2d 4h`.
pub fn format_age(age: Duration) -> String {
    let seconds = age.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m {}s", seconds / 60, seconds % 60),
        3600..86_400 => format!("{}h {}m", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d {}h", seconds / 86_400, seconds % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_format_as_utc() {
        assert_eq!(format_epoch_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_epoch_millis(1_795_963_051_815), "2026-11-29T14:37:31.815Z");
        assert_eq!(format_epoch_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(format_age(Duration::from_secs(45)), "45s");
        assert_eq!(format_age(Duration::from_secs(725)), "12m 5s");
        assert_eq!(format_age(Duration::from_secs(3 * 3600 + 120)), "3h 2m");
        assert_eq!(format_age(Duration::from_secs(2 * 86_400 + 4 * 3600)), "2d 4h");
    }

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
