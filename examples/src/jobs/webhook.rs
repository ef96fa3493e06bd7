//! A webhook delivery, signed with HMAC-SHA256 over the timestamp and the body.
//!
//! 2xx is success; 429 retries after the receiver's `Retry-After` (30 s without one); 5xx, timeouts and
//! connection errors are retryable (after `Retry-After` when a 5xx gives one, else the backoff); any other 4xx is permanent (the receiver refuses this delivery for good).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conveyor_core::{Context, Handler, HandlerError};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Header carrying the signature: `v1=<hex>`.
pub const SIGNATURE_HEADER: &str = "x-conveyor-signature";
/// Header carrying the signed timestamp (epoch seconds).
pub const TIMESTAMP_HEADER: &str = "x-conveyor-timestamp";
/// Header carrying the delivery id, stable across retries, so receivers can deduplicate too.
pub const DELIVERY_HEADER: &str = "x-conveyor-delivery";

/// The job: what to deliver where.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookDelivery {
    /// Stable across retries.
    pub delivery_id: String,
    /// The receiver's URL.
    pub url: String,
    /// The event name.
    pub event: String,
    /// The event's payload.
    pub payload: serde_json::Value,
}

/// What the receiver answered.
#[derive(Debug, Serialize, Deserialize)]
pub struct Delivered {
    /// The HTTP status.
    pub status: u16,
}

/// Delivers webhooks.
pub struct DeliverWebhook {
    client: reqwest::Client,
    secret: Vec<u8>,
}

impl std::fmt::Debug for DeliverWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliverWebhook").finish_non_exhaustive()
    }
}

impl DeliverWebhook {
    /// A deliverer signing with `secret`, giving up on a request after `timeout`.
    pub fn new(secret: impl Into<Vec<u8>>, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self {
            client,
            secret: secret.into(),
        })
    }
}

/// `v1=<hex(hmac_sha256(secret, "<timestamp>.<body>"))>`.
pub fn signature(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

impl Handler for DeliverWebhook {
    type Job = WebhookDelivery;
    type Output = Delivered;
    const JOB_TYPE: &'static str = "webhook";

    async fn handle(&self, job: WebhookDelivery, _ctx: Context) -> Result<Delivered, HandlerError> {
        let body = serde_json::to_vec(&serde_json::json!({ "event": job.event, "payload": job.payload }))
            .map_err(|error| HandlerError::permanent(format!("payload does not serialise: {error}")))?;
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let response = self
            .client
            .post(&job.url)
            .header("content-type", "application/json")
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, signature(&self.secret, timestamp, &body))
            .header(DELIVERY_HEADER, &job.delivery_id)
            .body(body)
            .send()
            .await
            .map_err(|error| {
                HandlerError::retryable(format!("webhook to {} failed: {error}", host(&job.url)))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(Delivered {
                status: status.as_u16(),
            });
        }
        if status.as_u16() == 429 {
            let wait = retry_after(&response).unwrap_or(Duration::from_secs(30));
            return Err(HandlerError::retry_after(
                format!("receiver throttled ({status})"),
                wait,
            ));
        }
        if status.is_server_error() {
            // A 503 may say when to come back (RFC 9110's Retry-After); other 5xx take the backoff.
            if let Some(wait) = retry_after(&response) {
                return Err(HandlerError::retry_after(
                    format!("receiver failed with {status}"),
                    wait,
                ));
            }
            return Err(HandlerError::retryable(format!("receiver failed with {status}")));
        }
        Err(HandlerError::permanent(format!(
            "receiver refused the delivery with {status}"
        )))
    }
}

fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response.headers().get("retry-after")?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The URL's host, for errors (never the path or query: they may carry tokens).
fn host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_a_known_vector() {
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac secret
        let expected = "v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686";
        assert_eq!(signature(b"secret", 1_700_000_000, br#"{"a":1}"#), expected);
    }

    #[test]
    fn host_hides_paths() {
        assert_eq!(
            host("https://hooks.example.com/t/secret?x=1"),
            "hooks.example.com"
        );
    }
}
