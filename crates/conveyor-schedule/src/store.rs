//! [`TickStore`]: tick claims and schedule state in the idempotency table, by conditional writes.
//!
//! # Design note: one tick, one sender
//!
//! Every worker runs the scheduler; each due tick is claimed with one conditional `UpdateItem` (an
//! upsert: the consumers' permissions already grant it and `GetItem`, and nothing more) on the item
//! `conveyor:schedule#<name>@<tick ms>`:
//!
//! ```text
//! attribute_not_exists(id) OR (status = CLAIMED AND lease_until_ms < :now_ms)
//! ```
//!
//! 1. The worker whose write succeeds holds the tick until `lease_until_ms` (30 s by default). It sends
//!    the job, then marks the tick `SENT` (conditional on still being the owner) and records the
//!    outcome on the schedule's state item. The others see the failed condition with the item
//!    (`ReturnValuesOnConditionCheckFailure = ALL_OLD`): `SENT` or `SKIPPED` means done; `CLAIMED`
//!    means "look again when its lease ends".
//! 2. A winner that dies between claiming and sending leaves a `CLAIMED` item whose lease lapses; the
//!    next worker to look claims it again and sends. So a tick is never lost while any worker runs.
//! 3. A winner that dies between sending and marking, or whose send outlived its lease, may be
//!    followed by a second send of the same tick: both carry the key `schedule:<name>@<tick>`, so the
//!    consumer's idempotency claim settles the second as a duplicate. Sent once, *run* once.
//!
//! Why the idempotency table rather than a table of its own: the scheduler runs where the consumers
//! run, which already have the table and its permissions (`dynamodb:UpdateItem`,
//! `GetItem`); schedule items live under their own `conveyor:schedule#` prefix, carry the table's TTL
//! attribute (`expiration`, 7 days past the tick) and never collide with job records
//! (`conveyor:<job type>#...`) or Powertools' (`<function>#<hash>`).
//!
//! The state item `conveyor:schedule#<name>` holds `paused`, `runs` (sends counted for `max_runs`,
//! conditionally incremented by the tick's winner before it sends), `last_tick_ms`, `last_fire_ms`
//! and `last_outcome`. With `max_runs`, a winner that dies after counting and before sending makes the
//! schedule one run short rather than one over.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

/// How long a tick's record is kept past the tick (the table's TTL attribute).
pub(crate) const TICK_RECORD_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

const CLAIMED: &str = "CLAIMED";
const SENT: &str = "SENT";
const SKIPPED: &str = "SKIPPED";

/// A store call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("schedule store ({table}): {message}")]
pub struct StoreError {
    /// The table.
    pub table: String,
    /// What failed.
    pub message: String,
}

/// What claiming a tick found.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TickClaim {
    /// This worker holds the tick: send it.
    Won,
    /// Already sent (or skipped) by someone.
    Done,
    /// Held by another worker until then; look again after.
    Held {
        /// The holder's lease end.
        until: SystemTime,
    },
}

/// A schedule's shared state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduleState {
    /// Paused schedules send nothing; their ticks pass.
    pub paused: bool,
    /// Sends counted toward `max_runs`.
    pub runs: u64,
    /// The latest tick sent (or triggered).
    pub last_tick: Option<SystemTime>,
    /// When that send happened.
    pub last_fire: Option<SystemTime>,
    /// What happened on the last attempt (`sent <message id>`, or the error).
    pub last_outcome: Option<String>,
}

/// Tick claims and schedule state in a DynamoDB table with a string partition key `id` (the
/// idempotency table; see the module's design note).
#[derive(Debug, Clone)]
pub struct TickStore {
    client: Client,
    table: String,
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |elapsed| {
        u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
    })
}

fn from_millis(ms: u64) -> SystemTime {
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

/// The state item's id.
pub(crate) fn state_id(name: &str) -> String {
    format!("conveyor:schedule#{name}")
}

/// A tick item's id.
pub fn tick_id(name: &str, tick: SystemTime) -> String {
    format!("conveyor:schedule#{name}@{}", millis(tick))
}

impl TickStore {
    /// A store on `table` (the consumers' `CONVEYOR_IDEMPOTENCY_TABLE`).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
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

    /// Claims `tick` of schedule `name` for `owner` until `lease_until` (see the design note).
    pub async fn claim_tick(
        &self,
        name: &str,
        tick: SystemTime,
        owner: &str,
        now: SystemTime,
        lease_until: SystemTime,
    ) -> Result<TickClaim, StoreError> {
        let expiration = (tick + TICK_RECORD_TTL)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&tick_id(name, tick)))
            .update_expression(
                "SET #status = :claimed, #owner = :owner, lease_until_ms = :lease, expiration = :expiration",
            )
            .condition_expression(
                "attribute_not_exists(id) OR (#status = :claimed AND lease_until_ms < :now)",
            )
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":claimed", s(CLAIMED))
            .expression_attribute_values(":owner", s(owner))
            .expression_attribute_values(":lease", n(millis(lease_until)))
            .expression_attribute_values(":expiration", n(expiration))
            .expression_attribute_values(":now", n(millis(now)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let error = match result {
            Ok(_) => return Ok(TickClaim::Won),
            Err(error) => error,
        };
        let failed = match error.as_service_error() {
            Some(
                aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(
                    failed,
                ),
            ) => Some(failed),
            _ => None,
        };
        let Some(failed) = failed else {
            return Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)));
        };
        let item = failed.item().cloned().unwrap_or_default();
        let status = item
            .get("status")
            .and_then(|value| value.as_s().ok())
            .map(String::as_str);
        if status == Some(CLAIMED) {
            let until = number(&item, "lease_until_ms").map_or(now, from_millis);
            return Ok(TickClaim::Held { until });
        }
        Ok(TickClaim::Done)
    }

    /// Counts one run toward `max_runs`; `false` when the schedule has used them all.
    pub async fn count_run(&self, name: &str, max_runs: u64) -> Result<bool, StoreError> {
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .update_expression("ADD runs :one")
            .condition_expression("attribute_not_exists(runs) OR runs < :max")
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":max", n(max_runs))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(error)
                if error
                    .as_service_error()
                    .is_some_and(|service| service.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(error) => Err(self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error))),
        }
    }

    /// Marks a tick sent (or skipped) by `owner`, and records the outcome on the schedule's state.
    pub async fn finish_tick(
        &self,
        name: &str,
        tick: SystemTime,
        owner: &str,
        outcome: Finished<'_>,
    ) -> Result<(), StoreError> {
        let (status, text) = match outcome {
            Finished::Sent { message_id } => (SENT, format!("sent {message_id}")),
            Finished::Skipped { reason } => (SKIPPED, format!("skipped: {reason}")),
        };
        let marked = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&tick_id(name, tick)))
            .update_expression("SET #status = :status")
            .condition_expression("#owner = :owner")
            .expression_attribute_names("#status", "status")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":status", s(status))
            .expression_attribute_values(":owner", s(owner))
            .send()
            .await;
        if let Err(error) = marked {
            // Taken over after our lease lapsed: the new owner sends too, and the key makes it a duplicate.
            tracing::warn!(schedule = name, error = %aws_sdk_dynamodb::error::DisplayErrorContext(&error), "could not mark the tick");
        }
        if status == SENT {
            self.record(name, Some(tick), &text).await
        } else {
            self.record(name, None, &text).await
        }
    }

    /// Records an attempt's outcome (and the tick, when one was sent) on the schedule's state.
    pub async fn record(
        &self,
        name: &str,
        sent_tick: Option<SystemTime>,
        outcome: &str,
    ) -> Result<(), StoreError> {
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .expression_attribute_values(":outcome", s(outcome));
        update = match sent_tick {
            Some(tick) => update
                .update_expression("SET last_outcome = :outcome, last_fire_ms = :fire, last_tick_ms = :tick")
                .expression_attribute_values(":fire", n(millis(SystemTime::now())))
                .expression_attribute_values(":tick", n(millis(tick))),
            None => update.update_expression("SET last_outcome = :outcome"),
        };
        update
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(())
    }

    /// The schedule's shared state (a consistent read; all defaults when it never ran).
    pub async fn state(&self, name: &str) -> Result<ScheduleState, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        let Some(item) = output.item else {
            return Ok(ScheduleState::default());
        };
        Ok(ScheduleState {
            paused: item
                .get("paused")
                .and_then(|value| value.as_bool().ok())
                .copied()
                .unwrap_or(false),
            runs: number(&item, "runs").unwrap_or(0),
            last_tick: number(&item, "last_tick_ms").map(from_millis),
            last_fire: number(&item, "last_fire_ms").map(from_millis),
            last_outcome: item
                .get("last_outcome")
                .and_then(|value| value.as_s().ok())
                .cloned(),
        })
    }

    /// Pauses (`true`) or resumes (`false`) the schedule for every worker.
    pub async fn set_paused(&self, name: &str, paused: bool) -> Result<(), StoreError> {
        self.client
            .update_item()
            .table_name(&self.table)
            .key("id", s(&state_id(name)))
            .update_expression("SET paused = :paused")
            .expression_attribute_values(":paused", AttributeValue::Bool(paused))
            .send()
            .await
            .map_err(|error| self.error(aws_sdk_dynamodb::error::DisplayErrorContext(&error)))?;
        Ok(())
    }
}

/// How a won tick ended.
#[non_exhaustive]
#[derive(Debug, Clone, Copy)]
pub enum Finished<'a> {
    /// Sent, with this message id.
    Sent {
        /// SQS's message id.
        message_id: &'a str,
    },
    /// Not sent (max runs reached).
    Skipped {
        /// Why.
        reason: &'a str,
    },
}
