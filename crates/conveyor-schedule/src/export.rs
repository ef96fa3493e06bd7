//! [`export`]: the schedules as the JSON file `infra/modules/schedules` reads (EventBridge Scheduler).
//!
//! ```json
//! {"format": 1, "schedules": [{
//!   "name": "nightly-report", "expression": "cron(0 2 * * ? *)", "timezone": "Europe/Berlin",
//!   "start_date": null, "end_date": null, "job_type": "nightly_report",
//!   "input": "{\"conveyor\":{...},\"payload\":{...}}"}]}
//! ```
//!
//! A schedule with a tenant adds `"tenant"` and `"message_body_json"`, and the file is then format 2
//! (see the design note below).
//!
//! EventBridge Scheduler's cron has six fields (minute hour day-of-month month day-of-week year), no
//! seconds, days of the week 1-7 from Sunday, and `?` in one of the two day fields; rates are whole
//! minutes. What cannot be said there is refused with the reason and what to do instead:
//! - a seconds field other than 0, both day fields set, a step in the day-of-week field;
//! - an interval not in whole minutes, or without a start: EventBridge counts `rate()` from the
//!   schedule's `StartDate` (its creation when none), the workers from [`Schedule::start`]; the export
//!   writes that start as `StartDate`, so both count from one anchor, a tick has one time and one key
//!   (`schedule:<name>@<tick>`) on either side, and during a migration (both running for a while) the
//!   consumer runs each tick once;
//! - `max_runs` (EventBridge has no run limit: use an end date);
//! - `skip_while_running` (EventBridge fires whatever the previous job does);
//!
//! Every missed-tick policy is exported (the default [`MissedTicks::LatestOnce`] too): the policy says
//! what the *workers'* scheduler does with the ticks of its own outage (no leader), and EventBridge
//! Scheduler has no such outage: it delivers every tick and retries a failed delivery up to the
//! module's `maximum_event_age_seconds`. The policy is kept in the file's definition, so `conveyor
//! schedules list` and `trigger` and a later move back to the workers keep it.
//!
//! # Design note: a schedule's tenant
//!
//! On a standard queue a job's tenant is its `MessageGroupId` (SQS fair queues). EventBridge
//! Scheduler's *templated* SQS target has `SqsParameters.MessageGroupId`, but its documentation (API
//! reference and CloudFormation, as of December 2026) gives it only "when the target is a FIFO queue",
//! whereas EventBridge rules' `SqsParameters` says "fair or FIFO queue": that a schedule's templated
//! target sends it to a standard queue is nowhere promised, and without AWS it cannot be tried here.
//! A *universal* target calls the SQS API itself (`arn:aws:scheduler:::aws-sdk:sqs:sendMessage`, its
//! input holding `SendMessage`'s parameters; AWS's "context attributes" guide uses exactly this target
//! with `<aws.scheduler.scheduled-time>` in the body), and SQS's `SendMessage` takes `MessageGroupId` on a
//! standard queue. So a schedule with a tenant is exported with `tenant` and `message_body_json` (its
//! `input` written as a JSON string, whose `<` and `>` Terraform's `jsonencode` would escape into
//! `\u003c`, hiding the placeholder from Scheduler), and `infra/modules/schedules` gives it a
//! universal target whose input is `{"QueueUrl", "MessageGroupId", "MessageBody"}`; schedules without
//! a tenant keep the templated target. A file with a tenant is format 2, which a module that does
//! not know tenants refuses at plan instead of dropping them; a file without one stays format 1. A
//! tenant SQS would refuse is refused here with `NewJob::tenant`'s words.

use std::time::SystemTime;

use conveyor_core::runtime::{Header, seal};
use serde::{Deserialize, Serialize};

use crate::definition::{JobTemplate, MissedTicks, Schedule, Timing, format_tick};

/// The file format's version.
pub(crate) const FORMAT: u32 = 1;
/// The version of a file with a tenant in it (see the design note); readers take both.
pub(crate) const FORMAT_WITH_TENANTS: u32 = 2;

/// A schedule that EventBridge Scheduler cannot express.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schedule {schedule} cannot be exported to EventBridge Scheduler: {reason}")]
pub struct ExportError {
    /// The schedule.
    pub schedule: String,
    /// Why.
    pub reason: String,
}

/// The definition as written in code, so `conveyor schedules list` and `trigger` can rebuild it
/// ([`load`]); Terraform ignores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Definition {
    /// The cron expression, for cron schedules.
    pub cron: Option<String>,
    /// The interval in seconds, for interval schedules.
    pub every_secs: Option<u64>,
    /// The IANA zone of a cron schedule.
    pub zone: String,
    /// Start, RFC 3339.
    pub start: Option<String>,
    /// End, RFC 3339.
    pub end: Option<String>,
    /// The missed-tick policy.
    pub missed: MissedTicks,
    /// The job.
    pub job: JobTemplate,
    /// The run limit (run-time schedules only: the export refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runs: Option<u64>,
    /// `skip_while_running`, in seconds (run-time schedules only: the export refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_while_running_secs: Option<u64>,
    /// `missed_after`, in seconds, when not the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed_after_secs: Option<u64>,
}

/// One schedule in the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Exported {
    /// The schedule's name.
    pub name: String,
    /// EventBridge's `cron(...)` or `rate(...)`.
    pub expression: String,
    /// IANA zone (`UTC` for rates).
    pub timezone: String,
    /// RFC 3339, or null.
    pub start_date: Option<String>,
    /// RFC 3339, or null.
    pub end_date: Option<String>,
    /// The job type (for descriptions and tags).
    pub job_type: String,
    /// The message body: the envelope, its key templated on the scheduled time.
    pub input: String,
    /// The job's tenant: the universal target's `MessageGroupId` (see the design note).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// With a tenant: `input` as a JSON string (quoted and escaped, `<` and `>` kept), for the
    /// universal target's `MessageBody`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_body_json: Option<String>,
    /// The definition, for the `conveyor schedules` commands.
    pub definition: Definition,
}

/// The file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ExportFile {
    /// [`FORMAT`].
    pub format: u32,
    /// The schedules.
    pub schedules: Vec<Exported>,
}

/// The file's content for `schedules`, or the first schedule EventBridge cannot express.
pub fn export(schedules: &[Schedule]) -> Result<String, ExportError> {
    crate::scheduler::check_schedules(schedules).map_err(|error| ExportError {
        schedule: String::new(),
        reason: error.to_string(),
    })?;
    let mut exported = Vec::with_capacity(schedules.len());
    for schedule in schedules {
        exported.push(export_one(schedule)?);
    }
    let format = if exported.iter().any(|schedule| schedule.tenant.is_some()) {
        FORMAT_WITH_TENANTS
    } else {
        FORMAT
    };
    let file = ExportFile {
        format,
        schedules: exported,
    };
    serde_json::to_string_pretty(&file).map_err(|error| ExportError {
        schedule: String::new(),
        reason: error.to_string(),
    })
}

fn export_one(schedule: &Schedule) -> Result<Exported, ExportError> {
    let refuse = |reason: String| ExportError {
        schedule: schedule.name.clone(),
        reason,
    };
    if schedule.max_runs.is_some() {
        return Err(refuse(
            "EventBridge Scheduler has no run limit; drop max_runs and set an end instead".to_owned(),
        ));
    }
    if schedule.skip_while_running.is_some() {
        return Err(refuse(
            "EventBridge Scheduler fires whatever the previous job does; drop skip_while_running, or \
             keep this schedule on the workers' scheduler"
                .to_owned(),
        ));
    }
    if let Timing::Every(_) = schedule.timing {
        let whole_minute = schedule.start.is_some_and(|start| {
            start
                .duration_since(SystemTime::UNIX_EPOCH)
                .is_ok_and(|since| since.as_secs().is_multiple_of(60) && since.subsec_nanos() == 0)
        });
        if !whole_minute {
            return Err(refuse(
                "an interval needs an explicit start on a whole minute (Schedule::starting): \
                 EventBridge counts rate() from the schedule's StartDate (its creation time when \
                 none) and the workers from the start, so without one the two fire different ticks \
                 with different keys and a migration runs them twice"
                    .to_owned(),
            ));
        }
    }
    // The zone's name as the tz database spells it (`TimeZone::get` ignores case): EventBridge takes it
    // as written. Every zone `Schedule::cron` accepts comes from the database and has one.
    let (expression, timezone, cron, every_secs) = match &schedule.timing {
        Timing::Cron { expression, zone, .. } => {
            let Some(name) = zone.iana_name() else {
                return Err(refuse(
                    "its time zone has no IANA name; define it with Schedule::cron and a name such as \
                     Europe/Berlin"
                        .to_owned(),
                ));
            };
            (
                eventbridge_cron(expression).map_err(refuse)?,
                name.to_owned(),
                Some(expression.clone()),
                None,
            )
        }
        Timing::Every(interval) => (
            rate(interval.as_secs(), interval.subsec_nanos()).map_err(refuse)?,
            "UTC".to_owned(),
            None,
            Some(interval.as_secs()),
        ),
    };
    // The tenant, checked as `NewJob::tenant` checks it (a `Schedule` built by hand or loaded from a
    // file skips `Schedule::tenant`).
    let key = crate::definition::tick_key(&schedule.name, SystemTime::UNIX_EPOCH);
    schedule
        .job
        .job(key)
        .to_message("schedule")
        .map_err(|error| refuse(error.to_string()))?;
    let header = Header {
        job_type: schedule.job.job_type.clone(),
        version: Some(schedule.job.version),
        key: Some(format!(
            "schedule:{}@<aws.scheduler.scheduled-time>",
            schedule.name
        )),
    };
    let date = |time: Option<SystemTime>| time.map(format_tick);
    let definition = Definition {
        cron,
        every_secs,
        zone: timezone.clone(),
        start: date(schedule.start),
        end: date(schedule.end),
        missed: schedule.missed,
        job: schedule.job.clone(),
        max_runs: None,
        skip_while_running_secs: None,
        missed_after_secs: missed_after_secs(schedule),
    };
    let input = seal(&header, &schedule.job.payload);
    let tenant = schedule.job.tenant.clone();
    let message_body_json = match &tenant {
        Some(_) => Some(serde_json::to_string(&input).map_err(|error| refuse(error.to_string()))?),
        None => None,
    };
    Ok(Exported {
        definition,
        name: schedule.name.clone(),
        expression,
        timezone,
        start_date: date(schedule.start),
        end_date: date(schedule.end),
        job_type: schedule.job.job_type.clone(),
        input,
        tenant,
        message_body_json,
    })
}

/// The schedules of an exported file, rebuilt from their definitions.
pub fn load(text: &str) -> Result<Vec<Schedule>, ExportError> {
    let invalid = |schedule: &str, reason: String| ExportError {
        schedule: schedule.to_owned(),
        reason,
    };
    let file: ExportFile = serde_json::from_str(text).map_err(|error| {
        invalid(
            "",
            format!("not a file from `conveyor schedules export`: {error}"),
        )
    })?;
    if ![FORMAT, FORMAT_WITH_TENANTS].contains(&file.format) {
        return Err(invalid(
            "",
            format!(
                "format {} is neither {FORMAT} nor {FORMAT_WITH_TENANTS}: export it again",
                file.format
            ),
        ));
    }
    file.schedules
        .into_iter()
        .map(|exported| schedule_of(&exported.name, exported.definition))
        .collect()
}

fn missed_after_secs(schedule: &Schedule) -> Option<u64> {
    (schedule.missed_after != crate::definition::DEFAULT_MISSED_AFTER)
        .then_some(schedule.missed_after.as_secs())
}

fn definition_of(schedule: &Schedule) -> Definition {
    let date = |time: Option<SystemTime>| time.map(format_tick);
    let (cron, every_secs, zone) = match &schedule.timing {
        Timing::Cron { expression, zone, .. } => (
            Some(expression.clone()),
            None,
            zone.iana_name().unwrap_or("UTC").to_owned(),
        ),
        Timing::Every(interval) => (None, Some(interval.as_secs()), "UTC".to_owned()),
    };
    Definition {
        cron,
        every_secs,
        zone,
        start: date(schedule.start),
        end: date(schedule.end),
        missed: schedule.missed,
        job: schedule.job.clone(),
        max_runs: schedule.max_runs,
        skip_while_running_secs: schedule.skip_while_running.map(|window| window.as_secs()),
        missed_after_secs: missed_after_secs(schedule),
    }
}

/// A schedule as the JSON stored for a run-time schedule (`conveyor schedules add`): everything a
/// [`Schedule`] says, with no EventBridge restriction.
pub fn to_definition_json(schedule: &Schedule) -> String {
    serde_json::to_string(&definition_of(schedule)).unwrap_or_default()
}

/// The schedule `name` from [`to_definition_json`]'s text.
pub fn from_definition_json(name: &str, text: &str) -> Result<Schedule, ExportError> {
    let definition: Definition = serde_json::from_str(text).map_err(|error| ExportError {
        schedule: name.to_owned(),
        reason: format!("not a schedule definition: {error}"),
    })?;
    schedule_of(name, definition)
}

fn schedule_of(name: &str, definition: Definition) -> Result<Schedule, ExportError> {
    let invalid = |reason: String| ExportError {
        schedule: name.to_owned(),
        reason,
    };
    let schedule = match (&definition.cron, definition.every_secs) {
        (Some(cron), _) => Schedule::cron(name, cron, &definition.zone),
        (None, Some(secs)) => Schedule::every(name, std::time::Duration::from_secs(secs)),
        (None, None) => return Err(invalid("neither cron nor every_secs".to_owned())),
    }
    .map_err(|error| invalid(error.to_string()))?;
    let time = |text: &Option<String>| -> Result<Option<SystemTime>, ExportError> {
        text.as_deref()
            .map(|text| {
                chrono::DateTime::parse_from_rfc3339(text)
                    .map(SystemTime::from)
                    .map_err(|error| invalid(format!("{text:?}: {error}")))
            })
            .transpose()
    };
    if definition.job.job_type.is_empty() {
        return Err(invalid("no job type".to_owned()));
    }
    let mut schedule = schedule.missed_ticks(definition.missed);
    schedule.job = definition.job;
    schedule.start = time(&definition.start)?;
    schedule.end = time(&definition.end)?;
    schedule.max_runs = definition.max_runs;
    schedule.skip_while_running = definition
        .skip_while_running_secs
        .map(std::time::Duration::from_secs);
    if let Some(secs) = definition.missed_after_secs {
        schedule.missed_after = std::time::Duration::from_secs(secs);
    }
    Ok(schedule)
}

fn rate(secs: u64, nanos: u32) -> Result<String, String> {
    if nanos != 0 || !secs.is_multiple_of(60) {
        return Err(format!(
            "an interval of {secs}s is not whole minutes, and EventBridge Scheduler's rate() counts minutes"
        ));
    }
    let minutes = secs / 60;
    let (value, unit) = if minutes.is_multiple_of(1440) {
        (minutes / 1440, "day")
    } else if minutes.is_multiple_of(60) {
        (minutes / 60, "hour")
    } else {
        (minutes, "minute")
    };
    let plural = if value == 1 { "" } else { "s" };
    Ok(format!("rate({value} {unit}{plural})"))
}

/// A 5- or 6-field cron (or an `@` alias) in EventBridge Scheduler's six-field form.
fn eventbridge_cron(expression: &str) -> Result<String, String> {
    let expanded = match expression.trim() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        other => other,
    };
    let mut fields: Vec<&str> = expanded.split_whitespace().collect();
    if fields.len() == 6 {
        if fields[0] != "0" {
            return Err(format!(
                "seconds field {:?}: EventBridge Scheduler fires on whole minutes (use 0 or 5 fields)",
                fields[0]
            ));
        }
        fields.remove(0);
    }
    let [minute, hour, dom, month, dow] = fields[..] else {
        return Err(format!("{expression:?} is not a 5- or 6-field cron expression"));
    };
    let (dom, dow) = match (dom, dow) {
        (dom, "*") => (dom.to_owned(), "?".to_owned()),
        ("*", dow) => ("?".to_owned(), weekdays(dow)?),
        _ => {
            return Err(
                "both day-of-month and day-of-week are set; EventBridge Scheduler takes one of them"
                    .to_owned(),
            );
        }
    };
    Ok(format!("cron({minute} {hour} {dom} {month} {dow} *)"))
}

/// Cron's day-of-week numbers (0 or 7 = Sunday) as EventBridge's (1 = Sunday); names pass through.
fn weekdays(field: &str) -> Result<String, String> {
    if field.contains('/') {
        return Err(format!(
            "a step in the day-of-week field ({field:?}) cannot be exported"
        ));
    }
    let convert = |token: &str| -> String {
        match token.parse::<u8>() {
            Ok(day) => ((day % 7) + 1).to_string(),
            Err(_) => token.to_owned(),
        }
    };
    let parts: Vec<String> = field
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((from, to)) => format!("{}-{}", convert(from), convert(to)),
            None => convert(part),
        })
        .collect();
    Ok(parts.join(","))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn cron_and_intervals_become_eventbridge_expressions() {
        assert_eq!(eventbridge_cron("0 2 * * *").unwrap(), "cron(0 2 * * ? *)");
        assert_eq!(
            eventbridge_cron("0 30 8 * * 1-5").unwrap(),
            "cron(30 8 ? * 2-6 *)"
        );
        assert_eq!(eventbridge_cron("0 9 1 * *").unwrap(), "cron(0 9 1 * ? *)");
        assert_eq!(eventbridge_cron("0 9 * * 0,6").unwrap(), "cron(0 9 ? * 1,7 *)");
        assert_eq!(eventbridge_cron("@daily").unwrap(), "cron(0 0 * * ? *)");
        assert!(
            eventbridge_cron("*/10 * * * * *")
                .unwrap_err()
                .contains("whole minutes")
        );
        assert!(eventbridge_cron("0 9 1 * 1").unwrap_err().contains("one of them"));
        assert_eq!(rate(300, 0).unwrap(), "rate(5 minutes)");
        assert_eq!(rate(3600, 0).unwrap(), "rate(1 hour)");
        assert_eq!(rate(2 * 86400, 0).unwrap(), "rate(2 days)");
        assert!(rate(90, 0).is_err());
    }

    #[test]
    fn a_zone_is_exported_as_the_tz_database_spells_it() {
        // EventBridge Scheduler takes IANA names as written; the definition matches them ignoring case.
        let schedule = Schedule::cron("nightly", "0 2 * * *", "europe/berlin")
            .unwrap()
            .job_of("nightly_report", 1, &serde_json::json!({}))
            .unwrap()
            .missed_ticks(MissedTicks::All);
        let file: serde_json::Value =
            serde_json::from_str(&export(std::slice::from_ref(&schedule)).unwrap()).unwrap();
        assert_eq!(file["schedules"][0]["timezone"], "Europe/Berlin");
    }

    #[test]
    fn the_file_carries_the_envelope_with_a_templated_key() {
        let schedule = Schedule::cron("nightly-report", "0 2 * * *", "Europe/Berlin")
            .unwrap()
            .job_of("nightly_report", 2, &serde_json::json!({"kind": "sales"}))
            .unwrap()
            .missed_ticks(MissedTicks::All);
        let file: serde_json::Value =
            serde_json::from_str(&export(std::slice::from_ref(&schedule)).unwrap()).unwrap();
        let exported = &file["schedules"][0];
        assert_eq!(exported["expression"], "cron(0 2 * * ? *)");
        assert_eq!(exported["timezone"], "Europe/Berlin");
        let input: serde_json::Value = serde_json::from_str(exported["input"].as_str().unwrap()).unwrap();
        assert_eq!(input["conveyor"]["type"], "nightly_report");
        assert_eq!(input["conveyor"]["version"], 2);
        assert_eq!(
            input["conveyor"]["key"],
            "schedule:nightly-report@<aws.scheduler.scheduled-time>"
        );
        assert_eq!(input["payload"]["kind"], "sales");

        let loaded = load(&export(std::slice::from_ref(&schedule)).unwrap()).unwrap();
        assert_eq!(loaded[0].name, "nightly-report");
        assert_eq!(loaded[0].job, schedule.job);
        let after = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        assert_eq!(loaded[0].next_tick(after), schedule.next_tick(after));
    }

    fn hourly() -> Schedule {
        hourly_named("hourly")
    }

    fn hourly_named(name: &str) -> Schedule {
        Schedule::every(name, Duration::from_secs(3600))
            .unwrap()
            .job_of("t", 1, &1)
            .unwrap()
            .missed_ticks(MissedTicks::All)
            .starting(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000))
    }

    fn refusal(schedule: Schedule) -> String {
        export(&[schedule]).unwrap_err().to_string()
    }

    #[test]
    fn what_eventbridge_cannot_express_is_refused_with_what_to_do() {
        assert!(export(&[hourly()]).is_ok());
        assert!(refusal(hourly().max_runs(3)).contains("run limit"));
        assert!(refusal(hourly().skip_while_running(Duration::from_secs(60))).contains("skip_while_running"));
        // Every missed-tick policy is exported, the default one too, and kept for `list` and `trigger`.
        for policy in [MissedTicks::LatestOnce, MissedTicks::Skip] {
            let text = export(&[hourly().missed_ticks(policy)]).unwrap();
            assert_eq!(load(&text).unwrap()[0].missed, policy);
        }
        let mut unanchored = hourly();
        unanchored.start = None;
        assert!(refusal(unanchored).contains("explicit start"));
        let off_minute = hourly().starting(SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_030));
        assert!(refusal(off_minute).contains("whole minute"));
    }

    #[test]
    fn an_exported_interval_ticks_where_eventbridge_rate_does() {
        // EventBridge: StartDate, then every rate. The workers: the same anchor, so the same ticks and keys.
        let schedule = hourly();
        let file: serde_json::Value =
            serde_json::from_str(&export(std::slice::from_ref(&schedule)).unwrap()).unwrap();
        let exported = &file["schedules"][0];
        assert_eq!(exported["expression"], "rate(1 hour)");
        let start = chrono::DateTime::parse_from_rfc3339(exported["start_date"].as_str().unwrap()).unwrap();
        let start = SystemTime::from(start);
        let eventbridge: Vec<SystemTime> = (0..5).map(|k| start + Duration::from_secs(3600 * k)).collect();
        let workers = schedule.ticks_between(
            start - Duration::from_secs(1),
            start + Duration::from_secs(4 * 3600),
            10,
        );
        assert_eq!(workers, eventbridge);
        let loaded = load(&export(std::slice::from_ref(&schedule)).unwrap()).unwrap();
        assert_eq!(loaded[0].start, schedule.start);
    }

    #[test]
    fn a_run_time_definition_keeps_everything() {
        let schedule = hourly()
            .max_runs(7)
            .skip_while_running(Duration::from_secs(90))
            .missed_ticks(MissedTicks::Skip)
            .missed_after(Duration::from_secs(5));
        let loaded = from_definition_json("hourly", &to_definition_json(&schedule)).unwrap();
        assert_eq!(loaded.max_runs, Some(7));
        assert_eq!(loaded.skip_while_running, Some(Duration::from_secs(90)));
        assert_eq!(loaded.missed, MissedTicks::Skip);
        assert_eq!(loaded.missed_after, Duration::from_secs(5));
        assert_eq!(loaded.start, schedule.start);
        assert_eq!(loaded.job, schedule.job);
    }

    #[test]
    fn a_tenant_is_kept_for_the_universal_target_in_a_format_2_file() {
        let schedule = hourly().tenant("acme-42").unwrap();
        let text = export(&[schedule.clone(), hourly_named("plain")]).unwrap();
        let file: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(file["format"], FORMAT_WITH_TENANTS);
        let tenanted = &file["schedules"][0];
        assert_eq!(tenanted["tenant"], "acme-42");
        // The body as a JSON string, its placeholder as Scheduler must see it (not `\u003c...`).
        let body_json = tenanted["message_body_json"].as_str().unwrap();
        assert!(
            body_json.contains("<aws.scheduler.scheduled-time>"),
            "{body_json}"
        );
        let body: String = serde_json::from_str(body_json).unwrap();
        assert_eq!(body, tenanted["input"].as_str().unwrap());
        // A schedule without a tenant is written as before.
        let plain = file["schedules"][1].as_object().unwrap();
        assert!(!plain.contains_key("tenant") && !plain.contains_key("message_body_json"));
        // `conveyor schedules list` and `trigger` rebuild it with its tenant.
        let loaded = load(&text).unwrap();
        assert_eq!(loaded[0].job.tenant.as_deref(), Some("acme-42"));
        assert_eq!(loaded[0].job, schedule.job);
    }

    #[test]
    fn a_file_without_tenants_stays_format_1() {
        let file: serde_json::Value = serde_json::from_str(&export(&[hourly()]).unwrap()).unwrap();
        assert_eq!(file["format"], FORMAT);
        let wrong = r#"{"format": 3, "schedules": []}"#;
        assert!(load(wrong).unwrap_err().to_string().contains("neither 1 nor 2"));
    }

    #[test]
    fn a_tenant_sqs_would_refuse_is_refused_with_new_job_tenants_words() {
        let mut schedule = hourly();
        schedule.job.tenant = Some("acme corp".to_owned());
        let refused = refusal(schedule);
        assert!(
            refused.contains("schedule hourly cannot be exported")
                && refused.contains(r#"tenant "acme corp" cannot be sent"#)
                && refused.contains("' ' at position 4"),
            "{refused}"
        );
    }
}
