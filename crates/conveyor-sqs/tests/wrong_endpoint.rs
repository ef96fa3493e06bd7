//! A wrong port in `AWS_ENDPOINT_URL_SQS` (issue 55): the producer's error names the address it dialled
//! and the variable that set it, and does not call it an outage. The SDK reads the variable from the
//! process environment, so the send runs in a child process of this test binary.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (house style)

use conveyor_sqs::{NewJob, ProduceError, Producer};
use conveyor_testing::child::{ERROR_MARKER, error_at_a_closed_sqs_port, is_child};

/// The queue URL's host and port are not what the client dials: the endpoint variable's are.
const QUEUE_URL: &str = "https://sqs.us-east-1.amazonaws.com/000000000000/orders";

#[test]
fn a_wrong_endpoint_port_names_the_port_and_the_variable() {
    let (port, error) = error_at_a_closed_sqs_port("send_to_the_endpoint_the_variable_sets").unwrap();
    assert!(
        error.contains(&format!("dials 127.0.0.1:{port}"))
            && error.contains("set by AWS_ENDPOINT_URL_SQS")
            && error.contains("not an outage")
            && error.contains("does not wait")
            && !error.contains("SQS is unavailable"),
        "{error}"
    );
}

#[tokio::test]
#[ignore = "run by a_wrong_endpoint_port_names_the_port_and_the_variable, with the variable set"]
async fn send_to_the_endpoint_the_variable_sets() {
    if !is_child() {
        return;
    }
    let producer = Producer::new(conveyor_sqs::sqs_client_from_env().await, QUEUE_URL);
    let error = producer
        .send(&NewJob::new("welcome_email", serde_json::json!({ "user": 42 })))
        .await
        .expect_err("nothing listens at the endpoint");
    assert!(matches!(error, ProduceError::Unreachable(_)), "{error:?}");
    println!("{ERROR_MARKER}{error}");
}
