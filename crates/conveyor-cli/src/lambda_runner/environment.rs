//! One execution environment: a Runtime API endpoint and the bootstrap process behind it.
//!
//! As on Lambda, an environment initialises on its first invocation (the cold start), and again on the
//! invocation after one that timed out, crashed or failed to initialise: an init error fails that
//! invocation (`Runtime.InitError`, or `Runtime.ExitError` when the process exits), its batch stays in
//! flight and comes back after its visibility timeout, and the next invocation starts a new process.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::child::{Bootstrap, FunctionSettings};
use super::runtime_api::{ApiEvent, Invocation, RuntimeApi};
use super::{ENVIRONMENT_HINT, describe_error};

/// How long a bootstrap may take from start to its first `next` request (Lambda's init limit).
pub(crate) const INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Slack after the invocation deadline for the answer's HTTP request to arrive.
const DEADLINE_GRACE: Duration = Duration::from_millis(250);

/// How one invocation ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// The function returned this body.
    Response(Vec<u8>),
    /// The function (or the Runtime API, for an oversized response) reported an error.
    Error {
        /// `Lambda-Runtime-Function-Error-Type`.
        error_type: Option<String>,
        /// The error document.
        body: Vec<u8>,
    },
    /// No answer by the deadline.
    TimedOut,
    /// The process exited mid-invocation.
    Exited(String),
    /// The event could not be written to the runtime.
    Undelivered,
    /// The environment failed to initialise for this invocation.
    InitFailed(String),
}

impl Ended {
    /// True when the environment is replaced before the next invocation (AWS discards it).
    pub(crate) fn replaces_environment(&self) -> bool {
        matches!(
            self,
            Ended::TimedOut | Ended::Exited(_) | Ended::Undelivered | Ended::InitFailed(_)
        )
    }
}

/// What an invocation did, with its timings.
#[derive(Debug)]
pub(crate) struct Invoked {
    /// How it ended.
    pub ended: Ended,
    /// Spawn to first `next`, when this invocation started a new process.
    pub cold_start: Option<Duration>,
    /// The deadline the runtime was given, once it took the event.
    pub deadline: Option<Instant>,
}

/// An execution environment, numbered from 1.
pub(crate) struct Environment {
    number: usize,
    api: RuntimeApi,
    bootstrap: Option<Bootstrap>,
    settings: Arc<FunctionSettings>,
}

impl Environment {
    /// Binds a Runtime API endpoint; the bootstrap starts with the first invocation.
    pub(crate) async fn bind(number: usize, settings: Arc<FunctionSettings>) -> std::io::Result<Self> {
        Ok(Self {
            number,
            api: RuntimeApi::bind().await?,
            bootstrap: None,
            settings,
        })
    }

    /// The environment's number (1, 2, ...), as printed.
    pub(crate) fn number(&self) -> usize {
        self.number
    }

    /// Runs one invocation, initialising first when needed.
    pub(crate) async fn invoke(&mut self, invocation: Invocation) -> Invoked {
        if self.bootstrap.as_mut().is_some_and(Bootstrap::has_exited) {
            // The runtime gave up after its last invocation: a new one starts, as Lambda would.
            self.discard().await;
        }
        let mut cold_start = None;
        if self.bootstrap.is_none() {
            match self.initialise().await {
                Ok(took) => cold_start = Some(took),
                Err(reason) => {
                    self.discard().await;
                    return Invoked {
                        ended: Ended::InitFailed(reason),
                        cold_start: None,
                        deadline: None,
                    };
                }
            }
        }
        let id = invocation.id.clone();
        let timeout = invocation.timeout;
        self.api.submit(invocation);
        let (ended, deadline) = self.wait_for(&id, timeout).await;
        if ended.replaces_environment() {
            self.discard().await;
        }
        Invoked {
            ended,
            cold_start,
            deadline,
        }
    }

    /// Kills the process, if any.
    pub(crate) async fn shut_down(&mut self) {
        self.discard().await;
    }

    async fn discard(&mut self) {
        self.api.withdraw();
        if let Some(mut bootstrap) = self.bootstrap.take() {
            bootstrap.kill().await;
        }
    }

    /// Starts the bootstrap and waits for its first `next` request: the cold start's length, or why
    /// it failed.
    async fn initialise(&mut self) -> Result<Duration, String> {
        self.api.withdraw();
        let mut bootstrap = Bootstrap::spawn(&self.settings, self.api.addr())
            .await
            .map_err(|error| format!("{error:#}"))?;
        let spawned_at = bootstrap.spawned_at();
        let limit = spawned_at + INIT_TIMEOUT;
        let result = loop {
            tokio::select! {
                event = self.api.next_event() => match event {
                    // A request from the process this one replaced does not count.
                    Some(ApiEvent::NextRequested { at }) if at >= spawned_at => break Ok(at - spawned_at),
                    Some(ApiEvent::InitError { error_type, body }) => break Err(format!(
                        "Runtime.InitError: {}; {ENVIRONMENT_HINT}",
                        describe_error(error_type.as_deref(), &body)
                    )),
                    Some(_) => {}
                    None => break Err("the Runtime API stopped".to_owned()),
                },
                status = bootstrap.wait() => break Err(format!(
                    "Runtime.ExitError: the bootstrap exited during init ({}); its output is above \
                     (bootstrap| lines); {ENVIRONMENT_HINT}",
                    status.map_or_else(|error| error.to_string(), |status| status.to_string())
                )),
                () = tokio::time::sleep_until(limit) => break Err(format!(
                    "Runtime.InitTimeout: the bootstrap did not ask for an event within {INIT_TIMEOUT:?} of starting"
                )),
            }
        };
        self.bootstrap = Some(bootstrap);
        result
    }

    /// Waits for the invocation's end: an answer, the deadline, or the process's exit.
    async fn wait_for(&mut self, id: &str, timeout: Duration) -> (Ended, Option<Instant>) {
        let Some(bootstrap) = self.bootstrap.as_mut() else {
            return (Ended::Exited("no bootstrap process".to_owned()), None);
        };
        // Until the bootstrap takes the event, allow for a slow start on top of the timeout.
        let mut limit = Instant::now() + timeout + INIT_TIMEOUT;
        let mut deadline = None;
        loop {
            let ended = tokio::select! {
                event = self.api.next_event() => match event {
                    Some(ApiEvent::Started { id: started, deadline: at }) if started == id => {
                        deadline = Some(at);
                        limit = at + DEADLINE_GRACE;
                        continue;
                    }
                    Some(ApiEvent::Response { id: answered, body }) if answered == id => Ended::Response(body),
                    Some(ApiEvent::Error { id: answered, error_type, body }) if answered == id => {
                        Ended::Error { error_type, body }
                    }
                    Some(ApiEvent::Undelivered { id: lost }) if lost == id => Ended::Undelivered,
                    Some(ApiEvent::InitError { error_type, body }) => {
                        crate::errln!(
                            "environment {}: bootstrap init error: {}",
                            self.number,
                            describe_error(error_type.as_deref(), &body)
                        );
                        crate::errln!("hint: {ENVIRONMENT_HINT}");
                        continue;
                    }
                    Some(_) => continue,
                    None => Ended::Exited("the Runtime API stopped".to_owned()),
                },
                status = bootstrap.wait() => {
                    Ended::Exited(status.map_or_else(|error| error.to_string(), |status| status.to_string()))
                }
                () = tokio::time::sleep_until(limit) => Ended::TimedOut,
            };
            return (ended, deadline);
        }
    }
}
