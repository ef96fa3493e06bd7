//! The tenant a job belongs to: its checks and where a received message carries it.
//!
//! # Design note: how the tenant travels
//!
//! SQS fair queues take the `MessageGroupId` of a message on a *standard* queue as its tenant. So on a
//! standard queue the tenant is sent as `MessageGroupId` and nothing else: no message attribute is
//! spent (a producer has 9 of SQS's 10; one stays free for the failure record). On a FIFO queue the
//! group is the FIFO group (ordering), so a tenant that differs from it travels in the
//! `conveyor.tenant` attribute, which counts toward the 9.
//!
//! A consumer reads the tenant with [`Message::tenant`]: the `conveyor.tenant` attribute when present,
//! else the received `MessageGroupId` (SQS returns it on standard queues too; the worker asks for it
//! and a Lambda event carries it). On a FIFO queue without the attribute the tenant is therefore the
//! message group, which is what a per-customer group usually is.
//!
//! Every copy Conveyor makes of a message on a standard queue (a deferral, a long delay's hop, a
//! dead-letter copy, a redrive) keeps its `MessageGroupId`, so it stays in its tenant's share.

use crate::message::Message;

/// SQS's longest `MessageGroupId`.
pub const MAX_TENANT_LEN: usize = 128;

/// Why a tenant cannot be sent as a `MessageGroupId`.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantError {
    /// The tenant is empty.
    #[error("the tenant is empty; SQS needs 1 to 128 characters")]
    Empty,
    /// Longer than SQS's 128 characters.
    #[error("the tenant is {0} characters long, over SQS's 128 for a MessageGroupId")]
    TooLong(usize),
    /// A character SQS refuses in a `MessageGroupId`.
    #[error(
        "the tenant holds {0:?} at position {1}: a MessageGroupId may hold only ASCII letters, digits and \
         punctuation (!\"#$%&'()*+,-./:;<=>?@[\\]^_`{{|}}~)"
    )]
    Character(char, usize),
}

/// Checks `tenant` against SQS's rules for a `MessageGroupId`: 1 to 128 ASCII letters, digits and
/// punctuation (no spaces).
pub fn check_tenant(tenant: &str) -> Result<(), TenantError> {
    if tenant.is_empty() {
        return Err(TenantError::Empty);
    }
    if let Some((position, bad)) = tenant
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || c.is_ascii_punctuation()))
    {
        return Err(TenantError::Character(bad, position));
    }
    let length = tenant.chars().count();
    if length > MAX_TENANT_LEN {
        return Err(TenantError::TooLong(length));
    }
    Ok(())
}

impl Message {
    /// The job's tenant: the `conveyor.tenant` attribute, else the received `MessageGroupId` (on a
    /// standard queue the tenant of SQS's fair queues; on a FIFO queue its group). See `src/tenant.rs`.
    pub fn tenant(&self) -> Option<&str> {
        self.string_attribute(crate::message::TENANT_ATTRIBUTE)
            .or(self.group_id.as_deref())
            .filter(|tenant| !tenant.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AttributeValue, TENANT_ATTRIBUTE};

    #[test]
    fn sqs_rules_with_the_reason() {
        assert_eq!(check_tenant("acme-42"), Ok(()));
        assert_eq!(check_tenant("a:b/c@d.e_f~!"), Ok(()));
        assert_eq!(check_tenant(&"x".repeat(128)), Ok(()));
        assert_eq!(check_tenant(""), Err(TenantError::Empty));
        assert_eq!(check_tenant(&"x".repeat(129)), Err(TenantError::TooLong(129)));
        assert_eq!(check_tenant("acme 42"), Err(TenantError::Character(' ', 4)));
        assert_eq!(check_tenant("café"), Err(TenantError::Character('é', 3)));
        let text = check_tenant("a\tb").unwrap_err().to_string();
        assert!(
            text.contains("position 1") && text.contains("punctuation"),
            "{text}"
        );
    }

    #[test]
    fn the_attribute_wins_over_the_group() {
        let mut message = Message::new("m-1", "{}");
        assert_eq!(message.tenant(), None);
        message.group_id = Some("acme".into());
        assert_eq!(
            message.tenant(),
            Some("acme"),
            "a standard queue's MessageGroupId"
        );
        message
            .attributes
            .insert(TENANT_ATTRIBUTE.into(), AttributeValue::string("globex"));
        assert_eq!(
            message.tenant(),
            Some("globex"),
            "a FIFO queue's tenant attribute"
        );
    }
}
