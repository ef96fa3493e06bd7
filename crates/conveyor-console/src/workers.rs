//! Throughput and errors from the workers' `/metrics` (Prometheus text), scraped on each refresh.
//!
//! Rates are the change of the counters between two scrapes of the same worker divided by the time
//! between them, so the first refresh after start shows totals only. "Errors" are retries plus
//! dead-lettered messages: every run that did not succeed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use conveyor_core::metric_names::{
    IN_FLIGHT, LEASES_LOST, MESSAGES_DEAD_LETTERED as DEAD_LETTERED, MESSAGES_RECEIVED as RECEIVED,
    MESSAGES_RETRIED as RETRIED, MESSAGES_SUCCEEDED as SUCCEEDED,
};

/// How long a scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest metrics page read (a worker's is a few KiB).
const MAX_METRICS_BYTES: usize = 1024 * 1024;

/// One worker as the page shows it.
#[derive(Debug, Clone)]
pub(crate) struct WorkerView {
    pub(crate) url: String,
    /// The scrape's error, when it failed.
    pub(crate) error: Option<String>,
    pub(crate) in_flight: f64,
    pub(crate) received: f64,
    pub(crate) succeeded: f64,
    pub(crate) errors: f64,
    pub(crate) leases_lost: f64,
    /// Succeeded per second since the previous scrape.
    pub(crate) per_second: Option<f64>,
    /// Errors per second since the previous scrape.
    pub(crate) errors_per_second: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    succeeded: f64,
    errors: f64,
}

/// The workers to scrape and their previous samples.
pub(crate) struct Workers {
    urls: Vec<String>,
    http: reqwest::Client,
    last: Mutex<HashMap<String, Sample>>,
}

impl Workers {
    pub(crate) fn new(urls: Vec<String>) -> Self {
        // No redirects: a worker's endpoint answers itself; a redirect elsewhere is not followed.
        let http = reqwest::Client::builder()
            .timeout(SCRAPE_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self {
            urls,
            http,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// True when no worker was given.
    pub(crate) fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// Scrapes every worker at once.
    pub(crate) async fn scrape(&self) -> Vec<WorkerView> {
        futures_util::future::join_all(self.urls.iter().map(|url| self.scrape_one(url))).await
    }

    async fn scrape_one(&self, url: &str) -> WorkerView {
        let mut view = WorkerView {
            url: url.to_owned(),
            error: None,
            in_flight: 0.0,
            received: 0.0,
            succeeded: 0.0,
            errors: 0.0,
            leases_lost: 0.0,
            per_second: None,
            errors_per_second: None,
        };
        let text = match self.fetch(&metrics_url(url)).await {
            Ok(text) => text,
            Err(error) => {
                view.error = Some(error);
                return view;
            }
        };
        let values = parse_metrics(&text);
        let value = |name: &str| values.get(name).copied().unwrap_or(0.0);
        view.in_flight = value(IN_FLIGHT);
        view.received = value(RECEIVED);
        view.succeeded = value(SUCCEEDED);
        view.errors = value(RETRIED) + value(DEAD_LETTERED);
        view.leases_lost = value(LEASES_LOST);
        let now = Sample {
            at: Instant::now(),
            succeeded: view.succeeded,
            errors: view.errors,
        };
        let previous = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(url.to_owned(), now);
        if let Some(previous) = previous {
            let seconds = now.at.duration_since(previous.at).as_secs_f64();
            if seconds > 0.0 {
                // A restarted worker starts its counters again: no negative rates.
                view.per_second = Some(((now.succeeded - previous.succeeded) / seconds).max(0.0));
                view.errors_per_second = Some(((now.errors - previous.errors) / seconds).max(0.0));
            }
        }
        view
    }

    /// The page at `url`: a success, read up to [`MAX_METRICS_BYTES`].
    async fn fetch(&self, url: &str) -> Result<String, String> {
        let mut response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|error| format!("cannot reach {url}: {error}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "{url} answered {} (redirects are not followed: give the worker's own address)",
                response.status()
            ));
        }
        let mut page = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| format!("reading {url} failed: {error}"))?
        {
            if page.len() + chunk.len() > MAX_METRICS_BYTES {
                return Err(format!(
                    "{url} sent more than {MAX_METRICS_BYTES} bytes: not a Conveyor worker's metrics"
                ));
            }
            page.extend_from_slice(&chunk);
        }
        String::from_utf8(page).map_err(|_| format!("{url} sent a page that is not UTF-8"))
    }
}

/// `http://host:9090` → `http://host:9090/metrics`; a URL that already ends in `/metrics` as is.
fn metrics_url(url: &str) -> String {
    let url = url.trim_end_matches('/');
    if url.ends_with("/metrics") {
        return url.to_owned();
    }
    format!("{url}/metrics")
}

/// Prometheus text exposition → each metric's value summed over its label sets. Comments, histogram
/// series and lines that do not parse are skipped.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut values: HashMap<String, f64> = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, rest) = match line.find('{') {
            Some(open) => match line[open..].find('}') {
                Some(close) => (&line[..open], &line[open + close + 1..]),
                None => continue,
            },
            None => match line.split_once(' ') {
                Some((name, rest)) => (name, rest),
                None => continue,
            },
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|value| value.parse::<f64>().ok())
        else {
            continue;
        };
        *values.entry(series.to_owned()).or_insert(0.0) += value;
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_summed_over_labels() {
        let text = "# HELP conveyor_messages_succeeded_total x\n\
            # TYPE conveyor_messages_succeeded_total counter\n\
            conveyor_messages_succeeded_total{queue=\"a\",job_type=\"email\"} 3\n\
            conveyor_messages_succeeded_total{queue=\"a\",job_type=\"webhook\"} 4\n\
            conveyor_in_flight 2\n\
            conveyor_handler_duration_seconds_bucket{job_type=\"email\",le=\"0.005\"} 1\n\
            broken{line\n";
        let values = parse_metrics(text);
        assert_eq!(values.get(SUCCEEDED), Some(&7.0));
        assert_eq!(values.get(IN_FLIGHT), Some(&2.0));
        assert!(!values.contains_key("broken"));
        assert_eq!(metrics_url("http://h:9090/"), "http://h:9090/metrics");
        assert_eq!(metrics_url("http://h:9090/metrics"), "http://h:9090/metrics");
    }

    /// A redirect is not followed and an endless page is cut at the cap; a real page is read.
    #[tokio::test]
    async fn scraping_follows_no_redirect_and_reads_at_most_the_cap() {
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        let Ok(addr) = listener.local_addr() else {
            panic!("no address");
        };
        let huge = "x".repeat(MAX_METRICS_BYTES + 1);
        let router = axum::Router::new()
            .route(
                "/moved/metrics",
                get(|| async { axum::response::Redirect::temporary("/ok/metrics") }),
            )
            .route("/ok/metrics", get(|| async { "conveyor_in_flight 2\n" }))
            .route("/huge/metrics", get(move || async move { huge }));
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(conveyor_http::serve(
            listener,
            router,
            conveyor_http::Limits::default(),
            stop.clone(),
        ));
        let base = format!("http://{addr}");
        let workers = Workers::new(vec![
            format!("{base}/ok"),
            format!("{base}/moved"),
            format!("{base}/huge"),
        ]);
        let views = workers.scrape().await;
        assert_eq!((views[0].error.as_deref(), views[0].in_flight), (None, 2.0));
        let moved = views[1].error.as_deref().unwrap_or_default();
        assert!(
            moved.contains("307") && moved.contains("redirects are not followed"),
            "{moved}"
        );
        let huge = views[2].error.as_deref().unwrap_or_default();
        assert!(huge.contains("more than 1048576 bytes"), "{huge}");
        stop.cancel();
    }
}
