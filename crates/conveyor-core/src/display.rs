//! Times and durations as people read them (the CLI's tables, the console's pages).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
}
