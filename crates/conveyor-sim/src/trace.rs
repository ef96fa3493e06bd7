//! The run's own log of steps, stamped with virtual time: printed as it happens under `--trace`.

use tokio::time::Instant;

/// A cheap-to-clone log of the simulation's steps.
#[derive(Debug, Clone)]
pub struct Trace {
    origin: Instant,
    print: bool,
}

impl Trace {
    /// A trace whose time starts now; `print` writes each step to stderr as it happens.
    pub fn new(print: bool) -> Self {
        Self {
            origin: Instant::now(),
            print,
        }
    }

    /// Milliseconds of virtual time since the run started.
    pub fn elapsed_ms(&self) -> u128 {
        self.origin.elapsed().as_millis()
    }

    /// Records one step: prints it when the trace prints.
    pub fn step(&self, text: impl AsRef<str>) {
        if self.print {
            eprintln!(
                "[sim {:>9.3}s] {}",
                self.origin.elapsed().as_secs_f64(),
                text.as_ref()
            );
        }
    }
}
