#![doc = include_str!("../README.md")]

pub mod browser;
pub mod child;
pub mod faults;
pub mod flow_conformance;
pub mod kit;
pub mod localstack;
pub mod memory_flows;
pub mod memory_payloads;
pub mod memory_queue;
pub mod memory_store;
pub mod memory_timers;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod payload_conformance;
pub mod ports;
pub mod powertools;
pub mod queue_conformance;
pub mod scripted_queue;
pub mod spans;
pub mod store_conformance;
pub mod suite;
pub mod timer_conformance;
pub mod tracking_conformance;
pub mod wait;

pub use faults::{Fault, Faults, Rule, RuleId, RuleStats};
#[cfg(feature = "aws")]
pub use faults::{faulty_dynamodb_client, faulty_sqs_client, with_faults_dynamodb, with_faults_sqs};
pub use localstack::{QueueSpec, TestQueue};
pub use memory_flows::{MemoryFlows, QueueSender};
pub use memory_payloads::{MemoryPayloadStore, PayloadRequests};
pub use memory_queue::{MemoryQueue, MessageState, QueueRequests, QueuedMessage, Quirks};
pub use memory_store::{MemoryIdempotencyStore, StoreRequests};
pub use memory_timers::MemoryTimers;
pub use ports::free_port;
pub use queue_conformance::{MemoryQueueFactory, QueueFactory, QueueUnderTest};
pub use scripted_queue::ScriptedQueue;
pub use spans::SpanOutcomes;
pub use suite::{CaseResult, SuiteFailure, SuiteFailures};
pub use wait::{wait_for, wait_until};
