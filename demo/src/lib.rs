#![doc = include_str!("../README.md")]

use std::path::Path;

use conveyor_examples::{OUTBOX_ENV, TABLE_ENV, WEBHOOK_SECRET_ENV};

/// The environment a child process of the example application (the `worker` or the `bootstrap`) needs
/// on the local AWS stack: emulator endpoints and credentials, the table, the webhook secret, the outbox.
pub fn local_app_env(table: &str, outbox: &Path, secret: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = conveyor_testing::localstack::aws_env()
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect();
    env.push((TABLE_ENV.to_owned(), table.to_owned()));
    env.push((WEBHOOK_SECRET_ENV.to_owned(), secret.to_owned()));
    env.push((OUTBOX_ENV.to_owned(), outbox.display().to_string()));
    env.push(("RUST_LOG".to_owned(), "warn,conveyor=info".to_owned()));
    env
}
