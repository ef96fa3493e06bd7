//! Fault injection for the AWS SDK clients: delay, hang, throttle, fail with a 5xx, or drop the
//! response of chosen operations, following a seeded schedule, against the real emulators.
//!
//! The schedule ([`Faults`], [`Rule`], [`Fault`], [`Faults::decide`]) needs no SDK. The layer that
//! applies it to real SDK clients (`Faults::wrap`, `Faults::http_client`, `faulty_sqs_client`,
//! `faulty_dynamodb_client`, `with_faults_sqs`, `with_faults_dynamodb`) needs the feature `aws`.
//!
//! ```text
//! let faults = Faults::new(7);
//! let sqs = faulty_sqs_client(&faults).await;                 // LocalStack, production deadlines
//! let dynamodb = faulty_dynamodb_client(&faults).await;       // DynamoDB Local, production deadlines
//! let hang = faults.add(Rule::new(Fault::Hang).on("PutItem").lasting(Duration::from_secs(60)));
//! // ... run the worker ...
//! assert!(faults.stats(hang).injected > 0);                   // the fault really happened
//! faults.clear();                                             // heal, while the clients are in use
//! ```
//!
//! # Why an HTTP client wrapper, not an interceptor
//!
//! The SDK's interceptor hooks (`aws_smithy_runtime_api::client::interceptors::Intercept`) are
//! synchronous: they can rewrite a request or a response, but they cannot wait, so they cannot delay or
//! hang a call, and a response they replace has still been sent to the service. The layer below them, the
//! HTTP client (`HttpClient` → `HttpConnector`), is asynchronous and is exactly where the network sits: a
//! wrapper there sleeps with `tokio::time` before delegating (delay, hang), answers without delegating
//! (throttle, 5xx: the service never sees the request), or delegates and then throws the response away
//! (drop: the service applied the request, the caller gets an IO error). Everything above it (the SDK's
//! attempt and operation timeouts, its retry classifier and backoff, the adapters' `classify`) runs
//! unchanged, which is what the tests want to exercise. The same wrapper serves every SDK client built on
//! the smithy runtime, so one [`Faults`] handle can be attached to the SQS and the DynamoDB client:
//!
//! ```text
//! let client = aws_sdk_sqs::Client::from_conf(
//!     client.config().to_builder().http_client(faults.wrap(client.config().http_client())).build(),
//! );
//! ```
//!
//! (`with_faults_sqs` and `with_faults_dynamodb` do exactly that for a client built elsewhere.)
//!
//! # The schedule
//!
//! A [`Rule`] names a [`Fault`], the operations it applies to (the `X-Amz-Target` operation name, such
//! as `ChangeMessageVisibilityBatch`, `DeleteMessageBatch`, `PutItem`, `UpdateItem`; none = every
//! operation), a time window (from [`Rule::after`] for [`Rule::lasting`], counted from when the rule is
//! added), a cap on injections ([`Rule::times`]: the first N matching calls) and a probability
//! ([`Rule::probability`]). Rules are tried in the order they were added; the first that fires decides.
//! Probabilities are drawn from one generator seeded by [`Faults::new`], one draw per matching call of a
//! rule whose probability is below 1, so the same seed and the same order of calls give the same
//! decisions ([`Faults::decide`] is the schedule without HTTP, usable by in-memory doubles too).
//!
//! Rules can be added, removed or cleared while clients use the handle. Each rule counts the calls it
//! matched and the faults it injected ([`Faults::stats`], kept after removal), and the handle counts
//! every call and every injection per operation ([`Faults::calls`], [`Faults::injected`]).
//!
//! Time is `tokio::time`: windows and sleeps follow a paused clock. A paused clock does not mix with
//! real I/O (the runtime advances time while a request waits for the network, so the SDK's timeouts fire
//! early); with the emulators, use the real clock, and [`Faults::decide`] with the doubles.
//!
//! # What the caller sees
//!
//! | fault | the service | the SDK (standard retries) | the adapters |
//! |---|---|---|---|
//! | [`Fault::Delay`] | applies it, late | succeeds, or times out if the delay exceeds the attempt timeout | as without the fault |
//! | [`Fault::Hang`] | never sees it | attempt timeout, retried, until the operation timeout | `Unavailable` |
//! | [`Fault::Throttle`] | never sees it | HTTP 400 `ThrottlingException`, retried with backoff as throttling | `Unavailable` |
//! | [`Fault::ServerError`] | never sees it | HTTP 500, retried | `Unavailable` |
//! | [`Fault::DropResponse`] | applies it | IO error (connection reset), retried: a retry applies it again | `Unavailable` |
//!
//! Every injected failure is retried by the SDK, so a rule that fires once is usually invisible to the
//! caller: to make a call fail, let the rule fire for all of its attempts (`times(MAX_ATTEMPTS)` or a
//! time window). Note that the SDK's standard retry mode keeps a retry quota per service and process;
//! a test that injects hundreds of failures can use it up, after which failures are no longer retried.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

#[cfg(feature = "aws")]
mod http;
#[cfg(feature = "aws")]
pub use http::{faulty_dynamodb_client, faulty_sqs_client, with_faults_dynamodb, with_faults_sqs};

/// How long a [`Fault::Hang`] sleeps: far past any deadline a client should have.
pub const HANG: Duration = Duration::from_secs(3600);

/// What to do to a call.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Wait this long, then send the request as usual.
    Delay(Duration),
    /// Never answer (sleep for [`HANG`]); only the client's deadline ends the call.
    Hang,
    /// Answer HTTP 400 with the service's throttling error (`ThrottlingException`) without sending the
    /// request.
    Throttle,
    /// Answer HTTP 500 (`InternalFailure` on SQS, `InternalServerError` on DynamoDB) without sending the
    /// request.
    ServerError,
    /// Send the request (the service applies it), then discard the response and fail as if the
    /// connection had been reset.
    DropResponse,
}

/// One entry of the schedule: a fault, the operations it applies to, when, how often.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    fault: Fault,
    operations: Vec<String>,
    after: Duration,
    lasting: Option<Duration>,
    times: Option<u64>,
    probability: f64,
}

impl Rule {
    /// `fault` on every call of every operation, from the moment the rule is added, forever.
    pub fn new(fault: Fault) -> Self {
        Self {
            fault,
            operations: Vec::new(),
            after: Duration::ZERO,
            lasting: None,
            times: None,
            probability: 1.0,
        }
    }

    /// Applies to `operation` (e.g. `DeleteMessageBatch`, `PutItem`); call again to add more. Without
    /// any, the rule applies to every operation.
    pub fn on(mut self, operation: impl Into<String>) -> Self {
        self.operations.push(operation.into());
        self
    }

    /// Active from `delay` after the rule is added (default: at once).
    pub fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }

    /// Active for `length` (default: forever).
    pub fn lasting(mut self, length: Duration) -> Self {
        self.lasting = Some(length);
        self
    }

    /// Injects at most `count` faults: the first `count` matching calls (with a probability, the first
    /// `count` that the draw selects).
    pub fn times(mut self, count: u64) -> Self {
        self.times = Some(count);
        self
    }

    /// Fires on a matching call with probability `probability` (clamped to 0..=1; default 1), drawn from
    /// the handle's seeded generator.
    pub fn probability(mut self, probability: f64) -> Self {
        self.probability = if probability.is_nan() {
            0.0
        } else {
            probability.clamp(0.0, 1.0)
        };
        self
    }

    /// The fault this rule injects.
    pub fn fault(&self) -> Fault {
        self.fault
    }

    fn applies_to(&self, operation: &str) -> bool {
        self.operations.is_empty() || self.operations.iter().any(|name| name == operation)
    }
}

/// Identifies a rule added to a [`Faults`] handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(u64);

/// What one rule did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleStats {
    /// Calls of the rule's operations made while the rule was active (in its window, under its cap),
    /// whether or not the draw selected them.
    pub matched: u64,
    /// Faults the rule injected.
    pub injected: u64,
}

/// A shared, seeded fault schedule; clones share the rules and the counters.
#[derive(Clone)]
pub struct Faults {
    shared: Arc<Mutex<State>>,
}

struct ActiveRule {
    id: RuleId,
    rule: Rule,
    added: Instant,
}

struct State {
    seed: u64,
    rng: fastrand::Rng,
    rules: Vec<ActiveRule>,
    next_id: u64,
    stats: HashMap<RuleId, RuleStats>,
    calls: HashMap<String, u64>,
    injected: HashMap<String, u64>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("Faults")
            .field("seed", &state.seed)
            .field(
                "rules",
                &state
                    .rules
                    .iter()
                    .map(|active| (active.id, &active.rule))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Faults {
    /// An empty schedule whose probabilities are drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            shared: Arc::new(Mutex::new(State {
                seed,
                rng: fastrand::Rng::with_seed(seed),
                rules: Vec::new(),
                next_id: 0,
                stats: HashMap::new(),
                calls: HashMap::new(),
                injected: HashMap::new(),
            })),
        }
    }

    /// The seed given to [`Faults::new`] (print it when a test fails, to replay it).
    pub fn seed(&self) -> u64 {
        self.state().seed
    }

    /// Adds `rule` after the existing ones; its window starts now.
    pub fn add(&self, rule: Rule) -> RuleId {
        let mut state = self.state();
        let id = RuleId(state.next_id);
        state.next_id += 1;
        state.stats.insert(id, RuleStats::default());
        state.rules.push(ActiveRule {
            id,
            rule,
            added: Instant::now(),
        });
        id
    }

    /// Removes a rule (its stats stay readable); false if it was not there.
    pub fn remove(&self, id: RuleId) -> bool {
        let mut state = self.state();
        let before = state.rules.len();
        state.rules.retain(|active| active.id != id);
        state.rules.len() != before
    }

    /// Removes every rule: calls go through untouched from now on (counters stay).
    pub fn clear(&self) {
        self.state().rules.clear();
    }

    /// What rule `id` did so far (zero for an unknown id).
    pub fn stats(&self, id: RuleId) -> RuleStats {
        self.state().stats.get(&id).copied().unwrap_or_default()
    }

    /// Calls of `operation` that went through the schedule, faulted or not (each SDK attempt counts).
    pub fn calls(&self, operation: &str) -> u64 {
        self.state().calls.get(operation).copied().unwrap_or(0)
    }

    /// Faults injected into calls of `operation`, by every rule.
    pub fn injected(&self, operation: &str) -> u64 {
        self.state().injected.get(operation).copied().unwrap_or(0)
    }

    /// Decides the fate of one call of `operation` now, and counts it: the fault of the first rule that
    /// fires, or `None` to let it through.
    pub fn decide(&self, operation: &str) -> Option<Fault> {
        let now = Instant::now();
        let mut guard = self.state();
        let state = &mut *guard;
        *state.calls.entry(operation.to_owned()).or_default() += 1;
        for active in &state.rules {
            let rule = &active.rule;
            if !rule.applies_to(operation) {
                continue;
            }
            let elapsed = now.saturating_duration_since(active.added);
            if elapsed < rule.after {
                continue;
            }
            if rule
                .lasting
                .is_some_and(|length| elapsed >= rule.after.saturating_add(length))
            {
                continue;
            }
            let stats = state.stats.entry(active.id).or_default();
            if rule.times.is_some_and(|times| stats.injected >= times) {
                continue;
            }
            stats.matched += 1;
            if rule.probability < 1.0 && state.rng.f64() >= rule.probability {
                continue;
            }
            stats.injected += 1;
            *state.injected.entry(operation.to_owned()).or_default() += 1;
            return Some(rule.fault);
        }
        None
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counters that are still meaningful.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn decisions(faults: &Faults, operation: &str, calls: usize) -> Vec<Option<Fault>> {
        (0..calls).map(|_| faults.decide(operation)).collect()
    }

    fn random_schedule(seed: u64) -> Faults {
        let faults = Faults::new(seed);
        faults.add(Rule::new(Fault::Throttle).on("PutItem").probability(0.3));
        faults.add(Rule::new(Fault::ServerError).on("PutItem").probability(0.5));
        faults
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_seed_gives_the_same_decisions() {
        let one = decisions(&random_schedule(42), "PutItem", 200);
        let two = decisions(&random_schedule(42), "PutItem", 200);
        let other = decisions(&random_schedule(43), "PutItem", 200);
        assert_eq!(one, two);
        assert_ne!(one, other);
        let throttled = one.iter().filter(|d| **d == Some(Fault::Throttle)).count();
        let failed = one.iter().filter(|d| **d == Some(Fault::ServerError)).count();
        // 30% of 200, then 50% of the rest: loose bounds, the point is that both rules fire.
        assert!((30..=90).contains(&throttled), "{throttled}");
        assert!((40..=100).contains(&failed), "{failed}");
    }

    #[tokio::test(start_paused = true)]
    async fn rules_apply_to_their_operations_and_count() {
        let faults = Faults::new(1);
        let hang = faults.add(Rule::new(Fault::Hang).on("PutItem").on("UpdateItem"));
        assert_eq!(faults.decide("GetItem"), None);
        assert_eq!(faults.decide("PutItem"), Some(Fault::Hang));
        assert_eq!(faults.decide("UpdateItem"), Some(Fault::Hang));
        assert_eq!(
            faults.stats(hang),
            RuleStats {
                matched: 2,
                injected: 2
            }
        );
        assert_eq!(faults.calls("GetItem"), 1);
        assert_eq!(faults.injected("PutItem"), 1);
        assert_eq!(faults.injected("GetItem"), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn times_limits_a_rule_to_the_first_calls() {
        let faults = Faults::new(1);
        let drop = faults.add(Rule::new(Fault::DropResponse).on("SendMessage").times(2));
        let fallback = faults.add(Rule::new(Fault::Delay(SECOND)));
        assert_eq!(
            decisions(&faults, "SendMessage", 4),
            vec![
                Some(Fault::DropResponse),
                Some(Fault::DropResponse),
                Some(Fault::Delay(SECOND)),
                Some(Fault::Delay(SECOND)),
            ]
        );
        assert_eq!(faults.stats(drop).injected, 2);
        assert_eq!(faults.stats(fallback).injected, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn windows_follow_the_tokio_clock() {
        let faults = Faults::new(1);
        let rule = faults.add(
            Rule::new(Fault::ServerError)
                .on("DeleteMessageBatch")
                .after(10 * SECOND)
                .lasting(5 * SECOND),
        );
        assert_eq!(faults.decide("DeleteMessageBatch"), None);
        tokio::time::advance(10 * SECOND).await;
        assert_eq!(faults.decide("DeleteMessageBatch"), Some(Fault::ServerError));
        tokio::time::advance(4 * SECOND).await;
        assert_eq!(faults.decide("DeleteMessageBatch"), Some(Fault::ServerError));
        tokio::time::advance(SECOND).await;
        assert_eq!(faults.decide("DeleteMessageBatch"), None);
        assert_eq!(faults.stats(rule).injected, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rules_change_through_any_clone() {
        let faults = Faults::new(1);
        let clone = faults.clone();
        let rule = clone.add(Rule::new(Fault::Throttle));
        assert_eq!(faults.decide("ReceiveMessage"), Some(Fault::Throttle));
        assert!(faults.remove(rule));
        assert!(!faults.remove(rule));
        assert_eq!(clone.decide("ReceiveMessage"), None);
        assert_eq!(clone.stats(rule).injected, 1, "stats outlive the rule");
        clone.add(Rule::new(Fault::Hang));
        faults.clear();
        assert_eq!(clone.decide("ReceiveMessage"), None);
        assert_eq!(faults.calls("ReceiveMessage"), 3);
    }

    #[test]
    fn probability_is_clamped() {
        assert_eq!(Rule::new(Fault::Hang).probability(3.0).probability, 1.0);
        assert_eq!(Rule::new(Fault::Hang).probability(-1.0).probability, 0.0);
        assert_eq!(Rule::new(Fault::Hang).probability(f64::NAN).probability, 0.0);
    }
}
