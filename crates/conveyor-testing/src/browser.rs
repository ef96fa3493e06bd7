//! A headless browser for UI tests: chromedriver (Debian's `chromium-driver`) started on a free loopback
//! port, driving Debian's `chromium`.
//!
//! [`Chromedriver::start`] runs `localstack/install-chromium.sh` first (idempotent: once both are on PATH
//! it only checks; as root it installs them with apt-get, otherwise it prints how), so a fresh machine
//! passes with `make test`. Set `CONVEYOR_CHROMEDRIVER` to use another driver binary.
//! [`screenshot_dir`] is where tests write what they saw (`target/`, ignored by git).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::localstack::repo_root;
use crate::ports::free_port;
use crate::wait::wait_for;

/// A running chromedriver; killed when dropped, with the browsers it started (its process group), so a
/// test that panics before closing its session leaves no Chromium behind.
pub struct Chromedriver {
    url: String,
    child: Child,
}

impl std::fmt::Debug for Chromedriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chromedriver")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Chromedriver {
    /// Installs the browser if needed, starts chromedriver and waits until it answers.
    pub async fn start() -> anyhow::Result<Self> {
        ensure_installed().await?;
        let port = free_port()?;
        let binary = std::env::var("CONVEYOR_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".to_owned());
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {binary}; run ./localstack/install-chromium.sh"))?;
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        wait_for(Duration::from_secs(20), Duration::from_millis(100), async || {
            let body = http_get(&status).await?;
            body.contains("\"ready\":true").then_some(())
        })
        .await
        .with_context(|| format!("{binary} did not answer on {status}"))?;
        Ok(Self { url, child })
    }

    /// The WebDriver URL, e.g. `http://127.0.0.1:9515`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Headless Chromium's WebDriver capabilities: a phone-or-laptop-sized window, no sandbox (containers run
/// as root), no GPU.
pub fn chromium_capabilities(width: u32, height: u32) -> serde_json::Map<String, serde_json::Value> {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                format!("--window-size={width},{height}"),
            ]
        }),
    );
    capabilities
}

/// `target/console-screenshots/` at the repository root (created).
pub fn screenshot_dir() -> anyhow::Result<PathBuf> {
    let dir = repo_root().join("target").join("console-screenshots");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Runs `localstack/install-chromium.sh` (once per process).
async fn ensure_installed() -> anyhow::Result<()> {
    static INSTALLED: tokio::sync::OnceCell<Result<(), String>> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let script = repo_root().join("localstack").join("install-chromium.sh");
            let output = Command::new(&script)
                .output()
                .await
                .map_err(|error| format!("cannot run {}: {error}", script.display()))?;
            if output.status.success() {
                return Ok(());
            }
            Err(format!(
                "{} failed: the console's browser tests need chromium and chromedriver:\n{}{}",
                script.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        })
        .await
        .clone()
        .map_err(anyhow::Error::msg)
}

/// A plain GET of a loopback URL (no client dependency for one health probe).
async fn http_get(url: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let mut stream = tokio::net::TcpStream::connect(authority).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    // The status document is small: whatever arrived within a second is enough.
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut response)).await;
    Some(String::from_utf8_lossy(&response).into_owned())
}
