//! Where the example jobs record their side effects: one JSON line per effect, appended to a file.
//!
//! In production these would be an email provider's API and a reports bucket; here a file lets the demo
//! and the tests count how often each effect happened (exactly once is the point).

use std::path::{Path, PathBuf};

use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// An append-only JSON-lines file of side effects.
#[derive(Debug)]
pub struct Outbox {
    path: PathBuf,
    lock: Mutex<()>,
}

impl Outbox {
    /// An outbox writing to `path` (created on first write).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            lock: Mutex::new(()),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one effect as a JSON line.
    pub async fn record(&self, effect: &impl Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(effect)?;
        line.push(b'\n');
        let _guard = self.lock.lock().await;
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .await?;
        file.write_all(&line).await?;
        file.flush().await
    }

    /// Reads every effect recorded so far (for the demo and tests).
    pub fn read_all(path: &Path) -> std::io::Result<Vec<serde_json::Value>> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect())
    }
}
