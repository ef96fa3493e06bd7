//! What a user passes as `--queue-url`: a queue URL, checked for its shape, or a queue name, resolved
//! with `GetQueueUrl` (what users of the AWS CLI and boto3 expect). A typo is caught here, with the
//! shape a URL should have, instead of reaching SQS as a request for a queue that does not exist.

use aws_sdk_sqs::Client;

use super::error::AdminError;
use conveyor_core::port::QueueError;

use crate::errors::classify;

/// The longest queue name SQS accepts (80 characters, `.fifo` included).
const MAX_QUEUE_NAME: usize = 80;

/// A `--queue-url` value that is neither a queue URL nor a queue name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not a queue URL ({reason}): a queue URL looks like https://sqs.REGION.amazonaws.com/ACCOUNT_ID/NAME \
     (LocalStack: http://127.0.0.1:4566/queue/REGION/000000000000/NAME); a plain queue name (letters, digits, - and _, \
     at most 80 characters, .fifo for FIFO queues) is looked up with GetQueueUrl"
)]
pub struct BadQueueRef {
    /// What was given.
    pub given: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// What a `--queue-url` value names.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueRef {
    /// A queue URL, used as is.
    Url(String),
    /// A queue name, to be resolved with `GetQueueUrl`.
    Name(String),
}

impl std::str::FromStr for QueueRef {
    type Err = BadQueueRef;

    fn from_str(given: &str) -> Result<Self, BadQueueRef> {
        Self::parse(given)
    }
}

impl std::fmt::Display for QueueRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueRef::Url(text) | QueueRef::Name(text) => f.write_str(text),
        }
    }
}

impl QueueRef {
    /// Sorts `given` into a URL or a name, refusing anything that is neither.
    pub fn parse(given: &str) -> Result<Self, BadQueueRef> {
        let bad = |reason| BadQueueRef {
            given: given.to_owned(),
            reason,
        };
        let Some((scheme, rest)) = given.split_once("://") else {
            if is_queue_name(given) {
                return Ok(QueueRef::Name(given.to_owned()));
            }
            return Err(bad(
                "no http:// or https:// scheme, and not a valid queue name either",
            ));
        };
        if scheme != "https" && scheme != "http" {
            return Err(bad("the scheme is not http or https"));
        }
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(bad("no host"));
        }
        let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
        let [.., account, name] = segments.as_slice() else {
            return Err(bad("the path must end in /ACCOUNT_ID/QUEUE_NAME"));
        };
        if account.len() != 12 || !account.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(bad(
                "the path must end in /ACCOUNT_ID/QUEUE_NAME, with a 12-digit account id",
            ));
        }
        if !is_queue_name(name) {
            return Err(bad("the last path segment is not a valid queue name"));
        }
        Ok(QueueRef::Url(given.trim_end_matches('/').to_owned()))
    }
}

/// True for a valid SQS queue name: 1 to 80 of `[A-Za-z0-9_-]`, the FIFO suffix `.fifo` included.
pub fn is_queue_name(name: &str) -> bool {
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    !base.is_empty()
        && name.len() <= MAX_QUEUE_NAME
        && base
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

/// The region a queue URL names, when it names one: `sqs.REGION.amazonaws.com`,
/// `REGION.queue.amazonaws.com`, LocalStack's `sqs.REGION.localhost.localstack.cloud` and
/// `/queue/REGION/ACCOUNT/NAME` paths. `None` for URLs without a region (`http://127.0.0.1:4566/000000000000/q`).
pub fn queue_url_region(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = host.split(':').next().unwrap_or(host);
    let labels: Vec<&str> = host.split('.').collect();
    let from_host = match labels.as_slice() {
        ["sqs", region, ..] if looks_like_region(region) => Some(*region),
        [region, "queue", ..] if looks_like_region(region) => Some(*region),
        _ => None,
    };
    let from_path = || {
        let mut segments = path.split('/');
        (segments.next() == Some("queue"))
            .then(|| segments.next())
            .flatten()
            .filter(|region| looks_like_region(region))
    };
    from_host.or_else(from_path)
}

/// `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-north-1`: letters, a dash, ..., a digit at the end.
fn looks_like_region(text: &str) -> bool {
    text.contains('-')
        && text.ends_with(|c: char| c.is_ascii_digit())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
}

/// The URL of `queue`: a URL as is, a name through `GetQueueUrl`.
pub async fn resolve_queue_url(client: &Client, queue: &QueueRef) -> Result<String, AdminError> {
    match queue {
        QueueRef::Url(url) => Ok(url.clone()),
        QueueRef::Name(name) => Ok(url_of_name(client, name).await?),
    }
}

/// The URL of the queue named `name`, from `GetQueueUrl` (also how `SqsQueue::connect` takes a name).
pub(crate) async fn url_of_name(client: &Client, name: &str) -> Result<String, QueueError> {
    let output = client
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .map_err(|error| classify(&error, name))?;
    output.queue_url.ok_or_else(|| QueueError::QueueMissing {
        queue: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_names_and_typos() {
        for url in [
            "https://sqs.us-east-1.amazonaws.com/123456789012/jobs",
            "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo",
            "http://127.0.0.1:4566/000000000000/jobs-dlq",
            "http://127.0.0.1:4566/queue/us-east-1/000000000000/jobs",
        ] {
            assert_eq!(QueueRef::parse(url), Ok(QueueRef::Url(url.to_owned())), "{url}");
        }
        assert_eq!(QueueRef::parse("jobs"), Ok(QueueRef::Name("jobs".to_owned())));
        assert_eq!(
            QueueRef::parse("orders.fifo"),
            Ok(QueueRef::Name("orders.fifo".to_owned()))
        );
        for typo in [
            "htps://sqs.us-east-1.amazonaws.com/123456789012/jobs",
            "https//sqs.us-east-1.amazonaws.com/123456789012/jobs",
            "https://sqs.us-east-1.amazonaws.com/jobs",
            "https://sqs.us-east-1.amazonaws.com/12345678901/jobs",
            "https://sqs.us-east-1.amazonaws.com/123456789012/jo bs",
            "ftp://host/123456789012/jobs",
            "jobs queue",
            ".fifo",
            "",
        ] {
            let error = QueueRef::parse(typo).unwrap_err();
            assert!(error.to_string().contains("ACCOUNT_ID/NAME"), "{typo}: {error}");
        }
        assert!(!is_queue_name(&"q".repeat(81)));
    }

    #[test]
    fn regions_from_urls() {
        assert_eq!(
            queue_url_region("https://sqs.eu-west-1.amazonaws.com/123456789012/jobs"),
            Some("eu-west-1")
        );
        assert_eq!(
            queue_url_region("https://us-west-2.queue.amazonaws.com/123456789012/jobs"),
            Some("us-west-2")
        );
        assert_eq!(
            queue_url_region("http://127.0.0.1:4566/queue/us-east-1/000000000000/jobs"),
            Some("us-east-1")
        );
        assert_eq!(
            queue_url_region("http://sqs.us-east-2.localhost.localstack.cloud:4566/000000000000/jobs"),
            Some("us-east-2")
        );
        assert_eq!(queue_url_region("http://127.0.0.1:4566/000000000000/jobs"), None);
        assert_eq!(
            queue_url_region("https://queue.amazonaws.com/123456789012/jobs"),
            None
        );
    }
}
