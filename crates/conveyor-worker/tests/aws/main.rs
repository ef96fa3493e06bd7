//! The worker against LocalStack (SQS) and DynamoDB Local, one test binary: the AWS adapters end to
//! end, faults injected into them, a long delay, a restart, and a closed log pipe.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/rows.rs"]
mod rows;

mod batch_rows;
mod faults;
mod localstack;
mod long_delay;
mod pipe;
mod restart;
