//! A queue's `RedrivePolicy` and SQS queue ARNs.

/// The parts of an SQS queue ARN (`arn:aws:sqs:us-east-1:123456789012:jobs-dlq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueArn {
    /// The whole ARN.
    pub arn: String,
    /// The owner's account id.
    pub account: String,
    /// The queue's name.
    pub name: String,
}

impl QueueArn {
    /// Parses an SQS queue ARN; `None` for anything else.
    pub fn parse(arn: &str) -> Option<Self> {
        let parts: Vec<&str> = arn.split(':').collect();
        let ["arn", _partition, "sqs", _region, account, name] = parts.as_slice() else {
            return None;
        };
        if account.is_empty() || name.is_empty() {
            return None;
        }
        Some(Self {
            arn: arn.to_owned(),
            account: (*account).to_owned(),
            name: (*name).to_owned(),
        })
    }

    /// True for a FIFO queue (its name ends in `.fifo`).
    pub fn is_fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }
}

/// What a queue's `RedrivePolicy` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedrivePolicy {
    /// `deadLetterTargetArn`: the DLQ.
    pub dead_letter_arn: QueueArn,
    /// `maxReceiveCount`, when present and readable.
    pub max_receive_count: Option<u32>,
}

impl RedrivePolicy {
    /// Parses the attribute's JSON (`maxReceiveCount` may be a number or a string, as SQS returns it);
    /// `None` when it is not JSON or has no SQS queue ARN in `deadLetterTargetArn`.
    pub fn parse(json: &str) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(json).ok()?;
        let arn = value.get("deadLetterTargetArn")?.as_str()?;
        let dead_letter_arn = QueueArn::parse(arn)?;
        let max_receive_count = match value.get("maxReceiveCount") {
            Some(serde_json::Value::Number(number)) => number.as_u64().and_then(|n| u32::try_from(n).ok()),
            Some(serde_json::Value::String(text)) => text.trim().parse().ok(),
            _ => None,
        };
        Some(Self {
            dead_letter_arn,
            max_receive_count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_localstack_and_aws_shapes() {
        let policy = RedrivePolicy::parse(
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:jobs-dlq","maxReceiveCount":"5"}"#,
        )
        .unwrap();
        assert_eq!(policy.dead_letter_arn.account, "000000000000");
        assert_eq!(policy.dead_letter_arn.name, "jobs-dlq");
        assert!(!policy.dead_letter_arn.is_fifo());
        assert_eq!(policy.max_receive_count, Some(5));
        let policy = RedrivePolicy::parse(
            r#"{"deadLetterTargetArn":"arn:aws-cn:sqs:cn-north-1:123:j.fifo","maxReceiveCount":3}"#,
        )
        .unwrap();
        assert!(policy.dead_letter_arn.is_fifo());
        assert_eq!(policy.max_receive_count, Some(3));
    }

    #[test]
    fn unreadable_policies_are_none() {
        for json in [
            "nope",
            "{}",
            r#"{"deadLetterTargetArn":"arn:aws:sns:us-east-1:1:t"}"#,
        ] {
            assert_eq!(RedrivePolicy::parse(json), None, "{json}");
        }
    }
}
