//! How failures reach the user: `error: ...` on stderr, a hint when there is an obvious next step, and
//! the exit code (1 for a failure, 2 for a usage error, as clap does for bad arguments).

use std::process::ExitCode;

use conveyor_core::QueueError;
use conveyor_sqs::ProduceError;
use conveyor_sqs::admin::AdminError;

/// A request the command refuses as given (exit code 2), such as `purge` without its confirmation flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Prints `error` (with its causes) and a hint on stderr; returns the exit code.
pub fn report(error: &anyhow::Error) -> ExitCode {
    crate::errln!("error: {error:#}");
    if let Some(hint) = hint(error) {
        crate::errln!("hint: {hint}");
    }
    if error.downcast_ref::<UsageError>().is_some() {
        return ExitCode::from(2);
    }
    ExitCode::FAILURE
}

/// A next step for errors that have an obvious one.
fn hint(error: &anyhow::Error) -> Option<String> {
    let queue = missing_queue(error)?;
    let name = queue.trim_end_matches('/').rsplit('/').next().unwrap_or(queue);
    let fifo = if name.ends_with(".fifo") {
        " --attributes FifoQueue=true"
    } else {
        ""
    };
    Some(format!(
        "create the queue with `aws sqs create-queue --queue-name {name}{fifo}` (add --endpoint-url \
         http://127.0.0.1:4566 for LocalStack), or apply infra/modules/queue, which also creates its DLQ and \
         redrive policy; check the URL with `aws sqs list-queues`"
    ))
}

/// The queue named by a "queue does not exist" error anywhere in the chain.
fn missing_queue(error: &anyhow::Error) -> Option<&str> {
    error.chain().find_map(|cause| {
        let queue_error = cause
            .downcast_ref::<QueueError>()
            .or_else(|| match cause.downcast_ref::<AdminError>() {
                Some(AdminError::Queue(inner)) => Some(inner),
                _ => None,
            })
            .or_else(|| match cause.downcast_ref::<ProduceError>() {
                Some(ProduceError::Queue(inner)) => Some(inner),
                _ => None,
            })?;
        match queue_error {
            QueueError::QueueMissing { queue } => Some(queue.as_str()),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_queue_gets_a_create_hint_with_its_name() {
        let error = anyhow::Error::new(AdminError::Queue(QueueError::QueueMissing {
            queue: "http://127.0.0.1:4566/000000000000/orders.fifo".to_owned(),
        }));
        let text = hint(&error).unwrap();
        assert!(
            text.contains("--queue-name orders.fifo --attributes FifoQueue=true"),
            "{text}"
        );
        let wrapped = anyhow::Error::new(ProduceError::Queue(QueueError::QueueMissing {
            queue: "http://x/jobs".to_owned(),
        }))
        .context("sending");
        assert!(hint(&wrapped).unwrap().contains("--queue-name jobs`"));
        assert!(hint(&anyhow::anyhow!("other")).is_none());
    }

    #[test]
    fn usage_errors_exit_with_2() {
        assert_eq!(
            report(&anyhow::Error::new(UsageError("no".to_owned()))),
            ExitCode::from(2)
        );
        assert_eq!(report(&anyhow::anyhow!("failed")), ExitCode::FAILURE);
    }
}
