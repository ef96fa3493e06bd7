//! The `FlowStore` port on the idempotency table: one item per flow, id `conveyor-flow:<flow id>`.
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `flow_parent` | S | the parent's message (queue, body, attributes) as JSON, sent when the flow finishes |
//! | `flow_parent_record` | S | the parent's idempotency record key |
//! | `flow_children` | S | child id → the child's record key, as JSON |
//! | `flow_done` | SS | the children counted as succeeded |
//! | `flow_failed` | M | child id → reason, for dead-lettered children |
//! | `flow_policy` | S | `fail_parent` or `ignore` |
//! | `flow_parent_sent` | N | when the parent was sent (epoch ms) |
//! | `flow_changed` | N | the last count (epoch ms) |
//! | `expiration` | N | TTL cleanup, [`FLOW_TTL`] after creation (a flow must finish within it) |
//!
//! Counting a child is one `UpdateItem`, conditional on the child not counted yet
//! (`NOT contains(flow_done, :child) AND attribute_not_exists(flow_failed.#child)`), returning the flow
//! as it is after the write (`ALL_NEW`); a refused count (a duplicate) reads it back. The item holds
//! every child's id and key, so a flow's children are bounded by DynamoDB's 400 KB item: a few
//! thousand children of short keys.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use conveyor_core::port::to_epoch_millis;
use conveyor_core::port::{FlowStore, StoreError};
use conveyor_core::{
    ChildFailurePolicy,
    port::{ChildEnd, Counted, FlowState, NewFlow, unknown_flow},
};

use crate::classify::{Failure, classify};
use crate::item::{Item, epoch_secs, number, string};
use crate::store::DynamoStore;

/// How long a flow's record is kept (TTL cleanup only).
pub const FLOW_TTL: Duration = Duration::from_secs(14 * 24 * 3600);

const PARENT: &str = "flow_parent";
const PARENT_RECORD: &str = "flow_parent_record";
const CHILDREN: &str = "flow_children";
const DONE: &str = "flow_done";
const FAILED: &str = "flow_failed";
const POLICY: &str = "flow_policy";
const PARENT_SENT: &str = "flow_parent_sent";
const CHANGED: &str = "flow_changed";

/// The item id of flow `flow_id`.
pub(crate) fn flow_item_id(flow_id: &str) -> String {
    format!("conveyor-flow:{flow_id}")
}

fn malformed(flow_id: &str, what: &str) -> StoreError {
    StoreError::Misconfigured {
        message: format!("the record of flow {flow_id:?} is malformed: {what}"),
    }
}

fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(text)) => Some(text),
        _ => None,
    }
}

fn parse_flow(flow_id: &str, item: &Item) -> Result<FlowState, StoreError> {
    let json =
        |name: &str| text(item, name).ok_or_else(|| malformed(flow_id, &format!("`{name}` is missing")));
    let parent =
        serde_json::from_str(json(PARENT)?).map_err(|error| malformed(flow_id, &error.to_string()))?;
    let children: BTreeMap<String, String> =
        serde_json::from_str(json(CHILDREN)?).map_err(|error| malformed(flow_id, &error.to_string()))?;
    let policy = ChildFailurePolicy::parse(json(POLICY)?)
        .ok_or_else(|| malformed(flow_id, "unknown `flow_policy`"))?;
    let mut done = match item.get(DONE) {
        Some(AttributeValue::Ss(done)) => done.clone(),
        _ => Vec::new(),
    };
    done.sort();
    let failed = match item.get(FAILED) {
        Some(AttributeValue::M(failed)) => failed
            .iter()
            .map(|(child, reason)| {
                let reason = match reason {
                    AttributeValue::S(reason) => reason.clone(),
                    _ => String::new(),
                };
                (child.clone(), reason)
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    let parent_sent_at = match item.get(PARENT_SENT) {
        Some(AttributeValue::N(millis)) => millis.parse().ok(),
        _ => None,
    };
    Ok(FlowState {
        id: flow_id.to_owned(),
        parent,
        parent_record: json(PARENT_RECORD)?.to_owned(),
        children,
        done,
        failed,
        policy,
        parent_sent_at,
    })
}

fn encode(encoded: serde_json::Result<String>) -> Result<String, StoreError> {
    encoded.map_err(|error| StoreError::Misconfigured {
        message: format!("flow record does not encode: {error}"),
    })
}

impl DynamoStore {
    fn flow_failure(&self, failure: Failure, flow_id: &str) -> StoreError {
        match failure {
            Failure::Store(error) => error,
            Failure::ItemTooLarge => StoreError::Misconfigured {
                message: format!(
                    "the record of flow {flow_id:?} is over DynamoDB's 400 KB item size: split the flow into \
                     nested flows of fewer children"
                ),
            },
            Failure::ConditionFailed => StoreError::Unavailable {
                message: format!("flow {flow_id:?}: unexpected condition failure"),
            },
        }
    }

    async fn read_flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError> {
        match self.get_item(&flow_item_id(flow_id)).await? {
            Some(item) => parse_flow(flow_id, &item).map(Some),
            None => Ok(None),
        }
    }
}

#[async_trait]
impl FlowStore for DynamoStore {
    async fn create_flow(&self, flow: &NewFlow) -> Result<(), StoreError> {
        let id = flow_item_id(&flow.id);
        let mut item: HashMap<String, AttributeValue> = self.primary_key(&id);
        item.insert(
            PARENT.to_owned(),
            string(encode(serde_json::to_string(&flow.parent))?),
        );
        item.insert(PARENT_RECORD.to_owned(), string(&flow.parent_record));
        item.insert(
            CHILDREN.to_owned(),
            string(encode(serde_json::to_string(&flow.children))?),
        );
        item.insert(FAILED.to_owned(), AttributeValue::M(HashMap::new()));
        item.insert(POLICY.to_owned(), string(flow.policy.as_str()));
        item.insert(CHANGED.to_owned(), number(to_epoch_millis(flow.created_at)));
        item.insert(
            self.options.attributes.expiration.clone(),
            number(epoch_secs(flow.created_at + FLOW_TTL)),
        );
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
        match result.map_err(|error| classify(&error, self.target("PutItem", &id))) {
            // A re-send of the same flow id: the record stays as the first send wrote it.
            Ok(_) | Err(Failure::ConditionFailed) => Ok(()),
            Err(failure) => Err(self.flow_failure(failure, &flow.id)),
        }
    }

    async fn child_finished(
        &self,
        flow_id: &str,
        child_id: &str,
        end: &ChildEnd,
    ) -> Result<Counted, StoreError> {
        let id = flow_item_id(flow_id);
        let now = number(to_epoch_millis(SystemTime::now()));
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&id)))
            .condition_expression(
                "attribute_exists(#id) AND NOT contains(#done, :child) AND attribute_not_exists(#failed.#child)",
            )
            .expression_attribute_names("#id", &self.options.attributes.id)
            .expression_attribute_names("#done", DONE)
            .expression_attribute_names("#failed", FAILED)
            .expression_attribute_names("#child", child_id)
            .expression_attribute_names("#changed", CHANGED)
            .expression_attribute_values(":child", string(child_id))
            .expression_attribute_values(":now", now)
            .return_values(ReturnValue::AllNew);
        update = match end {
            ChildEnd::Succeeded => update
                .update_expression("ADD #done :child_set SET #changed = :now")
                .expression_attribute_values(":child_set", AttributeValue::Ss(vec![child_id.to_owned()])),
            ChildEnd::Failed(reason) => update
                .update_expression("SET #failed.#child = :reason, #changed = :now")
                .expression_attribute_values(":reason", string(reason)),
        };
        self.count_request();
        match update.send().await {
            Ok(answer) => {
                let item = answer.attributes.unwrap_or_default();
                Ok(Counted {
                    first_time: true,
                    flow: parse_flow(flow_id, &item)?,
                })
            }
            Err(error) => match classify(&error, self.target("UpdateItem", &id)) {
                Failure::ConditionFailed => {
                    let flow = self
                        .read_flow(flow_id)
                        .await?
                        .ok_or_else(|| unknown_flow(flow_id))?;
                    Ok(Counted {
                        first_time: false,
                        flow,
                    })
                }
                failure => Err(self.flow_failure(failure, flow_id)),
            },
        }
    }

    async fn mark_parent_sent(&self, flow_id: &str, at: SystemTime) -> Result<(), StoreError> {
        let id = flow_item_id(flow_id);
        self.count_request();
        self.client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(self.primary_key(&id)))
            .update_expression("SET #sent = if_not_exists(#sent, :at)")
            .condition_expression("attribute_exists(#id)")
            .expression_attribute_names("#id", &self.options.attributes.id)
            .expression_attribute_names("#sent", PARENT_SENT)
            .expression_attribute_values(":at", number(to_epoch_millis(at)))
            .send()
            .await
            .map_err(|error| self.flow_failure(classify(&error, self.target("UpdateItem", &id)), flow_id))?;
        Ok(())
    }

    async fn flow(&self, flow_id: &str) -> Result<Option<FlowState>, StoreError> {
        self.read_flow(flow_id).await
    }
}
