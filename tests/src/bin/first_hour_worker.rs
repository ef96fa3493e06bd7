//! The README's worker `main`, as a user copies it into a crate of their own on the facade (features
//! `worker` and `dynamodb`): no `.with_store(..)`; `CONVEYOR_IDEMPOTENCY_TABLE` names the table.
//! Each run of a job appends its key to the file `FIRST_HOUR_EFFECTS` names (tests/first_hour.rs).

use conveyor::prelude::*;

/// Appends one line per run to a file: the effect a duplicate must not repeat.
struct Record {
    effects: std::path::PathBuf,
}

impl Handler for Record {
    type Job = serde_json::Value;
    type Output = ();
    const JOB_TYPE: &'static str = "first_hour";

    async fn handle(&self, job: serde_json::Value, _ctx: Context) -> Result<(), HandlerError> {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.effects)?;
        writeln!(file, "{job}")?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let effects = std::env::var_os("FIRST_HOUR_EFFECTS")
        .map(Into::into)
        .unwrap_or_else(|| "effects.jsonl".into());
    let pipeline = Pipeline::new(Router::new().route(Record { effects }));
    conveyor::worker::run(pipeline).await?;
    Ok(())
}
