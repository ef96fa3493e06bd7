//! Testing a handler without AWS (docs/testing.md): run it on a job through the real pipeline and
//! assert the outcome, and read what it sent through an in-process SQS. `cargo test -p conveyor
//! --example test_a_handler --features testing` runs the tests below.

// The handler is used by the tests below; a plain build only prints how to run them.
#![cfg_attr(not(test), allow(dead_code))]

use conveyor::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Signup {
    user_id: u64,
    email: String,
}

/// Checks a signup, and sends the welcome email as its own job.
struct AcceptSignup {
    emails: Producer,
}

impl Handler for AcceptSignup {
    type Job = Signup;
    type Output = String;
    const JOB_TYPE: &'static str = "accept_signup";

    async fn handle(&self, job: Signup, _ctx: Context) -> Result<String, HandlerError> {
        if !job.email.contains('@') {
            return Err(HandlerError::permanent("no valid email address"));
        }
        let welcome = NewJob::new("welcome_email", serde_json::json!({ "user_id": job.user_id }))
            .key(format!("welcome:{}", job.user_id));
        self.emails.send(&welcome).await?;
        Ok(format!("user {} accepted", job.user_id))
    }
}

fn main() {
    println!("run the tests: cargo test -p conveyor --example test_a_handler --features testing");
}

#[cfg(test)]
mod tests {
    use conveyor::testing::kit::{JobRunner, MemorySqs, TestJob};

    use super::*;

    fn runner(sqs: &MemorySqs) -> JobRunner {
        let emails = Producer::new(sqs.client(), sqs.queue_url("emails"));
        JobRunner::new(Pipeline::new(Router::new().route(AcceptSignup { emails })))
    }

    #[tokio::test]
    async fn a_signup_sends_one_welcome_email() {
        let sqs = MemorySqs::new();
        let signup = Signup {
            user_id: 7,
            email: "ada@example.com".into(),
        };
        let ran = runner(&sqs).run(TestJob::new("accept_signup", &signup)).await;
        assert!(ran.succeeded(), "{:?}", ran.outcome());
        assert_eq!(ran.output::<String>().as_deref(), Some("user 7 accepted"));
        let sent = sqs.sent_of_type("welcome_email");
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].key(), Some("welcome:7"));
        assert_eq!(sent[0].job::<serde_json::Value>().unwrap()["user_id"], 7);
    }

    #[tokio::test]
    async fn a_bad_address_goes_to_the_dlq_and_sends_nothing() {
        let sqs = MemorySqs::new();
        let signup = Signup {
            user_id: 8,
            email: "nobody".into(),
        };
        let ran = runner(&sqs).run(TestJob::new("accept_signup", &signup)).await;
        assert_eq!(ran.dead_lettered(), Some("no valid email address"));
        assert!(sqs.sent().is_empty());
    }

    #[tokio::test]
    async fn a_malformed_body_is_dead_lettered_with_what_is_missing() {
        let sqs = MemorySqs::new();
        let ran = runner(&sqs)
            .run(TestJob::with_body("accept_signup", r#"{"user_id": 9}"#))
            .await;
        let reason = ran.dead_lettered().unwrap_or_default();
        assert!(reason.contains("email"), "{reason}");
        assert!(!ran.handler_ran());
    }
}
