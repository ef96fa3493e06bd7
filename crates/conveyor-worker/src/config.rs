//! Loading the worker's configuration: a TOML file, then environment overrides, then validation.

use std::path::Path;
use std::time::Duration;

use conveyor_core::config::{QueueConfig, WorkerConfig};

use crate::error::WorkerError;

/// `CONVEYOR_QUEUE_URL`: one queue URL, or comma-separated URLs each with an optional `=weight`.
pub const ENV_QUEUE_URL: &str = "CONVEYOR_QUEUE_URL";
/// `CONVEYOR_MAX_IN_FLIGHT`: messages in flight at once, across all queues.
pub const ENV_MAX_IN_FLIGHT: &str = "CONVEYOR_MAX_IN_FLIGHT";
/// `CONVEYOR_VISIBILITY_TIMEOUT_SECS`: the queues' visibility timeout in seconds.
pub const ENV_VISIBILITY_TIMEOUT_SECS: &str = "CONVEYOR_VISIBILITY_TIMEOUT_SECS";
/// `CONVEYOR_DRAIN_DEADLINE_SECS`: how long in-flight jobs may finish after SIGTERM, in seconds.
pub const ENV_DRAIN_DEADLINE_SECS: &str = "CONVEYOR_DRAIN_DEADLINE_SECS";
/// `CONVEYOR_LISTEN_ADDR`: the operations endpoint's address, or `off`.
pub const ENV_LISTEN_ADDR: &str = "CONVEYOR_LISTEN_ADDR";
/// `CONVEYOR_MAX_PROCESSING_SECS`: the longest a message is kept in flight by heartbeats, in seconds.
pub const ENV_MAX_PROCESSING_SECS: &str = "CONVEYOR_MAX_PROCESSING_SECS";

/// Loads the worker config: the TOML file at `path` (defaults when `None`), then the `CONVEYOR_*`
/// environment overrides, then [`WorkerConfig::validate`].
///
/// Errors name the file field or the environment variable and say what to change.
pub fn load_config(path: Option<&Path>) -> Result<WorkerConfig, WorkerError> {
    load_config_with(path, |name| std::env::var(name).ok())
}

/// [`load_config`] with the environment given as a lookup function (for tests and embedding).
pub fn load_config_with(
    path: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<WorkerConfig, WorkerError> {
    let mut config = match path {
        Some(path) => read_file(path)?,
        None => WorkerConfig::default(),
    };
    apply_env(&mut config, &env)?;
    config.validate()?;
    Ok(config)
}

fn read_file(path: &Path) -> Result<WorkerConfig, WorkerError> {
    let text = std::fs::read_to_string(path).map_err(|source| WorkerError::ConfigFile {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|error| WorkerError::ConfigSyntax {
        path: path.to_owned(),
        message: error.to_string(),
    })
}

fn apply_env(config: &mut WorkerConfig, env: &impl Fn(&str) -> Option<String>) -> Result<(), WorkerError> {
    let get = |name: &str| {
        env(name)
            .map(|value| value.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(value) = get(ENV_QUEUE_URL) {
        config.queues = parse_queue_urls(&value)?;
    }
    if let Some(value) = get(ENV_MAX_IN_FLIGHT) {
        config.max_in_flight = parse_number(ENV_MAX_IN_FLIGHT, &value)? as usize;
    }
    if let Some(value) = get(ENV_VISIBILITY_TIMEOUT_SECS) {
        config.visibility_timeout = parse_seconds(ENV_VISIBILITY_TIMEOUT_SECS, &value)?;
    }
    if let Some(value) = get(ENV_DRAIN_DEADLINE_SECS) {
        config.drain_deadline = parse_seconds(ENV_DRAIN_DEADLINE_SECS, &value)?;
    }
    if let Some(value) = get(ENV_MAX_PROCESSING_SECS) {
        config.max_processing_time = parse_seconds(ENV_MAX_PROCESSING_SECS, &value)?;
    }
    if let Some(value) = get(ENV_LISTEN_ADDR) {
        config.listen_addr = if value.eq_ignore_ascii_case("off") {
            None
        } else {
            Some(value)
        };
    }
    Ok(())
}

/// Parses `url[=weight][,url[=weight]...]`.
fn parse_queue_urls(value: &str) -> Result<Vec<QueueConfig>, WorkerError> {
    let mut queues = Vec::new();
    for item in value.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let (url, weight) = match item.rsplit_once('=') {
            Some((url, weight)) => {
                let weight = weight.trim().parse::<u32>().map_err(|_| WorkerError::Setting {
                    setting: ENV_QUEUE_URL.to_owned(),
                    problem: format!(
                        "{item:?}: the weight after '=' must be a whole number of at least 1 \
                         (e.g. https://sqs.us-east-1.amazonaws.com/123456789012/emails=3)"
                    ),
                })?;
                (url.trim(), weight)
            }
            None => (item, 1),
        };
        queues.push(QueueConfig {
            url: url.to_owned(),
            weight,
        });
    }
    if queues.is_empty() {
        return Err(WorkerError::Setting {
            setting: ENV_QUEUE_URL.to_owned(),
            problem: "lists no queue URL: set one URL, or comma-separated URLs with optional =weight".into(),
        });
    }
    Ok(queues)
}

fn parse_number(name: &str, value: &str) -> Result<u64, WorkerError> {
    value.parse::<u64>().map_err(|_| WorkerError::Setting {
        setting: name.to_owned(),
        problem: format!("{value:?} is not a whole number"),
    })
}

fn parse_seconds(name: &str, value: &str) -> Result<Duration, WorkerError> {
    let seconds = value.parse::<f64>().map_err(|_| WorkerError::Setting {
        setting: name.to_owned(),
        problem: format!("{value:?} is not a number of seconds"),
    })?;
    Duration::try_from_secs_f64(seconds).map_err(|_| WorkerError::Setting {
        setting: name.to_owned(),
        problem: format!("{value:?} is not a non-negative number of seconds"),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;

    use super::*;

    const URL: &str = "http://127.0.0.1:4566/000000000000/jobs";

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn env_alone_is_enough() {
        let config = load_config_with(
            None,
            env(&[
                (ENV_QUEUE_URL, URL),
                (ENV_MAX_IN_FLIGHT, "7"),
                (ENV_VISIBILITY_TIMEOUT_SECS, "30"),
                (ENV_DRAIN_DEADLINE_SECS, "10"),
                (ENV_MAX_PROCESSING_SECS, "600"),
                (ENV_LISTEN_ADDR, "off"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.queues,
            vec![QueueConfig {
                url: URL.into(),
                weight: 1
            }]
        );
        assert_eq!(config.max_in_flight, 7);
        assert_eq!(config.visibility_timeout, Duration::from_secs(30));
        assert_eq!(config.drain_deadline, Duration::from_secs(10));
        assert_eq!(config.max_processing_time, Duration::from_secs(600));
        assert_eq!(config.listen_addr, None);
    }

    #[test]
    fn several_queues_with_weights() {
        let value = format!("{URL}-high=5, {URL}-low");
        let config = load_config_with(None, env(&[(ENV_QUEUE_URL, &value)])).unwrap();
        let weights: Vec<(String, u32)> = config.queues.iter().map(|q| (q.url.clone(), q.weight)).collect();
        assert_eq!(
            weights,
            vec![(format!("{URL}-high"), 5), (format!("{URL}-low"), 1)]
        );
    }

    #[test]
    fn errors_name_the_variable() {
        let error = load_config_with(None, env(&[(ENV_QUEUE_URL, URL), (ENV_MAX_IN_FLIGHT, "lots")]))
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(ENV_MAX_IN_FLIGHT), "{error}");
        let error = load_config_with(None, env(&[(ENV_QUEUE_URL, &format!("{URL}=high"))]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(ENV_QUEUE_URL) && error.contains("weight"),
            "{error}"
        );
    }

    #[test]
    fn validation_runs_after_overrides() {
        let error = load_config_with(None, env(&[])).unwrap_err().to_string();
        assert!(error.contains("CONVEYOR_QUEUE_URL"), "{error}");
        let error = load_config_with(
            None,
            env(&[(ENV_QUEUE_URL, URL), (ENV_DRAIN_DEADLINE_SECS, "45")]),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("drain_deadline"), "{error}");
    }

    #[test]
    fn file_then_env() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "max_in_flight = 50\npriority = \"strict\"\nlisten_addr = \"0.0.0.0:9100\"\n\n\
             [[queues]]\nurl = \"{URL}-high\"\nweight = 10\n\n[[queues]]\nurl = \"{URL}-low\"\n"
        )
        .unwrap();
        let config = load_config_with(Some(&file.0), env(&[(ENV_MAX_IN_FLIGHT, "60")])).unwrap();
        assert_eq!(config.max_in_flight, 60);
        assert_eq!(config.queues.len(), 2);
        assert_eq!(config.queues[0].weight, 10);
        assert_eq!(config.priority, conveyor_core::config::PriorityMode::Strict);
        assert_eq!(config.listen_addr.as_deref(), Some("0.0.0.0:9100"));
        std::fs::remove_file(&file.0).unwrap();
    }

    #[test]
    fn unknown_fields_in_the_file_are_named() {
        let mut file = tempfile();
        writeln!(file.1, "max_inflight = 50\n[[queues]]\nurl = \"{URL}\"\n").unwrap();
        let error = load_config_with(Some(&file.0), env(&[])).unwrap_err().to_string();
        assert!(error.contains("max_inflight"), "{error}");
        std::fs::remove_file(&file.0).unwrap();
    }

    fn tempfile() -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("conveyor-worker-{}.toml", fastrand::u64(..)));
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}
