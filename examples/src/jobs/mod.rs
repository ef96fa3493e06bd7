//! The example application's jobs.

pub mod chunked_report;
pub mod events;
pub mod import_contacts;
pub mod report;
pub mod webhook;
pub mod welcome_email;
