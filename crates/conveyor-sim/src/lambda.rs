//! A Lambda function behind an SQS event source mapping: the mapping's poll loop, written here as
//! AWS runs it (receive a batch, invoke with the records, delete the records not reported as
//! failures), around the real [`BatchProcessor`].
//!
//! An invocation that runs past its deadline is cut there, as Lambda does: its future is dropped,
//! nothing is deleted, and its messages come back when their visibility timeout ends.
//!
//! On Lambda Managed Instances ([`LambdaSpec::invocations`] above 1) one process runs several
//! invocations at once: that many mapping loops share the function's one `BatchProcessor` (its
//! clients, its store, its record slots), each invocation with its own deadline.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use conveyor_core::{
    message::{Message, ReceiptHandle},
    port::Queue,
};
use conveyor_lambda::LambdaConfig;
use conveyor_lambda::{BatchProcessor, SqsEvent, to_record};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::scenario::LambdaSpec;
use crate::sink::Sink;

/// One function and its event source mapping.
pub struct Function {
    /// Its name in the trace.
    pub name: String,
    /// Its settings.
    pub spec: LambdaSpec,
    /// The queue as this function reaches it.
    pub queue: Arc<dyn Queue>,
    /// The real batch processor, shared by the process's invocations.
    pub processor: Arc<BatchProcessor>,
    /// The log.
    pub sink: Arc<Sink>,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .finish()
    }
}

/// The config the function runs with.
pub fn config(spec: &LambdaSpec) -> LambdaConfig {
    LambdaConfig::default()
        .with_function_timeout(spec.function_timeout)
        .with_batch_concurrency(spec.batch_concurrency)
        .with_process_concurrency(spec.process_concurrency)
}

impl Function {
    /// Runs the process's invocations ([`LambdaSpec::invocations`] mapping loops at once) until `stop`
    /// is cancelled.
    pub async fn run(self, stop: CancellationToken) {
        let function = Arc::new(self);
        let loops: Vec<_> = (0..function.spec.invocations.max(1))
            .map(|_| {
                let function = Arc::clone(&function);
                let stop = stop.clone();
                tokio::spawn(async move { function.poll(stop).await })
            })
            .collect();
        for running in loops {
            let _ = running.await;
        }
    }

    /// One mapping loop: polls and invokes until `stop` is cancelled.
    async fn poll(&self, stop: CancellationToken) {
        // Lambda initialises an execution environment before its first invocation, and again after
        // an initialisation that failed; the mapping has received the batch by then.
        let mut initialised = false;
        loop {
            let received = tokio::select! {
                biased;
                received = self.queue.receive(self.spec.batch_size, Duration::from_secs(20)) => received,
                () = stop.cancelled() => return,
            };
            let messages = match received {
                Ok(messages) if messages.is_empty() => continue,
                Ok(messages) => messages,
                Err(error) => {
                    self.sink.step(format!("{}: receive failed: {error}", self.name));
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        () = stop.cancelled() => return,
                    }
                }
            };
            // The batching window, or a throttled invocation the mapping retries: the records'
            // visibility timeout runs from the receive.
            if !self.spec.invoke_delay.is_zero() {
                tokio::select! {
                    biased;
                    () = tokio::time::sleep(self.spec.invoke_delay) => {}
                    () = stop.cancelled() => return,
                }
            }
            if !initialised {
                let since_ms = self.sink.now_ms();
                if let Err(error) = self.processor.check_store().await {
                    // The invocation fails: nothing is deleted, the batch comes back at the visibility
                    // timeout (each receive counted), as an init error does on AWS.
                    self.sink
                        .cold_start_failed(&self.name, &messages, since_ms, error);
                    continue;
                }
                initialised = true;
            }
            self.invoke(messages).await;
        }
    }

    async fn invoke(&self, messages: Vec<Message>) {
        let deadline = Instant::now() + self.spec.function_timeout;
        let event = event(&messages, self.queue.name());
        let invocation = self
            .sink
            .invoked(&self.name, &messages, self.spec.function_timeout);
        let processed =
            tokio::time::timeout_at(deadline, self.processor.process_batch_report(event, deadline)).await;
        self.sink.invocation_over(invocation);
        let Ok(report) = processed else {
            self.sink.overran(&self.name);
            return;
        };
        let failed: HashSet<&str> = report
            .response
            .batch_item_failures
            .iter()
            .map(|failure| failure.item_identifier.as_str())
            .collect();
        let done: Vec<ReceiptHandle> = messages
            .iter()
            .filter(|message| !failed.contains(message.id.as_str()))
            .map(|message| message.receipt_handle.clone())
            .collect();
        self.sink.step(format!(
            "{}: {} records reported as failures, deleting {}",
            self.name,
            failed.len(),
            done.len()
        ));
        if done.is_empty() {
            return;
        }
        match self.queue.delete_batch(&done).await {
            Ok(failures) if failures.is_empty() => {}
            Ok(failures) => self
                .sink
                .step(format!("{}: {} deletes failed", self.name, failures.len())),
            Err(error) => self.sink.step(format!("{}: delete failed: {error}", self.name)),
        }
    }
}

/// The event the mapping sends for `messages`.
fn event(messages: &[Message], queue: &str) -> SqsEvent {
    let arn = format!("arn:aws:sqs:us-east-1:000000000000:{queue}");
    let mut event = SqsEvent::default();
    event.records = messages.iter().map(|message| to_record(message, &arn)).collect();
    event
}
