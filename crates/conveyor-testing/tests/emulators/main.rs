//! The AWS adapters and the testing kit's helpers against LocalStack (SQS) and DynamoDB Local, one
//! test binary: the conformance suites, the fault layer, the emulator helpers.

mod faults;
mod fidelity;
mod helpers;
