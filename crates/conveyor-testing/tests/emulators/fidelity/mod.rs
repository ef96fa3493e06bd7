//! The fidelity matrices: the conformance suites against every implementation that installs from the
//! registries here. `sqs.rs` runs the queue suite on LocalStack 4.8.1, moto's server and fauxqs (with
//! `SqsQueue`) and on `MemoryQueue`; `dynamodb.rs` runs the store suites (idempotency, tracking, flows,
//! timers) on DynamoDB Local and moto's DynamoDB (with `DynamoStore`) and on the memory doubles.
//!
//! A case that fails on one implementation is not a failure of the test: each implementation's failed
//! cases must be exactly its rows in the matrix's deviations, each with the AWS documentation sentence
//! that says what the service does. A new deviation (an emulator upgrade, a new case) or a fixed one
//! fails the test and names the row to add or remove. A deviation that shows only under a race
//! ([`Seen::Sometimes`]) may pass or fail its case in a run; a probe that repeats the race is what holds
//! it. A mismatching implementation is run a second time before the test fails, so one slow answer on a
//! loaded machine does not count as a deviation.
//!
//! Each table in `docs/running.md` ("Emulator fidelity", between its matrix's markers) is rendered from
//! the deviations the run has just confirmed; the test fails when the checked-in table differs, and
//! rewrites it when `CONVEYOR_UPDATE_FIDELITY=1` is set:
//!
//! ```text
//! CONVEYOR_UPDATE_FIDELITY=1 cargo test -p conveyor-testing --test emulators fidelity
//! ```

mod dynamodb;
mod sqs;

use std::collections::BTreeMap;
use std::sync::Mutex;

use conveyor_testing::localstack::repo_root;

/// One implementation under test: its column in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Implementation {
    LocalStack,
    MotoSqs,
    Fauxqs,
    MemoryQueue,
    DynamoDbLocal,
    MotoDynamoDb,
    MemoryStores,
}

impl Implementation {
    fn column(self) -> &'static str {
        match self {
            Self::LocalStack => "LocalStack 4.8.1",
            Self::MotoSqs | Self::MotoDynamoDb => "moto 5.2.6",
            Self::Fauxqs => "fauxqs 2.4.1",
            Self::MemoryQueue => "MemoryQueue",
            Self::DynamoDbLocal => "DynamoDB Local 3.3.1",
            Self::MemoryStores => "memory doubles",
        }
    }
}

/// How often a deviation shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// In every run: the case fails every time.
    Always,
    /// Only when a race goes the wrong way: the case may pass or fail in a run.
    Sometimes,
}

/// A case an implementation fails, and who is right.
struct Deviation {
    implementation: Implementation,
    /// The row's key (for the store suites, `suite/case`).
    case: &'static str,
    seen: Seen,
    /// What the implementation does.
    does: &'static str,
    /// What the service does, in the words of AWS's documentation.
    aws_says: &'static str,
    /// Where AWS says it.
    source: &'static str,
}

/// One row of a table: a case's key and what the table says after its name.
struct Row {
    key: String,
    /// `store`, `probe`, ...: shown in brackets after the case's name.
    note: Option<&'static str>,
}

impl Row {
    fn new(key: impl Into<String>, note: Option<&'static str>) -> Self {
        Self {
            key: key.into(),
            note,
        }
    }

    /// The case's name: the key without its `suite/`.
    fn name(&self) -> &str {
        self.key.rsplit('/').next().unwrap_or(&self.key)
    }
}

/// One table: its implementations, its rows and its known deviations.
struct Matrix {
    /// The name in its markers in `docs/running.md`.
    marker: &'static str,
    columns: &'static [Implementation],
    rows: Vec<Row>,
    deviations: &'static [Deviation],
}

/// What one run of an implementation produced: each failed case (its row's key) with its message.
type Failed = BTreeMap<String, String>;

impl Matrix {
    fn expected(&self, implementation: Implementation, seen: Seen) -> Vec<String> {
        let mut cases: Vec<String> = self
            .deviations
            .iter()
            .filter(|deviation| deviation.implementation == implementation && deviation.seen == seen)
            .map(|deviation| deviation.case.to_owned())
            .collect();
        cases.sort();
        cases
    }

    /// How `failed` disagrees with the deviations of `implementation`: empty when it does not.
    fn disagreements(&self, implementation: Implementation, failed: &Failed) -> Vec<String> {
        let always = self.expected(implementation, Seen::Always);
        let sometimes = self.expected(implementation, Seen::Sometimes);
        let mut report = Vec::new();
        for (case, message) in failed {
            if !always.contains(case) && !sometimes.contains(case) {
                report.push(format!(
                    "  new deviation {case}: {message}\n    (add a row to the deviations with the AWS documentation \
                     sentence that says who is right, or fix the cause)"
                ));
            }
        }
        for case in always.iter().filter(|case| !failed.contains_key(*case)) {
            report.push(format!(
                "  {case} passes now: remove its row from the deviations and regenerate the table"
            ));
        }
        report
    }

    /// Runs every implementation's suites with `run`, all at once, each checked against the deviations,
    /// then the docs table; fails with every disagreement.
    async fn judge<T, F>(&self, implementations: &[(Implementation, T)], run: F) -> anyhow::Result<()>
    where
        F: AsyncFn(&T) -> Failed,
    {
        let started = tokio::time::Instant::now();
        let runs = implementations
            .iter()
            .map(|(implementation, under)| self.checked_run(*implementation, async || run(under).await));
        let outcomes = futures_util::future::join_all(runs).await;
        tracing::info!(
            matrix = self.marker,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "fidelity matrix ran"
        );
        let mismatches: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
        anyhow::ensure!(mismatches.is_empty(), "{}", mismatches.join("\n\n"));
        self.check_docs_table()
    }

    /// Runs `run` (one implementation's suites), and once more when the first run disagrees with the
    /// deviations; `Err` says how the second run disagrees.
    async fn checked_run<F>(&self, implementation: Implementation, run: F) -> Result<(), String>
    where
        F: AsyncFn() -> Failed,
    {
        let first = run().await;
        if self.disagreements(implementation, &first).is_empty() {
            return Ok(());
        }
        tracing::warn!(
            implementation = implementation.column(),
            failed = ?first,
            "fidelity run disagrees with the matrix; running it again"
        );
        let second = run().await;
        let report = self.disagreements(implementation, &second);
        if report.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} disagrees with the {} deviations:\n{}",
            implementation.column(),
            self.marker,
            report.join("\n")
        ))
    }

    /// The table and the deviations' notes, as `docs/running.md` carries them.
    fn render(&self) -> String {
        let mut out = String::from("| case |");
        for implementation in self.columns {
            out.push_str(&format!(" {} |", implementation.column()));
        }
        out.push_str("\n|---|");
        out.push_str(&"---|".repeat(self.columns.len()));
        out.push('\n');
        for row in &self.rows {
            let note = row.note.map(|note| format!(" ({note})")).unwrap_or_default();
            out.push_str(&format!("| `{}`{note} |", row.name()));
            for implementation in self.columns {
                let cell = match self.note_number(*implementation, &row.key) {
                    Some((number, Seen::Always)) => format!(" fails [{number}] |"),
                    Some((number, Seen::Sometimes)) => format!(" fails sometimes [{number}] |"),
                    None => " passes |".to_owned(),
                };
                out.push_str(&cell);
            }
            out.push('\n');
        }
        out.push_str(&format!("| **passed, of {}** |", self.rows.len()));
        for implementation in self.columns {
            let failing = self
                .deviations
                .iter()
                .filter(|deviation| deviation.implementation == *implementation)
                .count();
            out.push_str(&format!(" **{}** |", self.rows.len() - failing));
        }
        out.push('\n');
        if !self.deviations.is_empty() {
            out.push('\n');
        }
        for (index, notes) in self.notes().iter().enumerate() {
            let first = notes[0];
            let cases: Vec<String> = notes
                .iter()
                .map(|deviation| format!("`{}`", deviation.case))
                .collect();
            let sometimes = match first.seen {
                Seen::Always => "",
                Seen::Sometimes => " (sometimes)",
            };
            out.push_str(&format!(
                "{}. {}, {}{sometimes}: {} AWS: \"{}\" ({})\n",
                index + 1,
                first.implementation.column(),
                cases.join(", "),
                first.does,
                first.aws_says,
                first.source
            ));
        }
        out
    }

    /// The deviations grouped into the table's notes: one note per implementation, behaviour and
    /// frequency, in the order of their first row.
    fn notes(&self) -> Vec<Vec<&Deviation>> {
        let mut notes: Vec<Vec<&Deviation>> = Vec::new();
        for deviation in self.deviations {
            let same = notes.iter_mut().find(|note| {
                note[0].implementation == deviation.implementation
                    && note[0].does == deviation.does
                    && note[0].seen == deviation.seen
            });
            match same {
                Some(note) => note.push(deviation),
                None => notes.push(vec![deviation]),
            }
        }
        notes
    }

    /// The number of the note on `case` of `implementation`, and how often it fails.
    fn note_number(&self, implementation: Implementation, case: &str) -> Option<(usize, Seen)> {
        self.notes().iter().enumerate().find_map(|(index, note)| {
            note.iter()
                .find(|deviation| deviation.implementation == implementation && deviation.case == case)
                .map(|deviation| (index + 1, deviation.seen))
        })
    }

    /// Fails unless `docs/running.md` carries this matrix's table between its markers; rewrites it there
    /// instead when `CONVEYOR_UPDATE_FIDELITY=1`.
    fn check_docs_table(&self) -> anyhow::Result<()> {
        // The tables share one file, and their tests run at once.
        static DOCS: Mutex<()> = Mutex::new(());
        let _docs = DOCS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let begin_marker = format!(
            "<!-- {}:begin (generated by crates/conveyor-testing/tests/emulators/fidelity/; \
             CONVEYOR_UPDATE_FIDELITY=1 rewrites it) -->",
            self.marker
        );
        let end_marker = format!("<!-- {}:end -->", self.marker);
        let path = repo_root().join("docs").join("running.md");
        let text = std::fs::read_to_string(&path)?;
        let (Some(begin), Some(end)) = (text.find(&begin_marker), text.find(&end_marker)) else {
            anyhow::bail!(
                "{} has no markers for this table ({begin_marker} ... {end_marker})",
                path.display()
            );
        };
        let checked_in = &text[begin + begin_marker.len()..end];
        let generated = format!("\n{}", self.render());
        if checked_in == generated {
            return Ok(());
        }
        if std::env::var("CONVEYOR_UPDATE_FIDELITY").as_deref() == Ok("1") {
            let updated = format!(
                "{}{generated}{}",
                &text[..begin + begin_marker.len()],
                &text[end..]
            );
            std::fs::write(&path, updated)?;
            return Ok(());
        }
        anyhow::bail!(
            "the {} table in {} is not what this run produced; rerun with CONVEYOR_UPDATE_FIDELITY=1 to \
             rewrite it. Generated:\n{generated}",
            self.marker,
            path.display()
        )
    }
}
