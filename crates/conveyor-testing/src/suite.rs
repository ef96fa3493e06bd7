//! What the conformance suites report: one [`SuiteFailure`] per failed case, never a panic, so a test can
//! assert that a deliberately broken backend fails the right case.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// One failed conformance case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{case}: {message}")]
pub struct SuiteFailure {
    /// The case's name (its function's name).
    pub case: &'static str,
    /// What was expected and what happened.
    pub message: String,
}

impl SuiteFailure {
    /// A failure of `case`.
    pub fn new(case: &'static str, message: impl Into<String>) -> Self {
        Self {
            case,
            message: message.into(),
        }
    }
}

/// The result of one case.
pub type CaseResult = Result<(), SuiteFailure>;

/// Every failed case of a suite run.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub struct SuiteFailures(pub Vec<SuiteFailure>);

impl SuiteFailures {
    /// True when `case` is among the failures.
    pub fn failed(&self, case: &str) -> bool {
        self.0.iter().any(|failure| failure.case == case)
    }

    /// The failed cases' names.
    pub fn cases(&self) -> Vec<&'static str> {
        self.0.iter().map(|failure| failure.case).collect()
    }
}

impl fmt::Display for SuiteFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} conformance case(s) failed:", self.0.len())?;
        for failure in &self.0 {
            writeln!(f, "  - {failure}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for SuiteFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// One case, ready to run.
pub(crate) type Case<'a> = (&'static str, Pin<Box<dyn Future<Output = CaseResult> + 'a>>);

/// Runs the cases concurrently (each makes its own queues or keys, and their timing checks only assert
/// "not before", which load cannot break), logs each, and collects the failures in case order. A name in
/// `listed` (the suite's `CASES`) that `cases` does not run, or the other way round, is a failure too:
/// a case left out of `run_all` would otherwise pass unseen.
pub(crate) async fn run_cases(
    suite: &str,
    listed: &'static [&'static str],
    cases: Vec<Case<'_>>,
) -> Result<(), SuiteFailures> {
    let ran: Vec<&'static str> = cases.iter().map(|(name, _)| *name).collect();
    let mut unlisted: Vec<SuiteFailure> = listed
        .iter()
        .filter(|name| !ran.contains(name))
        .map(|name| SuiteFailure::new(name, "listed in CASES, but run_all does not run it"))
        .collect();
    unlisted.extend(
        ran.iter()
            .filter(|name| !listed.contains(name))
            .map(|name| SuiteFailure::new(name, "run by run_all, but not listed in CASES")),
    );
    let runs = cases.into_iter().map(|(name, case)| async move {
        let started = tokio::time::Instant::now();
        let result = case.await;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(()) => tracing::info!(suite, case = name, elapsed_ms, "conformance case passed"),
            Err(failure) => {
                tracing::warn!(suite, case = name, elapsed_ms, %failure, "conformance case failed")
            }
        }
        result
    });
    let mut failures: Vec<SuiteFailure> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    failures.extend(unlisted);
    if failures.is_empty() {
        return Ok(());
    }
    Err(SuiteFailures(failures))
}

/// Fails the current case with a formatted message unless the condition holds.
macro_rules! ensure {
    ($case:expr, $condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err($crate::suite::SuiteFailure::new($case, format!($($message)+)));
        }
    };
}
pub(crate) use ensure;

/// Turns an error of a backend call into the current case's failure.
pub(crate) trait OrFail<T> {
    /// `Err(e)` becomes a failure of `case` naming `what` and `e`.
    fn or_fail(self, case: &'static str, what: &str) -> Result<T, SuiteFailure>;
}

impl<T, E: fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, case: &'static str, what: &str) -> Result<T, SuiteFailure> {
        self.map_err(|error| SuiteFailure::new(case, format!("{what} failed: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_listed_case_run_all_leaves_out_fails_and_so_does_an_unlisted_one() {
        const LISTED: &[&str] = &["runs", "left_out"];
        let cases: Vec<Case<'_>> = vec![
            ("runs", Box::pin(async { Ok(()) })),
            ("unlisted", Box::pin(async { Ok(()) })),
        ];
        let failures = run_cases("test", LISTED, cases).await.unwrap_err();
        assert_eq!(failures.cases(), vec!["left_out", "unlisted"], "{failures}");
        let all: Vec<Case<'_>> = vec![
            ("runs", Box::pin(async { Ok(()) })),
            ("left_out", Box::pin(async { Ok(()) })),
        ];
        assert!(run_cases("test", LISTED, all).await.is_ok());
    }
}
