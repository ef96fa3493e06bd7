//! The invariants every run must keep, checked on what it left behind.

use std::collections::HashSet;
use std::time::Duration;

use conveyor_core::limits::MAX_VISIBILITY_TIMEOUT;
use conveyor_core::message::FAILURE_ATTRIBUTE;
use conveyor_core::runtime::{CLOCK_SKEW_ALLOWANCE, Failure, NotRun};
use conveyor_lambda::LambdaConfig;
use conveyor_testing::QueuedMessage;

use crate::run::Observation;
use crate::scenario::{JobSpec, Scenario, job_of_body};
use crate::sink::{Invocation, Log, Received, Run, RunEnd};
use conveyor_core::JobStatus;

/// The broken invariants of one run, each in words (empty: the run kept them all).
pub fn check(scenario: &Scenario, observed: &Observation) -> Vec<String> {
    let mut violations = Vec::new();
    let log = &observed.log;
    for job in &scenario.jobs {
        check_job(scenario, job, observed, &mut violations);
    }
    // No check that a message is received at most `maxReceiveCount` times: `MemoryQueue` redrives before
    // it delivers, so such a check could never fail here. That is the queue's promise, held by the
    // conformance case `redrive_moves_to_dlq_after_max_receive_count` (MemoryQueue and LocalStack). What
    // the runtimes control, runs per copy within the budget, is checked per job below.
    for (index, run) in log.runs.iter().enumerate() {
        if run.token.is_none() {
            violations.push(format!(
                "run {index} of job {} on {} ran without an idempotency claim",
                run.job, run.instance
            ));
        }
    }
    // A run holds its claim as it holds its message: a run whose claim was taken over was cancelled
    // (and its future dropped) before another could take it, store outage or not.
    for refused in &log.refused {
        let Some(run) = log.runs.get(refused.run) else {
            continue;
        };
        // A handler that ignores its context acted after the runtime told it to stop: the fence
        // refusing it is the fence working.
        if refused.told_to_stop {
            continue;
        }
        violations.push(format!(
            "run {} of job {} on {}: a holder whose claim was taken over tried to apply its effect; the runtime \
             had not stopped it before its claim could be taken over: {}",
            refused.run, run.job, run.instance, refused.reason
        ));
    }
    for (index, run) in log.runs.iter().enumerate() {
        // A receive held longer than half the visibility timeout (the heartbeat's margin) may answer
        // after SQS already gave the message back: its lease is lost by then, rightly.
        let late = |(from, to): &(u128, u128)| {
            run.started_ms >= *from && run.started_ms <= *to + scenario.visibility.as_millis()
        };
        let cancelled = run.end == RunEnd::Cancelled && run.instance.starts_with("worker-");
        if !cancelled
            || lease_loss_explained(run, observed, scenario.visibility)
            || stopped_at_the_visibility_cap(run, log, scenario.visibility)
        {
            continue;
        }
        if !long_late_receives(log, scenario.visibility).any(late) {
            violations.push(format!(
                "run {index} of job {} on {} was cancelled before its deadline (its lease lost) with no fault to \
                 explain it: the queue and the store answered within a fifth of the visibility timeout, and no \
                 receive answered more than half of it late",
                run.job, run.instance
            ));
        }
    }
    // The adapter answers before its invocation's deadline, whatever the faults (every call is cut at
    // `settle_by`), and whatever the other invocations of its process do (Managed Instances): each
    // has its own deadline. One that overran was cut by Lambda, its deletes lost.
    for (instance, at) in &log.overran {
        violations.push(format!(
            "an invocation of {instance} ran past its deadline (stopped at {at} ms): the adapter answers before it"
        ));
    }
    check_visibility_refusals(scenario, log, &mut violations);
    if observed.fifo {
        check_fifo_order(scenario, log, &mut violations);
    }
    check_misconfigured_store(scenario, log, &mut violations);
    if !observed.settled {
        let left: Vec<String> = observed
            .left
            .iter()
            .map(|message| {
                format!(
                    "{} (job {:?}, receive {}, {:?})",
                    message.id,
                    job_of_body(&message.body),
                    message.receive_count,
                    message.state
                )
            })
            .collect();
        violations.push(format!(
            "not settled {:?} after the faults ended; left in the queue: [{}]",
            scenario.settle_limit(),
            left.join(", ")
        ));
    }
    violations.extend(observed.worker_errors.iter().cloned());
    violations
}

/// SQS never refuses a visibility change as invalid: the runtimes keep every extension, retry delay
/// and wait in flight within 12 hours of the message's *first* receive (SQS's limit, counted from
/// `ApproximateFirstReceiveTimestamp`, not from the current receipt). A refused extension loses the
/// lease hours early in the worst case, and says "lease lost" where nothing was.
fn check_visibility_refusals(scenario: &Scenario, log: &Log, violations: &mut Vec<String>) {
    for refused in &log.visibility_refused {
        let message = refused
            .message_id
            .as_deref()
            .unwrap_or("a receipt it was not handed");
        let job = log
            .received
            .iter()
            .find(|received| Some(&received.message_id) == refused.message_id.as_ref())
            .and_then(|received| received.job);
        let first = refused
            .message_id
            .as_deref()
            .and_then(|id| first_received_ms(log, id));
        violations.push(format!(
            "{} asked SQS to keep {message} (job {job:?}, first received at {first:?} ms, visibility {:?}) in \
             flight past its limit, and SQS refused at {} ms: {}",
            refused.instance, scenario.visibility, refused.at_ms, refused.error
        ));
    }
}

/// The worker stopped holding `run`'s message at SQS's limit of 12 hours from its first receive: the
/// heartbeat stops extending there (less the clock skew allowance, a margin before it), cancels the
/// handler and leaves the message to expire; its handler's own timeout may be later. A run cancelled
/// within two visibility timeouts (and the allowance) before that limit (the heartbeat's margin and a
/// call's latency allowance), or after it (a FIFO message received again past its limit is held only
/// for the visibility timeout that receive gave it: no extension is possible, and a fresh copy would
/// break its group's order), lost nothing it could have kept, provided SQS refused no visibility
/// change for the message (else the worker asked for more than the limit, and the lease was lost to
/// that).
fn stopped_at_the_visibility_cap(run: &Run, log: &Log, visibility: Duration) -> bool {
    let Some(ended) = run.ended_ms else {
        return false;
    };
    let Some(first) = first_received_ms(log, &run.message_id) else {
        return false;
    };
    let refused = log
        .visibility_refused
        .iter()
        .any(|refused| refused.message_id.as_deref() == Some(run.message_id.as_str()));
    let cap = first + MAX_VISIBILITY_TIMEOUT.as_millis();
    let from = cap.saturating_sub((visibility * 2 + CLOCK_SKEW_ALLOWANCE * 2).as_millis());
    !refused && ended >= from
}

/// When SQS first handed `message_id` out (virtual ms, as the queue dated it), if it ever did.
fn first_received_ms(log: &Log, message_id: &str) -> Option<u128> {
    log.received
        .iter()
        .filter(|received| received.message_id == message_id)
        .filter_map(|received| received.first_received_ms)
        .min()
}

/// A store that answers "misconfigured" is a configuration error, not an outage: while it does, a
/// worker refuses to start (it receives nothing) and a Lambda's cold start fails (no invocation
/// processes its records); every worker running from the start refused.
fn check_misconfigured_store(scenario: &Scenario, log: &Log, violations: &mut Vec<String>) {
    let Some((_, until)) = log.store_misconfigured else {
        return;
    };
    if let Some(received) = log
        .received
        .iter()
        .find(|received| received.instance.starts_with("worker-") && received.at_ms < until)
    {
        violations.push(format!(
            "{} received {} at {} ms while the store was misconfigured (until {until} ms): a worker must refuse \
             to start",
            received.instance, received.message_id, received.at_ms
        ));
    }
    if let Some(invocation) = log
        .invocations
        .iter()
        .find(|invocation| invocation.processed && invocation.at_ms < until)
    {
        violations.push(format!(
            "{} processed an invocation at {} ms while the store was misconfigured (until {until} ms): \
             its cold start must fail",
            invocation.instance, invocation.at_ms
        ));
    }
    for index in 0..scenario.initial_workers {
        let name = format!("worker-{index}");
        if !log.refused_starts.iter().any(|(instance, _)| *instance == name) {
            violations.push(format!(
                "{name} started on a misconfigured store and did not refuse (it must fail its start with the fix)"
            ));
        }
    }
}

/// `copy` was received by a Lambda whose cold start then failed on a misconfigured store: the
/// invocation failed, the receive counted (AWS's event source mapping receives before it invokes).
fn received_by_a_failed_cold_start(copy: &QueuedMessage, observed: &Observation) -> bool {
    let log = &observed.log;
    log.received.iter().any(|received| {
        received.message_id == copy.id
            && log.refused_starts.iter().any(|(instance, at)| {
                *instance == received.instance
                    && *at >= received.at_ms
                    && *at <= received.at_ms + LONG_POLL_MS
            })
    })
}

/// FIFO order: within a group, no run of a message starts after a later message of the group (in send
/// order, of another job) applied its effect. A predecessor that reached the DLQ never runs again, so
/// skipping it is allowed; running it after its successor is not.
fn check_fifo_order(scenario: &Scenario, log: &Log, violations: &mut Vec<String>) {
    let group_of = |job: u32| {
        scenario
            .jobs
            .iter()
            .find(|spec| spec.id == job)
            .and_then(|spec| spec.group.clone())
    };
    let effect_at = |message_id: &str| {
        log.runs
            .iter()
            .filter(|run| run.message_id == message_id && run.end == RunEnd::Succeeded)
            .filter_map(|run| run.ended_ms)
            .min()
    };
    for (position, (job, message_id)) in log.sent.iter().enumerate() {
        let Some(group) = group_of(*job) else {
            continue;
        };
        for (later_job, later_id) in &log.sent[position + 1..] {
            if later_job == job || group_of(*later_job).as_ref() != Some(&group) {
                continue;
            }
            let Some(later_effect) = effect_at(later_id) else {
                continue;
            };
            let Some(run) = log
                .runs
                .iter()
                .find(|run| run.message_id == *message_id && run.started_ms > later_effect)
            else {
                continue;
            };
            let text = format!(
                "FIFO order broken in {group}: job {job} ({message_id}) ran on {} at {} ms, after job {later_job}, \
                 sent behind it, applied its effect at {later_effect} ms",
                run.instance, run.started_ms
            );
            violations.push(text);
        }
    }
}

fn check_job(scenario: &Scenario, job: &JobSpec, observed: &Observation, violations: &mut Vec<String>) {
    let log = &observed.log;
    let sends = log.sent.iter().filter(|(sent, _)| *sent == job.id).count();
    if sends == 0 {
        return;
    }
    let of_job = |message: &&QueuedMessage| job_of_body(&message.body) == Some(job.id);
    let dead: Vec<&QueuedMessage> = observed.dead_lettered.iter().filter(of_job).collect();
    let left = observed.left.iter().filter(of_job).count();
    let runs: Vec<&Run> = log.runs.iter().filter(|run| run.job == job.id).collect();
    let effects = log.effects.iter().filter(|(done, _)| *done == job.id).count();

    // The documented at-least-once window (counted in the report, see `in_the_window`): the process
    // died between the effect and the completion.
    if effects > 1 && !every_earlier_effect_excused(job.id, observed) {
        let by: Vec<String> = log
            .effects
            .iter()
            .filter(|(done, _)| *done == job.id)
            .filter_map(|(_, run)| log.runs.get(*run))
            .map(|run| format!("{} for {}", run.instance, run.message_id))
            .collect();
        violations.push(format!(
            "job {}: effect applied {effects} times (by {})",
            job.id,
            by.join("; ")
        ));
    }
    if effects == 0 && dead.is_empty() && left == 0 && !expired_past_its_retention(scenario, job, observed) {
        violations.push(format!(
            "job {}: lost: no effect, no copy in the DLQ, none in the queue ({} runs)",
            job.id,
            runs.len()
        ));
    }
    if job.poison && !runs.is_empty() {
        violations.push(format!("job {}: poison input reached the handler", job.id));
    }
    if scenario.tracked && !redriven_with_no_write_possible(scenario, job, &dead, observed) {
        let counts = Counts {
            dead: dead.len(),
            left,
            effects,
        };
        check_status(scenario, job, observed, counts, violations);
    }
    for copy in dead {
        check_dead_letter(scenario, job, copy, &runs, observed, violations);
    }
    check_budget(scenario, job, &runs, violations);
}

/// Runs within the budget: the retry budget counts runs recorded in the store, per idempotency key
/// (every copy of a job with a producer key shares one; a job without one has its message's), so no
/// key sees more failed runs than `maxReceiveCount`, however many copies were sent. (The check used to
/// allow `maxReceiveCount` per send, which let a key with two copies fail twice its budget.)
fn check_budget(scenario: &Scenario, job: &JobSpec, runs: &[&Run], violations: &mut Vec<String>) {
    let mut per_key: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for run in runs
        .iter()
        .filter(|run| matches!(run.end, RunEnd::Failed | RunEnd::Permanent))
    {
        let key = run.key.as_deref().unwrap_or(run.message_id.as_str());
        *per_key.entry(key).or_default() += 1;
    }
    for (key, failing) in per_key {
        if failing > scenario.max_receive_count as usize {
            violations.push(format!(
                "job {}: {failing} failed runs under key {key}, more than maxReceiveCount {} (the budget counts \
                 runs in the store)",
                job.id, scenario.max_receive_count
            ));
        }
    }
}

/// A message of `job` was deleted by the queue's retention ([`Quirks::retention`]) at an age past
/// the retention: the one excused loss (counted, [`expired_by_retention`]). A message the queue
/// deleted younger than its retention is no excuse.
///
/// [`Quirks::retention`]: conveyor_testing::Quirks::retention
fn expired_past_its_retention(scenario: &Scenario, job: &JobSpec, observed: &Observation) -> bool {
    let Some(retention) = scenario.quirks.retention else {
        return false;
    };
    let of_job: HashSet<&str> = observed
        .log
        .received
        .iter()
        .filter(|received| received.job == Some(job.id))
        .map(|received| received.message_id.as_str())
        .chain(
            observed
                .log
                .sent
                .iter()
                .filter(|(sent, _)| *sent == job.id)
                .map(|(_, id)| id.as_str()),
        )
        .collect();
    observed
        .expired
        .iter()
        .any(|(id, age)| of_job.contains(id.as_str()) && *age >= retention.as_millis())
}

/// The jobs lost to the queue's retention, each past it: counted,
/// not failures.
pub fn expired_by_retention(scenario: &Scenario, observed: &Observation) -> usize {
    scenario
        .jobs
        .iter()
        .filter(|job| {
            let effects = observed.log.effects.iter().any(|(done, _)| *done == job.id);
            let of_job = |message: &QueuedMessage| job_of_body(&message.body) == Some(job.id);
            !effects
                && !observed.dead_lettered.iter().any(of_job)
                && !observed.left.iter().any(of_job)
                && expired_past_its_retention(scenario, job, observed)
        })
        .count()
}

/// SQS's redrive moved the job's message (its DLQ copies carry no reason) at a last receive where no
/// consumer could write anything: the consumer holding it died, or was hard-stopped (its shutdown
/// skipped the drain) within a visibility timeout of the receive, SQS was down or hanging when the
/// receive had to settle, the receive was handed out stale (a late receive), or the store was down.
/// The DLQ checks allow the copy for the same reasons; the status then stays what the last run wrote
/// (`running`, `retrying`): the redrive is the backstop, and nothing that runs sees it happen.
fn redriven_with_no_write_possible(
    scenario: &Scenario,
    job: &JobSpec,
    dead: &[&QueuedMessage],
    observed: &Observation,
) -> bool {
    let redriven = !dead.is_empty()
        && dead
            .iter()
            .all(|copy| !copy.attributes.contains_key(FAILURE_ATTRIBUTE));
    if !redriven {
        return false;
    }
    let last = last_receives_unrun(scenario, job, observed);
    let store_down = !last.is_empty() && store_blocked_last_receive(&last, observed).is_ok();
    let hard_stopped = last.iter().any(|received| {
        observed.log.hard_stops.iter().any(|(instance, at)| {
            *instance == received.instance
                && received.at_ms <= *at
                && *at <= received.at_ms + scenario.visibility.as_millis()
        })
    });
    store_down
        || hard_stopped
        || dead.iter().any(|copy| {
            received_by_the_dead(&copy.id, observed)
                || settled_in_a_queue_fault(copy, observed, scenario.visibility)
                || received_in_a_late_receive(copy, observed, scenario.visibility)
        })
}

/// A tracked job's final status, read as `conveyor jobs show` reads it, equals what happened to it:
/// `succeeded` only when its effect happened and a run completed; `dead_lettered` only when a copy is
/// in the DLQ, and whenever one is there while no run completed (SQS's redrive included); `running`,
/// `retrying` or `sent` only while a copy is still in the queue (no one runs a job that is nowhere).
/// Where a job's copies ended: in the DLQ, left in the queue, and its effects.
struct Counts {
    dead: usize,
    left: usize,
    effects: usize,
}

fn check_status(
    scenario: &Scenario,
    job: &JobSpec,
    observed: &Observation,
    counts: Counts,
    violations: &mut Vec<String>,
) {
    let Counts { dead, left, effects } = counts;
    if !observed.settled {
        return;
    }
    let records: Vec<(&String, &conveyor_core::JobRecord)> = observed
        .statuses
        .iter()
        .filter(|(of, _, _)| *of == job.id)
        .filter_map(|(_, key, record)| Some((key, record.as_ref()?)))
        .collect();
    let claimed = observed.log.runs.iter().any(|run| run.job == job.id);
    if records.is_empty() {
        if claimed && (dead > 0 || effects > 0) {
            violations.push(format!(
                "job {}: ran, and is {}, but its status is gone (expired before the DLQ's retention)",
                job.id,
                if dead > 0 { "in the DLQ" } else { "done" }
            ));
        }
        return;
    }
    // A job decided for the DLQ (a run ended in a permanent failure) never runs again from its queue:
    // its status would go dead_lettered → running (the DLQ send failed and the message came back).
    // A permanent error in a batch call that returned too few results was never taken: the call
    // failed as a whole and every job of it was retried. Nor one a handler returned after it was told
    // to stop: its error is the stop's failure, a retry (seed 4411: a batch handler's permanent error
    // 2.6 s past its timeout).
    let runs: Vec<&Run> = observed.log.runs.iter().filter(|run| run.job == job.id).collect();
    let rejections: Vec<bool> = observed
        .log
        .runs
        .iter()
        .enumerate()
        .filter(|(_, run)| run.job == job.id)
        .map(|(index, run)| {
            run.end == RunEnd::Permanent
                && !in_a_short_call(index, &observed.log)
                && !(run.returns_late && run.returned_ms.is_some())
        })
        .collect();
    // The rejected run's release wrote dead_lettered before the later run claimed, unless its process
    // was killed first (the rejection never recorded: the job runs again, at least once), its Lambda
    // invocation was over before the store came back and another message of the job ran (the same: no
    // function writes after its invocation), or the later claim landed before the release could (the
    // rejected run's lease had lapsed: a takeover, which fenced the release out).
    let released_before = |rejected: &Run, again: &Run| {
        !observed.dead_instances.contains(&rejected.instance)
            && (again.message_id == rejected.message_id
                || !release_outlived_by_a_store_outage(rejected, observed))
            && rejected
                .ended_ms
                .is_some_and(|ended| ended + scenario.store_latency.as_millis() <= again.started_ms)
    };
    if let Some(rejected) = rejections.iter().position(|rejection| *rejection)
        && let Some(again) = runs.get(rejected + 1)
        && job.key.is_some()
        && released_before(runs[rejected], again)
    {
        violations.push(format!(
            "job {}: ran again on {} after a run was rejected to the DLQ (dead_lettered, then running)",
            job.id, again.instance
        ));
    }
    // The one write no runtime can make: the last receive could not claim because the store was
    // down, so it went to the DLQ unrun ("not run at its last allowed receive ... claim failed"),
    // and the status could not be written either. The DLQ copy carries the reason.
    let unrun_in_a_store_outage = observed.dead_lettered.iter().any(|copy| {
        job_of_body(&copy.body) == Some(job.id)
            && copy
                .attributes
                .get(FAILURE_ATTRIBUTE)
                .and_then(|value| value.string_value.as_deref())
                .is_some_and(|failure| {
                    failure.contains("not run at its last allowed receive") && failure.contains("unavailable")
                })
    });
    if unrun_in_a_store_outage {
        return;
    }
    // Its Lambda twin: the last run ended (rejected to the DLQ, with its reason) and the store went down
    // before its settlement could write the status, and stayed down past the invocation's deadline;
    // a function cannot write after its invocation ends (seed 1077, found with Managed Instances' timings).
    let longest_invocation = scenario
        .lambdas
        .iter()
        .map(|lambda| lambda.function_timeout.as_millis())
        .max()
        .unwrap_or(0);
    let settled_in_a_store_outage = dead > 0
        && runs.last().is_some_and(|last| {
            let ended = last.ended_ms.unwrap_or(last.started_ms);
            last.instance.starts_with("lambda-")
                && observed
                    .log
                    .store_outages
                    .iter()
                    .any(|(from, to)| *from <= ended + longest_invocation && *to >= ended)
        });
    if settled_in_a_store_outage {
        return;
    }
    let completed = |key: &str| observed.completed_tokens.iter().any(|(done, _)| done == key);
    for (key, record) in &records {
        let status = record.status;
        let lie = match status {
            // The documented at-least-once window: the run's completion never landed (its process
            // stopped or died in a store outage after the effect), so its record still says running.
            JobStatus::Running if effects > 0 && completion_lost_in_the_window(job.id, observed) => None,
            // A job the queue's retention deleted (past it) is nowhere, and no runtime could know:
            // its last status stands (counted as expired, not excused otherwise).
            JobStatus::Running | JobStatus::Retrying | JobStatus::Sent
                if left == 0 && expired_past_its_retention(scenario, job, observed) =>
            {
                None
            }
            JobStatus::Running | JobStatus::Retrying | JobStatus::Sent => (left == 0).then(|| {
                format!(
                    "says {status} but no copy is left in the queue (in the DLQ: {dead}, effects: {effects})"
                )
            }),
            JobStatus::Succeeded => (effects == 0 || !completed(key)).then(|| {
                format!(
                    "says succeeded but its effect happened {effects} times and it completed: {}",
                    completed(key)
                )
            }),
            // The same window at the last allowed receive: its lapsed claim reads as redriven, and
            // the reason says that the run may have finished instead (`REDRIVE_REASON`).
            JobStatus::DeadLettered
                if dead == 0
                    && effects > 0
                    && record.last_error.as_deref() == Some(conveyor_core::port::REDRIVE_REASON)
                    && completion_lost_in_the_window(job.id, observed) =>
            {
                None
            }
            // Retention's twin: its last-receive claim lapsed because the queue's retention deleted
            // the message under it, which reads as redriven (seed 1199).
            JobStatus::DeadLettered
                if dead == 0
                    && record.last_error.as_deref() == Some(conveyor_core::port::REDRIVE_REASON)
                    && expired_past_its_retention(scenario, job, observed) =>
            {
                None
            }
            JobStatus::DeadLettered => {
                (dead == 0).then(|| "says dead_lettered but no copy is in the DLQ".to_owned())
            }
            _ => None,
        };
        if let Some(lie) = lie {
            violations.push(format!("job {} ({key}): status {lie}", job.id));
        }
    }
    let says = |status: JobStatus| records.iter().any(|(_, record)| record.status == status);
    let any_completed = records.iter().any(|(key, _)| completed(key));
    if dead > 0 && !any_completed && !says(JobStatus::DeadLettered) {
        let statuses: Vec<String> = records
            .iter()
            .map(|(_, record)| record.status.to_string())
            .collect();
        violations.push(format!(
            "job {}: in the DLQ, never completed, but its status says {statuses:?}",
            job.id
        ));
    }
    if dead == 0 && any_completed && effects > 0 && !says(JobStatus::Succeeded) {
        let statuses: Vec<String> = records
            .iter()
            .map(|(_, record)| record.status.to_string())
            .collect();
        violations.push(format!(
            "job {}: completed with its effect, but its status says {statuses:?}",
            job.id
        ));
    }
}

fn check_dead_letter(
    scenario: &Scenario,
    job: &JobSpec,
    copy: &QueuedMessage,
    runs: &[&Run],
    observed: &Observation,
    violations: &mut Vec<String>,
) {
    let failure = copy
        .attributes
        .get(FAILURE_ATTRIBUTE)
        .and_then(|value| value.string_value.as_deref())
        .and_then(|json| serde_json::from_str::<Failure>(json).ok());
    let Some(failure) = failure else {
        // Moved by SQS's redrive, without a reason (the backstop when a last attempt could not be
        // settled): this very message must have run (another copy of the job running is not enough:
        // a duplicate or a deferred copy spending its receives unrun is the defect this catches), or
        // a consumer holding it must have died.
        let ran = !job.poison && runs.iter().any(|run| run.message_id == copy.id);
        if !ran && duplicate_left_by_failed_deletes(job, copy, observed, scenario.visibility) {
            // Not a lost or doubled job: the job's effect was applied, and this copy was received
            // while SQS refused deletes, so its acknowledgements (as a duplicate) never removed it.
        } else if !ran && settled_in_a_queue_fault(copy, observed, scenario.visibility) {
            // Its last receive's settling needed SQS (the DLQ send with the reason), and SQS was down
            // or hanging then: the redrive is the backstop for exactly this.
        } else if !ran && dead_lettered_then_stopped(job, copy, observed, scenario.visibility) {
            // Its holder sent the DLQ copy with the reason, then stopped (its shutdown's deadline)
            // before the original's delete: a second copy in the DLQ, the documented worst case of
            // `reject` ("never none").
        } else if !ran && received_by_a_failed_cold_start(copy, observed) {
            // The store was misconfigured: the function's cold start failed with the fix (loudly, an
            // init error per invocation), and the event source mapping's receives counted.
        } else if !ran && received_in_a_late_receive(copy, observed, scenario.visibility) {
            // A receive held past half the visibility timeout handed it out: its receipt could be stale
            // when the consumer got it, so neither the DLQ send's delete nor a visibility change could
            // hold it, and SQS moved it at its last receive. (For a Lambda the receive is the event
            // source mapping's, AWS's side.)
        } else if !ran && !received_by_the_dead(&copy.id, observed) {
            violations.push(format!(
                "job {}: copy {} is in the DLQ without a reason and without having run{}",
                job.id,
                copy.id,
                if job.poison {
                    " (poison input must say so)"
                } else {
                    ""
                }
            ));
        }
        return;
    };
    if job.poison {
        if failure.retries_exhausted {
            violations.push(format!(
                "job {}: poison input dead-lettered as out of retries: {}",
                job.id, failure.error
            ));
        }
        return;
    }
    if let Some(cause) = failure.not_run {
        // The rule for a message that could not run (a FIFO message cannot be deferred with a copy):
        // at its last allowed receive it reaches the DLQ with a reason that says so and why. Both must
        // be true: it was not run at that receive, and the cause it gives happened.
        if !not_run_at_its_last_receive(scenario, job, cause, observed) {
            violations.push(format!(
                "job {}: dead-lettered as not run at its last allowed receive, but it was not at that receive \
                 or it ran then: {}",
                job.id, failure.error
            ));
        } else if let Err(why) = cause_happened(scenario, job, cause, observed) {
            violations.push(format!(
                "job {}: dead-lettered as not run ({cause:?}), but {why}: {}",
                job.id, failure.error
            ));
        }
        return;
    }
    if runs.is_empty() {
        violations.push(format!(
            "job {}: in the DLQ without having run: {}",
            job.id, failure.error
        ));
        return;
    }
    if failure.retries_exhausted {
        if !runs.iter().any(|run| run.end != RunEnd::Succeeded) {
            violations.push(format!(
                "job {}: dead-lettered as out of retries, but no run of it failed: {}",
                job.id, failure.error
            ));
        }
        return;
    }
    if failure.receives_exhausted {
        // A FIFO job with runs left whose retry came at its message's last allowed receive (a copy
        // would break its group's order): a run of it failed at that receive.
        let at_the_last = runs.iter().any(|run| {
            !matches!(run.end, RunEnd::Succeeded | RunEnd::Permanent)
                && run.receive_count >= scenario.max_receive_count
        });
        if !observed.fifo || !at_the_last {
            violations.push(format!(
                "job {}: dead-lettered as out of receives, but no run of it failed at its last allowed \
                 receive of a FIFO queue: {}",
                job.id, failure.error
            ));
        }
        return;
    }
    let permanent = runs.iter().any(|run| run.end == RunEnd::Permanent);
    if !permanent || !failure.error.contains("sim: permanent failure") {
        violations.push(format!(
            "job {}: dead-lettered as a permanent failure it never had: {}",
            job.id, failure.error
        ));
    }
}

/// A message of `job` (the DLQ copy is a new message) was delivered as many times as the redrive
/// policy allows, on a FIFO queue (or on a standard one, by a worker shutting down whose deferred copy
/// could not be sent), and no run of it started at that last receive. A run counts by the receive it
/// ran in: a consumer still running an older receipt (after a late receive) did not run this one.
fn not_run_at_its_last_receive(
    scenario: &Scenario,
    job: &JobSpec,
    cause: NotRun,
    observed: &Observation,
) -> bool {
    (observed.fifo || cause == NotRun::ShutDown) && !last_receives_unrun(scenario, job, observed).is_empty()
}

/// The receives of `job`'s messages at the last count the redrive policy allows in which no run of
/// the message started.
fn last_receives_unrun<'a>(
    scenario: &Scenario,
    job: &JobSpec,
    observed: &'a Observation,
) -> Vec<&'a Received> {
    let log = &observed.log;
    log.received
        .iter()
        .filter(|received| {
            received.job == Some(job.id) && received.receive_count >= scenario.max_receive_count
        })
        .filter(|received| {
            !log.runs.iter().any(|run| {
                run.message_id == received.message_id && run.receive_count >= received.receive_count
            })
        })
        .collect()
}

/// Whether the cause a never-run copy of `job` gives happened, by the log: `Err` says what is missing.
fn cause_happened(
    scenario: &Scenario,
    job: &JobSpec,
    cause: NotRun,
    observed: &Observation,
) -> Result<(), String> {
    let log = &observed.log;
    let last = last_receives_unrun(scenario, job, observed);
    match cause {
        NotRun::StoreUnreachable => store_blocked_last_receive(&last, observed),
        NotRun::KeyInProgress => {
            // Another run of the job (another message, or this one under an older receipt, its holder
            // perhaps dead with its lease not yet lapsed) held the key while the consumer tried it for
            // the last receive: a worker at the receive; a Lambda in the invocation the mapping handed
            // the batch to, which can come long after the receive (a held batch), so a run that
            // started in between counts ([`tried_the_claim`]).
            let held = last.iter().any(|received| {
                let Some((from, to)) = tried_the_claim(received, observed) else {
                    return false;
                };
                log.runs.iter().any(|run| {
                    run.job == job.id
                        && (run.message_id != received.message_id
                            || run.receive_count < received.receive_count)
                        && run.started_ms <= to
                        && run
                            .ended_ms
                            .is_none_or(|ended| ended + scenario.visibility.as_millis() >= from)
                })
            });
            if held {
                return Ok(());
            }
            Err(
                "no other run of the job held its key while its consumer tried it at its last receive"
                    .to_owned(),
            )
        }
        NotRun::BehindItsGroup => {
            // A message sent before it in its group had not applied its effect by that receive, or the
            // same consumer had received the same message before (a batch of its group ahead of this
            // one: after a lost lease it holds the old receipt until it settles it, and the new batch
            // follows it back).
            let ahead_unfinished = last.iter().any(|received| {
                ahead_unfinished_at(scenario, job, received.at_ms, log)
                    || log.received.iter().any(|earlier| {
                        earlier.message_id == received.message_id
                            && earlier.instance == received.instance
                            && earlier.receive_count < received.receive_count
                    })
            });
            if ahead_unfinished {
                return Ok(());
            }
            Err("every message ahead of it in its group had finished by its last receive".to_owned())
        }
        NotRun::OutOfTime => {
            if last
                .iter()
                .any(|received| received.instance.starts_with("lambda-"))
            {
                return Ok(());
            }
            Err("no Lambda invocation received it at its last receive".to_owned())
        }
        NotRun::ShutDown => {
            // Shut down after that receive (a worker holds its messages in flight until then), or
            // during the long poll that brought it.
            let stopped = last.iter().any(|received| {
                log.shutdowns.iter().any(|(instance, at)| {
                    *instance == received.instance && *at + LONG_POLL_MS >= received.at_ms
                })
            });
            if stopped {
                return Ok(());
            }
            Err("the consumer that received it at its last receive was not shut down then".to_owned())
        }
        _ => Err("the simulator has no such deferral (no payloads, circuits or flows)".to_owned()),
    }
}

/// The store was down when the consumer of one of `last` (the unrun last receives) tried it
/// ([`tried_the_store`]), and the Lambda adapter's promise held (`LambdaConfig::fifo_last_receive_wait`):
/// when the receive before it was kept from running by the store too, the last one came at least half
/// that wait later, so that a short outage is waited out rather than spending the last receive. A
/// visibility change that SQS failed or hung on is the exception (the message then comes back at the
/// queue's visibility timeout).
fn store_blocked_last_receive(last: &[&Received], observed: &Observation) -> Result<(), String> {
    let log = &observed.log;
    let store_down = |(from, to): (u128, u128)| {
        log.store_outages
            .iter()
            .any(|(down, up)| *down <= to && from <= *up)
    };
    let wait = (LambdaConfig::default().fifo_last_receive_wait / 2).as_millis();
    let mut reasons = Vec::new();
    for received in last {
        let Some(tried) = tried_the_store(received, observed) else {
            reasons.push(format!(
                "no invocation had it after its last receive ({} ms)",
                received.at_ms
            ));
            continue;
        };
        if !store_down(tried) {
            reasons.push(format!(
                "the store was up from its last receive ({} ms) through its consumer's tries ({} to {} ms)",
                received.at_ms, tried.0, tried.1
            ));
            continue;
        }
        let previous = log
            .received
            .iter()
            .filter(|earlier| {
                earlier.message_id == received.message_id
                    && earlier.receive_count + 1 == received.receive_count
            })
            .max_by_key(|earlier| earlier.at_ms);
        let Some(previous) = previous else {
            return Ok(());
        };
        let ran_then = log.runs.iter().any(|run| {
            run.message_id == received.message_id && run.receive_count + 1 == received.receive_count
        });
        // Kept from running by the store: down when its consumer first tried (an outage starting later
        // in that invocation may have met a message behind its group, or out of time).
        let tried_then = tried_the_store(previous, observed);
        let blocked_then = !ran_then && tried_then.is_some_and(|(first, _)| store_down((first, first)));
        let visibility_failed = tried_then.is_some_and(|(from, to)| {
            log.queue_faults
                .iter()
                .any(|(down, up)| *down <= to && from <= *up)
        });
        if !blocked_then || visibility_failed || received.at_ms - previous.at_ms >= wait {
            return Ok(());
        }
        reasons.push(format!(
            "its receive before the last ({} ms) was kept from running by the store too, and the last came \
             {} ms later, not the {wait} ms the adapter waits before a last receive",
            previous.at_ms,
            received.at_ms - previous.at_ms
        ));
    }
    Err(reasons.join("; "))
}

/// When the consumer of `received` could try the store for it (virtual ms, both ends included). A
/// function tries only while it has the batch: from the invocation the mapping hands it to, after
/// holding it ([`LambdaSpec::invoke_delay`](crate::scenario::LambdaSpec::invoke_delay)), or the cold
/// start that failed, until it is done with the batch; `None` when no invocation had it. A worker tries
/// from the receive on, for as long as the scenario's longest invocation.
fn tried_the_store(received: &Received, observed: &Observation) -> Option<(u128, u128)> {
    if !received.instance.starts_with("lambda-") {
        return Some((
            received.at_ms,
            received.at_ms + observed.longest_invocation.as_millis(),
        ));
    }
    observed
        .log
        .invocations
        .iter()
        .filter(|invocation| invocation.instance == received.instance && invocation.at_ms >= received.at_ms)
        .find(|invocation| {
            invocation
                .records
                .iter()
                .any(|(id, count)| *id == received.message_id && *count == received.receive_count)
        })
        .map(Invocation::window)
}

/// When the consumer of `received` tried the idempotency claim for it (virtual ms, both ends
/// included): a worker claims at the receive; a function only while it has the batch, the window of
/// [`tried_the_store`]. `None` when no invocation had it.
fn tried_the_claim(received: &Received, observed: &Observation) -> Option<(u128, u128)> {
    if received.instance.starts_with("lambda-") {
        tried_the_store(received, observed)
    } else {
        Some((received.at_ms, received.at_ms))
    }
}

/// A message of `job`'s group sent before `job`'s first send had not applied its effect by `at`
/// (virtual ms).
fn ahead_unfinished_at(scenario: &Scenario, job: &JobSpec, at: u128, log: &Log) -> bool {
    let Some(group) = &job.group else {
        return false;
    };
    let Some(position) = log.sent.iter().position(|(sent, _)| *sent == job.id) else {
        return false;
    };
    log.sent[..position].iter().any(|(ahead, message_id)| {
        let same_group = scenario
            .jobs
            .iter()
            .any(|spec| spec.id == *ahead && spec.group.as_ref() == Some(group));
        let finished_by = log
            .runs
            .iter()
            .filter(|run| run.message_id == *message_id && run.end == RunEnd::Succeeded)
            .filter_map(|run| run.ended_ms)
            .min();
        same_group && *ahead != job.id && finished_by.is_none_or(|ended| ended >= at)
    })
}

/// SQS failed (down, or its visibility calls hanging) while `copy` was held after its last receive,
/// in the last visibility timeout of that hold: the time its consumer had to extend or settle it. The
/// hold lasts one visibility timeout, or until the queue's redrive log says it ended when a worker's
/// heartbeat extended it.
fn settled_in_a_queue_fault(copy: &QueuedMessage, observed: &Observation, visibility: Duration) -> bool {
    let log = &observed.log;
    let Some(last) = log
        .received
        .iter()
        .filter(|received| received.message_id == copy.id)
        .map(|received| received.at_ms)
        .max()
    else {
        return false;
    };
    let held_until = observed
        .redriven_held_until
        .get(&copy.id)
        .copied()
        .unwrap_or(0)
        .max(last + visibility.as_millis());
    let settling_from = last.max(held_until.saturating_sub(visibility.as_millis()));
    log.queue_faults
        .iter()
        .any(|(from, to)| *from <= held_until && settling_from <= *to)
}

/// Another copy of `job` is in the DLQ with a reason, and a consumer that received `copy` was shut
/// down before that receive's visibility timeout ended.
fn dead_lettered_then_stopped(
    job: &JobSpec,
    copy: &QueuedMessage,
    observed: &Observation,
    visibility: Duration,
) -> bool {
    let log = &observed.log;
    another_copy_with_a_reason(job, copy, observed)
        && log.received.iter().any(|received| {
            received.message_id == copy.id
                && log.shutdowns.iter().any(|(instance, at)| {
                    *instance == received.instance && *at <= received.at_ms + visibility.as_millis()
                })
        })
}

/// A copy of `job` other than `copy` is in the DLQ with its reason.
fn another_copy_with_a_reason(job: &JobSpec, copy: &QueuedMessage, observed: &Observation) -> bool {
    observed.dead_lettered.iter().any(|other| {
        other.id != copy.id
            && job_of_body(&other.body) == Some(job.id)
            && other.attributes.contains_key(FAILURE_ATTRIBUTE)
    })
}

/// `copy` was received in a receive answered late (see [`long_late_receives`]).
fn received_in_a_late_receive(copy: &QueuedMessage, observed: &Observation, visibility: Duration) -> bool {
    let log = &observed.log;
    log.received.iter().any(|received| {
        received.message_id == copy.id
            && long_late_receives(log, visibility)
                .any(|(from, to)| *from <= received.at_ms && received.at_ms <= *to)
    })
}

/// The windows of receives answered late by more than half the visibility timeout (the heartbeat's
/// margin): a receive answered in one may hand out a receipt SQS already gave back.
fn long_late_receives(log: &Log, visibility: Duration) -> impl Iterator<Item = &(u128, u128)> {
    log.late_receives
        .iter()
        .filter(move |(from, to)| to - from > visibility.as_millis() / 2)
}

fn received_by_the_dead(message_id: &str, observed: &Observation) -> bool {
    observed.log.received.iter().any(|received| {
        received.message_id == message_id && observed.dead_instances.contains(&received.instance)
    })
}

/// The jobs whose effect was applied more than once inside the documented at-least-once window (see
/// `completion_lost_in_the_window`), and a later delivery ran it again.
pub fn in_the_window(scenario: &Scenario, observed: &Observation) -> usize {
    scenario
        .jobs
        .iter()
        .filter(|job| {
            observed
                .log
                .effects
                .iter()
                .filter(|(done, _)| *done == job.id)
                .count()
                > 1
        })
        .filter(|job| every_earlier_effect_excused(job.id, observed))
        .count()
}

/// `run` was a run of a batch call that returned too few
/// results (recorded by the handler as it returned them): such a list cannot be matched to its jobs,
/// so every job of the call failed and ran again, the documented window of a whole-call failure
/// after its writes landed (`docs/batch-handlers.md`). Runs of other calls are never excused.
fn in_a_short_call(run: usize, log: &Log) -> bool {
    log.short_calls.iter().any(|call| call.runs.contains(&run))
}

/// `rejected` ran on a Lambda, and the store was down from the run's end (when its release is made)
/// until the function was done with the invocation that had the message, plus the store latency (a
/// call made before the end reaches the store up to that much later): the release (the
/// `dead_lettered` status and the spent runs) was tried only in the outage and never landed.
/// The claim lapses with its lease, and another message of the job (a duplicate send, or its deferred
/// copy) takes it over and runs, as after a killed worker (seed 5842). The caller never lets this
/// excuse the rejected message itself coming back: its DLQ send goes out even when the release is given
/// up (seed 9324). An outage that ended while the invocation still had the message does not count, nor
/// does any worker's run (a worker tries for up to 15 minutes, until its hard stop).
fn release_outlived_by_a_store_outage(rejected: &Run, observed: &Observation) -> bool {
    let Some(ended) = rejected.ended_ms else {
        return false;
    };
    if !rejected.instance.starts_with("lambda-") {
        return false;
    }
    let log = &observed.log;
    let Some(invocation) = log
        .invocations
        .iter()
        .filter(|invocation| {
            invocation.instance == rejected.instance && invocation.at_ms <= rejected.started_ms
        })
        .filter(|invocation| {
            invocation
                .records
                .iter()
                .any(|(id, count)| *id == rejected.message_id && *count == rejected.receive_count)
        })
        .max_by_key(|invocation| invocation.at_ms)
    else {
        return false;
    };
    let (_, done) = invocation.window();
    let last_reached = done + observed.store_latency.as_millis();
    log.store_outages
        .iter()
        .any(|(from, to)| *from <= ended && last_reached <= *to)
}

/// The first run that applied `job`'s effect never got its claim completed, inside the window: its
/// process died (a worker killed between the effect and the completion); or it ran on a Lambda whose
/// invocation ended while the store was down after the effect (the adapter tries the completion until
/// its settle deadline; a Lambda cannot hold the message longer); or the store was down when the
/// effect happened and either the worker was shut down in it (the tries end at its hard stop) or
/// another delivery claimed first within a second of the store coming back (the completion is tried
/// every half second; whoever reaches the store first after an outage wins).
fn completion_lost_in_the_window(job: u32, observed: &Observation) -> bool {
    let runs = effect_runs(job, &observed.log);
    let mut effects = runs.iter().map(|(_, run)| *run);
    let first = effects.next();
    let second = effects.next();
    first.is_some_and(|run| lost_in_the_window(run, second, observed))
}

/// The runs that applied `job`'s effects, in order, each with its index in [`Log::runs`].
fn effect_runs(job: u32, log: &Log) -> Vec<(usize, &Run)> {
    log.effects
        .iter()
        .filter(|(done, _)| *done == job)
        .filter_map(|(_, index)| log.runs.get(*index).map(|run| (*index, run)))
        .collect()
}

/// `run` applied its effect and its completion was lost in the documented at-least-once window
/// (`next` is the run that applied the effect after it, if any): see [`completion_lost_in_the_window`].
fn lost_in_the_window(run: &Run, next: Option<&Run>, observed: &Observation) -> bool {
    let log = &observed.log;
    let in_the_window = killed_before_its_completion(run, observed)
        || (run.instance.starts_with("lambda-")
            && store_down_after_the_effect(run, log, observed.longest_invocation))
        || next.is_some_and(|next| {
            claimed_first_at_recovery(run, next, log, observed.store_latency)
                || outlived_its_lease(run, next, log, observed.store_latency)
        })
        || stopped_in_a_store_outage(run, log);
    in_the_window
        && run
            .key
            .clone()
            .zip(run.token)
            .is_some_and(|claim| !observed.completed_tokens.contains(&claim))
}

/// Every effect of `job` but its last is excused, each on its own: its completion was lost in the
/// at-least-once window ([`lost_in_the_window`]), or its batch call returned too few results
/// ([`in_a_short_call`]). Seed 4450 had one of each.
fn every_earlier_effect_excused(job: u32, observed: &Observation) -> bool {
    let log = &observed.log;
    let runs = effect_runs(job, log);
    let Some((_, earlier)) = runs.split_last() else {
        return false;
    };
    !earlier.is_empty()
        && earlier.iter().enumerate().all(|(position, (index, run))| {
            let next = runs.get(position + 1).map(|(_, next)| *next);
            in_a_short_call(*index, log) || lost_in_the_window(run, next, observed)
        })
}

/// `run`'s process was killed after its effect, before its completion could land: while its handler
/// still held its result (a late return), within a second and two store calls of the effect (or of
/// the handler's return), or later while the store was down from then on (the completion is tried
/// every half second through an outage). A kill at any other time excuses nothing: a run
/// whose worker lived on with the store up completes, and a double effect then is a defect.
fn killed_before_its_completion(run: &Run, observed: &Observation) -> bool {
    let Some(effect) = run.settled_from_ms() else {
        return false;
    };
    let latency = observed.store_latency.as_millis();
    let calls = effect + 2 * latency + RECOVERY_RACE_MS;
    // A handler still holding its result (to return it late) when its process died: nothing could
    // complete the run before the kill.
    let holding = run.returns_late && run.returned_ms.is_none();
    observed.kills.iter().any(|(instance, at)| {
        *instance == run.instance
            && *at >= effect
            && (holding
                || *at <= calls
                || observed.log.store_outages.iter().any(|(from, to)| {
                    *from <= effect + latency
                        && effect <= to + latency
                        && *at <= to + latency + RECOVERY_RACE_MS
                }))
    })
}

/// The store was down when `first`'s completion reached it (a call reaches the store up to the store
/// latency after it is made), and `second` claimed the job within a second and that latency after the
/// store came back: before `first`'s completion, tried every half second, could land.
fn claimed_first_at_recovery(first: &Run, second: &Run, log: &Log, store_latency: Duration) -> bool {
    let Some(effect) = first.settled_from_ms() else {
        return false;
    };
    let latency = store_latency.as_millis();
    log.store_outages.iter().any(|(from, to)| {
        *from <= effect + latency
            && effect <= *to
            && second.started_ms >= *to
            && second.started_ms <= to + RECOVERY_RACE_MS + latency
    })
}

/// `first`'s handler returned late, after it was told to stop (its lease lost in a queue fault while
/// it ran), and `second` claimed the job before `first`'s completion, made as the handler returned,
/// could reach the store: a handler that outlives its message's visibility may run twice, whatever
/// the runtime (seed 3119: a 4.8 s store, the completion 3 s behind the other worker's claim).
/// `second` ran for the same message at a later receive: SQS handed it out again, so its visibility,
/// and with it `first`'s lease, had ended. A claim taken from a live lease is never excused.
fn outlived_its_lease(first: &Run, second: &Run, log: &Log, store_latency: Duration) -> bool {
    let Some(returned) = first.returned_ms else {
        return false;
    };
    let lease_lost_in_a_fault = log
        .queue_faults
        .iter()
        .any(|(from, to)| *from <= returned && first.started_ms <= *to);
    let handed_out_again =
        second.message_id == first.message_id && second.receive_count > first.receive_count;
    first.returns_late
        && lease_lost_in_a_fault
        && handed_out_again
        && second.started_ms >= first.started_ms
        && second.started_ms <= returned + store_latency.as_millis() + RECOVERY_RACE_MS
}

/// `run`'s worker was asked to shut down after the run started, and the store was down when the run
/// settled (its effect, or its handler's later return): the completion's tries end with the worker's
/// hard stop.
fn stopped_in_a_store_outage(run: &Run, log: &Log) -> bool {
    let Some(effect) = run.settled_from_ms() else {
        return false;
    };
    let stopped = log
        .shutdowns
        .iter()
        .any(|(instance, at)| *instance == run.instance && *at >= run.started_ms);
    stopped
        && log
            .store_outages
            .iter()
            .any(|(from, to)| *from <= effect && effect <= *to)
}

/// The longest a receive waits for messages (SQS's long poll), in ms.
const LONG_POLL_MS: u128 = 20_000;

/// How soon after a store outage another delivery's claim counts as winning the race against a
/// completion tried every half second.
const RECOVERY_RACE_MS: u128 = 1_000;

/// A store outage covered part of the time between `run`'s end (its effect) and the end of its
/// invocation (at most `function_timeout` later): the completion was tried in it.
fn store_down_after_the_effect(run: &Run, log: &Log, function_timeout: Duration) -> bool {
    let Some(ended) = run.settled_from_ms() else {
        return false;
    };
    let invocation_over = ended + function_timeout.as_millis();
    log.store_outages
        .iter()
        .any(|(from, to)| *from <= invocation_over && ended <= *to)
}

/// `copy` is a stale receipt of a job that was settled (its effect applied, or a copy of it in the DLQ
/// with its reason), and SQS failed deletes while a consumer held it (between a receive and the end of
/// that receive's visibility timeout): the acknowledgement could not remove it, and SQS's redrive moved
/// it after `maxReceiveCount`.
fn duplicate_left_by_failed_deletes(
    job: &JobSpec,
    copy: &QueuedMessage,
    observed: &Observation,
    visibility: Duration,
) -> bool {
    let log = &observed.log;
    let done = log.effects.iter().any(|(effected, _)| *effected == job.id);
    let dead_lettered_with_a_reason = another_copy_with_a_reason(job, copy, observed);
    let held_in_a_delete_fault = |at: u128| {
        log.delete_faults
            .iter()
            .any(|(from, to)| *from <= at + visibility.as_millis() && at <= *to)
    };
    (done || dead_lettered_with_a_reason)
        && log
            .received
            .iter()
            .any(|received| received.message_id == copy.id && held_in_a_delete_fault(received.at_ms))
}

/// A worker run's lease may be lost, or the run cancelled, only when the queue or the store failed
/// while it ran (or up to a visibility timeout before: a call that hung in a fault window can still
/// lose a lease after it), its worker died, or its worker was shutting down.
fn lease_loss_explained(run: &Run, observed: &Observation, visibility: Duration) -> bool {
    let log = &observed.log;
    let ended = run.ended_ms.unwrap_or(u128::MAX);
    let overlaps =
        |(from, to): &(u128, u128)| run.started_ms <= *to + visibility.as_millis() && *from <= ended;
    observed.dead_instances.contains(&run.instance)
        || log
            .shutdowns
            .iter()
            .any(|(instance, at)| *instance == run.instance && *at <= ended)
        || log.queue_faults.iter().any(overlaps)
        || log.store_outages.iter().any(overlaps)
        || expired_under_it(run, observed)
}

/// The queue's retention deleted the message `run` ran for while it ran (a message expires whoever
/// holds it): it expired, and no one received it after the run started.
fn expired_under_it(run: &Run, observed: &Observation) -> bool {
    let expired = observed.expired.iter().any(|(id, _)| *id == run.message_id);
    let received_later = observed
        .log
        .received
        .iter()
        .any(|received| received.message_id == run.message_id && received.at_ms > run.started_ms);
    expired && !received_later
}
