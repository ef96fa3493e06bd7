//! A wrong port in `AWS_ENDPOINT_URL_SQS` (issue 55): resolving the source queue fails with the
//! address dialled and the variable that set it, says what happens to the records, and does not call
//! it an outage. The SDK reads the variable from the process environment, so the lookup runs in a
//! child process of this test binary.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use conveyor_lambda::{QueueResolver, ResolveError, SqsQueues};
use conveyor_testing::child::{ERROR_MARKER, error_at_a_closed_sqs_port, is_child};

#[test]
fn a_wrong_endpoint_port_names_the_port_and_the_variable() {
    let (port, error) = error_at_a_closed_sqs_port("resolve_at_the_endpoint_the_variable_sets").unwrap();
    assert!(
        error.contains(&format!("dials 127.0.0.1:{port}"))
            && error.contains("set by AWS_ENDPOINT_URL_SQS")
            && error.contains("not an outage")
            && error.contains("listed as batch failures"),
        "{error}"
    );
}

#[tokio::test]
#[ignore = "run by a_wrong_endpoint_port_names_the_port_and_the_variable, with the variable set"]
async fn resolve_at_the_endpoint_the_variable_sets() {
    if !is_child() {
        return;
    }
    let queues = SqsQueues::new(conveyor_sqs::sqs_client_from_env().await);
    let error = queues
        .resolve("arn:aws:sqs:us-east-1:000000000000:orders")
        .await
        .err()
        .expect("nothing listens at the endpoint");
    assert!(matches!(error, ResolveError::Unreachable { .. }), "{error:?}");
    println!("{ERROR_MARKER}{error}");
}
