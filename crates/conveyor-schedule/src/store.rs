//! The schedule store port ([`ScheduleStore`]) and its DynamoDB implementation ([`TickStore`]).
//!
//! # Design note: what is stored, and who writes it
//!
//! All items live in the idempotency table under the `conveyor:schedule` prefix, read with `GetItem` and
//! written with conditional `UpdateItem`s only (the consumers already have the table and exactly these
//! two permissions; the prefix never collides with job records or Powertools' records):
//!
//! - `conveyor:schedules#<set>@lease`: the leader lease of a schedule set (owner, epoch, version). Every
//!   worker reads it; the leader renews it; a taker takes it over (see `lease.rs`).
//! - `conveyor:schedules#<set>`: schedules added at run time (`definitions`, a map name -> JSON).
//! - `conveyor:schedules#<set>@code`: the schedules given in code to the set's leader, as it serves
//!   them (`code_definitions`, a map name -> the same JSON, with `recorded_ms` and `recorded_by`).
//!   The leader replaces the map once per lease term (one `UpdateItem`; a schedule dropped from the
//!   code drops out at the next term), so `conveyor schedules list` shows code schedules with their
//!   policies (default ones included) without an export from the application's binary.
//! - `conveyor:schedule#<name>`: the schedule's state. `last_tick_ms` is the cursor: the newest tick that
//!   was sent or deliberately skipped. Only the leader moves it, with a write conditional on
//!   `last_tick_ms < :tick`, so it never moves backwards, whatever the clocks of the workers; the same
//!   write counts the run (`runs + 1`, when the tick was sent and confirmed by SQS) and appends to the
//!   bounded run history. `paused_at_ms` / `resumed_at_ms` record the current or last pause (written
//!   by the CLI), and `pauses` keeps every closed pause `(paused_at, resumed_at]` the cursor has not
//!   passed yet (a resume appends its pause, with a write conditional on the pause it closes, and drops
//!   the pauses behind the cursor; at most [`MAX_PAUSES`], the two oldest merged beyond that, so a
//!   tick is skipped rather than replayed). The leader skips every tick inside any of them by moving
//!   the cursor past it, however many pause/resume cycles happened between two of its looks.
//!   Removing a run-time schedule deletes this state too, and adding a schedule new to the set deletes
//!   whatever a leader that had not reloaded its definitions yet wrote meanwhile: a schedule added
//!   again under the same name starts fresh (no cursor, no runs, no pauses).
//!
//! Ticks have no item of their own: the conditional cursor is the guard, and the job's idempotency key
//! `schedule:<name>@<tick>` deduplicates the one send that can repeat (a leader that sent and died, or
//! lost its lease, before moving the cursor).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;

/// The most entries kept in a schedule's run history.
pub const HISTORY_LENGTH: usize = 20;
/// The most closed pauses kept ahead of the cursor; beyond it the two oldest merge into one.
pub const MAX_PAUSES: usize = 20;

/// A store call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("schedule store ({table}): {message}")]
pub struct StoreError {
    /// The table.
    pub table: String,
    /// What failed.
    pub message: String,
}

/// The leader lease's record: compared whole, never by time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The holder (empty: released).
    pub owner: String,
    /// Raised by every takeover.
    pub epoch: u64,
    /// Raised by every renewal.
    pub version: u64,
}

/// One entry of a schedule's run history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The tick (for a skipped run of ticks: the last of them).
    pub tick: SystemTime,
    /// When the leader recorded it (the leader's clock).
    pub at: SystemTime,
    /// `sent`, `skipped`, or `failed`.
    pub outcome: String,
    /// SQS's message id when sent; the reason otherwise.
    pub detail: String,
}

/// A schedule's shared state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduleState {
    /// Paused schedules send nothing; their ticks are skipped, never replayed.
    pub paused: bool,
    /// When the current or last pause began.
    pub paused_at: Option<SystemTime>,
    /// When the last pause ended.
    pub resumed_at: Option<SystemTime>,
    /// Closed pauses `(paused_at, resumed_at]` the cursor may not have passed yet, oldest first (at
    /// most [`MAX_PAUSES`]).
    pub pauses: Vec<(SystemTime, SystemTime)>,
    /// Ticks sent (confirmed by SQS), counted toward `max_runs`.
    pub runs: u64,
    /// The cursor: the newest tick sent or skipped.
    pub last_tick: Option<SystemTime>,
    /// The newest tick sent.
    pub last_sent: Option<SystemTime>,
    /// When that send was confirmed.
    pub last_fire: Option<SystemTime>,
    /// What happened last (`sent <message id>`, `skipped: ...`, or the error).
    pub last_outcome: Option<String>,
    /// Recent ticks, newest last (at most [`HISTORY_LENGTH`]).
    pub history: Vec<HistoryEntry>,
}

impl ScheduleState {
    /// True when `tick` falls in a pause: after the current pause began, or inside a closed pause
    /// (after its `paused_at` and not after its `resumed_at`).
    pub fn in_pause(&self, tick: SystemTime) -> bool {
        let inside = |from: SystemTime, to: SystemTime| tick > from && tick <= to;
        if let Some(paused_at) = self.paused_at {
            if self.paused && tick > paused_at {
                return true;
            }
            // A state written before `pauses` existed keeps its one closed pause here.
            if !self.paused && self.resumed_at.is_some_and(|resumed| inside(paused_at, resumed)) {
                return true;
            }
        }
        self.pauses.iter().any(|(from, to)| inside(*from, *to))
    }

    /// The closed pauses after resuming at `at`: the current pause appended, the pauses the cursor
    /// passed dropped, and the two oldest merged while more than [`MAX_PAUSES`] remain (skipping the
    /// ticks between them rather than replaying any). Unchanged when not paused.
    pub fn pauses_after_resume(&self, at: SystemTime) -> Vec<(SystemTime, SystemTime)> {
        let mut pauses: Vec<(SystemTime, SystemTime)> = self
            .pauses
            .iter()
            .copied()
            .filter(|(_, to)| self.last_tick.is_none_or(|cursor| *to > cursor))
            .collect();
        if let (true, Some(paused_at)) = (self.paused, self.paused_at) {
            pauses.push((paused_at, at.max(paused_at)));
        }
        while pauses.len() > MAX_PAUSES {
            let (from, _) = pauses.remove(0);
            pauses[0].0 = from;
        }
        pauses
    }
}

/// A move of the cursor, with what happened to the tick(s) it passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    /// The new cursor.
    pub tick: SystemTime,
    /// Count one run (the tick was sent and SQS confirmed it).
    pub count_run: bool,
    /// The confirmed send's time, when sent.
    pub fired_at: Option<SystemTime>,
    /// The outcome text (`sent <id>` or `skipped: <why>`).
    pub outcome: String,
    /// The history after this move (the caller appends and bounds it).
    pub history: Vec<HistoryEntry>,
}

/// Where schedules keep their lease, state and run-time definitions (see the module's design note).
/// The DynamoDB implementation is [`TickStore`]; `crate::memory::MemoryScheduleStore` serves tests and
/// the simulator.
#[async_trait]
pub trait ScheduleStore: Send + Sync + std::fmt::Debug {
    /// The lease record of schedule set `set`, if any.
    async fn read_lease(&self, set: &str) -> Result<Option<LeaseRecord>, StoreError>;
    /// Writes `record` if the stored record is exactly `expected` (`None`: absent). `Ok(false)` when it
    /// is not.
    async fn write_lease(
        &self,
        set: &str,
        expected: Option<&LeaseRecord>,
        record: &LeaseRecord,
    ) -> Result<bool, StoreError>;
    /// The schedule's state (a consistent read; defaults when it never ran).
    async fn state(&self, name: &str) -> Result<ScheduleState, StoreError>;
    /// Moves the cursor to `advance.tick` if it is before it (and, when counting a run, while
    /// `runs < max_runs`). `Ok(false)`: the condition failed (the cursor was already there).
    async fn advance(&self, name: &str, advance: &Advance, max_runs: Option<u64>)
    -> Result<bool, StoreError>;
    /// Records an outcome only (a failed send, a manual trigger).
    async fn note(&self, name: &str, outcome: &str) -> Result<(), StoreError>;
    /// Pauses at `at` (no-op when already paused).
    async fn pause(&self, name: &str, at: SystemTime) -> Result<(), StoreError>;
    /// Resumes at `at`: ticks up to `at` since the pause are skipped, and stay skipped after any
    /// number of later pauses (the pause joins [`ScheduleState::pauses`]; no-op when not paused).
    async fn resume(&self, name: &str, at: SystemTime) -> Result<(), StoreError>;
    /// Schedules added at run time to `set`: name -> definition JSON.
    async fn definitions(&self, set: &str) -> Result<HashMap<String, String>, StoreError>;
    /// Adds or replaces a run-time schedule. A schedule new to the set starts fresh: any state left
    /// under its name (a leader that served it once more while it was being removed) is deleted.
    async fn put_definition(&self, set: &str, name: &str, definition: &str) -> Result<(), StoreError>;
    /// Removes a run-time schedule and its state (cursor, runs, pauses, history), so a schedule added
    /// again under the name starts fresh (no-op when absent).
    async fn remove_definition(&self, set: &str, name: &str) -> Result<(), StoreError>;
    /// Records the schedules given in code to `set`'s leader (name -> definition JSON, as
    /// [`crate::to_definition_json`] writes it), replacing what was recorded; `by` is the leader's
    /// owner id. Default: records nothing.
    async fn record_code_definitions(
        &self,
        set: &str,
        definitions: &HashMap<String, String>,
        by: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let _ = (set, definitions, by, at);
        Ok(())
    }
    /// The schedules last recorded by [`ScheduleStore::record_code_definitions`] for `set` (empty when
    /// no leader recorded any). Default: none.
    async fn code_definitions(&self, set: &str) -> Result<HashMap<String, String>, StoreError> {
        let _ = set;
        Ok(HashMap::new())
    }
    /// Requests made so far (figures).
    fn requests(&self) -> u64;
}

/// The store in a DynamoDB table with a string partition key `id` (the idempotency table).
#[derive(Debug, Clone)]
pub struct TickStore {
    client: Client,
    table: String,
    requests: Arc<AtomicU64>,
}

/// Milliseconds since the epoch.
pub(crate) fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |elapsed| {
        u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The time `ms` milliseconds after the epoch.
pub(crate) fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Option<u64> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

fn text(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    item.get(name)?.as_s().ok().cloned()
}

/// The state item's id.
pub fn state_id(name: &str) -> String {
    format!("conveyor:schedule#{name}")
}

fn set_id(set: &str) -> String {
    format!("conveyor:schedules#{set}")
}

fn code_id(set: &str) -> String {
    format!("conveyor:schedules#{set}@code")
}

/// The string values of the map attribute `name` of `item` (empty when absent).
fn string_map(item: &HashMap<String, AttributeValue>, name: &str) -> HashMap<String, String> {
    let Some(Ok(map)) = item.get(name).map(AttributeValue::as_m) else {
        return HashMap::new();
    };
    map.iter()
        .filter_map(|(name, value)| Some((name.clone(), value.as_s().ok()?.clone())))
        .collect()
}

fn lease_id(set: &str) -> String {
    format!("conveyor:schedules#{set}@lease")
}

fn history_value(history: &[HistoryEntry]) -> AttributeValue {
    AttributeValue::L(
        history
            .iter()
            .map(|entry| {
                AttributeValue::M(HashMap::from([
                    ("tick_ms".to_owned(), n(millis(entry.tick))),
                    ("at_ms".to_owned(), n(millis(entry.at))),
                    ("outcome".to_owned(), s(&entry.outcome)),
                    ("detail".to_owned(), s(&entry.detail)),
                ]))
            })
            .collect(),
    )
}

fn history_of(value: Option<&AttributeValue>) -> Vec<HistoryEntry> {
    let Some(Ok(list)) = value.map(AttributeValue::as_l) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|entry| {
            let map = entry.as_m().ok()?;
            Some(HistoryEntry {
                tick: from_millis(number(map, "tick_ms")?),
                at: from_millis(number(map, "at_ms")?),
                outcome: text(map, "outcome").unwrap_or_default(),
                detail: text(map, "detail").unwrap_or_default(),
            })
        })
        .collect()
}

fn pauses_value(pauses: &[(SystemTime, SystemTime)]) -> AttributeValue {
    AttributeValue::L(
        pauses
            .iter()
            .map(|(from, to)| {
                AttributeValue::M(HashMap::from([
                    ("from_ms".to_owned(), n(millis(*from))),
                    ("to_ms".to_owned(), n(millis(*to))),
                ]))
            })
            .collect(),
    )
}

fn pauses_of(value: Option<&AttributeValue>) -> Vec<(SystemTime, SystemTime)> {
    let Some(Ok(list)) = value.map(AttributeValue::as_l) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|entry| {
            let map = entry.as_m().ok()?;
            Some((
                from_millis(number(map, "from_ms")?),
                from_millis(number(map, "to_ms")?),
            ))
        })
        .collect()
}

/// Every attribute of a schedule's state item but its id: removed together, the state reads as new.
const STATE_ATTRIBUTES: &str = "paused, paused_at_ms, resumed_at_ms, pauses, runs, last_tick_ms, last_sent_ms, \
                                last_fire_ms, last_outcome, history";

/// How often a resume re-reads the state when another pause or resume changed it meanwhile.
const RESUME_ATTEMPTS: usize = 5;

fn is_condition_failure<E: aws_sdk_dynamodb::error::ProvideErrorMetadata>(error: &E) -> bool {
    error.code() == Some("ConditionalCheckFailedException")
}

impl TickStore {
    /// A store on `table` (the consumers' `CONVEYOR_IDEMPOTENCY_TABLE`).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            requests: Arc::default(),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    fn error(&self, error: impl std::fmt::Display) -> StoreError {
        StoreError {
            table: self.table.clone(),
            message: error.to_string(),
        }
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Pauses at `at`, recording when; a no-op when already paused.
    async fn pause_at(&self, name: &str, at: SystemTime) -> Result<(), StoreError> {
        self.count();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .update_expression("SET paused = :to, paused_at_ms = :at")
            .condition_expression("attribute_not_exists(paused) OR paused = :from")
            .expression_attribute_values(":to", AttributeValue::Bool(true))
            .expression_attribute_values(":from", AttributeValue::Bool(false))
            .expression_attribute_values(":at", n(millis(at)))
            .send()
            .await;
        self.conditional(result).map(|_| ())
    }

    /// Closes the pause `state` shows at `at`, if the stored pause is still that one: `Ok(false)` when
    /// another pause or resume came first (re-read and try again).
    async fn close_pause(
        &self,
        name: &str,
        state: &ScheduleState,
        at: SystemTime,
    ) -> Result<bool, StoreError> {
        let Some(paused_at) = state.paused_at else {
            return Ok(true);
        };
        self.count();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .update_expression("SET paused = :to, resumed_at_ms = :at, pauses = :pauses")
            .condition_expression("paused = :from AND paused_at_ms = :paused_at")
            .expression_attribute_values(":to", AttributeValue::Bool(false))
            .expression_attribute_values(":from", AttributeValue::Bool(true))
            .expression_attribute_values(":at", n(millis(at)))
            .expression_attribute_values(":paused_at", n(millis(paused_at)))
            .expression_attribute_values(":pauses", pauses_value(&state.pauses_after_resume(at)))
            .send()
            .await;
        self.conditional(result)
    }

    /// `Ok(true)` for a write made, `Ok(false)` for a condition that failed, else the error.
    fn conditional<T, E>(
        &self,
        result: Result<T, aws_sdk_dynamodb::error::SdkError<E>>,
    ) -> Result<bool, StoreError>
    where
        E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static,
    {
        match result {
            Ok(_) => Ok(true),
            Err(error) if error.as_service_error().is_some_and(is_condition_failure) => Ok(false),
            Err(error) => Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error))),
        }
    }

    /// Deletes a schedule's state (every attribute but the id, with `UpdateItem`, which the operators'
    /// policy grants): it reads as a schedule that never ran.
    async fn reset_state(&self, name: &str) -> Result<(), StoreError> {
        self.count();
        self.client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .update_expression(format!("REMOVE {STATE_ATTRIBUTES}"))
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(())
    }

    async fn get(&self, id: String) -> Result<Option<HashMap<String, AttributeValue>>, StoreError> {
        self.count();
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("id", s(&id))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(output.item)
    }
}

#[async_trait]
impl ScheduleStore for TickStore {
    async fn read_lease(&self, set: &str) -> Result<Option<LeaseRecord>, StoreError> {
        let Some(item) = self.get(lease_id(set)).await? else {
            return Ok(None);
        };
        Ok(Some(LeaseRecord {
            owner: text(&item, "owner").unwrap_or_default(),
            epoch: number(&item, "epoch").unwrap_or(0),
            version: number(&item, "version").unwrap_or(0),
        }))
    }

    async fn write_lease(
        &self,
        set: &str,
        expected: Option<&LeaseRecord>,
        record: &LeaseRecord,
    ) -> Result<bool, StoreError> {
        self.count();
        // `UpdateItem` (an upsert), not `PutItem`: the consumers' policy grants `UpdateItem` and
        // `GetItem` on the table and nothing more (`conveyor_dynamodb::iam::CONSUMER_TABLE`).
        let mut put = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&lease_id(set)))
            .update_expression("SET #owner = :new_owner, epoch = :new_epoch, version = :new_version")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":new_owner", s(&record.owner))
            .expression_attribute_values(":new_epoch", n(record.epoch))
            .expression_attribute_values(":new_version", n(record.version));
        put = match expected {
            None => put.condition_expression("attribute_not_exists(id)"),
            Some(expected) => put
                .condition_expression("#owner = :owner AND epoch = :epoch AND version = :version")
                .expression_attribute_values(":owner", s(&expected.owner))
                .expression_attribute_values(":epoch", n(expected.epoch))
                .expression_attribute_values(":version", n(expected.version)),
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(error) if error.as_service_error().is_some_and(is_condition_failure) => Ok(false),
            Err(error) => Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error))),
        }
    }

    async fn state(&self, name: &str) -> Result<ScheduleState, StoreError> {
        let Some(item) = self.get(state_id(name)).await? else {
            return Ok(ScheduleState::default());
        };
        Ok(ScheduleState {
            paused: item
                .get("paused")
                .and_then(|value| value.as_bool().ok())
                .copied()
                .unwrap_or(false),
            paused_at: number(&item, "paused_at_ms").map(from_millis),
            resumed_at: number(&item, "resumed_at_ms").map(from_millis),
            pauses: pauses_of(item.get("pauses")),
            runs: number(&item, "runs").unwrap_or(0),
            last_tick: number(&item, "last_tick_ms").map(from_millis),
            last_sent: number(&item, "last_sent_ms").map(from_millis),
            last_fire: number(&item, "last_fire_ms").map(from_millis),
            last_outcome: text(&item, "last_outcome"),
            history: history_of(item.get("history")),
        })
    }

    async fn advance(
        &self,
        name: &str,
        advance: &Advance,
        max_runs: Option<u64>,
    ) -> Result<bool, StoreError> {
        self.count();
        let mut set = "SET last_tick_ms = :tick, last_outcome = :outcome, history = :history".to_owned();
        let mut condition = "(attribute_not_exists(last_tick_ms) OR last_tick_ms < :tick)".to_owned();
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .expression_attribute_values(":tick", n(millis(advance.tick)))
            .expression_attribute_values(":outcome", s(&advance.outcome))
            .expression_attribute_values(":history", history_value(&advance.history));
        if let Some(fired) = advance.fired_at {
            set.push_str(", last_fire_ms = :fired, last_sent_ms = :tick");
            update = update.expression_attribute_values(":fired", n(millis(fired)));
        }
        if advance.count_run {
            set.push_str(" ADD runs :one");
            update = update.expression_attribute_values(":one", n(1));
            if let Some(max) = max_runs {
                condition.push_str(" AND (attribute_not_exists(runs) OR runs < :max)");
                update = update.expression_attribute_values(":max", n(max));
            }
        }
        match update
            .update_expression(set)
            .condition_expression(condition)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if error.as_service_error().is_some_and(is_condition_failure) => Ok(false),
            Err(error) => Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error))),
        }
    }

    async fn note(&self, name: &str, outcome: &str) -> Result<(), StoreError> {
        self.count();
        self.client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .update_expression("SET last_outcome = :outcome")
            .expression_attribute_values(":outcome", s(outcome))
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(())
    }

    async fn pause(&self, name: &str, at: SystemTime) -> Result<(), StoreError> {
        self.pause_at(name, at).await
    }

    async fn resume(&self, name: &str, at: SystemTime) -> Result<(), StoreError> {
        for _ in 0..RESUME_ATTEMPTS {
            let state = self.state(name).await?;
            if !state.paused || self.close_pause(name, &state, at).await? {
                return Ok(());
            }
        }
        Err(self.error(format!(
            "schedule {name}: its pause changed {RESUME_ATTEMPTS} times while resuming it (other operators \
             pausing and resuming it at once); run the resume again"
        )))
    }

    async fn definitions(&self, set: &str) -> Result<HashMap<String, String>, StoreError> {
        let Some(item) = self.get(set_id(set)).await? else {
            return Ok(HashMap::new());
        };
        Ok(string_map(&item, "definitions"))
    }

    async fn record_code_definitions(
        &self,
        set: &str,
        definitions: &HashMap<String, String>,
        by: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        self.count();
        let map = definitions
            .iter()
            .map(|(name, definition)| (name.clone(), s(definition)))
            .collect();
        self.client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&code_id(set)))
            .update_expression("SET code_definitions = :definitions, recorded_ms = :at, recorded_by = :by")
            .expression_attribute_values(":definitions", AttributeValue::M(map))
            .expression_attribute_values(":at", n(millis(at)))
            .expression_attribute_values(":by", s(by))
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(())
    }

    async fn code_definitions(&self, set: &str) -> Result<HashMap<String, String>, StoreError> {
        let Some(item) = self.get(code_id(set)).await? else {
            return Ok(HashMap::new());
        };
        Ok(string_map(&item, "code_definitions"))
    }

    async fn put_definition(&self, set: &str, name: &str, definition: &str) -> Result<(), StoreError> {
        self.count();
        // Two writes would race; one `SET` on a map needs the map to exist, so create it first if absent.
        let created = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&set_id(set)))
            .update_expression("SET definitions = if_not_exists(definitions, :empty)")
            .expression_attribute_values(":empty", AttributeValue::M(HashMap::new()))
            .send()
            .await;
        created.map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        // A schedule new to the set first, so that it starts fresh; a replacement keeps its state.
        self.count();
        let added = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&set_id(set)))
            .update_expression("SET definitions.#name = :definition")
            .condition_expression("attribute_not_exists(definitions.#name)")
            .expression_attribute_names("#name", name)
            .expression_attribute_values(":definition", s(definition))
            .send()
            .await;
        if self.conditional(added)? {
            return self.reset_state(name).await;
        }
        self.count();
        self.client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&set_id(set)))
            .update_expression("SET definitions.#name = :definition")
            .expression_attribute_names("#name", name)
            .expression_attribute_values(":definition", s(definition))
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(())
    }

    async fn remove_definition(&self, set: &str, name: &str) -> Result<(), StoreError> {
        self.count();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&set_id(set)))
            .update_expression("REMOVE definitions.#name")
            .condition_expression("attribute_exists(definitions.#name)")
            .expression_attribute_names("#name", name)
            .send()
            .await;
        // Only a schedule that was in the set loses its state: a code schedule of the same name keeps
        // its cursor when an operator removes a name the set does not hold.
        if self.conditional(result)? {
            self.reset_state(name).await?;
        }
        Ok(())
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn a_tick_is_in_the_pause_between_pause_and_resume_only() {
        let mut state = ScheduleState {
            paused: true,
            paused_at: Some(at(100)),
            ..ScheduleState::default()
        };
        assert!(
            !state.in_pause(at(100)),
            "the tick at the pause itself was due before it"
        );
        assert!(state.in_pause(at(101)));
        assert!(state.in_pause(at(10_000)), "still paused");
        state.paused = false;
        state.resumed_at = Some(at(200));
        assert!(state.in_pause(at(200)));
        assert!(!state.in_pause(at(201)));
        assert!(!ScheduleState::default().in_pause(at(5)));
    }

    #[test]
    fn closed_pauses_are_bounded_and_merge_rather_than_replay() {
        let mut state = ScheduleState {
            last_tick: Some(at(50)),
            pauses: vec![(at(10), at(40))],
            ..ScheduleState::default()
        };
        for cycle in 0..(MAX_PAUSES as u64 + 5) {
            let from = 100 + cycle * 10;
            state.paused = true;
            state.paused_at = Some(at(from));
            state.pauses = state.pauses_after_resume(at(from + 5));
            state.paused = false;
        }
        assert_eq!(state.pauses.len(), MAX_PAUSES, "{:?}", state.pauses);
        assert!(
            state.pauses.iter().all(|(_, to)| *to > at(50)),
            "the pause behind the cursor is dropped"
        );
        assert!(
            state.in_pause(at(103)),
            "the oldest pause is still skipped (merged)"
        );
        assert!(
            state.in_pause(at(103 + 10 * (MAX_PAUSES as u64 + 4))),
            "the newest too"
        );
        assert!(!state.in_pause(at(500)));
    }
}
