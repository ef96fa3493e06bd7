//! The `FlowStore` port on the idempotency table: a flow is a small head, its parent's message, and
//! one item per child (see `conveyor_core`'s flow note for why and in which order they are written).
//!
//! | item id | attribute | type | meaning |
//! |---|---|---|---|
//! | `conveyor-flow:<id>` (head) | `flow_fingerprint` | S | what the flow is: a re-send with other content is refused |
//! | | `flow_parent_record`, `flow_policy` | S | the parent's record key; the failure policy |
//! | | `flow_children`, `flow_succeeded`, `flow_failed` | N | children; counted as succeeded; as failed |
//! | | `flow_failure` | S | the first failure counted (`child <id>: <reason>`) |
//! | | `flow_deadline` | N | epoch ms; the deadline sweep counts what is unfinished then |
//! | | `flow_parent_sent`, `flow_failure_sent` | N | when the parent was sent to run; when a failure notice was |
//! | | `flow_notice` | S | the message id of the failure notice that went to the DLQ |
//! | | `flow_parent_ran` | N | when the parent's run completed (the guard against a second run) |
//! | | `flow_parent_refusals`, `flow_parent_error` | N, S | sends of the parent its queue refused; the last reason |
//! | | `flow_parent_failed` | N | when the flow ended as failed because its parent could not be sent |
//! | | `job_shard`, `job_sort` | S | `conveyor-flow#open` and `open#<deadline ms>` while open: the sweep's listing on the jobs index |
//! | `conveyor-flow:<id>/parent` | `flow_parent`, `flow_child_ids` | S | the parent's message and the children's ids, as JSON |
//! | `conveyor-flow:<id>/child:<child id>` | `flow_child_key` | S | the child's idempotency record key |
//! | | `flow_child_end`, `flow_child_output`, `flow_child_error` | S | `succeeded`/`failed`; its output; its reason |
//!
//! Every item expires ([`conveyor_core::FLOW_RETENTION`]) after the deadline.
//!
//! Costs: creating a flow is one conditional `PutItem` per child plus two (the child items are never
//! overwritten, so a re-send cannot reset a count); counting a child is one `TransactWriteItems` of two
//! small updates (the child's item and the head's counter: 4 write units, whatever the flow's size)
//! and one consistent `GetItem` of the head (1 read unit); the parent reads its children with
//! `BatchGetItem`, 100 a request.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemOutput;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use conveyor_core::port::{
    ChildEnd, Count, Created, FlowChild, FlowState, FlowStore, NewFlow, ParentMessage,
};
use conveyor_core::port::{StoreError, to_epoch_millis};
use conveyor_core::{ChildFailurePolicy, FLOW_RETENTION};
use futures_util::StreamExt as _;

use crate::classify::{Failure, classify};
use crate::item::{Item, epoch_secs, number, string, text, whole};
use crate::jobs::{JOB_SHARD, JOB_SORT};
use crate::store::DynamoStore;

const FINGERPRINT: &str = "flow_fingerprint";
const PARENT_RECORD: &str = "flow_parent_record";
const POLICY: &str = "flow_policy";
const CHILDREN: &str = "flow_children";
const SUCCEEDED: &str = "flow_succeeded";
const FAILED: &str = "flow_failed";
const FAILURE: &str = "flow_failure";
const DEADLINE: &str = "flow_deadline";
const PARENT_SENT: &str = "flow_parent_sent";
const FAILURE_SENT: &str = "flow_failure_sent";
const NOTICE: &str = "flow_notice";
const PARENT_RAN: &str = "flow_parent_ran";
const REFUSALS: &str = "flow_parent_refusals";
const PARENT_ERROR: &str = "flow_parent_error";
const PARENT_FAILED: &str = "flow_parent_failed";
const PARENT: &str = "flow_parent";
const CHILD_IDS: &str = "flow_child_ids";
const CHILD_KEY: &str = "flow_child_key";
const CHILD_END: &str = "flow_child_end";
const CHILD_OUTPUT: &str = "flow_child_output";
const CHILD_ERROR: &str = "flow_child_error";
/// The jobs index partition that lists open flows by deadline (for the deadline sweep).
pub(crate) const OPEN_FLOWS: &str = "conveyor-flow#open";
/// Child items written at once when a flow is created.
const CREATE_CONCURRENCY: usize = 16;
/// Outputs larger than this are not kept on the child's item (the item must stay under 400 KB).
const MAX_KEPT_OUTPUT: usize = 300 * 1024;
/// Tries of a count that meets another transaction on the head at the same moment.
const CONFLICT_TRIES: u32 = 8;

/// The jobs index sort value of an open flow whose deadline is `millis`.
fn open_sort(millis: u64) -> String {
    format!("open#{millis:013}")
}

/// The head's item id of flow `flow_id`.
pub(crate) fn flow_item_id(flow_id: &str) -> String {
    format!("conveyor-flow:{flow_id}")
}

fn parent_item_id(flow_id: &str) -> String {
    format!("conveyor-flow:{flow_id}/parent")
}

fn child_item_id(flow_id: &str, child_id: &str) -> String {
    format!("conveyor-flow:{flow_id}/child:{child_id}")
}

fn malformed(flow_id: &str, what: &str) -> StoreError {
    StoreError::Misconfigured {
        message: format!("the records of flow {flow_id:?} are malformed: {what}"),
    }
}

fn parse_head(flow_id: &str, item: &Item) -> Result<FlowState, StoreError> {
    let policy = text(item, POLICY)
        .and_then(ChildFailurePolicy::parse)
        .ok_or_else(|| malformed(flow_id, "`flow_policy` is missing or unknown"))?;
    Ok(FlowState {
        id: flow_id.to_owned(),
        parent_record: text(item, PARENT_RECORD).unwrap_or_default().to_owned(),
        policy,
        children: whole(item, CHILDREN).ok_or_else(|| malformed(flow_id, "`flow_children` is missing"))?,
        succeeded: whole(item, SUCCEEDED).unwrap_or(0),
        failed: whole(item, FAILED).unwrap_or(0),
        first_failure: text(item, FAILURE).map(str::to_owned),
        deadline: whole(item, DEADLINE).unwrap_or(0),
        parent_sent_at: whole(item, PARENT_SENT),
        failure_sent_at: whole(item, FAILURE_SENT),
        parent_ran_at: whole(item, PARENT_RAN),
        parent_refusals: whole(item, REFUSALS).unwrap_or(0),
        parent_error: text(item, PARENT_ERROR).map(str::to_owned),
        parent_failed_at: whole(item, PARENT_FAILED),
    })
}

fn parse_child(item: &Item, child_id: &str) -> FlowChild {
    let end = match text(item, CHILD_END) {
        Some("succeeded") => Some(ChildEnd::Succeeded {
            output: text(item, CHILD_OUTPUT).map(str::to_owned),
        }),
        Some(_) => Some(ChildEnd::Failed(
            text(item, CHILD_ERROR).unwrap_or_default().to_owned(),
        )),
        None => None,
    };
    FlowChild {
        id: child_id.to_owned(),
        key: text(item, CHILD_KEY).unwrap_or_default().to_owned(),
        end,
    }
}

fn encode(encoded: serde_json::Result<String>) -> Result<String, StoreError> {
    encoded.map_err(|error| StoreError::Misconfigured {
        message: format!("flow record does not encode: {error}"),
    })
}

/// How a count's transaction ended.
enum Transacted {
    Done,
    /// The child's condition failed; the child's item as it was (`None`: no such item).
    ChildRefused(Option<Item>),
    /// The head's condition failed (no head).
    NoHead,
}

impl DynamoStore {
    fn flow_failure(&self, failure: Failure, flow_id: &str) -> StoreError {
        match failure {
            Failure::Store(error) => error,
            Failure::ItemTooLarge => StoreError::Misconfigured {
                message: format!(
                    "a record of flow {flow_id:?} is over DynamoDB's 400 KB item size: split the flow into \
                     nested flows of fewer children"
                ),
            },
            Failure::ConditionFailed => StoreError::Unavailable {
                message: format!("flow {flow_id:?}: unexpected condition failure"),
            },
        }
    }

    /// The item's id attribute (the sort key's when the table has one).
    fn id_attribute(&self) -> &str {
        self.options
            .sort_key
            .as_ref()
            .map_or(self.options.attributes.id.as_str(), |sort_key| {
                sort_key.attribute.as_str()
            })
    }

    /// Puts `item` (with the id `id`) where no item exists; `Ok(false)` when one did.
    async fn put_new(&self, id: &str, mut item: Item, flow_id: &str) -> Result<bool, StoreError> {
        item.extend(self.primary_key(id));
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
        match result.map_err(|error| classify(&error, self.target("PutItem", id))) {
            Ok(_) => Ok(true),
            Err(Failure::ConditionFailed) => Ok(false),
            Err(failure) => Err(self.flow_failure(failure, flow_id)),
        }
    }

    /// Ids of the open flows whose deadline is before `before` (epoch ms), earliest first, at most `limit`.
    async fn query_open_before(&self, before: u64, limit: usize) -> Result<Vec<String>, StoreError> {
        let partition = OPEN_FLOWS;
        self.count_request();
        let answer = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(crate::defaults::JOBS_INDEX)
            .key_condition_expression("#shard = :partition AND #sort BETWEEN :open AND :before")
            .expression_attribute_names("#shard", JOB_SHARD)
            .expression_attribute_names("#sort", JOB_SORT)
            .expression_attribute_values(":partition", string(partition))
            .expression_attribute_values(":open", string(open_sort(0)))
            .expression_attribute_values(":before", string(open_sort(before)))
            .limit(i32::try_from(limit).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|error| match classify(&error, self.target("Query", partition)) {
                Failure::Store(error) => error,
                other => StoreError::Unavailable {
                    message: format!("Query on table {} failed: {other:?}", self.table),
                },
            })?;
        Ok(answer
            .items()
            .iter()
            .filter_map(|item| text(item, self.id_attribute()).map(str::to_owned))
            .collect())
    }

    /// Sets `name` to `value` on the head once (`if_not_exists`), optionally dropping it off the open
    /// flows' listing.
    /// An update of the flow's head item, made only while the head exists (`#id` is bound).
    fn head_update(&self, id: &str) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(id)))
            .condition_expression("attribute_exists(#id)")
            .expression_attribute_names("#id", &self.options.attributes.id)
    }

    /// Sends a head update: `Ok(None)` when its condition failed (no head: the flow is gone, or the
    /// update's own condition did not hold).
    async fn send_head_update(
        &self,
        flow_id: &str,
        id: &str,
        update: UpdateItemFluentBuilder,
    ) -> Result<Option<UpdateItemOutput>, StoreError> {
        self.count_request();
        match update.send().await {
            Ok(answer) => Ok(Some(answer)),
            Err(error) => match classify(&error, self.target("UpdateItem", id)) {
                Failure::ConditionFailed => Ok(None),
                failure => Err(self.flow_failure(failure, flow_id)),
            },
        }
    }

    async fn set_once(
        &self,
        flow_id: &str,
        name: &str,
        value: AttributeValue,
        close: bool,
    ) -> Result<(), StoreError> {
        let id = flow_item_id(flow_id);
        let mut expression = "SET #name = if_not_exists(#name, :value)".to_owned();
        if close {
            expression.push_str(" REMOVE #shard, #sort");
        }
        let mut update = self
            .head_update(&id)
            .update_expression(expression)
            .expression_attribute_names("#name", name)
            .expression_attribute_values(":value", value);
        if close {
            update = update
                .expression_attribute_names("#shard", JOB_SHARD)
                .expression_attribute_names("#sort", JOB_SORT);
        }
        // No head: the flow is gone; nothing to mark.
        self.send_head_update(flow_id, &id, update).await.map(drop)
    }

    /// One count's transaction: the child's item (conditional on `child_condition`) and the head's
    /// counters.
    async fn count_transaction(
        &self,
        flow_id: &str,
        child_id: &str,
        child_update: Update,
        head_update: Update,
    ) -> Result<Transacted, StoreError> {
        let id = child_item_id(flow_id, child_id);
        let items = vec![
            TransactWriteItem::builder().update(child_update).build(),
            TransactWriteItem::builder().update(head_update).build(),
        ];
        let mut tries = 0;
        loop {
            tries += 1;
            self.count_request();
            let result = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .send()
                .await;
            let error = match result {
                Ok(_) => return Ok(Transacted::Done),
                Err(error) => error,
            };
            match cancelled(&error) {
                Some(Cancelled::Child(item)) => return Ok(Transacted::ChildRefused(item)),
                Some(Cancelled::Head) => return Ok(Transacted::NoHead),
                Some(Cancelled::Conflict) if tries < CONFLICT_TRIES => {
                    tokio::time::sleep(conveyor_core::runtime::equal_jitter(Duration::from_millis(
                        20 << tries.min(5),
                    )))
                    .await;
                }
                Some(Cancelled::Conflict) => {
                    return Err(StoreError::Unavailable {
                        message: format!(
                            "counting child {child_id} of flow {flow_id:?} met other counts {tries} times in a row"
                        ),
                    });
                }
                None => {
                    return Err(
                        self.flow_failure(classify(&error, self.target("TransactWriteItems", &id)), flow_id)
                    );
                }
            }
        }
    }

    fn update(&self, id: &str) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
        Update::builder()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(id)))
            .expression_attribute_names("#id", &self.options.attributes.id)
    }

    fn built(update: aws_sdk_dynamodb::types::builders::UpdateBuilder) -> Result<Update, StoreError> {
        update.build().map_err(|error| StoreError::Misconfigured {
            message: format!("a flow count could not be built: {error}"),
        })
    }

    /// The updates that count `end` for a child not counted yet (or, `resume`, counted as failed).
    fn count_updates(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
        resume: bool,
    ) -> Result<(Update, Update), StoreError> {
        let child = self
            .update(&child_item_id(flow_id, child_id))
            .expression_attribute_names("#end", CHILD_END)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let head = self
            .update(&flow_item_id(flow_id))
            .condition_expression("attribute_exists(#id)");
        let (child, head) = match end {
            ChildEnd::Succeeded { output } => {
                let output = output.as_deref().filter(|output| output.len() <= MAX_KEPT_OUTPUT);
                let mut child = child.expression_attribute_values(":end", string("succeeded"));
                let mut expression = "SET #end = :end".to_owned();
                if let Some(output) = output {
                    expression.push_str(", #output = :output");
                    child = child
                        .expression_attribute_names("#output", CHILD_OUTPUT)
                        .expression_attribute_values(":output", string(output));
                }
                let head = head
                    .expression_attribute_names("#succeeded", SUCCEEDED)
                    .expression_attribute_values(":one", AttributeValue::N("1".to_owned()));
                if resume {
                    let child = child
                        .update_expression(format!("{expression} REMOVE #error"))
                        .expression_attribute_names("#error", CHILD_ERROR)
                        .condition_expression("attribute_exists(#id) AND #end = :failed")
                        .expression_attribute_values(":failed", string("failed"));
                    // Once the parent was sent (or ran) it saw the failure: the flow keeps it.
                    let head = head
                        .update_expression("ADD #succeeded :one, #failed :minus_one")
                        .condition_expression(
                            "attribute_exists(#id) AND attribute_not_exists(#sent) AND attribute_not_exists(#ran)",
                        )
                        .expression_attribute_names("#sent", PARENT_SENT)
                        .expression_attribute_names("#ran", PARENT_RAN)
                        .expression_attribute_names("#failed", FAILED)
                        .expression_attribute_values(":minus_one", AttributeValue::N("-1".to_owned()));
                    (child, head)
                } else {
                    let child = child
                        .update_expression(expression)
                        .condition_expression("attribute_exists(#id) AND attribute_not_exists(#end)");
                    (child, head.update_expression("ADD #succeeded :one"))
                }
            }
            ChildEnd::Failed(reason) => {
                let child = child
                    .update_expression("SET #end = :end, #error = :error")
                    .condition_expression("attribute_exists(#id) AND attribute_not_exists(#end)")
                    .expression_attribute_names("#error", CHILD_ERROR)
                    .expression_attribute_values(":end", string("failed"))
                    .expression_attribute_values(":error", string(reason));
                let head = head
                    .update_expression("ADD #failed :one SET #failure = if_not_exists(#failure, :failure)")
                    .expression_attribute_names("#failed", FAILED)
                    .expression_attribute_names("#failure", FAILURE)
                    .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
                    .expression_attribute_values(":failure", string(format!("child {child_id}: {reason}")));
                (child, head)
            }
        };
        Ok((Self::built(child)?, Self::built(head)?))
    }

    async fn head(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError> {
        match self.get_item(&flow_item_id(flow_id)).await? {
            Some(item) => parse_head(flow_id, &item).map(Some),
            None => Ok(None),
        }
    }

    async fn head_or_gone(&self, flow_id: &str, counted: bool) -> Result<Count, StoreError> {
        Ok(match self.head(flow_id).await? {
            Some(head) if counted => Count::Counted(head),
            Some(head) => Count::Before(head),
            None => Count::NotInFlow,
        })
    }

    /// Items by id, 100 a `BatchGetItem`, following unprocessed keys.
    async fn batch_get(&self, ids: &[String]) -> Result<HashMap<String, Item>, StoreError> {
        let mut found = HashMap::new();
        for chunk in ids.chunks(100) {
            let keys: Vec<Item> = chunk.iter().map(|id| self.primary_key(id)).collect();
            let mut request = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .build()
                    .map_err(|error| StoreError::Misconfigured {
                        message: format!("a flow read could not be built: {error}"),
                    })?,
            );
            let mut rounds = 0u32;
            while let Some(keys) = request.take() {
                rounds += 1;
                self.count_request();
                let answer = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, keys)
                    .send()
                    .await
                    .map_err(
                        |error| match classify(&error, self.target("BatchGetItem", &ids[0])) {
                            Failure::Store(error) => error,
                            other => StoreError::Unavailable {
                                message: format!("BatchGetItem on table {} failed: {other:?}", self.table),
                            },
                        },
                    )?;
                for item in answer
                    .responses
                    .unwrap_or_default()
                    .remove(&self.table)
                    .unwrap_or_default()
                {
                    if let Some(id) = text(&item, self.id_attribute()) {
                        found.insert(id.to_owned(), item);
                    }
                }
                request = answer
                    .unprocessed_keys
                    .unwrap_or_default()
                    .remove(&self.table)
                    .filter(|keys| !keys.keys.is_empty());
                if request.is_some() {
                    tokio::time::sleep(conveyor_core::runtime::equal_jitter(Duration::from_millis(
                        50 << rounds.min(5),
                    )))
                    .await;
                }
            }
        }
        Ok(found)
    }
}

/// Why a count's transaction was cancelled.
enum Cancelled {
    /// The child's condition failed, with its item as it was.
    Child(Option<Item>),
    /// The head's condition failed.
    Head,
    /// Another transaction touched an item at the same moment.
    Conflict,
}

fn cancelled(error: &SdkError<TransactWriteItemsError>) -> Option<Cancelled> {
    let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) = error.as_service_error()
    else {
        return None;
    };
    let reasons = cancelled.cancellation_reasons();
    let code = |index: usize| reasons.get(index).and_then(|reason| reason.code());
    if code(0) == Some("ConditionalCheckFailed") {
        let item = reasons[0].item().filter(|item| !item.is_empty()).cloned();
        return Some(Cancelled::Child(item));
    }
    if code(1) == Some("ConditionalCheckFailed") {
        return Some(Cancelled::Head);
    }
    if reasons
        .iter()
        .any(|reason| reason.code() == Some("TransactionConflict"))
    {
        return Some(Cancelled::Conflict);
    }
    None
}

#[async_trait]
impl FlowStore for DynamoStore {
    async fn create_flow(&self, flow: &NewFlow) -> Result<Created, StoreError> {
        let fingerprint = flow.fingerprint();
        let expires = number(epoch_secs(flow.deadline + FLOW_RETENTION));
        let expiration = self.options.attributes.expiration.clone();
        let deadline = to_epoch_millis(flow.deadline);
        let head: Item = HashMap::from([
            (FINGERPRINT.to_owned(), string(&fingerprint)),
            (PARENT_RECORD.to_owned(), string(&flow.parent_record)),
            (POLICY.to_owned(), string(flow.policy.as_str())),
            (
                CHILDREN.to_owned(),
                number(u64::try_from(flow.children.len()).unwrap_or(u64::MAX)),
            ),
            (SUCCEEDED.to_owned(), number(0)),
            (FAILED.to_owned(), number(0)),
            (DEADLINE.to_owned(), number(deadline)),
            (JOB_SHARD.to_owned(), string(OPEN_FLOWS)),
            (JOB_SORT.to_owned(), string(open_sort(deadline))),
            (expiration.clone(), expires.clone()),
        ]);
        // The head first: a conflicting re-send is refused before it writes anything.
        if !self.put_new(&flow_item_id(&flow.id), head, &flow.id).await? {
            let existing = self.get_item(&flow_item_id(&flow.id)).await?;
            if existing.as_ref().and_then(|item| text(item, FINGERPRINT)) != Some(fingerprint.as_str()) {
                return Ok(Created::Conflict);
            }
        }
        let ids: Vec<&String> = flow.children.keys().collect();
        let parent: Item = HashMap::from([
            (
                PARENT.to_owned(),
                string(encode(serde_json::to_string(&flow.parent))?),
            ),
            (CHILD_IDS.to_owned(), string(encode(serde_json::to_string(&ids))?)),
            (expiration.clone(), expires.clone()),
        ]);
        self.put_new(&parent_item_id(&flow.id), parent, &flow.id).await?;
        let items: Vec<(String, Item)> = flow
            .children
            .iter()
            .map(|(child_id, key)| {
                let item: Item = HashMap::from([
                    (CHILD_KEY.to_owned(), string(key)),
                    (expiration.clone(), expires.clone()),
                ]);
                (child_item_id(&flow.id, child_id), item)
            })
            .collect();
        let flow_id = flow.id.as_str();
        let writes = items
            .into_iter()
            .map(|(id, item)| async move { self.put_new(&id, item, flow_id).await });
        let mut writes = futures_util::stream::iter(writes).buffer_unordered(CREATE_CONCURRENCY);
        while let Some(written) = writes.next().await {
            written?;
        }
        Ok(Created::Written)
    }

    async fn child_finished(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
    ) -> Result<Count, StoreError> {
        let (child, head) = self.count_updates(flow_id, child_id, end, false)?;
        match self.count_transaction(flow_id, child_id, child, head).await? {
            Transacted::Done => self.head_or_gone(flow_id, true).await,
            Transacted::NoHead | Transacted::ChildRefused(None) => Ok(Count::NotInFlow),
            Transacted::ChildRefused(Some(item)) => {
                let was_failed = text(&item, CHILD_END) == Some("failed");
                if !(was_failed && matches!(end, ChildEnd::Succeeded { .. })) {
                    return self.head_or_gone(flow_id, false).await;
                }
                // A failed child that succeeded after all (redriven): the flow resumes.
                let (child, head) = self.count_updates(flow_id, child_id, end, true)?;
                match self.count_transaction(flow_id, child_id, child, head).await? {
                    Transacted::Done => self.head_or_gone(flow_id, true).await,
                    Transacted::ChildRefused(None) => Ok(Count::NotInFlow),
                    // No head, or the parent was sent: `Before` while the head exists.
                    Transacted::NoHead | Transacted::ChildRefused(Some(_)) => {
                        self.head_or_gone(flow_id, false).await
                    }
                }
            }
        }
    }

    async fn mark_parent_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        self.set_once(flow_id, PARENT_SENT, number(to_epoch_millis(at)), true)
            .await
    }

    async fn mark_failure_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        self.set_once(flow_id, FAILURE_SENT, number(to_epoch_millis(at)), false)
            .await
    }

    async fn mark_parent_ran(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        self.set_once(flow_id, PARENT_RAN, number(to_epoch_millis(at)), true)
            .await
    }

    async fn parent_refused(&self, flow_id: &str, reason: &str) -> Result<Option<u64>, StoreError> {
        let id = flow_item_id(flow_id);
        let update = self
            .head_update(&id)
            .update_expression("ADD #refusals :one SET #error = :reason")
            .expression_attribute_names("#refusals", REFUSALS)
            .expression_attribute_names("#error", PARENT_ERROR)
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .expression_attribute_values(":reason", string(reason))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew);
        let Some(answer) = self.send_head_update(flow_id, &id, update).await? else {
            return Ok(None);
        };
        let refusals = answer.attributes().and_then(|item| whole(item, REFUSALS));
        refusals
            .map(Some)
            .ok_or_else(|| malformed(flow_id, "`flow_parent_refusals` is missing after its update"))
    }

    async fn mark_parent_failed(
        &self,
        flow_id: &str,
        reason: &str,
        at: SystemTime,
    ) -> Result<(), StoreError> {
        let id = flow_item_id(flow_id);
        let update = self
            .head_update(&id)
            .update_expression(
                "SET #failed = if_not_exists(#failed, :at), #error = if_not_exists(#error, :reason) \
                 REMOVE #shard, #sort",
            )
            .expression_attribute_names("#failed", PARENT_FAILED)
            .expression_attribute_names("#error", PARENT_ERROR)
            .expression_attribute_names("#shard", JOB_SHARD)
            .expression_attribute_names("#sort", JOB_SORT)
            .expression_attribute_values(":at", number(to_epoch_millis(at)))
            .expression_attribute_values(":reason", string(reason));
        self.send_head_update(flow_id, &id, update).await.map(drop)
    }

    async fn claim_failure_notice(&self, flow_id: &str, message_id: &str) -> Result<bool, StoreError> {
        let id = flow_item_id(flow_id);
        self.count_request();
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&id)))
            .update_expression("SET #notice = :message")
            .condition_expression(
                "attribute_exists(#id) AND (attribute_not_exists(#notice) OR #notice = :message)",
            )
            .expression_attribute_names("#id", &self.options.attributes.id)
            .expression_attribute_names("#notice", NOTICE)
            .expression_attribute_values(":message", string(message_id))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(error) => match classify(&error, self.target("UpdateItem", &id)) {
                Failure::ConditionFailed => Ok(false),
                failure => Err(self.flow_failure(failure, flow_id)),
            },
        }
    }

    async fn flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError> {
        self.head(flow_id).await
    }

    async fn parent(&self, flow_id: &str) -> Result<Option<ParentMessage>, StoreError> {
        let Some(item) = self.get_item(&parent_item_id(flow_id)).await? else {
            return Ok(None);
        };
        let json = text(&item, PARENT).ok_or_else(|| malformed(flow_id, "`flow_parent` is missing"))?;
        serde_json::from_str(json)
            .map(Some)
            .map_err(|error| malformed(flow_id, &error.to_string()))
    }

    async fn children(&self, flow_id: &str) -> Result<Vec<FlowChild>, StoreError> {
        let Some(item) = self.get_item(&parent_item_id(flow_id)).await? else {
            return Ok(Vec::new());
        };
        let json = text(&item, CHILD_IDS).ok_or_else(|| malformed(flow_id, "`flow_child_ids` is missing"))?;
        let ids: Vec<String> =
            serde_json::from_str(json).map_err(|error| malformed(flow_id, &error.to_string()))?;
        let item_ids: Vec<String> = ids
            .iter()
            .map(|child_id| child_item_id(flow_id, child_id))
            .collect();
        let items = self.batch_get(&item_ids).await?;
        let mut children = BTreeMap::new();
        for (child_id, item_id) in ids.iter().zip(&item_ids) {
            if let Some(item) = items.get(item_id) {
                children.insert(child_id.clone(), parse_child(item, child_id));
            }
        }
        Ok(children.into_values().collect())
    }

    async fn overdue(&self, now: SystemTime, limit: usize) -> Result<Vec<String>, StoreError> {
        let ids = self.query_open_before(to_epoch_millis(now), limit).await?;
        Ok(ids
            .into_iter()
            .filter_map(|id| {
                let flow_id = id.strip_prefix("conveyor-flow:")?;
                (!flow_id.contains("/parent") && !flow_id.contains("/child:")).then(|| flow_id.to_owned())
            })
            .collect())
    }

    async fn close(&self, flow_id: &str) -> Result<(), StoreError> {
        let id = flow_item_id(flow_id);
        let update = self
            .head_update(&id)
            .update_expression("REMOVE #shard, #sort")
            .expression_attribute_names("#shard", JOB_SHARD)
            .expression_attribute_names("#sort", JOB_SORT);
        self.send_head_update(flow_id, &id, update).await.map(drop)
    }
}
