//! Times and durations as people read them (the CLI's tables, the console's pages).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Datelike, Timelike};

/// `error`'s text, then the texts of its causes that the texts before do not quote already (most
/// messages quote their cause: "cannot read the config file x: {source}").
fn chain_texts(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut texts = vec![error.to_string()];
    let mut cause = error.source();
    while let Some(inner) = cause {
        let text = inner.to_string();
        if !texts.iter().any(|before| before.contains(&text)) {
            texts.push(text);
        }
        cause = inner.source();
    }
    texts
}

/// An error and its causes as one line of `Display` texts joined by `: `, no SDK debug structures
/// (which the SDK's `DisplayErrorContext` appends) and no cause repeated.
pub fn display_chain(error: &(dyn std::error::Error + 'static)) -> String {
    chain_texts(error).join(": ")
}

/// Writes `error`'s text and then each cause it does not quote already on its own line (`caused by:
/// ...`): the `Debug` of the runtimes' errors, so `fn main() -> Result<(), WorkerError>` (or a
/// `Box<dyn Error>`) prints what went wrong and what to change rather than the variant's fields.
pub fn write_error_chain(
    error: &(dyn std::error::Error + 'static),
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    f.write_str(&chain_texts(error).join("\n  caused by: "))
}

/// A time as `2026-11-29T14:37:31.815Z` (UTC, milliseconds); a time before 1970 as the epoch.
pub fn format_time(time: SystemTime) -> String {
    let millis = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    format_epoch_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

/// Epoch milliseconds as `2026-11-29T14:37:31.815Z`. Past chrono's last date (the end of the year 262142)
/// the milliseconds are printed as they are: `18446744073709551615 ms after the epoch`.
pub fn format_epoch_millis(millis: u64) -> String {
    let Some(time) = i64::try_from(millis)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
    else {
        return format!("{millis} ms after the epoch");
    };
    // The fields one by one rather than `%Y`, which signs years past 9999.
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        time.year(),
        time.month(),
        time.day(),
        time.hour(),
        time.minute(),
        time.second(),
        millis % 1000
    )
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

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the config file w.toml: {source}")]
    struct Quoting {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the worker stopped")]
    struct Wrapping(#[source] std::io::Error);

    struct Chain<'a>(&'a (dyn std::error::Error + 'static));

    impl std::fmt::Debug for Chain<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write_error_chain(self.0, f)
        }
    }

    #[test]
    fn an_error_chain_reads_as_text_and_a_quoted_cause_is_not_repeated() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert_eq!(
            format!("{:?}", Chain(&Quoting { source: io() })),
            "cannot read the config file w.toml: no such file"
        );
        assert_eq!(
            format!("{:?}", Chain(&Wrapping(io()))),
            "the worker stopped\n  caused by: no such file"
        );
    }

    #[test]
    fn times_format_as_utc() {
        assert_eq!(format_epoch_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_epoch_millis(1_795_963_051_815), "2026-11-29T14:37:31.815Z");
        assert_eq!(format_epoch_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            format_time(UNIX_EPOCH + Duration::from_millis(1_795_963_051_815)),
            "2026-11-29T14:37:31.815Z"
        );
        assert_eq!(
            format_time(UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00.000Z",
            "before the epoch: the epoch"
        );
    }

    #[test]
    fn leap_years_and_month_ends() {
        let day = 86_400_000;
        // 2024 is a leap year: 28 February, 29 February, 1 March.
        assert_eq!(format_epoch_millis(1_709_078_400_000), "2024-02-28T00:00:00.000Z");
        assert_eq!(
            format_epoch_millis(1_709_078_400_000 + day),
            "2024-02-29T00:00:00.000Z"
        );
        assert_eq!(
            format_epoch_millis(1_709_078_400_000 + 2 * day - 1),
            "2024-02-29T23:59:59.999Z"
        );
        assert_eq!(
            format_epoch_millis(1_709_078_400_000 + 2 * day),
            "2024-03-01T00:00:00.000Z"
        );
        // 2023 is not: 28 February, then 1 March.
        assert_eq!(format_epoch_millis(1_677_542_400_000), "2023-02-28T00:00:00.000Z");
        assert_eq!(
            format_epoch_millis(1_677_542_400_000 + day),
            "2023-03-01T00:00:00.000Z"
        );
        // 1900 and 2100 are not (divisible by 100), 2000 is (by 400).
        assert_eq!(format_epoch_millis(4_107_456_000_000), "2100-02-28T00:00:00.000Z");
        assert_eq!(
            format_epoch_millis(4_107_456_000_000 + day),
            "2100-03-01T00:00:00.000Z"
        );
        assert_eq!(format_epoch_millis(951_696_000_000), "2000-02-28T00:00:00.000Z");
        assert_eq!(
            format_epoch_millis(951_696_000_000 + day),
            "2000-02-29T00:00:00.000Z"
        );
        // Month and year ends.
        assert_eq!(format_epoch_millis(1_714_521_599_999), "2024-04-30T23:59:59.999Z");
        assert_eq!(format_epoch_millis(1_714_521_600_000), "2024-05-01T00:00:00.000Z");
        assert_eq!(format_epoch_millis(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
        assert_eq!(format_epoch_millis(1_735_689_600_000), "2025-01-01T00:00:00.000Z");
    }

    #[test]
    fn far_years_keep_their_digits() {
        // 9999-12-31T23:59:59.999Z and the millisecond after: no sign, five digits.
        assert_eq!(
            format_epoch_millis(253_402_300_799_999),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(
            format_epoch_millis(253_402_300_800_000),
            "10000-01-01T00:00:00.000Z"
        );
        assert_eq!(
            format_epoch_millis(u64::MAX),
            "18446744073709551615 ms after the epoch"
        );
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(format_age(Duration::from_secs(45)), "45s");
        assert_eq!(format_age(Duration::from_secs(725)), "12m 5s");
        assert_eq!(format_age(Duration::from_secs(3 * 3600 + 120)), "3h 2m");
        assert_eq!(format_age(Duration::from_secs(2 * 86_400 + 4 * 3600)), "2d 4h");
    }
}
