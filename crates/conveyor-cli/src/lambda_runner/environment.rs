//! One execution environment: a Runtime API endpoint and the bootstrap process behind it.
//!
//! As on Lambda, an environment initialises on its first invocation (the cold start), and again on the
//! invocation after one that timed out, crashed or failed to initialise: an init error fails that
//! invocation (`Runtime.InitError`, or `Runtime.ExitError` when the process exits), its batch stays in
//! flight and comes back after its visibility timeout, and the next invocation starts a new process.
//!
//! An environment may serve several invocations at once (`--concurrency`, as Lambda Managed Instances
//! do): each waits for its own answer on its own receiver (see `runtime_api`'s design note), one
//! initialisation serves them all, and a process that is replaced (a timeout, a crash) ends every
//! invocation still in it, as a replaced execution environment does. Each process has a generation, so
//! an invocation that ended with an old process never replaces the new one.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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
    /// The running bootstrap; locked while one is started or replaced, never during an invocation.
    process: tokio::sync::Mutex<Option<Process>>,
    settings: Arc<FunctionSettings>,
}

/// A bootstrap process, watched by a task that reaps it.
struct Process {
    /// Counts the processes of this environment.
    generation: u64,
    /// `Some(how it ended)` once the process exited.
    exited: watch::Receiver<Option<String>>,
    /// Kills the process.
    kill: CancellationToken,
    /// The watching task; done once the process is reaped, with its peak resident memory (KiB) when
    /// it was killed.
    reaped: tokio::task::JoinHandle<Option<u64>>,
}

impl Process {
    /// Starts watching `bootstrap`: its exit is published, and `kill` kills it.
    fn watch(mut bootstrap: Bootstrap, generation: u64) -> Self {
        let (exit, exited) = watch::channel(None);
        let kill = CancellationToken::new();
        let killed = kill.clone();
        let reaped = tokio::spawn(async move {
            let (ended, peak) = tokio::select! {
                status = bootstrap.wait() => {
                    (status.map_or_else(|error| error.to_string(), |status| status.to_string()), None)
                }
                () = killed.cancelled() => {
                    let peak = bootstrap.peak_rss_kib();
                    bootstrap.kill().await;
                    ("killed".to_owned(), peak)
                }
            };
            exit.send_replace(Some(ended));
            peak
        });
        Self {
            generation,
            exited,
            kill,
            reaped,
        }
    }

    fn has_exited(&self) -> bool {
        self.exited.borrow().is_some()
    }

    /// Kills the process and waits until it is reaped; its peak resident memory (KiB), when known.
    async fn stop(mut self) -> Option<u64> {
        self.kill.cancel();
        match (&mut self.reaped).await {
            Ok(peak) => peak,
            Err(error) => {
                tracing::debug!(%error, "the bootstrap's watcher ended abnormally");
                None
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // An environment dropped without `shut_down` still kills its process.
        self.kill.cancel();
    }
}

/// How a process ended, once it has: what `exited` says, waited for.
async fn exit_of(exited: &mut watch::Receiver<Option<String>>) -> String {
    match exited.wait_for(Option::is_some).await {
        Ok(ended) => ended.clone().unwrap_or_default(),
        Err(_) => "the environment was shut down".to_owned(),
    }
}

impl Environment {
    /// Binds a Runtime API endpoint; the bootstrap starts with the first invocation.
    pub(crate) async fn bind(number: usize, settings: Arc<FunctionSettings>) -> std::io::Result<Self> {
        Ok(Self {
            number,
            api: RuntimeApi::bind().await?,
            process: tokio::sync::Mutex::new(None),
            settings,
        })
    }

    /// The environment's number (1, 2, ...), as printed.
    pub(crate) fn number(&self) -> usize {
        self.number
    }

    /// Runs one invocation, initialising first when needed; other invocations may run in the same
    /// process at the same time.
    pub(crate) async fn invoke(&self, invocation: Invocation) -> Invoked {
        self.report_init_errors();
        let (generation, exited, cold_start) = {
            let mut process = self.process.lock().await;
            if process.as_ref().is_some_and(Process::has_exited) {
                // The runtime gave up after its last invocation: a new one starts, as Lambda would.
                self.discard(&mut process).await;
            }
            let mut cold_start = None;
            if process.is_none() {
                match self.initialise(&mut process).await {
                    Ok(took) => cold_start = Some(took),
                    Err(reason) => {
                        self.discard(&mut process).await;
                        return Invoked {
                            ended: Ended::InitFailed(reason),
                            cold_start: None,
                            deadline: None,
                        };
                    }
                }
            }
            match process.as_ref() {
                Some(running) => (running.generation, running.exited.clone(), cold_start),
                None => {
                    return Invoked {
                        ended: Ended::InitFailed("no bootstrap process".to_owned()),
                        cold_start: None,
                        deadline: None,
                    };
                }
            }
        };
        let id = invocation.id.clone();
        let timeout = invocation.timeout;
        let events = self.api.submit(invocation);
        let (ended, deadline) = wait_for(events, exited, timeout).await;
        self.api.withdraw(&id);
        if ended.replaces_environment() {
            let mut process = self.process.lock().await;
            if process
                .as_ref()
                .is_some_and(|running| running.generation == generation)
            {
                self.discard(&mut process).await;
            }
        }
        Invoked {
            ended,
            cold_start,
            deadline,
        }
    }

    /// Kills the process, if any: its peak resident memory (KiB, Linux), when known.
    pub(crate) async fn shut_down(&self) -> Option<u64> {
        let mut process = self.process.lock().await;
        self.discard(&mut process).await
    }

    /// Kills the process and ends every invocation still in it; the process's peak resident memory.
    async fn discard(&self, process: &mut Option<Process>) -> Option<u64> {
        self.api.withdraw_all();
        process.take()?.stop().await
    }

    /// Prints the init errors a running bootstrap reported since the last invocation.
    fn report_init_errors(&self) {
        while let Some(event) = self.api.try_next_event() {
            if let ApiEvent::InitError { error_type, body } = event {
                crate::errln!(
                    "environment {}: bootstrap init error: {}",
                    self.number,
                    describe_error(error_type.as_deref(), &body)
                );
                crate::errln!("hint: {ENVIRONMENT_HINT}");
            }
        }
    }

    /// Starts the bootstrap and waits for its first `next` request: the cold start's length, or why
    /// it failed.
    async fn initialise(&self, process: &mut Option<Process>) -> Result<Duration, String> {
        self.api.withdraw_all();
        let bootstrap = Bootstrap::spawn(&self.settings, self.api.addr())
            .await
            .map_err(|error| format!("{error:#}"))?;
        let spawned_at = bootstrap.spawned_at();
        let generation = process_generation();
        let running = Process::watch(bootstrap, generation);
        let mut exited = running.exited.clone();
        *process = Some(running);
        let limit = spawned_at + INIT_TIMEOUT;
        loop {
            tokio::select! {
                event = self.api.next_event() => match event {
                    // A request from the process this one replaced does not count.
                    Some(ApiEvent::NextRequested { at }) if at >= spawned_at => return Ok(at - spawned_at),
                    Some(ApiEvent::InitError { error_type, body }) => return Err(format!(
                        "Runtime.InitError: {}; {ENVIRONMENT_HINT}",
                        describe_error(error_type.as_deref(), &body)
                    )),
                    Some(_) => {}
                    None => return Err("the Runtime API stopped".to_owned()),
                },
                status = exit_of(&mut exited) => return Err(format!(
                    "Runtime.ExitError: the bootstrap exited during init ({status}); its output is above \
                     (bootstrap| lines); {ENVIRONMENT_HINT}"
                )),
                () = tokio::time::sleep_until(limit) => return Err(format!(
                    "Runtime.InitTimeout: the bootstrap did not ask for an event within {INIT_TIMEOUT:?} of starting"
                )),
            }
        }
    }
}

/// A new process generation, unique in the runner.
fn process_generation() -> u64 {
    static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

/// Waits for one invocation's end: its answer, its deadline, or the process's exit.
async fn wait_for(
    mut events: mpsc::UnboundedReceiver<ApiEvent>,
    mut exited: watch::Receiver<Option<String>>,
    timeout: Duration,
) -> (Ended, Option<Instant>) {
    // Until the bootstrap takes the event, allow for a slow start on top of the timeout.
    let mut limit = Instant::now() + timeout + INIT_TIMEOUT;
    let mut deadline = None;
    loop {
        let ended = tokio::select! {
            event = events.recv() => match event {
                Some(ApiEvent::Started { deadline: at, .. }) => {
                    deadline = Some(at);
                    limit = at + DEADLINE_GRACE;
                    continue;
                }
                Some(ApiEvent::Response { body, .. }) => Ended::Response(body),
                Some(ApiEvent::Error { error_type, body, .. }) => Ended::Error { error_type, body },
                Some(ApiEvent::Undelivered { .. }) => Ended::Undelivered,
                Some(_) => continue,
                // Withdrawn: another invocation's timeout or crash replaced the process.
                None => Ended::Exited("the execution environment was replaced".to_owned()),
            },
            status = exit_of(&mut exited) => Ended::Exited(status),
            () = tokio::time::sleep_until(limit) => Ended::TimedOut,
        };
        return (ended, deadline);
    }
}
