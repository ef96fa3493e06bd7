//! The handler of the README's `main`s as `src/bin/first_hour_{worker,bootstrap}.rs` run them: each run
//! of a job appends its body to the file `FIRST_HOUR_EFFECTS` names (tests/first_hour.rs counts them).

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

/// The pipeline both `main`s run, with no store of its own: `CONVEYOR_IDEMPOTENCY_TABLE` names it.
pub fn pipeline() -> Pipeline {
    let effects = std::env::var_os("FIRST_HOUR_EFFECTS")
        .map(Into::into)
        .unwrap_or_else(|| "effects.jsonl".into());
    Pipeline::new(Router::new().route(Record { effects }))
}
