//! The `TimerStore` port on the idempotency table: one item per delayed job, listed by due time on the
//! jobs index (see `conveyor_core`'s timer note for the claim, send and finish steps).
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | id | S | `conveyor-timer:<queue name>/<timer id>` |
//! | `job_shard` | S | `conveyor-timer#<queue name>#<0..4>`: a stable hash of the timer id spreads one queue's timers over [`TIMER_SHARDS`] index partitions |
//! | `job_sort` | S | `due#<due epoch ms, 13 digits>#<timer id>`: the index lists a shard soonest first |
//! | `job_type`, `job_sent_at` | S, N | the job's type; when the timer was written (projected, for listings) |
//! | `job_status`, `job_changed` | S, N | `delayed`; once a relay has claimed it, `sending` and the claim's end (projected; a failed send ends it early) |
//! | `timer_message` | S | the encoded message, as JSON (the queue is the caller's: its name is in the id) |
//! | `timer_token` | S | the claiming relay's token, while claimed |
//!
//! Timer items carry no `expiration`: a timer is removed by its relay after the send, or by a cancel.
//!
//! The relays' "seen" mark (`conveyor_core`'s timer note, "nothing waits silently") is one more item
//! per queue, `conveyor-timer-relay:<queue name>`, holding `relay_seen_ms` and `relay_lookahead_ms` (N)
//! and the table's TTL attribute one day after the pass. Each relay replaces it with one unconditional
//! `UpdateItem` at most once a minute (1 write unit: about 1,440 a day per running relay, so ten
//! workers cost about 14,400 write units a day, under 2 US cents on demand); a producer that keeps
//! timers reads it with one eventually consistent `GetItem` (0.5 read units) at most every ten
//! minutes. Nothing depends on TTL: the mark is judged by its time.
//!
//! Costs: writing a timer is one `PutItem` (`ceil(item size / 1 KB)` write units); a relay pass is one
//! `Query` per shard (0.5 read units each when nothing is due), then per due timer one `UpdateItem`
//! (claim), the `SendMessage` and one `DeleteItem` (finish). Listing is one `Query` per shard.

use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::ReturnValue;
use aws_smithy_runtime_api::http::Response;
use conveyor_core::TimerChange;
use conveyor_core::port::{
    ClaimedTimer, NewTimer, OutgoingMessage, RelayMark, StoreError, Timer, TimerStore, from_epoch_millis,
    to_epoch_millis,
};

use crate::classify::{ConditionalError, Failure, classify};
use crate::item::{Item, number, string, text, whole};
use crate::jobs::{JOB_CHANGED, JOB_SHARD, JOB_SORT, JOB_TYPE, shard_of};
use crate::store::DynamoStore;

/// How many index partitions one queue's timers are spread over (`timers` reads all of them).
pub(crate) const TIMER_SHARDS: u32 = 4;
const STATUS: &str = "job_status";
const CREATED: &str = "job_sent_at";
const MESSAGE: &str = "timer_message";
const TOKEN: &str = "timer_token";
const DELAYED: &str = "delayed";
const RELAY_SEEN: &str = "relay_seen_ms";
const RELAY_LOOKAHEAD: &str = "relay_lookahead_ms";
/// How long a relay mark stays in the table (TTL; the mark is judged by its time, never by TTL).
const RELAY_MARK_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
const SENDING: &str = "sending";

/// The queue's name: the last segment of its URL.
fn queue_name(queue_url: &str) -> &str {
    queue_url.rsplit('/').next().unwrap_or(queue_url)
}

fn item_id(queue_url: &str, id: &str) -> String {
    format!("conveyor-timer:{}/{id}", queue_name(queue_url))
}

fn relay_mark_id(queue_url: &str) -> String {
    format!("conveyor-timer-relay:{}", queue_name(queue_url))
}

fn shard(queue_url: &str, index: u32) -> String {
    format!("conveyor-timer#{}#{index}", queue_name(queue_url))
}

fn sort(due: SystemTime, id: &str) -> String {
    format!("due#{:013}#{id}", to_epoch_millis(due))
}

fn millis(item: &Item, name: &str) -> Option<SystemTime> {
    whole(item, name).map(from_epoch_millis)
}

/// A timer from its item (the table's or the index's projection).
fn parse_timer(queue_url: &str, item: &Item) -> Option<Timer> {
    let (due, id) = text(item, JOB_SORT)?.strip_prefix("due#")?.split_once('#')?;
    Some(Timer {
        id: id.to_owned(),
        queue_url: queue_url.to_owned(),
        due: from_epoch_millis(due.parse().ok()?),
        job_type: text(item, JOB_TYPE).unwrap_or_default().to_owned(),
        created: millis(item, CREATED).unwrap_or(SystemTime::UNIX_EPOCH),
        claimed_until: (text(item, STATUS) == Some(SENDING))
            .then(|| millis(item, JOB_CHANGED))
            .flatten(),
    })
}

impl DynamoStore {
    /// A failed timer request as a store error.
    fn timer_failure(&self, failure: Failure, id: &str) -> StoreError {
        match failure {
            Failure::Store(error) => error,
            Failure::ItemTooLarge => StoreError::Misconfigured {
                message: format!(
                    "timer {id}: the job is over DynamoDB's 400 KB item size; send it through the claim check \
                     (Producer::with_large_payloads) so the timer keeps only the pointer"
                ),
            },
            Failure::ConditionFailed => StoreError::Unavailable {
                message: format!("timer {id}: unexpected condition failure"),
            },
        }
    }

    /// A conditional write's answer for timer `id` (item `key`): `Some` when it was applied, `None`
    /// when its condition failed.
    fn applied<T, E>(
        &self,
        result: Result<T, SdkError<E, Response>>,
        operation: &'static str,
        key: &str,
        id: &str,
    ) -> Result<Option<T>, StoreError>
    where
        E: ConditionalError + ProvideErrorMetadata + std::error::Error + 'static,
    {
        match result.map_err(|error| classify(&error, self.target(operation, key))) {
            Ok(answer) => Ok(Some(answer)),
            Err(Failure::ConditionFailed) => Ok(None),
            Err(failure) => Err(self.timer_failure(failure, id)),
        }
    }

    /// A change (reschedule, cancel) as applied, or what its refusal met.
    async fn change(
        &self,
        applied: Option<()>,
        queue_url: &str,
        id: &str,
    ) -> Result<TimerChange, StoreError> {
        match applied {
            Some(()) => Ok(TimerChange::Changed),
            None => self.refused_change(queue_url, id).await,
        }
    }

    /// What a refused change met: a claimed timer, or none.
    async fn refused_change(&self, queue_url: &str, id: &str) -> Result<TimerChange, StoreError> {
        Ok(match self.get_item(&item_id(queue_url, id)).await? {
            Some(_) => TimerChange::Sending,
            None => TimerChange::NotFound,
        })
    }

    /// One shard's timers due by `before` (all when `None`), soonest first.
    async fn query_timers(
        &self,
        queue_url: &str,
        index: u32,
        before: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        let partition = shard(queue_url, index);
        let upper = before.map_or_else(|| "due#~".to_owned(), |before| sort(before, "~"));
        self.count_request();
        let answer = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(crate::defaults::JOBS_INDEX)
            .key_condition_expression("#shard = :partition AND #sort BETWEEN :first AND :last")
            .expression_attribute_names("#shard", JOB_SHARD)
            .expression_attribute_names("#sort", JOB_SORT)
            .expression_attribute_values(":partition", string(&partition))
            .expression_attribute_values(":first", string("due#"))
            .expression_attribute_values(":last", string(upper))
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|error| {
                self.timer_failure(classify(&error, self.target("Query", &partition)), &partition)
            })?;
        Ok(answer
            .items()
            .iter()
            .filter_map(|item| parse_timer(queue_url, item))
            .collect())
    }
}

#[async_trait]
impl TimerStore for DynamoStore {
    async fn put_timer(&self, timer: &NewTimer, now: SystemTime) -> Result<bool, StoreError> {
        let id = item_id(&timer.queue_url, &timer.id);
        let message = serde_json::to_string(&timer.message).map_err(|error| StoreError::Misconfigured {
            message: format!("timer {}: its message cannot be encoded: {error}", timer.id),
        })?;
        let mut item: Item = [
            (
                JOB_SHARD,
                string(shard(&timer.queue_url, shard_of(&timer.id) % TIMER_SHARDS)),
            ),
            (JOB_SORT, string(sort(timer.due, &timer.id))),
            (JOB_TYPE, string(&timer.job_type)),
            (CREATED, number(to_epoch_millis(now))),
            (STATUS, string(DELAYED)),
            (JOB_CHANGED, number(to_epoch_millis(now))),
            (MESSAGE, string(message)),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        item.extend(self.primary_key(&id));
        self.count_request();
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#id)")
            .expression_attribute_names("#id", &self.options.attributes.id)
            .send()
            .await;
        Ok(self.applied(result, "PutItem", &id, &timer.id)?.is_some())
    }

    async fn timers(
        &self,
        queue_url: &str,
        before: Option<SystemTime>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        let mut listed = Vec::new();
        for index in 0..TIMER_SHARDS {
            listed.extend(self.query_timers(queue_url, index, before, limit).await?);
        }
        listed.sort_by(|a, b| (a.due, &a.id).cmp(&(b.due, &b.id)));
        listed.truncate(limit);
        Ok(listed)
    }

    async fn timer(&self, queue_url: &str, id: &str) -> Result<Option<Timer>, StoreError> {
        Ok(self
            .get_item(&item_id(queue_url, id))
            .await?
            .and_then(|item| parse_timer(queue_url, &item)))
    }

    async fn reschedule_timer(
        &self,
        queue_url: &str,
        id: &str,
        due: SystemTime,
    ) -> Result<TimerChange, StoreError> {
        let key = item_id(queue_url, id);
        self.count_request();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&key)))
            .update_expression("SET #sort = :sort")
            .condition_expression("attribute_exists(#id) AND attribute_not_exists(#token)")
            .expression_attribute_names("#id", &self.options.attributes.id)
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_names("#sort", JOB_SORT)
            .expression_attribute_values(":sort", string(sort(due, id)))
            .send()
            .await;
        let applied = self.applied(result, "UpdateItem", &key, id)?.map(|_| ());
        self.change(applied, queue_url, id).await
    }

    async fn cancel_timer(&self, queue_url: &str, id: &str) -> Result<TimerChange, StoreError> {
        let key = item_id(queue_url, id);
        self.count_request();
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&key)))
            .condition_expression("attribute_exists(#id) AND attribute_not_exists(#token)")
            .expression_attribute_names("#id", &self.options.attributes.id)
            .expression_attribute_names("#token", TOKEN)
            .send()
            .await;
        let applied = self.applied(result, "DeleteItem", &key, id)?.map(|_| ());
        self.change(applied, queue_url, id).await
    }

    async fn claim_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
        until: SystemTime,
    ) -> Result<Option<ClaimedTimer>, StoreError> {
        let key = item_id(queue_url, id);
        self.count_request();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&key)))
            .update_expression("SET #token = :token, #status = :sending, #changed = :until")
            .condition_expression(
                "attribute_exists(#id) AND (attribute_not_exists(#token) OR #changed <= :now)",
            )
            .expression_attribute_names("#id", &self.options.attributes.id)
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_names("#status", STATUS)
            .expression_attribute_names("#changed", JOB_CHANGED)
            .expression_attribute_values(":token", string(token))
            .expression_attribute_values(":sending", string(SENDING))
            .expression_attribute_values(":until", number(to_epoch_millis(until)))
            .expression_attribute_values(":now", number(to_epoch_millis(now)))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        let Some(answer) = self.applied(result, "UpdateItem", &key, id)? else {
            return Ok(None);
        };
        let item = answer.attributes.unwrap_or_default();
        let malformed = |what: &str| StoreError::Misconfigured {
            message: format!("timer {id} in table {} is malformed: {what}", self.table),
        };
        let timer =
            parse_timer(queue_url, &item).ok_or_else(|| malformed("`job_sort` is not `due#<ms>#<id>`"))?;
        let json = text(&item, MESSAGE).ok_or_else(|| malformed("`timer_message` is missing"))?;
        let message: OutgoingMessage =
            serde_json::from_str(json).map_err(|error| malformed(&error.to_string()))?;
        Ok(Some(ClaimedTimer { timer, message }))
    }

    async fn release_timer(
        &self,
        queue_url: &str,
        id: &str,
        token: &str,
        now: SystemTime,
    ) -> Result<(), StoreError> {
        let key = item_id(queue_url, id);
        self.count_request();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&key)))
            .update_expression("SET #changed = :now")
            .condition_expression("#token = :token")
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_names("#changed", JOB_CHANGED)
            .expression_attribute_values(":token", string(token))
            .expression_attribute_values(":now", number(to_epoch_millis(now)))
            .send()
            .await;
        // Not ours any more (taken over after a lapse): nothing to do.
        self.applied(result, "UpdateItem", &key, id)?;
        Ok(())
    }

    async fn finish_timer(&self, queue_url: &str, id: &str, token: &str) -> Result<(), StoreError> {
        let key = item_id(queue_url, id);
        self.count_request();
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&key)))
            .condition_expression("#token = :token")
            .expression_attribute_names("#token", TOKEN)
            .expression_attribute_values(":token", string(token))
            .send()
            .await;
        // Not ours any more (taken over after a lapse): nothing to do.
        self.applied(result, "DeleteItem", &key, id)?;
        Ok(())
    }

    fn keeps_relay_marks(&self) -> bool {
        true
    }

    async fn mark_relay(&self, queue_url: &str, mark: &RelayMark) -> Result<(), StoreError> {
        let key = relay_mark_id(queue_url);
        let expires = (mark.seen + RELAY_MARK_TTL)
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        self.count_request();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&key)))
            .update_expression("SET #seen = :seen, #lookahead = :lookahead, #expiry = :expiry")
            .expression_attribute_names("#seen", RELAY_SEEN)
            .expression_attribute_names("#lookahead", RELAY_LOOKAHEAD)
            .expression_attribute_names("#expiry", &self.options.attributes.expiration)
            .expression_attribute_values(":seen", number(to_epoch_millis(mark.seen)))
            .expression_attribute_values(
                ":lookahead",
                number(u64::try_from(mark.lookahead.as_millis()).unwrap_or(u64::MAX)),
            )
            .expression_attribute_values(":expiry", number(expires))
            .send()
            .await;
        self.applied(result, "UpdateItem", &key, "relay mark")?;
        Ok(())
    }

    async fn relay_mark(&self, queue_url: &str) -> Result<Option<RelayMark>, StoreError> {
        let key = relay_mark_id(queue_url);
        self.count_request();
        let answer = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&key)))
            .send()
            .await
            .map_err(|error| self.timer_failure(classify(&error, self.target("GetItem", &key)), &key))?;
        let Some(item) = answer.item else {
            return Ok(None);
        };
        Ok(millis(&item, RELAY_SEEN).map(|seen| RelayMark {
            seen,
            lookahead: std::time::Duration::from_millis(whole(&item, RELAY_LOOKAHEAD).unwrap_or(0)),
        }))
    }
}
