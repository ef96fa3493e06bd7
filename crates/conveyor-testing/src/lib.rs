#![doc = include_str!("../README.md")]

pub mod localstack;
pub mod memory_queue;
pub mod memory_store;
pub mod wait;

pub use localstack::{QueueSpec, TestQueue};
pub use memory_queue::{MemoryQueue, MessageState, QueueRequests, QueuedMessage};
pub use memory_store::{MemoryIdempotencyStore, StoreRequests};
pub use wait::{wait_for, wait_until};
