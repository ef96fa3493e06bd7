//! What the console serves, and the rules its configuration must follow.

use std::net::SocketAddr;
use std::time::Duration;

use conveyor_http::Limits;
use conveyor_sqs::admin::{AdminError, QueueRef};

/// The environment variable the token can come from instead of `--token`.
pub const TOKEN_ENV: &str = "CONVEYOR_CONSOLE_TOKEN";
/// The environment variable the viewer's token can come from instead of `--viewer-token`.
pub const VIEWER_TOKEN_ENV: &str = "CONVEYOR_CONSOLE_VIEWER_TOKEN";
/// The most bytes of a payload object the dead-letter page reads unless configured otherwise (1 MiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: u64 = 1024 * 1024;
/// The shortest token accepted.
const MIN_TOKEN_CHARS: usize = 16;

/// The console's settings.
#[derive(Debug, Clone, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct ConsoleConfig {
    /// Where it listens. Anything but a loopback address needs [`ConsoleConfig::behind_tls_proxy`].
    pub listen: SocketAddr,
    /// The token every request must carry (`Authorization: Bearer`, or the cookie set by opening
    /// `/?token=...` once). `None`: a random one is generated at start ([`Console::token`](crate::Console::token)).
    pub token: Option<String>,
    /// A second token, a viewer's: it sees queues, jobs and metrics but no message body, payload or job
    /// output, and takes no action (every POST is refused). `None`: only the operator's token.
    pub viewer_token: Option<String>,
    /// Names besides `localhost`, `127.0.0.1` and `[::1]` the console answers to (the `Host` of a
    /// request, any port): the name of the TLS proxy in front of it. Requests addressed to any other
    /// name are refused (DNS rebinding).
    pub public_names: Vec<String>,
    /// Served through a proxy that terminates TLS: required to listen on anything but loopback (the
    /// token would otherwise cross the network in clear); the token's cookie is then `Secure` and
    /// `__Host-` prefixed.
    pub behind_tls_proxy: bool,
    /// Queues shown, by URL or name.
    pub queues: Vec<QueueRef>,
    /// Queues shown by name prefix (`ListQueues` on every refresh).
    pub prefixes: Vec<String>,
    /// Workers' operations endpoints (`http://host:9090`), scraped for throughput and errors.
    pub workers: Vec<String>,
    /// The job types the send form offers.
    pub job_types: Vec<String>,
    /// The idempotency table the job lookup reads.
    pub table: Option<String>,
    /// The buckets a dead letter's large-payload pointer may be followed into ("fetch the payload"):
    /// the workers' `CONVEYOR_PAYLOAD_BUCKET`. A pointer into any other bucket is shown as a pointer
    /// and never read, so a message cannot make the console read an object with the operator's
    /// credentials from wherever it names. Empty: no payload is fetched.
    pub payload_buckets: Vec<String>,
    /// The most bytes of a payload object read for the page (the read stops there, and the page
    /// says the object is larger).
    pub max_payload_bytes: u64,
    /// How often the live parts of a page refresh.
    pub refresh: Duration,
    /// How often the queues page's charts take a sample (each costs what a refresh of the page costs).
    pub history_every: Duration,
    /// Request deadlines and body limit.
    pub limits: Limits,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8025)),
            token: None,
            viewer_token: None,
            public_names: Vec::new(),
            behind_tls_proxy: false,
            queues: Vec::new(),
            prefixes: Vec::new(),
            workers: Vec::new(),
            job_types: Vec::new(),
            table: None,
            payload_buckets: Vec::new(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            refresh: Duration::from_secs(3),
            history_every: Duration::from_secs(15),
            limits: Limits::default().with_max_body(1024 * 1024 + 64 * 1024),
        }
    }
}

/// Why the console cannot start.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// A non-loopback address without a TLS proxy in front.
    #[error(
        "the console would listen on {addr}, which other machines can reach, over plain HTTP: its token \
         would cross the network in clear. Put a proxy that terminates TLS in front of it and pass \
         --behind-tls-proxy (with --public-name <the proxy's name>), or listen on 127.0.0.1 and reach it \
         through an SSH tunnel"
    )]
    PlainHttpOffLoopback {
        /// The address.
        addr: SocketAddr,
    },
    /// A token too short to resist guessing.
    #[error("the console token is {chars} characters long; use a random value of at least {MIN_TOKEN_CHARS}")]
    TokenTooShort {
        /// Its length.
        chars: usize,
    },
    /// The viewer's token is the operator's.
    #[error("the viewer token is the operator token: give the viewers a token of their own")]
    SameTokens,
    /// Nothing to show.
    #[error("no queues to show: pass --queue-url (URL or name) or --queue-prefix, as often as needed")]
    NoQueues,
    /// A queue could not be resolved.
    #[error(transparent)]
    Admin(#[from] AdminError),
}

impl ConsoleConfig {
    /// Checks the rules: a TLS proxy in front off loopback, a long enough token, at least one queue.
    pub fn check(&self) -> Result<(), ConsoleError> {
        if !self.listen.ip().is_loopback() && !self.behind_tls_proxy {
            return Err(ConsoleError::PlainHttpOffLoopback { addr: self.listen });
        }
        if let Some(token) = &self.token
            && token.chars().count() < MIN_TOKEN_CHARS
        {
            return Err(ConsoleError::TokenTooShort {
                chars: token.chars().count(),
            });
        }
        if let Some(viewer) = &self.viewer_token {
            if viewer.chars().count() < MIN_TOKEN_CHARS {
                return Err(ConsoleError::TokenTooShort {
                    chars: viewer.chars().count(),
                });
            }
            if self.token.as_ref() == Some(viewer) {
                return Err(ConsoleError::SameTokens);
            }
        }
        if self.queues.is_empty() && self.prefixes.is_empty() {
            return Err(ConsoleError::NoQueues);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_addresses_need_a_tls_proxy_and_tokens_are_long() {
        let config = |listen: &str, token: Option<&str>, behind_tls_proxy: bool| ConsoleConfig {
            listen: listen
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 1))),
            token: token.map(str::to_owned),
            behind_tls_proxy,
            prefixes: vec!["jobs".to_owned()],
            ..ConsoleConfig::default()
        };
        assert!(config("127.0.0.1:8025", None, false).check().is_ok());
        assert!(config("[::1]:8025", None, false).check().is_ok());
        let open = config("0.0.0.0:8025", Some("0123456789abcdef"), false).check();
        assert!(
            matches!(open, Err(ConsoleError::PlainHttpOffLoopback { .. })),
            "{open:?}"
        );
        let short = config("127.0.0.1:8025", Some("abc"), false).check();
        assert!(
            matches!(short, Err(ConsoleError::TokenTooShort { chars: 3 })),
            "{short:?}"
        );
        assert!(config("0.0.0.0:8025", None, true).check().is_ok());
        let none = ConsoleConfig::default().check();
        assert!(matches!(none, Err(ConsoleError::NoQueues)), "{none:?}");
    }
}
