//! One seed's run: the shared queue and store, the consumers, the producer, the faults, then the
//! calm phase until everything settles, on a paused current-thread runtime.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Once};
use std::time::Duration;

use conveyor_core::message::{IDEMPOTENCY_KEY_ATTRIBUTE, JOB_TYPE_ATTRIBUTE};
use conveyor_core::{
    message::AttributeValue,
    port::{IdempotencyStore, OutgoingMessage, Queue},
    {Pipeline, Router},
};
use conveyor_lambda::{BatchProcessor, FixedQueue};
use conveyor_testing::{MemoryIdempotencyStore, MemoryQueue, QueuedMessage, ScriptedQueue};
use conveyor_worker::config::{QueueConfig, WorkerConfig};
use conveyor_worker::{Worker, WorkerError, WorkerReport};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{SkewedStore, VirtualStore};
use crate::handler::{PANIC_MESSAGE, SimBatchHandler, SimHandler};
use crate::io::{Instance, InstanceQueue, InstanceStore};
use crate::lambda::{self, Function};
use crate::scenario::{Event, JobSpec, Scenario, job_of_body};
use crate::sink::{Log, Sink};
use crate::trace::Trace;

/// How long after the faults end everything must have settled (longer in a seed with long jobs, see
/// [`Scenario::settle_limit`]).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(6 * 3600);

/// What a run left behind, for the invariants.
#[derive(Debug, Clone)]
pub struct Observation {
    /// Sends, receives, runs, effects.
    pub log: Log,
    /// The DLQ's messages at the end.
    pub dead_lettered: Vec<QueuedMessage>,
    /// The queue's messages at the end.
    pub left: Vec<QueuedMessage>,
    /// True when every job settled and the queue emptied within [`Scenario::settle_limit`].
    pub settled: bool,
    /// Virtual time the run took.
    pub virtual_time: Duration,
    /// Workers whose run returned an error.
    pub worker_errors: Vec<String>,
    /// The instances that were killed, one entry per kill.
    pub dead_instances: Vec<String>,
    /// Each kill: the instance and when (ms from the start).
    pub kills: Vec<(String, u128)>,
    /// The queue was FIFO.
    pub fifo: bool,
    /// The longest function timeout of the scenario's Lambda functions (zero without any).
    pub longest_invocation: Duration,
    /// The longest a store call waits before it reaches the store (the scenario's store latency).
    pub store_latency: Duration,
    /// Each message SQS's redrive policy moved, with when its last hold ended (ms from the start).
    pub redriven_held_until: HashMap<String, u128>,
    /// The claims (key, fencing token) that were completed in the store.
    pub completed_tokens: HashSet<(String, u64)>,
    /// Each message the queue's retention deleted ([`Scenario::quirks`]): its id, and its age when
    /// deleted (ms).
    pub expired: Vec<(String, u128)>,
    /// Tracked seeds: each job's records (one per key its copies claim), as `conveyor jobs show` reads
    /// them [`STATUS_READ_AFTER`] after the end, within the DLQ's retention: (job, key, status).
    pub statuses: Vec<(u32, String, Option<conveyor_core::JobRecord>)>,
}

/// A worker started by the run.
struct RunningWorker {
    instance: Arc<Instance>,
    graceful: CancellationToken,
    immediate: CancellationToken,
    /// Taken when the worker's end was collected early (it refused to start).
    handle: Option<JoinHandle<Result<WorkerReport, WorkerError>>>,
}

/// What every consumer shares.
struct Shared<'a> {
    scenario: &'a Scenario,
    queue: Arc<ScriptedQueue>,
    store: Arc<VirtualStore>,
    sink: Arc<Sink>,
    jobs: Arc<Vec<JobSpec>>,
}

/// Keeps the scripted panics out of the test output; every other panic prints as usual.
fn quiet_scripted_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<String>().map(String::as_str) == Some(PANIC_MESSAGE) {
                return;
            }
            default(info);
        }));
    });
}

/// Runs `scenario` on a fresh paused runtime.
pub fn run(scenario: &Scenario, trace: bool) -> std::io::Result<Observation> {
    quiet_scripted_panics();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()?;
    // The runtimes' own jitter (backoff, deferrals) draws from fastrand's thread-local generator.
    fastrand::seed(scenario.seed);
    // The trace's origin is taken inside the runtime, on its paused clock: outside it, tokio's
    // `Instant::now` is the real clock's, and every time the run logs (the checks' too) would carry
    // a real, unrepeatable offset (seed 84 ran 1 ms apart between two replays).
    Ok(runtime.block_on(async { simulate(scenario, Trace::new(trace)).await }))
}

impl Shared<'_> {
    fn instance(&self, name: String, salt: u64) -> Arc<Instance> {
        let seed = self
            .scenario
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(salt);
        Instance::new(
            name,
            seed,
            self.scenario.queue_latency,
            self.scenario.store_latency,
            self.scenario.clock_skew,
        )
    }

    fn pipeline(&self, instance: &Arc<Instance>) -> Pipeline {
        let skewed = SkewedStore::new(Arc::clone(&self.store), instance.skew());
        let store: Arc<dyn IdempotencyStore> =
            Arc::new(InstanceStore::new(Arc::new(skewed), Arc::clone(instance)));
        let handler = SimHandler {
            instance: Arc::clone(instance),
            sink: Arc::clone(&self.sink),
            jobs: Arc::clone(&self.jobs),
            timeout: self.scenario.handler_timeout,
            record_ttl: self.scenario.record_ttl(),
            ignores_cancellation: self.scenario.handlers_ignore_cancellation,
            tracked: self.scenario.tracked,
            late: self.scenario.late.clone(),
        };
        let router = match self.scenario.batch {
            Some(max_jobs) => Router::new().batch_route(SimBatchHandler {
                handler,
                max_jobs,
                short_results: self.scenario.short_results,
            }),
            None => Router::single(handler),
        };
        Pipeline::new(router)
            .with_store(store)
            .with_retry_budget(self.scenario.retry_budget)
    }

    fn queue_for(&self, instance: &Arc<Instance>) -> Arc<dyn Queue> {
        Arc::new(InstanceQueue::new(
            Arc::clone(&self.queue) as _,
            Arc::clone(instance),
            Arc::clone(&self.sink),
        ))
    }

    fn start_worker(&self, index: usize) -> Result<RunningWorker, WorkerError> {
        let instance = self.instance(format!("worker-{index}"), index as u64 + 1);
        let capacity = self.scenario.worker_capacity[index % self.scenario.worker_capacity.len()];
        let mut config = WorkerConfig::default()
            .with_queues(vec![QueueConfig::new("http://sim.invalid/jobs")])
            .with_max_in_flight(capacity)
            .with_listen_addr(None);
        if let Some(max_processing_time) = self.scenario.max_processing_time {
            config = config.with_max_processing_time(max_processing_time);
        }
        let worker = Worker::new(config, self.pipeline(&instance), vec![self.queue_for(&instance)])?;
        let graceful = CancellationToken::new();
        let immediate = CancellationToken::new();
        let handle = tokio::spawn(worker.run_with(graceful.clone(), immediate.clone()));
        self.sink.step(format!(
            "worker-{index} started (max_in_flight {capacity}, clock {:+} ms)",
            instance.skew().0
        ));
        Ok(RunningWorker {
            instance,
            graceful,
            immediate,
            handle: Some(handle),
        })
    }

    fn start_function(&self, index: usize, stop: &CancellationToken) -> JoinHandle<()> {
        let spec = self.scenario.lambdas[index];
        let instance = self.instance(format!("lambda-{index}"), 1000 + index as u64);
        let queue = self.queue_for(&instance);
        let config = lambda::config(&spec);
        let processor = Arc::new(
            BatchProcessor::new(
                self.pipeline(&instance),
                config,
                Arc::new(FixedQueue(Arc::clone(&queue))),
            )
            .without_metrics(),
        );
        let function = Function {
            name: instance.name().to_owned(),
            spec,
            queue,
            processor,
            sink: Arc::clone(&self.sink),
        };
        self.sink.step(format!("lambda-{index} polling ({spec:?})"));
        tokio::spawn(function.run(stop.clone()))
    }

    fn outgoing(&self, job: &JobSpec, copy: usize) -> OutgoingMessage {
        let mut message = OutgoingMessage {
            body: job.body(),
            group_id: job.group.clone(),
            deduplication_id: self.scenario.fifo.then(|| format!("job-{}-copy-{copy}", job.id)),
            ..OutgoingMessage::default()
        };
        if let Some(key) = &job.key {
            message
                .attributes
                .insert(IDEMPOTENCY_KEY_ATTRIBUTE.to_owned(), AttributeValue::string(key));
        }
        if self.scenario.batch.is_some() {
            // A batch route is not a default route: the job names its type.
            message
                .attributes
                .insert(JOB_TYPE_ATTRIBUTE.to_owned(), AttributeValue::string("sim"));
        }
        message
    }
}

async fn produce(shared: Arc<ProducerPlan>, start: Instant) {
    for (at, job, message) in &shared.sends {
        tokio::time::sleep_until(start + *at).await;
        match shared.queue.push_message(message.clone()) {
            Ok(id) => shared.sink.sent(*job, id),
            Err(error) => shared
                .sink
                .step(format!("producer could not send job {job}: {error}")),
        }
    }
}

/// Every send of the run, in time order.
struct ProducerPlan {
    sends: Vec<(Duration, u32, OutgoingMessage)>,
    queue: Arc<MemoryQueue>,
    sink: Arc<Sink>,
}

async fn simulate(scenario: &Scenario, trace: Trace) -> Observation {
    let dlq = Arc::new(if scenario.fifo {
        MemoryQueue::fifo("jobs-dlq")
    } else {
        MemoryQueue::standard("jobs-dlq")
    });
    let main = Arc::new(
        if scenario.fifo {
            MemoryQueue::fifo("jobs")
        } else {
            MemoryQueue::standard("jobs")
        }
        .with_visibility_timeout(scenario.visibility)
        .with_dead_letter_queue(Arc::clone(&dlq), scenario.max_receive_count)
        .with_quirks(scenario.quirks),
    );
    let memory_store = Arc::new(MemoryIdempotencyStore::new());
    if scenario.store_misconfigured_until.is_some() {
        memory_store.set_misconfigured(true);
    }
    let store = Arc::new(VirtualStore::new(Arc::clone(&memory_store)));
    // Every wall-clock time the runtimes and the queue compute is virtual: the seed replays exactly.
    let _wall_clock = conveyor_core::wall_clock::set_for_thread(store.wall_clock());
    let sink = Arc::new(Sink::new(Arc::clone(&store), trace.clone()));
    let shared = Shared {
        scenario,
        queue: ScriptedQueue::new(Arc::clone(&main)),
        store,
        sink: Arc::clone(&sink),
        jobs: Arc::new(scenario.jobs.clone()),
    };
    trace.step(format!(
        "seed {}: {} jobs, {} queue, visibility {:?}, maxReceiveCount {}, retry budget {:?}, handler timeout \
         {:?}, latency queue {:?} store {:?}, {} workers, {} lambdas, faults until {:?}, clocks up to {:?} apart, \
         long jobs {:?}",
        scenario.seed,
        scenario.jobs.len(),
        if scenario.fifo { "FIFO" } else { "standard" },
        scenario.visibility,
        scenario.max_receive_count,
        scenario.retry_budget,
        scenario.handler_timeout,
        scenario.queue_latency,
        scenario.store_latency,
        scenario.initial_workers,
        scenario.lambdas.len(),
        scenario.fault_phase,
        scenario.clock_skew,
        scenario.long_jobs,
    ));

    let start = Instant::now();
    let mut worker_errors = Vec::new();
    let mut workers: Vec<RunningWorker> = Vec::new();
    for index in 0..scenario.initial_workers {
        match shared.start_worker(index) {
            Ok(worker) => workers.push(worker),
            Err(error) => worker_errors.push(format!("worker-{index} refused to start: {error}")),
        }
    }
    let stop_functions = CancellationToken::new();
    let functions: Vec<JoinHandle<()>> = (0..scenario.lambdas.len())
        .map(|index| shared.start_function(index, &stop_functions))
        .collect();

    let mut sends: Vec<(Duration, u32, OutgoingMessage)> = scenario
        .jobs
        .iter()
        .flat_map(|job| {
            job.send_at
                .iter()
                .enumerate()
                .map(|(copy, at)| (*at, job.id, shared.outgoing(job, copy)))
                .collect::<Vec<_>>()
        })
        .collect();
    sends.sort_by_key(|(at, job, _)| (*at, *job));
    let plan = Arc::new(ProducerPlan {
        sends,
        queue: Arc::clone(&main),
        sink: Arc::clone(&sink),
    });
    let producer = tokio::spawn(produce(plan, start));

    let mut dead_instances = Vec::new();
    let mut kills = Vec::new();
    let mut windows = Vec::new();
    let mut events = scenario.events.clone();
    if let Some(until) = scenario.store_misconfigured_until {
        events.push((until, Event::StoreFixed));
        events.sort_by_key(|(when, _)| *when);
    }
    for (at, event) in &events {
        tokio::time::sleep_until(start + *at).await;
        trace.step(format!("fault: {event:?}"));
        match event {
            Event::StoreFixed => {
                memory_store.set_misconfigured(false);
                sink.store_misconfigured(0, trace.elapsed_ms());
                let refused = collect_refused(&mut workers, &sink, &mut worker_errors).await;
                for _ in 0..refused {
                    match shared.start_worker(workers.len()) {
                        Ok(worker) => workers.push(worker),
                        Err(error) => worker_errors.push(format!("a fresh worker refused to start: {error}")),
                    }
                }
            }
            Event::Kill(index) => {
                if let Some(worker) = workers.get(*index) {
                    worker.instance.kill();
                    if let Some(handle) = &worker.handle {
                        handle.abort();
                    }
                    dead_instances.push(worker.instance.name().to_owned());
                    kills.push((worker.instance.name().to_owned(), trace.elapsed_ms()));
                }
            }
            Event::StartWorker => match shared.start_worker(workers.len()) {
                Ok(worker) => workers.push(worker),
                Err(error) => worker_errors.push(format!("a fresh worker refused to start: {error}")),
            },
            Event::Shutdown {
                worker,
                immediate_after,
            } => {
                if let Some(worker) = workers.get(*worker) {
                    sink.shutdown(worker.instance.name());
                    worker.graceful.cancel();
                    if let Some(after) = immediate_after {
                        let immediate = worker.immediate.clone();
                        let after = *after;
                        let sink = sink.clone();
                        let name = worker.instance.name().to_owned();
                        tokio::spawn(async move {
                            tokio::time::sleep(after).await;
                            sink.hard_stop(&name);
                            immediate.cancel();
                        });
                    }
                }
            }
            Event::QueueDown(length) => {
                let from = trace.elapsed_ms();
                sink.queue_fault(from, from + length.as_millis());
                main.set_unavailable(true);
                let main = Arc::clone(&main);
                windows.push(window(*length, move || main.set_unavailable(false)));
            }
            Event::StoreDown(length) => {
                memory_store.set_unavailable(true);
                let from = trace.elapsed_ms();
                sink.store_outage(from, from + length.as_millis());
                let memory_store = Arc::clone(&memory_store);
                windows.push(window(*length, move || memory_store.set_unavailable(false)));
            }
            Event::HangVisibility(length) => {
                let from = trace.elapsed_ms();
                sink.queue_fault(from, from + length.as_millis());
                shared.queue.hang_visibility(true);
                let queue = Arc::clone(&shared.queue);
                windows.push(window(*length, move || queue.hang_visibility(false)));
            }
            Event::FailDeletes(length) => {
                let from = trace.elapsed_ms();
                sink.delete_fault(from, from + length.as_millis());
                shared.queue.fail_deletes(true);
                let queue = Arc::clone(&shared.queue);
                windows.push(window(*length, move || queue.fail_deletes(false)));
            }
            Event::HoldReceives(length) => {
                let from = trace.elapsed_ms();
                sink.late_receives(from, from + length.as_millis());
                shared.queue.hold_receives(true);
                let queue = Arc::clone(&shared.queue);
                windows.push(window(*length, move || {
                    queue.hold_receives(false);
                    for _ in 0..32 {
                        queue.release_receive();
                    }
                }));
            }
        }
    }
    tokio::time::sleep_until(start + scenario.fault_phase).await;
    for window in windows {
        let _ = window.await;
    }
    trace.step("faults over");
    let alive = workers
        .iter()
        .any(|worker| !worker.instance.is_dead() && !worker.graceful.is_cancelled());
    if !alive && functions.is_empty() {
        match shared.start_worker(workers.len()) {
            Ok(worker) => workers.push(worker),
            Err(error) => worker_errors.push(format!("the last worker refused to start: {error}")),
        }
    }

    let limit = Instant::now() + scenario.settle_limit();
    // Looked at every second; with long jobs, which take a day of virtual time, every half minute,
    // which saves most of those seeds' wall time.
    let every = if scenario.long_jobs.is_empty() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(30)
    };
    let mut settled = false;
    while Instant::now() < limit {
        if producer.is_finished() && is_settled(&main, &dlq, &sink) {
            settled = true;
            break;
        }
        tokio::time::sleep(every).await;
    }
    trace.step(if settled {
        "settled; stopping"
    } else {
        "not settled in time; stopping"
    });
    let virtual_time = start.elapsed();

    for worker in &workers {
        sink.shutdown(worker.instance.name());
        worker.graceful.cancel();
    }
    stop_functions.cancel();
    for (index, worker) in workers.into_iter().enumerate() {
        let Some(handle) = worker.handle else {
            continue;
        };
        if worker.instance.is_dead() {
            continue;
        }
        match tokio::time::timeout(Duration::from_secs(60), handle).await {
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(error))) => worker_errors.push(format!("worker-{index} failed: {error}")),
            Ok(Err(error)) => worker_errors.push(format!("worker-{index} panicked: {error}")),
            Err(_) => worker_errors.push(format!("worker-{index} did not stop within 60 s")),
        }
    }
    for function in functions {
        let _ = function.await;
    }
    Observation {
        log: sink.log(),
        dead_lettered: dlq.snapshot(),
        redriven_held_until: main
            .redriven()
            .into_iter()
            .map(|(id, held_until)| (id, held_until.saturating_duration_since(start).as_millis()))
            .collect(),
        left: main.snapshot(),
        expired: main
            .expired()
            .into_iter()
            .map(|(id, stored, deleted)| (id, deleted.saturating_duration_since(stored).as_millis()))
            .collect(),
        settled,
        virtual_time,
        worker_errors,
        dead_instances,
        kills,
        fifo: scenario.fifo,
        longest_invocation: scenario
            .lambdas
            .iter()
            .map(|lambda| lambda.function_timeout)
            .max()
            .unwrap_or_default(),
        store_latency: scenario.store_latency,
        completed_tokens: shared.store.completed_tokens(),
        statuses: statuses(scenario, &shared.store, &sink).await,
    }
}

/// When the statuses are read, after the job's last send: an operator looks at a dead-lettered job
/// days later, while its DLQ copy is still kept (SQS's longest retention, 14 days, counted from the
/// message's first enqueue, less a day). A run with day-long jobs ends more than a day after its
/// sends, so the read is timed from each job's sends, not from the end of the run.
pub const STATUS_READ_AFTER: Duration = Duration::from_secs(13 * 24 * 3600);

/// Every job's records as `conveyor jobs show` reads them (the store's `job`, judged
/// [`STATUS_READ_AFTER`] after the job's last send, or at the end if that is later, expired records
/// gone), in tracked seeds.
async fn statuses(
    scenario: &Scenario,
    store: &VirtualStore,
    sink: &Sink,
) -> Vec<(u32, String, Option<conveyor_core::JobRecord>)> {
    if !scenario.tracked {
        return Vec::new();
    }
    let log = sink.log();
    let mut keys = std::collections::BTreeSet::new();
    for (job, id) in &log.sent {
        let producer_key = scenario
            .jobs
            .get(*job as usize)
            .and_then(|spec| spec.key.as_deref());
        keys.insert((
            *job,
            conveyor_core::port::idempotency_key("sim", producer_key, id),
        ));
    }
    let mut found = Vec::new();
    for (job, key) in keys {
        let last_send = scenario
            .jobs
            .get(job as usize)
            .and_then(|spec| spec.send_at.iter().max().copied())
            .unwrap_or_default();
        let at = store.started() + last_send + STATUS_READ_AFTER;
        let record = store.job_at(&key, at).await.ok().flatten();
        found.push((job, key, record));
    }
    found
}

/// Collects the workers that have ended, before the end of the run: one that ended because its store
/// was misconfigured refused to start (logged; counted, so the operator starts as many fresh ones);
/// one that ended with another error is reported in `errors`.
async fn collect_refused(workers: &mut [RunningWorker], sink: &Sink, errors: &mut Vec<String>) -> usize {
    let mut refused = 0;
    for worker in workers.iter_mut() {
        // A killed worker's task was aborted: it answers "cancelled" unless it had ended before.
        let finished = worker.handle.as_ref().is_some_and(JoinHandle::is_finished);
        if !finished {
            continue;
        }
        let Some(handle) = worker.handle.take() else {
            continue;
        };
        let name = worker.instance.name();
        match handle.await {
            Ok(Ok(_)) => {}
            Ok(Err(WorkerError::Store(error))) => {
                sink.refused_start(name, error);
                refused += 1;
            }
            Ok(Err(error)) => errors.push(format!("{name} failed: {error}")),
            Err(error) if error.is_cancelled() => {}
            Err(error) => errors.push(format!("{name} panicked: {error}")),
        }
    }
    refused
}

/// Ends a fault window after `length`.
fn window(length: Duration, end: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(length).await;
        end();
    })
}

/// Every job sent has had its effect or has a copy in the DLQ, and the queue is empty.
/// The queue is empty and every job sent had its effect, is in the DLQ, or lost a message to the
/// queue's retention (the check judges whether that loss is excused).
fn is_settled(main: &MemoryQueue, dlq: &MemoryQueue, sink: &Sink) -> bool {
    if !main.is_empty() {
        return false;
    }
    let log = sink.log();
    let expired: HashSet<String> = main.expired().into_iter().map(|(id, _, _)| id).collect();
    let lost: HashSet<u32> = log
        .sent
        .iter()
        .filter(|(_, id)| expired.contains(id))
        .map(|(job, _)| *job)
        .chain(
            log.received
                .iter()
                .filter(|received| expired.contains(&received.message_id))
                .filter_map(|received| received.job),
        )
        .collect();
    let dead: HashSet<u32> = dlq
        .snapshot()
        .iter()
        .filter_map(|message| job_of_body(&message.body))
        .collect();
    let done: HashSet<u32> = log.effects.iter().map(|(job, _)| *job).collect();
    log.sent
        .iter()
        .all(|(job, _)| done.contains(job) || dead.contains(job) || lost.contains(job))
}
