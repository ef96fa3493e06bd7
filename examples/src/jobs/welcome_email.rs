//! A welcome email, sent once per user: producers set the idempotency key `welcome_email:user:<id>`.

use std::sync::Arc;

use conveyor_core::{Context, Handler, HandlerError};
use serde::{Deserialize, Serialize};

use crate::outbox::Outbox;

/// The job: who to welcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WelcomeEmail {
    /// The user's id.
    pub user_id: u64,
    /// Where to send it.
    pub email: String,
    /// How to greet them.
    pub name: String,
}

impl WelcomeEmail {
    /// The business key that makes a second send for the same user a duplicate.
    pub fn idempotency_key(&self) -> String {
        format!("welcome_email:user:{}", self.user_id)
    }
}

/// What the provider returned, stored so a duplicate can read it.
#[derive(Debug, Serialize, Deserialize)]
pub struct EmailSent {
    /// The provider's message id.
    pub provider_message_id: String,
}

/// Sends welcome emails (into the outbox).
#[derive(Debug)]
pub struct SendWelcomeEmail {
    /// Where sent emails are recorded.
    pub outbox: Arc<Outbox>,
}

impl Handler for SendWelcomeEmail {
    type Job = WelcomeEmail;
    type Output = EmailSent;
    const JOB_TYPE: &'static str = "welcome_email";

    async fn handle(&self, job: WelcomeEmail, ctx: Context) -> Result<EmailSent, HandlerError> {
        if !job.email.contains('@') {
            return Err(HandlerError::permanent(format!(
                "user {} has no valid email address",
                job.user_id
            )));
        }
        let provider_message_id = format!("email-{}-{}", job.user_id, ctx.message_id());
        self.outbox
            .record(&serde_json::json!({
                "effect": "email_sent",
                "to_user": job.user_id,
                "subject": format!("Welcome, {}!", job.name),
                "provider_message_id": provider_message_id,
                "message_id": ctx.message_id(),
                "queue": ctx.queue(),
            }))
            .await?;
        tracing::info!(user_id = job.user_id, "welcome email sent");
        Ok(EmailSent { provider_message_id })
    }
}
