//! [`Schedule`]: when a job is sent (cron in a time zone, or a fixed interval) and which job.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use conveyor_core::Handler;
use conveyor_sqs::NewJob;
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Serialize};

/// Why a schedule definition was refused.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    /// The cron expression does not parse.
    #[error(
        "schedule {name}: cron expression {expression:?} does not parse ({message}); use 5 fields \
         (minute hour day-of-month month day-of-week) or 6 with seconds first"
    )]
    Cron {
        /// The schedule.
        name: String,
        /// The expression.
        expression: String,
        /// croner's message.
        message: String,
    },
    /// The time zone is not an IANA name.
    #[error("schedule {name}: {zone:?} is not an IANA time zone name (such as Europe/Berlin or UTC)")]
    TimeZone {
        /// The schedule.
        name: String,
        /// The zone given.
        zone: String,
    },
    /// An interval under one second.
    #[error("schedule {name}: the interval must be at least 1 second")]
    Interval {
        /// The schedule.
        name: String,
    },
    /// A name that cannot be a key or an EventBridge schedule name.
    #[error(
        "schedule name {name:?} must be 1 to 64 characters of letters, digits, '-', '_' and '.' \
         (it names the EventBridge schedule and the tick keys)"
    )]
    Name {
        /// The name given.
        name: String,
    },
    /// The payload does not serialise.
    #[error("schedule {name}: the job's payload does not serialise to JSON: {message}")]
    Payload {
        /// The schedule.
        name: String,
        /// serde_json's message.
        message: String,
    },
    /// The job breaks a limit (size, attributes).
    #[error("schedule {name}: {message}")]
    Job {
        /// The schedule.
        name: String,
        /// The producer's message.
        message: String,
    },
}

/// When a schedule fires.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub enum Timing {
    /// A cron expression (seconds optional) in an IANA time zone; daylight-saving changes as the
    /// `croner` crate defines them (a fixed time in a skipped hour fires right after the gap, a fixed
    /// time in a repeated hour fires once; wildcard fields follow the wall clock).
    Cron {
        /// The expression as written.
        expression: String,
        /// The parsed pattern.
        cron: Box<Cron>,
        /// The time zone (its IANA name: [`jiff::tz::TimeZone::iana_name`]).
        zone: jiff::tz::TimeZone,
    },
    /// Every `interval`, counted from the schedule's start (or the Unix epoch). The anchor is what an
    /// EventBridge `rate()` counts from (the schedule's `StartDate`), so the export needs a start: a
    /// migration then fires each tick once, with one key.
    Every(Duration),
}

/// Which missed ticks fire when the schedulers come back (all workers down, paused clock, deploy).
/// A tick is *missed* when it is older than [`Schedule::missed_after`] when first seen.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissedTicks {
    /// The latest missed tick fires once (cron's usual catch-up).
    #[default]
    LatestOnce,
    /// Every missed tick fires (at most [`MAX_CATCH_UP`] at a time).
    All,
    /// Missed ticks do not fire.
    Skip,
}

/// The most missed ticks [`MissedTicks::All`] fires in one catch-up.
pub const MAX_CATCH_UP: usize = 1000;

/// The job a schedule sends: type, version and payload, as a typed [`NewJob`] would carry them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobTemplate {
    /// `conveyor.type`.
    pub job_type: String,
    /// `conveyor.version`.
    pub version: u32,
    /// The payload as JSON.
    pub payload: serde_json::Value,
    /// The tenant every tick's job belongs to (`NewJob::tenant`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl JobTemplate {
    /// The job to send for one tick, keyed by schedule and tick (see [`tick_key`]).
    pub fn job(&self, key: String) -> NewJob<serde_json::Value> {
        let job = NewJob::new(self.job_type.clone(), self.payload.clone())
            .version(self.version)
            .key(key);
        match &self.tenant {
            Some(tenant) => job.tenant(tenant.clone()),
            None => job,
        }
    }
}

/// A schedule: a name, a timing, a job, and optional bounds.
///
/// ```
/// use conveyor_schedule::Schedule;
/// # use conveyor_core::{Context, Handler, HandlerError};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Report { kind: String }
/// # struct NightlyReport;
/// # impl Handler for NightlyReport {
/// #     type Job = Report; type Output = (); const JOB_TYPE: &'static str = "nightly_report";
/// #     async fn handle(&self, _job: Report, _ctx: Context) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// let nightly = Schedule::cron("nightly-report", "0 2 * * *", "Europe/Berlin")?
///     .job::<NightlyReport>(&Report { kind: "sales".into() })?;
/// # Ok::<(), conveyor_schedule::DefinitionError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The name: unique per deployment; names the tick keys and the EventBridge schedule.
    pub name: String,
    /// When it fires.
    pub timing: Timing,
    /// What it sends.
    pub job: JobTemplate,
    /// No tick before this.
    pub start: Option<SystemTime>,
    /// No tick after this.
    pub end: Option<SystemTime>,
    /// At most this many sends, across all workers.
    pub max_runs: Option<u64>,
    /// What fires after ticks were missed.
    pub missed: MissedTicks,
    /// A tick first seen later than this after its time counts as missed (default 60 s).
    pub missed_after: Duration,
    /// Skip a tick while the previous tick's job has not completed, for at most this long after its
    /// send (a job lost to the DLQ does not stop the schedule for ever). Needs the job records:
    /// `Scheduler::with_job_records`.
    pub skip_while_running: Option<Duration>,
}

/// The default [`Schedule::missed_after`].
pub(crate) const DEFAULT_MISSED_AFTER: Duration = Duration::from_secs(60);

fn check_name(name: &str) -> Result<(), DefinitionError> {
    let valid = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err(DefinitionError::Name {
            name: name.to_owned(),
        })
    }
}

impl Schedule {
    /// A cron schedule: `expression` with 5 fields, or 6 with seconds first, in IANA `zone`.
    pub fn cron(name: &str, expression: &str, zone: &str) -> Result<Schedule, DefinitionError> {
        check_name(name)?;
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|error| DefinitionError::Cron {
                name: name.to_owned(),
                expression: expression.to_owned(),
                message: error.to_string(),
            })?;
        let zone = jiff::tz::TimeZone::get(zone).map_err(|_| DefinitionError::TimeZone {
            name: name.to_owned(),
            zone: zone.to_owned(),
        })?;
        Ok(Self::with_timing(
            name,
            Timing::Cron {
                expression: expression.to_owned(),
                cron: Box::new(cron),
                zone,
            },
        ))
    }

    /// A fixed-interval schedule (at least 1 second), ticking at the start plus whole intervals (the
    /// Unix epoch when no start is set).
    pub fn every(name: &str, interval: Duration) -> Result<Schedule, DefinitionError> {
        check_name(name)?;
        if interval < Duration::from_secs(1) {
            return Err(DefinitionError::Interval {
                name: name.to_owned(),
            });
        }
        Ok(Self::with_timing(name, Timing::Every(interval)))
    }

    fn with_timing(name: &str, timing: Timing) -> Schedule {
        Schedule {
            name: name.to_owned(),
            timing,
            job: JobTemplate {
                job_type: String::new(),
                version: 1,
                payload: serde_json::Value::Null,
                tenant: None,
            },
            start: None,
            end: None,
            max_runs: None,
            missed: MissedTicks::default(),
            missed_after: DEFAULT_MISSED_AFTER,
            skip_while_running: None,
        }
    }

    /// The job for handler `H` (its type and version), with this payload; checked against SQS's limits.
    pub fn job<H: Handler>(self, payload: &H::Job) -> Result<Schedule, DefinitionError>
    where
        H::Job: Serialize,
    {
        self.job_of(H::JOB_TYPE, H::VERSION, payload)
    }

    /// The job by type and version, for producers without the handler's crate.
    pub fn job_of(
        mut self,
        job_type: &str,
        version: u32,
        payload: &impl Serialize,
    ) -> Result<Schedule, DefinitionError> {
        let payload = serde_json::to_value(payload).map_err(|error| DefinitionError::Payload {
            name: self.name.clone(),
            message: error.to_string(),
        })?;
        // Sorted keys, so the exported file's text does not depend on serde_json's map order.
        let payload = conveyor_core::runtime::sorted(&payload);
        self.job = JobTemplate {
            job_type: job_type.to_owned(),
            version,
            payload,
            tenant: self.job.tenant.take(),
        };
        self.checked()
    }

    /// Every tick's job belongs to `tenant` (`NewJob::tenant`); checked against SQS's rules.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Result<Schedule, DefinitionError> {
        self.job.tenant = Some(tenant.into());
        self.checked()
    }

    /// The schedule, once its job passes SQS's limits.
    fn checked(self) -> Result<Schedule, DefinitionError> {
        let probe = self.job.job(tick_key(&self.name, SystemTime::UNIX_EPOCH));
        probe
            .to_message("schedule")
            .map_err(|error| DefinitionError::Job {
                name: self.name.clone(),
                message: error.to_string(),
            })?;
        Ok(self)
    }

    /// No tick before `start`.
    pub fn starting(mut self, start: SystemTime) -> Schedule {
        self.start = Some(start);
        self
    }

    /// No tick after `end`.
    pub fn ending(mut self, end: SystemTime) -> Schedule {
        self.end = Some(end);
        self
    }

    /// At most `runs` sends in all.
    pub fn max_runs(mut self, runs: u64) -> Schedule {
        self.max_runs = Some(runs);
        self
    }

    /// What fires after missed ticks (default [`MissedTicks::LatestOnce`]).
    pub fn missed_ticks(mut self, policy: MissedTicks) -> Schedule {
        self.missed = policy;
        self
    }

    /// A tick first seen later than this after its time counts as missed (default 60 s).
    pub fn missed_after(mut self, after: Duration) -> Schedule {
        self.missed_after = after;
        self
    }

    /// Skips a tick while the previous tick's job has not completed (its idempotency record is not
    /// `COMPLETED`), for at most `at_most` after that job was sent.
    pub fn skip_while_running(mut self, at_most: Duration) -> Schedule {
        self.skip_while_running = Some(at_most);
        self
    }

    /// The first tick strictly after `after`, within start and end; `None` when there is none.
    pub fn next_tick(&self, after: SystemTime) -> Option<SystemTime> {
        let after = match self.start {
            // A tick exactly at the start counts.
            Some(start) if start > after => start - Duration::from_nanos(1),
            _ => after,
        };
        let next = match &self.timing {
            Timing::Every(interval) => {
                let anchor = self.start.unwrap_or(SystemTime::UNIX_EPOCH);
                let Ok(since) = after.duration_since(anchor) else {
                    return Some(anchor).filter(|first| self.end.is_none_or(|end| *first <= end));
                };
                let steps = since.as_nanos() / interval.as_nanos() + 1;
                let offset = interval.as_nanos().checked_mul(steps)?;
                anchor.checked_add(Duration::from_nanos(u64::try_from(offset).ok()?))?
            }
            Timing::Cron { cron, zone, .. } => {
                let local = jiff::Timestamp::try_from(after).ok()?.to_zoned(zone.clone());
                let next = cron.find_next_occurrence(&local, false).ok()?;
                SystemTime::from(next.timestamp())
            }
        };
        match self.end {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// The ticks in `(after, until]`, at most `limit`, oldest first.
    pub fn ticks_between(&self, after: SystemTime, until: SystemTime, limit: usize) -> Vec<SystemTime> {
        let mut ticks = Vec::new();
        let mut cursor = after;
        while ticks.len() < limit {
            match self.next_tick(cursor) {
                Some(tick) if tick <= until => {
                    ticks.push(tick);
                    cursor = tick;
                }
                _ => break,
            }
        }
        ticks
    }
}

/// The idempotency key of the job a tick sends: `schedule:<name>@<tick, RFC 3339 UTC>`, the same
/// as the EventBridge export's (`<aws.scheduler.scheduled-time>`), so a re-send of a tick is settled
/// as a duplicate by the consumer.
pub fn tick_key(name: &str, tick: SystemTime) -> String {
    format!("schedule:{name}@{}", format_tick(tick))
}

/// A tick as RFC 3339 UTC, seconds precision (`2026-11-30T02:00:00Z`).
pub(crate) fn format_tick(tick: SystemTime) -> String {
    let time: DateTime<Utc> = tick.into();
    time.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> SystemTime {
        SystemTime::from(DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&Utc))
    }

    fn ticks(schedule: &Schedule, from: &str, to: &str) -> Vec<String> {
        schedule
            .ticks_between(utc(from), utc(to), 100)
            .into_iter()
            .map(format_tick)
            .collect()
    }

    #[test]
    fn a_daily_time_follows_the_zone_across_daylight_saving() {
        // Europe/Berlin: CET (UTC+1) until 2026-03-29 02:00, then CEST (UTC+2).
        let nightly = Schedule::cron("nightly", "30 1 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            ticks(&nightly, "2026-03-27T00:00:00Z", "2026-03-31T00:00:00Z"),
            [
                "2026-03-27T00:30:00Z", // 01:30 CET
                "2026-03-28T00:30:00Z",
                "2026-03-29T00:30:00Z", // 01:30 CET, half an hour before the switch
                "2026-03-29T23:30:00Z", // 01:30 CEST
                "2026-03-30T23:30:00Z"
            ]
        );
    }

    #[test]
    fn a_time_in_the_skipped_hour_fires_after_the_gap_and_the_repeated_hour_fires_once() {
        // 02:30 does not exist in Berlin on 2026-03-29: it fires right after the gap, at 03:00 CEST.
        let skipped = Schedule::cron("skipped", "30 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            ticks(&skipped, "2026-03-28T12:00:00Z", "2026-03-30T12:00:00Z"),
            ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
        );
        // 02:30 happens twice on 2026-10-25 (CEST, then CET): one tick.
        let repeated = Schedule::cron("repeated", "30 2 * * *", "Europe/Berlin").unwrap();
        let fall = ticks(&repeated, "2026-10-24T12:00:00Z", "2026-10-26T00:00:00Z");
        assert_eq!(fall.len(), 1, "{fall:?}");
    }

    #[test]
    fn seconds_are_optional_and_intervals_anchor_on_the_start() {
        let every_second = Schedule::cron("fast", "* * * * * *", "UTC").unwrap();
        assert_eq!(
            ticks(&every_second, "2026-01-01T00:00:00Z", "2026-01-01T00:00:03Z").len(),
            3
        );
        let start = utc("2026-01-01T00:00:10Z");
        let every = Schedule::every("every", Duration::from_secs(60))
            .unwrap()
            .starting(start)
            .ending(utc("2026-01-01T00:03:10Z"));
        assert_eq!(
            ticks(&every, "2025-12-31T00:00:00Z", "2026-01-02T00:00:00Z"),
            [
                "2026-01-01T00:00:10Z",
                "2026-01-01T00:01:10Z",
                "2026-01-01T00:02:10Z",
                "2026-01-01T00:03:10Z"
            ]
        );
    }

    #[test]
    fn an_image_without_a_tz_database_still_knows_the_zones() {
        // `TimeZone::get` reads the system's database first; `scratch` and distroless images have none,
        // and then the copy bundled by jiff's `tzdb-bundle-always` answers (empty without the feature).
        let bundled = jiff::tz::TimeZoneDatabase::bundled();
        let berlin = bundled.get("Europe/Berlin").unwrap();
        assert_eq!(berlin.iana_name(), Some("Europe/Berlin"));
    }

    #[test]
    fn bad_definitions_say_what_is_wrong() {
        let error = Schedule::cron("x", "61 * * * *", "UTC").unwrap_err();
        assert!(error.to_string().contains("does not parse"), "{error}");
        let error = Schedule::cron("x", "* * * * *", "Mars/Olympus").unwrap_err();
        assert!(error.to_string().contains("IANA"), "{error}");
        assert!(matches!(
            Schedule::every("x", Duration::from_millis(10)),
            Err(DefinitionError::Interval { .. })
        ));
        assert!(matches!(
            Schedule::every("no spaces", Duration::from_secs(1)),
            Err(DefinitionError::Name { .. })
        ));
    }
}
