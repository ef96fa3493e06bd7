//! An SQS endpoint that a variable set and that a request never reached (nothing listens there, or its
//! host does not resolve): a configuration error that names the address dialled and the variable, not
//! an outage. The worker, the Lambda adapter and the producer say it in the same words, each adding
//! what it does next (stops, lists the records as failures, sends nothing).

use aws_sdk_sqs::error::SdkError;
use conveyor_core::port::QueueError;

/// The variables that set the SQS endpoint the client dials, in the SDK's order.
pub const ENDPOINT_VARIABLES: [&str; 2] = ["AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL"];

/// With `true`, the SDK ignores the endpoint variables (and so does [`UnreachableEndpoint`]).
const IGNORE_ENDPOINTS: &str = "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS";

/// The prefix [`QueueError::Unavailable`] messages carry when the request never reached SQS.
pub(crate) const NOT_REACHED: &str = "the request did not reach SQS: ";

/// Why a request never reached the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unreachable {
    /// Nothing listens at the address (connection refused).
    Refused,
    /// The endpoint's host name does not resolve.
    Unresolved,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unreachable::Refused => "nothing listens there (connection refused)",
            Unreachable::Unresolved => "its host name does not resolve",
        })
    }
}

/// A request that never reached the SQS endpoint a variable set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the SQS client dials {address} ({endpoint}, set by {variable}) and {why}: a configuration error, not \
     an outage"
)]
pub struct UnreachableEndpoint {
    /// The endpoint as the variable sets it (`http://127.0.0.1:4567`).
    pub endpoint: String,
    /// The `host:port` dialled (the scheme's port when the endpoint names none).
    pub address: String,
    /// The variable that set it (`AWS_ENDPOINT_URL_SQS` or `AWS_ENDPOINT_URL`).
    pub variable: &'static str,
    /// What happened there.
    pub why: Unreachable,
}

impl UnreachableEndpoint {
    /// From the sources of a failed dispatch (`reason`: the error chain as text), when a variable read
    /// with `var` set the endpoint; `None` when no variable set it (AWS's own endpoint: an outage) or
    /// the request failed otherwise (a timeout, TLS).
    pub fn from_reason(reason: &str, var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let why = if reason.contains("Connection refused") || reason.contains("connection refused") {
            Unreachable::Refused
        } else if reason.contains("dns error") || reason.contains("failed to lookup address") {
            Unreachable::Unresolved
        } else {
            return None;
        };
        if var(IGNORE_ENDPOINTS).is_some_and(|value| value.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let (variable, endpoint) = ENDPOINT_VARIABLES.iter().find_map(|name| {
            let value = var(name)?;
            let value = value.trim();
            (!value.is_empty()).then(|| (*name, value.to_owned()))
        })?;
        Some(Self {
            address: address_of(&endpoint),
            endpoint,
            variable,
            why,
        })
    }

    /// From a [`QueueError::Unavailable`] this crate wrote for a request that never reached SQS.
    pub fn from_queue_error(error: &QueueError, var: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let QueueError::Unavailable { message } = error else {
            return None;
        };
        Self::from_reason(message.strip_prefix(NOT_REACHED)?, var)
    }

    /// From an SDK error whose request was never sent (a dispatch failure).
    pub fn from_sdk_error<E, R>(error: &SdkError<E, R>, var: impl Fn(&str) -> Option<String>) -> Option<Self>
    where
        E: std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let SdkError::DispatchFailure(failure) = error else {
            return None;
        };
        let reason = match std::error::Error::source(error) {
            Some(source) => conveyor_core::runtime::display_chain(source),
            None => format!("{failure:?}"),
        };
        Self::from_reason(&reason, var)
    }

    /// What to change: the variable, or the emulator's start.
    pub fn fix(&self) -> String {
        format!(
            "fix {} (LocalStack listens on http://127.0.0.1:4566; `source localstack/env.sh`), or start the \
             emulator first",
            self.variable
        )
    }
}

/// The process environment, as the `var` of [`UnreachableEndpoint`]'s constructors.
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `host:port` of an endpoint URL; the scheme's port (80 for http, else 443) when it names none.
fn address_of(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let after_host = authority.rsplit_once(']').map_or(authority, |(_, tail)| tail);
    if after_host.contains(':') {
        return authority.to_owned();
    }
    let port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    format!("{authority}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED: &str = "dispatch failure: io error: client error (Connect): tcp connect error: Connection \
                           refused (os error 111)";

    #[test]
    fn a_refused_endpoint_that_a_variable_set_is_named_with_its_address_and_the_variable() {
        let set = |name: &str| (name == "AWS_ENDPOINT_URL_SQS").then(|| "http://127.0.0.1:4567/".to_owned());
        let found = UnreachableEndpoint::from_reason(REFUSED, set).unwrap();
        assert_eq!(
            (found.address.as_str(), found.variable, found.why),
            ("127.0.0.1:4567", "AWS_ENDPOINT_URL_SQS", Unreachable::Refused)
        );
        let text = found.to_string();
        assert!(
            text.contains("127.0.0.1:4567") && text.contains("not an outage"),
            "{text}"
        );
        // AWS's own endpoint (no variable), or the variables ignored: an outage, as before.
        assert_eq!(UnreachableEndpoint::from_reason(REFUSED, |_| None), None);
        let ignored = |name: &str| match name {
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS" => Some("true".to_owned()),
            _ => set(name),
        };
        assert_eq!(UnreachableEndpoint::from_reason(REFUSED, ignored), None);
        assert_eq!(UnreachableEndpoint::from_reason("timeout", set), None);
    }

    #[test]
    fn the_general_variable_and_an_unresolved_host() {
        let general = |name: &str| (name == "AWS_ENDPOINT_URL").then(|| "https://localstack".to_owned());
        let dns = "dispatch failure: dns error: failed to lookup address information";
        let found = UnreachableEndpoint::from_reason(dns, general).unwrap();
        assert_eq!(
            (found.address.as_str(), found.variable, found.why),
            ("localstack:443", "AWS_ENDPOINT_URL", Unreachable::Unresolved)
        );
    }

    #[test]
    fn only_a_request_that_did_not_reach_sqs_counts() {
        let set = |_: &str| Some("http://localhost".to_owned());
        let unavailable = |message: String| QueueError::Unavailable { message };
        let found =
            UnreachableEndpoint::from_queue_error(&unavailable(format!("{NOT_REACHED}{REFUSED}")), set);
        assert_eq!(found.map(|found| found.address), Some("localhost:80".to_owned()));
        // A service message that merely mentions a refusal is not a dispatch failure.
        assert_eq!(
            UnreachableEndpoint::from_queue_error(&unavailable(REFUSED.to_owned()), set),
            None
        );
    }

    #[test]
    fn addresses() {
        assert_eq!(address_of("http://[::1]:4566"), "[::1]:4566");
        assert_eq!(address_of("https://[::1]/x"), "[::1]:443");
        assert_eq!(address_of("http://user@host:9/"), "host:9");
        assert_eq!(address_of("sqs.local"), "sqs.local:443");
    }
}
