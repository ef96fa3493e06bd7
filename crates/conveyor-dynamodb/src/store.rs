//! [`DynamoStore`]: the `IdempotencyStore` port on DynamoDB, one request per claim.
//!
//! # Design note: the requests
//!
//! - **claim** is one `UpdateItem` that writes the in-progress record, conditional in Powertools' exact
//!   form. It is an update rather than Powertools' `PutItem` for one reason: the fencing token. In the
//!   same conditional write, `#fence = if_not_exists(#fence, :fence_base) + :one` increases the token
//!   the record carries (a takeover gets the previous holder's token + 1; a fresh record starts above
//!   the claimant's clock in epoch milliseconds, see `conveyor_core::port::next_token`), and
//!   `ReturnValues = UPDATED_NEW` brings the new token back. Because an update keeps attributes a put
//!   would drop, the claim also `REMOVE`s `data` (and `validation` when it sets none), so a taken-over
//!   record holds exactly what a fresh claim writes. When the condition fails,
//!   `ReturnValuesOnConditionCheckFailure = ALL_OLD` brings the existing record back with the failure,
//!   so a duplicate costs one request and no read. The times in the condition are ours (`:now`,
//!   `:now_in_millis`), compared by DynamoDB at the moment of the write: expired records are claimable
//!   whether or not TTL has deleted them.
//! - Ordering: the condition is evaluated before the update on the same item, atomically, so two
//!   claimants can never both see the condition true, and the token increase happens only for the one
//!   that acquired. A holder's complete, release and extend compare its token with the record's: after a
//!   takeover the record's token is higher, so the old holder's writes fail and change nothing.
//! - **complete**, **release** and **extend_lease** are conditional on the claim's fencing token, so a
//!   worker whose lease lapsed and was taken over cannot overwrite or delete the new owner's record
//!   (Powertools writes these unconditionally).
//! - A first-time job therefore costs two requests (claim + complete), a duplicate one, a duplicate of a
//!   job this process completed none when the completed cache is on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_smithy_runtime_api::http::Response;
use conveyor_core::port::EXPIRY_PAST_LEASE;
use conveyor_core::port::{
    Claim, ClaimOutcome, ClaimRequest, IdempotencyRecord, IdempotencyStore, RecordStatus, StoreError,
};

use conveyor_core::{
    port::JobChange,
    {JobQuery, JobRecord, Progress},
};

use crate::cache::CompletedCache;
use crate::classify::{Failure, Target, classify};
use crate::item::{self, Item, epoch_millis, epoch_secs, number, string};
use crate::jobs::{self, Clauses};
use crate::options::{OversizedOutput, StoreOptions};
use crate::size;

/// The claim condition, exactly as AWS Lambda Powertools writes it: absent, or expired, or in progress
/// with a lease that has lapsed.
pub const CLAIM_CONDITION: &str = "attribute_not_exists(#id) OR #expiry < :now OR (#status = :inprogress AND \
                                   attribute_exists(#in_progress_expiry) AND #in_progress_expiry < :now_in_millis)";
/// A tracked job's claim condition: Powertools' own, plus one case Powertools never meets: an item
/// without a Powertools `status` (a tracked job's `sent` marker, written by a producer before any
/// claim) is free too.
pub(crate) const TRACKED_CLAIM_CONDITION: &str = "attribute_not_exists(#id) OR #expiry < :now OR (#status = :inprogress \
                                   AND attribute_exists(#in_progress_expiry) AND #in_progress_expiry < :now_in_millis) \
                                   OR attribute_not_exists(#status)";
/// The condition on complete and release: the record still carries our claim's token.
pub const TOKEN_CONDITION: &str = "#token = :token";
/// The condition on extend_lease: our token, and still in progress.
pub const EXTEND_CONDITION: &str = "#token = :token AND #status = :inprogress";

/// The `IdempotencyStore` on a DynamoDB table in AWS Lambda Powertools' layout (see the crate docs).
#[derive(Debug)]
pub struct DynamoStore {
    pub(crate) client: Client,
    pub(crate) table: String,
    pub(crate) options: StoreOptions,
    cache: Option<CompletedCache>,
    requests: AtomicU64,
}

impl DynamoStore {
    /// A store on `table_name` with the default options (Powertools' attribute names, oversized outputs
    /// stored without data, no cache).
    pub fn new(client: Client, table_name: impl Into<String>) -> Self {
        Self {
            client,
            table: table_name.into(),
            options: StoreOptions::default(),
            cache: None,
            requests: AtomicU64::new(0),
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, options: StoreOptions) -> Self {
        self.cache = options.completed_cache.and_then(CompletedCache::new);
        self.options = options;
        self
    }

    /// The table's name.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// The options in use.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// How many requests this store has sent to DynamoDB (SDK retries of one request count once).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub(crate) fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn target<'a>(&'a self, operation: &'static str, key: &'a str) -> Target<'a> {
        Target {
            operation,
            table: &self.table,
            key,
        }
    }

    pub(crate) fn parse(&self, key: &str, item: &Item) -> Result<IdempotencyRecord, StoreError> {
        item::parse_record(
            &self.options.attributes,
            self.options.sort_key.as_ref(),
            &self.table,
            key,
            item,
        )
    }

    /// The primary key of record `id` (with the constant partition value when the table has a sort key).
    pub(crate) fn primary_key(&self, id: &str) -> Item {
        item::primary_key(&self.options.attributes, self.options.sort_key.as_ref(), id)
    }

    /// A whole number attribute of an acquired claim's `UPDATED_OLD` answer (absent: the item had none).
    fn old_number(
        &self,
        key: &str,
        attributes: Option<&Item>,
        name: &str,
    ) -> Result<Option<u64>, StoreError> {
        match attributes.and_then(|item| item.get(name)) {
            None => Ok(None),
            Some(AttributeValue::N(text)) => text.parse().map(Some).map_err(|_| StoreError::Misconfigured {
                message: format!(
                    "record {key:?} in table {} holds {name} = {text:?}, not a whole number; delete the record \
                     or fix the attribute",
                    self.table
                ),
            }),
            Some(other) => Err(StoreError::Misconfigured {
                message: format!(
                    "record {key:?} in table {} holds {name} as {}, not a number; delete the record or fix the \
                     attribute",
                    self.table,
                    item::type_name(other)
                ),
            }),
        }
    }

    /// The claim an acquiring update made, from the values it replaced (`UPDATED_OLD`): the token is
    /// the old one + 1 (or `fence_base` + 1 on a fresh record), the run the old count + 1, or 1 when
    /// the record was absent or expired (or the claim restarts the count). An expired record's count
    /// is then set back to 1, fenced on the new token (one more request, only when an expired record
    /// is claimed again).
    async fn acquired(
        &self,
        request: &ClaimRequest,
        old: Option<&Item>,
        fence_base: u64,
        now: SystemTime,
    ) -> Result<Claim, StoreError> {
        let names = &self.options.attributes;
        let key = &request.key;
        let token = self
            .old_number(key, old, &names.fencing_token)?
            .unwrap_or(fence_base)
            .saturating_add(1);
        let expired = self
            .old_number(key, old, &names.expiration)?
            .is_some_and(|expiry| expiry < epoch_secs(now));
        let restarted = expired || request.restart_runs;
        let old_runs = self.old_number(key, old, &names.runs)?.unwrap_or(0);
        let claim = Claim {
            key: key.clone(),
            token,
            run: if restarted {
                1
            } else {
                u32::try_from(old_runs.saturating_add(1)).unwrap_or(u32::MAX)
            },
        };
        if expired && !request.restart_runs && old_runs > 0 {
            self.count_request();
            self.client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(self.primary_key(key)))
                .update_expression("SET #runs = :one")
                .condition_expression(TOKEN_CONDITION)
                .expression_attribute_names("#runs", &names.runs)
                .expression_attribute_names("#token", &names.fencing_token)
                .expression_attribute_values(":one", number(1))
                .expression_attribute_values(":token", number(token))
                .send()
                .await
                .map_err(|error| self.fenced(classify(&error, self.target("UpdateItem", key)), &claim))?;
        }
        Ok(claim)
    }

    fn remember(&self, record: &IdempotencyRecord) {
        if let Some(cache) = &self.cache {
            cache.insert(record);
        }
    }

    /// The record that made a claim's condition fail, from the failure response; one consistent read
    /// when the response did not carry it (DynamoDB always does; some emulators may not).
    async fn existing_record(
        &self,
        key: &str,
        error: &SdkError<UpdateItemError, Response>,
    ) -> Result<IdempotencyRecord, StoreError> {
        let returned = match error.as_service_error() {
            Some(UpdateItemError::ConditionalCheckFailedException(failure)) => failure.item(),
            _ => None,
        };
        if let Some(item) = returned.filter(|item| !item.is_empty()) {
            return self.parse(key, item);
        }
        tracing::debug!(key, "claim failure carried no record; reading it");
        match self.get(key).await? {
            Some(record) => Ok(record),
            None => Err(StoreError::Unavailable {
                message: format!(
                    "the record of {key:?} in table {} was deleted while it was being claimed (by TTL or by \
                     hand); retry the claim",
                    self.table
                ),
            }),
        }
    }

    /// The output to store: as given, or `None` (with a warning) when it cannot fit and the policy
    /// says omit.
    fn fit_output<'o>(&self, key: &str, output: &'o str) -> Result<Option<&'o str>, StoreError> {
        let limit = self.output_limit(key);
        if output.len() <= limit {
            return Ok(Some(output));
        }
        self.oversized(key, output.len(), limit)?;
        Ok(None)
    }

    /// The largest output that fits in `key`'s record (a sort key's name and the partition's constant
    /// value take room too).
    fn output_limit(&self, key: &str) -> usize {
        let sort_key = self.options.sort_key.as_ref().map_or(0, |sort_key| {
            sort_key.attribute.len() + sort_key.partition_value.len()
        });
        size::output_limit(&self.options.attributes, key).saturating_sub(sort_key)
    }

    /// Applies the oversized-output policy: an error, or a warning and `Ok` (store without output).
    fn oversized(&self, key: &str, size: usize, limit: usize) -> Result<(), StoreError> {
        match self.options.oversized_output {
            OversizedOutput::Error => Err(StoreError::OutputTooLarge {
                key: key.to_owned(),
                size,
                limit,
            }),
            OversizedOutput::Omit => {
                tracing::warn!(
                    key,
                    size,
                    limit,
                    table = %self.table,
                    "output too large for one DynamoDB item; completing the record without it"
                );
                Ok(())
            }
        }
    }

    /// One `UpdateItem` that completes the record if it still carries the claim's token.
    async fn send_complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        change: Option<&JobChange>,
    ) -> Result<Option<Item>, Failure> {
        let names = &self.options.attributes;
        let clauses = change
            .map(|change| jobs::change_clauses(&claim.key, change))
            .unwrap_or_default();
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&claim.key)))
            .condition_expression(TOKEN_CONDITION)
            .expression_attribute_names("#token", &names.fencing_token)
            .expression_attribute_names("#expiry", &names.expiration)
            .expression_attribute_names("#status", &names.status)
            .expression_attribute_values(":token", number(claim.token))
            .expression_attribute_values(":expiry", number(epoch_secs(expires_at)))
            .expression_attribute_values(":status", string(RecordStatus::Completed.as_str()));
        // Powertools' own expression (and order) when untracked.
        let mut set = vec!["#expiry = :expiry".to_owned(), "#status = :status".to_owned()];
        if let Some(output) = output {
            set.insert(0, "#response_data = :response_data".to_owned());
            update = update
                .expression_attribute_names("#response_data", &names.data)
                .expression_attribute_values(
                    ":response_data",
                    item::output_value(self.options.data_format, output),
                );
        }
        update = with_clauses(update, &clauses).update_expression(clauses.expression(set, Vec::new()));
        if self.cache.is_some() {
            // The cache needs the whole record (its validation included); it comes back with the answer.
            update = update.return_values(ReturnValue::AllNew);
        }
        self.count_request();
        match update.send().await {
            Ok(answer) => Ok(answer.attributes),
            Err(error) => Err(classify(&error, self.target("UpdateItem", &claim.key))),
        }
    }

    async fn claim_with(
        &self,
        request: &ClaimRequest,
        change: Option<&JobChange>,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = SystemTime::now();
        if let Some(record) = self.cache.as_ref().and_then(|cache| cache.get(&request.key, now)) {
            tracing::debug!(key = %request.key, "completed record answered from the cache");
            return Ok(ClaimOutcome::Exists(record));
        }
        let names = &self.options.attributes;
        let fence_base = epoch_millis(now);
        self.count_request();
        let mut set = vec![
            "#status = :inprogress".to_owned(),
            "#expiry = :expiry".to_owned(),
            "#in_progress_expiry = :in_progress_expiry".to_owned(),
            "#token = if_not_exists(#token, :fence_base) + :one".to_owned(),
            if request.restart_runs {
                "#runs = :one".to_owned()
            } else {
                "#runs = if_not_exists(#runs, :zero) + :one".to_owned()
            },
        ];
        let mut remove = vec!["#response_data".to_owned()];
        if request.last_attempt {
            set.push("#last_attempt = :last_attempt".to_owned());
        } else {
            remove.push("#last_attempt".to_owned());
        }
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&request.key)))
            .condition_expression(match change {
                Some(_) => TRACKED_CLAIM_CONDITION,
                None => CLAIM_CONDITION,
            })
            .expression_attribute_names("#id", &names.id)
            .expression_attribute_names("#expiry", &names.expiration)
            .expression_attribute_names("#in_progress_expiry", &names.in_progress_expiration)
            .expression_attribute_names("#status", &names.status)
            .expression_attribute_names("#token", &names.fencing_token)
            .expression_attribute_names("#runs", &names.runs)
            .expression_attribute_names("#response_data", &names.data)
            .expression_attribute_names("#validation", &names.validation)
            .expression_attribute_names("#last_attempt", jobs::LAST_ATTEMPT)
            .expression_attribute_values(":now", number(epoch_secs(now)))
            .expression_attribute_values(":now_in_millis", number(epoch_millis(now)))
            .expression_attribute_values(":inprogress", string(RecordStatus::InProgress.as_str()))
            .expression_attribute_values(":expiry", number(epoch_secs(request.expires_at)))
            .expression_attribute_values(":in_progress_expiry", number(epoch_millis(request.lease_until)))
            .expression_attribute_values(":fence_base", number(fence_base))
            .expression_attribute_values(":one", number(1))
            .return_values(ReturnValue::UpdatedOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if !request.restart_runs {
            update = update.expression_attribute_values(":zero", number(0));
        }
        if request.last_attempt {
            update = update.expression_attribute_values(":last_attempt", AttributeValue::Bool(true));
        }
        match &request.validation {
            Some(validation) => {
                set.push("#validation = :validation".to_owned());
                update = update.expression_attribute_values(":validation", string(validation));
            }
            None => remove.push("#validation".to_owned()),
        }
        if change.is_some() {
            // A tracked record keeps its expiry through lease extensions (see `extend_lease`).
            set.push("#keep = :expiry".to_owned());
            update = update.expression_attribute_names("#keep", jobs::JOB_KEEP_UNTIL);
        }
        let clauses = change
            .map(|change| jobs::change_clauses(&request.key, change))
            .unwrap_or_default();
        let expression = clauses.expression(set, remove);
        let result = with_clauses(update, &clauses)
            .update_expression(expression)
            .send()
            .await;
        let error = match result {
            Ok(answer) => {
                let claim = self
                    .acquired(request, answer.attributes.as_ref(), fence_base, now)
                    .await?;
                tracing::debug!(key = %request.key, token = claim.token, run = claim.run, "claimed");
                return Ok(ClaimOutcome::Acquired(claim));
            }
            Err(error) => error,
        };
        match classify(&error, self.target("UpdateItem", &request.key)) {
            Failure::ConditionFailed => {
                let record = self.existing_record(&request.key, &error).await?;
                tracing::debug!(key = %request.key, status = record.status.as_str(), "key already claimed");
                self.remember(&record);
                Ok(ClaimOutcome::Exists(record))
            }
            Failure::ItemTooLarge => Err(StoreError::Misconfigured {
                message: format!(
                    "the claim item for {:?} is over DynamoDB's item size (is the key or validation huge?)",
                    request.key
                ),
            }),
            Failure::Store(error) => Err(error),
        }
    }

    async fn complete_with(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        change: Option<&JobChange>,
    ) -> Result<(), StoreError> {
        let output = match output {
            Some(output) => self.fit_output(&claim.key, output)?,
            None => None,
        };
        let mut result = self.send_complete(claim, output, expires_at, change).await;
        if let (Err(Failure::ItemTooLarge), Some(output)) = (&result, output) {
            // Our estimate was under DynamoDB's count: apply the same policy to its verdict.
            let limit = self.output_limit(&claim.key);
            self.oversized(&claim.key, output.len(), limit)?;
            result = self.send_complete(claim, None, expires_at, change).await;
        }
        let returned = result.map_err(|failure| self.fenced(failure, claim))?;
        tracing::debug!(key = %claim.key, "completed");
        if let Some(item) = returned.filter(|item| !item.is_empty()) {
            match self.parse(&claim.key, &item) {
                Ok(record) => self.remember(&record),
                Err(error) => tracing::warn!(%error, key = %claim.key, "completed record not cached"),
            }
        }
        Ok(())
    }

    async fn release_with(&self, claim: &Claim, change: Option<&JobChange>) -> Result<(), StoreError> {
        let names = &self.options.attributes;
        self.count_request();
        let clauses = change
            .map(|change| jobs::change_clauses(&claim.key, change))
            .unwrap_or_default();
        // The record stays, with its lease ended and its token moved past ours: the key is claimable at
        // once, the counters keep counting, and a late extend or complete of ours is fenced.
        // `last_attempt` stays: a message whose receives are spent is moved by SQS's redrive unless
        // the runtime deletes it (a DLQ send, a deferred copy), and the next claim clears it. A final
        // status keeps the record for the status retention.
        let mut set = vec![
            "#in_progress_expiry = :released".to_owned(),
            "#token = #token + :one".to_owned(),
        ];
        let mut update = self.client.update_item();
        if let Some(until) = change.and_then(|change| change.keep_until) {
            set.push("#expiry = :expiry".to_owned());
            update = update
                .expression_attribute_names("#expiry", &names.expiration)
                .expression_attribute_values(":expiry", number(epoch_secs(until)));
        }
        if let Some(runs) = change.and_then(|change| change.spend_runs) {
            // A rejection spends the runs: a comeback after a failed DLQ send is not run again.
            set.push("#runs = :spent_runs".to_owned());
            update = update
                .expression_attribute_names("#runs", &names.runs)
                .expression_attribute_values(":spent_runs", number(u64::from(runs)));
        }
        let result = with_clauses(update, &clauses)
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&claim.key)))
            .update_expression(clauses.expression(set, Vec::new()))
            .condition_expression(TOKEN_CONDITION)
            .expression_attribute_names("#token", &names.fencing_token)
            .expression_attribute_names("#in_progress_expiry", &names.in_progress_expiration)
            .expression_attribute_values(":token", number(claim.token))
            .expression_attribute_values(":released", number(0))
            .expression_attribute_values(":one", number(1))
            .send()
            .await;
        if let Some(cache) = &self.cache {
            cache.remove(&claim.key);
        }
        match result {
            Ok(_) => {
                tracing::debug!(key = %claim.key, "released");
                Ok(())
            }
            Err(error) => Err(self.fenced(classify(&error, self.target("UpdateItem", &claim.key)), claim)),
        }
    }

    pub(crate) fn fenced(&self, failure: Failure, claim: &Claim) -> StoreError {
        match failure {
            Failure::ConditionFailed => StoreError::Fenced {
                key: claim.key.clone(),
            },
            Failure::ItemTooLarge => StoreError::Misconfigured {
                message: format!(
                    "record {:?} in table {} is over DynamoDB's item size",
                    claim.key, self.table
                ),
            },
            Failure::Store(error) => error,
        }
    }
}

#[async_trait]
impl IdempotencyStore for DynamoStore {
    fn table(&self) -> Option<&str> {
        Some(&self.table)
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_with(request, None).await
    }

    async fn complete(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
    ) -> Result<(), StoreError> {
        self.complete_with(claim, output, expires_at, None).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.release_with(claim, None).await
    }

    async fn claim_tracked(
        &self,
        request: &ClaimRequest,
        change: &JobChange,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_with(request, Some(change)).await
    }

    async fn complete_tracked(
        &self,
        claim: &Claim,
        output: Option<&str>,
        expires_at: SystemTime,
        change: &JobChange,
    ) -> Result<(), StoreError> {
        self.complete_with(claim, output, expires_at, Some(change)).await
    }

    async fn release_tracked(&self, claim: &Claim, change: &JobChange) -> Result<(), StoreError> {
        self.release_with(claim, Some(change)).await
    }

    async fn record_progress(&self, claim: &Claim, progress: &Progress) -> Result<(), StoreError> {
        self.write_progress(claim, progress).await
    }

    async fn mark_sent(&self, key: &str, change: &JobChange) -> Result<(), StoreError> {
        self.write_sent(key, change).await
    }

    async fn job(&self, key: &str) -> Result<Option<JobRecord>, StoreError> {
        self.read_job(key).await
    }

    async fn jobs(&self, query: &JobQuery) -> Result<Vec<JobRecord>, StoreError> {
        self.query_jobs(query).await
    }

    async fn extend_lease(&self, claim: &Claim, lease_until: SystemTime) -> Result<(), StoreError> {
        let names = &self.options.attributes;
        let update = self
            .client
            .update_item()
            // A tracked record's expiry (its status retention, `job_keep_until`) never shrinks to the
            // lease's: a run SQS's redrive takes must still say so days later.
            .update_expression(
                "SET #in_progress_expiry = :in_progress_expiry, #expiry = if_not_exists(#keep, :expiry)",
            )
            .expression_attribute_names("#keep", jobs::JOB_KEEP_UNTIL)
            .expression_attribute_names("#in_progress_expiry", &names.in_progress_expiration)
            .expression_attribute_names("#expiry", &names.expiration)
            .expression_attribute_values(":expiry", number(epoch_secs(lease_until + EXPIRY_PAST_LEASE)))
            .expression_attribute_values(":in_progress_expiry", number(epoch_millis(lease_until)));
        self.fenced_update(claim, update).await
    }

    async fn get(&self, key: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        match self.get_item(key).await? {
            Some(item) => self.parse(key, &item).map(Some),
            None => Ok(None),
        }
    }
}

impl DynamoStore {
    /// Sends `update` (its `SET` expression and values already given) on the claim's record, fenced: it
    /// applies only while the record carries the claim's token and is still in progress. A failed
    /// condition means the claim was taken over or settled, which [`Self::fenced`] reports as `Fenced`.
    pub(crate) async fn fenced_update(
        &self,
        claim: &Claim,
        update: UpdateItemFluentBuilder,
    ) -> Result<(), StoreError> {
        let names = &self.options.attributes;
        self.count_request();
        let result = update
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&claim.key)))
            .condition_expression(EXTEND_CONDITION)
            .expression_attribute_names("#token", &names.fencing_token)
            .expression_attribute_names("#status", &names.status)
            .expression_attribute_values(":token", number(claim.token))
            .expression_attribute_values(":inprogress", string(RecordStatus::InProgress.as_str()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(error) => Err(self.fenced(classify(&error, self.target("UpdateItem", &claim.key)), claim)),
        }
    }

    /// The item `id` (one consistent `GetItem`); `None` when there is none.
    pub(crate) async fn get_item(&self, id: &str) -> Result<Option<Item>, StoreError> {
        self.count_request();
        let result = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(id)))
            .consistent_read(true)
            .send()
            .await;
        match result {
            Ok(answer) => Ok(answer.item.filter(|item| !item.is_empty())),
            Err(error) => Err(match classify(&error, self.target("GetItem", id)) {
                Failure::Store(error) => error,
                other => StoreError::Unavailable {
                    message: format!(
                        "GetItem on table {} for {id:?} failed unexpectedly: {other:?}",
                        self.table
                    ),
                },
            }),
        }
    }
}

/// Adds the names and values of `clauses` to an update.
pub(crate) fn with_clauses(
    mut update: UpdateItemFluentBuilder,
    clauses: &Clauses,
) -> UpdateItemFluentBuilder {
    for (name, attribute) in &clauses.names {
        update = update.expression_attribute_names(name, attribute);
    }
    for (placeholder, value) in &clauses.values {
        update = update.expression_attribute_values(placeholder, value.clone());
    }
    update
}
