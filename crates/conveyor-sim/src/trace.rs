//! The run's own log of steps, stamped with virtual time: printed as it happens under `--trace`,
//! kept for the report otherwise.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

/// A shared, cheap-to-clone log of the simulation's steps.
#[derive(Debug, Clone)]
pub struct Trace {
    origin: Instant,
    print: bool,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Trace {
    /// A trace whose time starts now; `print` writes each step to stderr as it happens.
    pub fn new(print: bool) -> Self {
        Self {
            origin: Instant::now(),
            print,
            lines: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Milliseconds of virtual time since the run started.
    pub fn elapsed_ms(&self) -> u128 {
        self.origin.elapsed().as_millis()
    }

    /// Records one step.
    pub fn step(&self, text: impl AsRef<str>) {
        let line = format!(
            "[sim {:>9.3}s] {}",
            self.origin.elapsed().as_secs_f64(),
            text.as_ref()
        );
        if self.print {
            eprintln!("{line}");
        }
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    /// Every step so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}
