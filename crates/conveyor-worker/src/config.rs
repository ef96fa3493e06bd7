//! Loading the worker's configuration: a TOML file, then environment overrides, then validation.
//!
//! The file is read by `toml` into a whole [`WorkerConfig`] (its errors give the line and column);
//! `figment` then layers the environment's overrides on it and reads the result back strictly: a value
//! of the wrong type is an error naming its variable, never coerced (`off` is not 0 seconds). Every
//! `CONVEYOR_*` variable the worker reads is one entry of [`WORKER_VARIABLES`], which says which field it
//! overrides and in what form: that one list feeds both the overrides and the typo warning.

pub use crate::settings::{PriorityMode, QueueConfig, WorkerConfig};

use std::collections::BTreeMap;
use std::path::Path;

use figment::Figment;
use figment::error::Kind;
use figment::providers::Serialized;
use figment::value::{Dict, Empty, Tag, Value};

use crate::error::WorkerError;

/// `CONVEYOR_QUEUE_URL`: one queue URL (or name), or comma-separated URLs (or names) each with an
/// optional `=weight`. A name is resolved with `GetQueueUrl` in the worker's region.
pub const ENV_QUEUE_URL: &str = "CONVEYOR_QUEUE_URL";
/// `CONVEYOR_MAX_IN_FLIGHT`: messages in flight at once, across all queues.
pub(crate) const ENV_MAX_IN_FLIGHT: &str = "CONVEYOR_MAX_IN_FLIGHT";
/// `CONVEYOR_VISIBILITY_TIMEOUT_SECS`: the queues' visibility timeout in seconds.
pub const ENV_VISIBILITY_TIMEOUT_SECS: &str = "CONVEYOR_VISIBILITY_TIMEOUT_SECS";
/// `CONVEYOR_DRAIN_DEADLINE_SECS`: how long in-flight jobs may finish after SIGTERM, in seconds.
pub const ENV_DRAIN_DEADLINE_SECS: &str = "CONVEYOR_DRAIN_DEADLINE_SECS";
/// `CONVEYOR_LISTEN_ADDR`: the operations endpoint's address, or `off`.
pub const ENV_LISTEN_ADDR: &str = "CONVEYOR_LISTEN_ADDR";
/// `CONVEYOR_MAX_PROCESSING_SECS`: the longest a message is kept in flight by heartbeats, in seconds.
pub(crate) const ENV_MAX_PROCESSING_SECS: &str = "CONVEYOR_MAX_PROCESSING_SECS";
/// `CONVEYOR_STOP_TIMEOUT_SECS`: the platform's stop timeout (SIGTERM to SIGKILL), in seconds; shutdown
/// fits inside it, and the drain deadline defaults to what fits.
pub const ENV_STOP_TIMEOUT_SECS: &str = "CONVEYOR_STOP_TIMEOUT_SECS";
/// `CONVEYOR_TENANT_MAX_CONCURRENT`: at most this many jobs of one tenant at once in this worker.
pub const ENV_TENANT_MAX_CONCURRENT: &str = "CONVEYOR_TENANT_MAX_CONCURRENT";
/// `CONVEYOR_TENANT_PER_SECOND`: at most this many jobs of one tenant start a second in this worker.
pub const ENV_TENANT_PER_SECOND: &str = "CONVEYOR_TENANT_PER_SECOND";
/// `CONVEYOR_TENANT_METRICS_TOP`: how many tenants the per-tenant metrics name (the rest are `other`).
pub const ENV_TENANT_METRICS_TOP: &str = "CONVEYOR_TENANT_METRICS_TOP";
/// `CONVEYOR_CONFIG`: the config file (the binaries' `--config`).
pub(crate) const ENV_CONFIG: &str = "CONVEYOR_CONFIG";

/// One `CONVEYOR_*` environment variable the worker reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variable {
    /// The variable's name.
    pub name: &'static str,
    /// The form of its value, and the [`WorkerConfig`] field it overrides.
    pub form: Form,
}

/// The form of a variable's value and what it sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Form {
    /// A whole number, for this field.
    Whole(&'static str),
    /// Seconds (fractions allowed, not negative), for this field.
    Seconds(&'static str),
    /// A number (fractions allowed), for this field.
    Decimal(&'static str),
    /// `url[=weight][,url[=weight]...]`, for `queues`.
    QueueUrls,
    /// An address, or `off` for none, for `listen_addr`.
    AddressOrOff,
    /// The config file's path: read before the file, no field.
    ConfigPath,
}

impl Variable {
    const fn new(name: &'static str, form: Form) -> Self {
        Self { name, form }
    }
}

impl Form {
    /// The [`WorkerConfig`] field a variable of this form overrides.
    pub fn field(self) -> Option<&'static str> {
        match self {
            Form::Whole(field) | Form::Seconds(field) | Form::Decimal(field) => Some(field),
            Form::QueueUrls => Some("queues"),
            Form::AddressOrOff => Some("listen_addr"),
            Form::ConfigPath => None,
        }
    }
}

/// Every `CONVEYOR_*` environment variable the worker reads, with the field each overrides: the one
/// list to extend when the worker starts reading another. It drives the overrides, and at start-up any
/// other `CONVEYOR_*` name in the environment is reported as a likely typo, with the closest name from
/// this list (and [`OTHER_CONVEYOR_VARIABLES`]).
pub const WORKER_VARIABLES: &[Variable] = &[
    Variable::new(ENV_QUEUE_URL, Form::QueueUrls),
    Variable::new(ENV_MAX_IN_FLIGHT, Form::Whole("max_in_flight")),
    Variable::new(ENV_VISIBILITY_TIMEOUT_SECS, Form::Seconds("visibility_timeout")),
    Variable::new(ENV_DRAIN_DEADLINE_SECS, Form::Seconds("drain_deadline")),
    Variable::new(ENV_LISTEN_ADDR, Form::AddressOrOff),
    Variable::new(ENV_MAX_PROCESSING_SECS, Form::Seconds("max_processing_time")),
    Variable::new(ENV_STOP_TIMEOUT_SECS, Form::Seconds("stop_timeout")),
    Variable::new(ENV_TENANT_MAX_CONCURRENT, Form::Whole("tenants.max_concurrent")),
    Variable::new(ENV_TENANT_PER_SECOND, Form::Decimal("tenants.per_second")),
    Variable::new(ENV_TENANT_METRICS_TOP, Form::Whole("tenants.metrics_top")),
    Variable::new(ENV_CONFIG, Form::ConfigPath),
];

/// `CONVEYOR_*` variables that other parts of Conveyor read and that a worker's environment may
/// carry (the binaries' log format, the idempotency table, the local stack's ports): never reported.
pub const OTHER_CONVEYOR_VARIABLES: &[&str] = &[
    conveyor_core::runtime::ENV_LOG_FORMAT,
    // Read by `run` (the store it builds when the pipeline has none), not by the config.
    conveyor_core::runtime::ENV_IDEMPOTENCY_TABLE,
    "CONVEYOR_PAYLOAD_BUCKET",
    "CONVEYOR_PAYLOAD_CLEANUP",
    "CONVEYOR_SQS_PORT",
    "CONVEYOR_DYNAMODB_PORT",
];

/// A worker configuration and what start-up should warn about.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoadedConfig {
    /// The validated configuration.
    pub config: WorkerConfig,
    /// `CONVEYOR_*` variables set in the environment that nothing reads (most likely typos).
    pub unknown_variables: Vec<UnknownVariable>,
}

/// A `CONVEYOR_*` environment variable that nothing reads: most likely a typo, and its value ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVariable {
    /// The variable's name.
    pub name: String,
    /// The closest known name, when one is close enough to be the intended one.
    pub closest: Option<String>,
}

impl std::fmt::Display for UnknownVariable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is set but not read by the worker, so it has no effect",
            self.name
        )?;
        match &self.closest {
            Some(closest) => write!(f, "; did you mean {closest}?"),
            None => {
                let names: Vec<&str> = WORKER_VARIABLES.iter().map(|variable| variable.name).collect();
                write!(f, "; the worker reads {}", names.join(", "))
            }
        }
    }
}

/// Loads the worker config: the TOML file at `path` (defaults when `None`), then the `CONVEYOR_*`
/// environment overrides, then [`WorkerConfig::validate`]. Unknown `CONVEYOR_*` variables are logged
/// as warnings naming the closest known variable.
///
/// Errors name the file field or the environment variable and say what to change.
pub fn load_config(path: Option<&Path>) -> Result<WorkerConfig, WorkerError> {
    load_config_reading(path, &[])
}

/// [`load_config`] for an application that reads `CONVEYOR_*` variables of its own
/// (`app_variables`): those are not reported as unknown.
pub fn load_config_reading(path: Option<&Path>, app_variables: &[&str]) -> Result<WorkerConfig, WorkerError> {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .collect();
    let loaded = load_config_with(path, &env, app_variables)?;
    for unknown in &loaded.unknown_variables {
        tracing::warn!(
            variable = %unknown.name,
            did_you_mean = unknown.closest.as_deref().unwrap_or("-"),
            "an environment variable starting with CONVEYOR_ is not one the worker reads (a typo?); it is ignored"
        );
    }
    Ok(loaded.config)
}

/// [`load_config_reading`] with the environment given as a map (for tests and embedding): returns
/// the unknown variables instead of logging them.
pub fn load_config_with(
    path: Option<&Path>,
    env: &BTreeMap<String, String>,
    app_variables: &[&str],
) -> Result<LoadedConfig, WorkerError> {
    let base = match path {
        Some(path) => read_file(path)?,
        None => WorkerConfig::default(),
    };
    let config: WorkerConfig = Figment::from(Serialized::defaults(base))
        .merge(Serialized::defaults(overrides(env)?))
        .extract()
        .map_err(|error| explain(error, env))?;
    config.validate()?;
    let unknown_variables = unknown_variables(env.keys().map(String::as_str), app_variables);
    Ok(LoadedConfig {
        config,
        unknown_variables,
    })
}

/// The `CONVEYOR_*` names in `names` that are neither the worker's, Conveyor's other variables nor
/// `app_variables`, each with the closest known name when it is close enough to be the intended one.
pub(crate) fn unknown_variables<'a>(
    names: impl IntoIterator<Item = &'a str>,
    app_variables: &[&str],
) -> Vec<UnknownVariable> {
    let known: Vec<&str> = WORKER_VARIABLES
        .iter()
        .map(|variable| variable.name)
        .chain(OTHER_CONVEYOR_VARIABLES.iter().copied())
        .chain(app_variables.iter().copied())
        .collect();
    names
        .into_iter()
        .filter(|name| name.starts_with("CONVEYOR_") && !known.contains(name))
        .map(|name| UnknownVariable {
            name: name.to_owned(),
            closest: closest(name, &known).map(str::to_owned),
        })
        .collect()
}

/// The known name nearest to `name` by edit distance (Levenshtein), if at most half of the part after
/// `CONVEYOR_` differs (`CONVEYOR_MAX_INFLIGHT` → `CONVEYOR_MAX_IN_FLIGHT`; `CONVEYOR_COLOUR` → none).
fn closest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let suffix = |name: &'k str| name.strip_prefix("CONVEYOR_").unwrap_or(name);
    let wanted = name.strip_prefix("CONVEYOR_").unwrap_or(name);
    known
        .iter()
        .map(|candidate| {
            let candidate_suffix = suffix(candidate);
            let distance = strsim::levenshtein(wanted, candidate_suffix);
            let longer = wanted.chars().count().max(candidate_suffix.chars().count());
            (distance, longer, *candidate)
        })
        .filter(|(distance, longer, _)| distance * 2 <= *longer)
        .min_by_key(|(distance, _, _)| *distance)
        .map(|(_, _, candidate)| candidate)
}

/// The file's settings, defaults for the fields it leaves out (errors name the file, line and column).
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

/// The variables of [`WORKER_VARIABLES`] set in `env`, with their values (blank counts as unset).
fn set_variables(env: &BTreeMap<String, String>) -> impl Iterator<Item = (&'static Variable, &str)> {
    WORKER_VARIABLES.iter().filter_map(|variable| {
        let value = env.get(variable.name)?.trim();
        (!value.is_empty()).then_some((variable, value))
    })
}

/// The environment's layer: each set variable's value under the field it overrides.
fn overrides(env: &BTreeMap<String, String>) -> Result<Dict, WorkerError> {
    let mut fields = Dict::new();
    for (variable, value) in set_variables(env) {
        let Some(field) = variable.form.field() else {
            continue;
        };
        let parsed = match variable.form {
            Form::QueueUrls => queue_urls(value)?,
            Form::AddressOrOff if value.eq_ignore_ascii_case("off") => {
                Value::Empty(Tag::Default, Empty::None)
            }
            // What does not parse stays text, which the extraction refuses for the field.
            Form::Whole(_) => value
                .parse::<u64>()
                .map_or_else(|_| Value::from(value), Value::from),
            Form::Seconds(_) | Form::Decimal(_) => value
                .parse::<f64>()
                .map_or_else(|_| Value::from(value), Value::from),
            Form::AddressOrOff | Form::ConfigPath => Value::from(value),
        };
        insert_at(&mut fields, field, parsed);
    }
    Ok(fields)
}

/// Inserts `value` at the dotted `path` (`tenants.max_concurrent` is `max_concurrent` in `tenants`).
fn insert_at(fields: &mut Dict, path: &str, value: Value) {
    let Some((table, rest)) = path.split_once('.') else {
        fields.insert(path.to_owned(), value);
        return;
    };
    let entry = fields
        .entry(table.to_owned())
        .or_insert_with(|| Value::from(Dict::new()));
    if let Value::Dict(_, inner) = entry {
        insert_at(inner, rest, value);
    }
}

/// `error` from reading the layers back, naming the variable whose value it is about (the file's values
/// were read by `toml` already).
fn explain(error: figment::Error, env: &BTreeMap<String, String>) -> WorkerError {
    let path = error.path.join(".");
    let Some((variable, value)) = set_variables(env).find(|(variable, _)| {
        variable
            .form
            .field()
            .is_some_and(|field| field == path || error.path.first().is_some_and(|first| first == field))
    }) else {
        return WorkerError::Setting {
            setting: error.path.join("."),
            problem: error.kind.to_string(),
        };
    };
    let problem = match (variable.form, &error.kind) {
        (Form::Whole(_), _) => format!("{value:?} is not a whole number"),
        (Form::Seconds(_), Kind::InvalidType(..)) => format!("{value:?} is not a number of seconds"),
        (Form::Seconds(_), _) => format!("{value:?} is not a non-negative number of seconds"),
        (Form::Decimal(_), _) => format!("{value:?} is not a number"),
        _ => format!("{value:?}: {}", error.kind),
    };
    WorkerError::Setting {
        setting: variable.name.to_owned(),
        problem,
    }
}

/// Parses `url[=weight][,url[=weight]...]` into `queues`' value.
fn queue_urls(value: &str) -> Result<Value, WorkerError> {
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
    Value::serialize(&queues).map_err(|error| WorkerError::Setting {
        setting: ENV_QUEUE_URL.to_owned(),
        problem: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    const URL: &str = "http://127.0.0.1:4566/000000000000/jobs";

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Loads with no application variables; the config only.
    fn load(path: Option<&Path>, env: BTreeMap<String, String>) -> Result<WorkerConfig, WorkerError> {
        load_config_with(path, &env, &[]).map(|loaded| loaded.config)
    }

    #[test]
    fn env_alone_is_enough() {
        let config = load(
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
        assert_eq!(config.visibility_timeout, Some(Duration::from_secs(30)));
        assert_eq!(config.drain_deadline, Some(Duration::from_secs(10)));
        assert_eq!(config.max_processing_time, Duration::from_secs(600));
        assert_eq!(config.listen_addr, None);
    }

    #[test]
    fn several_queues_with_weights() {
        let value = format!("{URL}-high=5, {URL}-low");
        let config = load(None, env(&[(ENV_QUEUE_URL, &value)])).unwrap();
        let weights: Vec<(String, u32)> = config.queues.iter().map(|q| (q.url.clone(), q.weight)).collect();
        assert_eq!(
            weights,
            vec![(format!("{URL}-high"), 5), (format!("{URL}-low"), 1)]
        );
    }

    #[test]
    fn errors_name_the_variable() {
        let error = load(None, env(&[(ENV_QUEUE_URL, URL), (ENV_MAX_IN_FLIGHT, "lots")]))
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(ENV_MAX_IN_FLIGHT), "{error}");
        let error = load(None, env(&[(ENV_QUEUE_URL, &format!("{URL}=high"))]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(ENV_QUEUE_URL) && error.contains("weight"),
            "{error}"
        );
    }

    #[test]
    fn validation_runs_after_overrides() {
        let error = load(None, env(&[])).unwrap_err().to_string();
        assert!(error.contains("CONVEYOR_QUEUE_URL"), "{error}");
        let error = load(
            None,
            env(&[(ENV_QUEUE_URL, URL), (ENV_DRAIN_DEADLINE_SECS, "45")]),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("drain_deadline"), "{error}");
    }

    /// The contract `infra/modules/ecs-consumer` relies on: any drain that leaves the shutdown reserve
    /// inside the stop timeout is accepted (a 60 s drain in a 90 s stop timeout, the case), one
    /// second more is refused naming both variables, and without a drain the worker takes all that fits.
    #[test]
    fn any_drain_that_fits_the_stop_timeout_is_accepted() {
        let reserve = conveyor_core::runtime::SHUTDOWN_RESERVE.as_secs();
        for (stop, drain) in [(90, 60), (90, 90 - reserve), (120, 113), (8, 0), (8, 1), (30, 23)] {
            let config = load(
                None,
                env(&[
                    (ENV_QUEUE_URL, URL),
                    (ENV_STOP_TIMEOUT_SECS, &stop.to_string()),
                    (ENV_DRAIN_DEADLINE_SECS, &drain.to_string()),
                ]),
            )
            .unwrap_or_else(|error| panic!("stop {stop} s, drain {drain} s refused: {error}"));
            assert_eq!(config.drain_deadline(), Duration::from_secs(drain));
        }
        for (stop, drain) in [(90, 90 - reserve + 1), (30, 24), (8, 2)] {
            let error = load(
                None,
                env(&[
                    (ENV_QUEUE_URL, URL),
                    (ENV_STOP_TIMEOUT_SECS, &stop.to_string()),
                    (ENV_DRAIN_DEADLINE_SECS, &drain.to_string()),
                ]),
            )
            .expect_err("a drain that does not fit must be refused")
            .to_string();
            assert!(
                error.contains("drain_deadline") && error.contains(ENV_STOP_TIMEOUT_SECS),
                "{error}"
            );
        }
        let config = load(None, env(&[(ENV_QUEUE_URL, URL), (ENV_STOP_TIMEOUT_SECS, "90")])).unwrap();
        assert_eq!(config.drain_deadline(), Duration::from_secs(90 - reserve));
        // A stop timeout of the reserve or less leaves no drain at all: refused.
        let error = load(
            None,
            env(&[
                (ENV_QUEUE_URL, URL),
                (ENV_STOP_TIMEOUT_SECS, &reserve.to_string()),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("stop_timeout"), "{error}");
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
        let config = load(Some(&file.0), env(&[(ENV_MAX_IN_FLIGHT, "60")])).unwrap();
        assert_eq!(config.max_in_flight, 60);
        assert_eq!(config.queues.len(), 2);
        assert_eq!(config.queues[0].weight, 10);
        assert_eq!(config.priority, crate::config::PriorityMode::Strict);
        assert_eq!(config.listen_addr.as_deref(), Some("0.0.0.0:9100"));
        std::fs::remove_file(&file.0).unwrap();
    }

    #[test]
    fn tenant_limits_from_the_file_and_the_environment() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "[[queues]]\nurl = \"{URL}\"\n\n[tenants]\nmax_concurrent = 4\ndefer = 750\n\n\
             [tenants.overrides.acme]\nmax_concurrent = 20\nper_second = 5.0\n"
        )
        .unwrap();
        let config = load(
            Some(&file.0),
            env(&[(ENV_TENANT_PER_SECOND, "2.5"), (ENV_TENANT_METRICS_TOP, "5")]),
        )
        .unwrap();
        std::fs::remove_file(&file.0).unwrap();
        let tenants = &config.tenants;
        assert_eq!(
            tenants.max_concurrent,
            Some(4),
            "the file's, kept beside the variables"
        );
        assert_eq!(tenants.per_second, Some(2.5));
        assert_eq!(tenants.metrics_top, 5);
        assert_eq!(tenants.defer, Duration::from_millis(750));
        let limits = tenants.limits();
        assert_eq!(limits.default.max_concurrent, Some(4));
        assert_eq!(limits.overrides["acme"].max_concurrent, Some(20));
        assert_eq!(limits.overrides["acme"].per_second, Some((5.0, 10)));

        let error = load(
            None,
            env(&[(ENV_QUEUE_URL, URL), (ENV_TENANT_MAX_CONCURRENT, "0")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("tenants") && error.contains("limit of 0"),
            "{error}"
        );
        let error = load(
            None,
            env(&[(ENV_QUEUE_URL, URL), (ENV_TENANT_PER_SECOND, "fast")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with(ENV_TENANT_PER_SECOND) && error.contains("not a number"),
            "{error}"
        );
    }

    /// A value is read as its variable's form or refused: never coerced (`off` is not 0 seconds, `yes`
    /// is not 1), and Rust's own number syntax is accepted as before (`1e2` seconds, `+7`).
    #[test]
    fn values_are_never_coerced() {
        for (name, value, problem) in [
            (ENV_MAX_IN_FLIGHT, "yes", "\"yes\" is not a whole number"),
            (ENV_MAX_IN_FLIGHT, "1.5", "\"1.5\" is not a whole number"),
            (
                ENV_DRAIN_DEADLINE_SECS,
                "off",
                "\"off\" is not a number of seconds",
            ),
            (
                ENV_STOP_TIMEOUT_SECS,
                "-5",
                "\"-5\" is not a non-negative number of seconds",
            ),
        ] {
            let error = load(None, env(&[(ENV_QUEUE_URL, URL), (name, value)]))
                .unwrap_err()
                .to_string();
            assert_eq!(error, format!("{name}: {problem}"));
        }
        let config = load(
            None,
            env(&[
                (ENV_QUEUE_URL, URL),
                (ENV_STOP_TIMEOUT_SECS, "1e2"),
                (ENV_MAX_IN_FLIGHT, " +7 "),
            ]),
        )
        .unwrap();
        assert_eq!(config.stop_timeout, Duration::from_secs(100));
        assert_eq!(config.max_in_flight, 7);
    }

    #[test]
    fn off_turns_off_the_files_listen_addr() {
        let mut file = tempfile();
        writeln!(
            file.1,
            "listen_addr = \"0.0.0.0:9100\"\nreceive_wait = 2.5\n[[queues]]\nurl = \"{URL}\"\n"
        )
        .unwrap();
        let config = load(Some(&file.0), env(&[(ENV_LISTEN_ADDR, "off")])).unwrap();
        assert_eq!(config.listen_addr, None);
        assert_eq!(
            config.receive_wait,
            Duration::from_millis(2500),
            "the file's values stand"
        );
        let config = load(Some(&file.0), env(&[(ENV_LISTEN_ADDR, ""), (ENV_CONFIG, "x")])).unwrap();
        assert_eq!(
            config.listen_addr.as_deref(),
            Some("0.0.0.0:9100"),
            "a blank value is unset"
        );
        std::fs::remove_file(&file.0).unwrap();
    }

    #[test]
    fn unknown_fields_in_the_file_are_named() {
        let mut file = tempfile();
        writeln!(file.1, "max_inflight = 50\n[[queues]]\nurl = \"{URL}\"\n").unwrap();
        let error = load(Some(&file.0), env(&[])).unwrap_err().to_string();
        assert!(error.contains("max_inflight"), "{error}");
        std::fs::remove_file(&file.0).unwrap();
    }

    #[test]
    fn a_misspelled_variable_is_reported_with_the_closest_name() {
        let loaded = load_config_with(
            None,
            &env(&[
                (ENV_QUEUE_URL, URL),
                ("CONVEYOR_MAX_INFLIGHT", "50"),
                ("CONVEYOR_DRAIN_DEADLINE", "10"),
                ("CONVEYOR_COLOUR", "blue"),
                ("CONVEYOR_LOG_FORMAT", "json"),
                ("CONVEYOR_SQS_PORT", "4567"),
                ("CONVEYOR_DEMO_OUTBOX", "outbox.jsonl"),
                ("AWS_REGION", "us-east-1"),
            ]),
            &["CONVEYOR_DEMO_OUTBOX"],
        )
        .unwrap();
        // The misspelled variable has no effect: the default stands.
        assert_eq!(loaded.config.max_in_flight, WorkerConfig::default().max_in_flight);
        let reported: Vec<(&str, Option<&str>)> = loaded
            .unknown_variables
            .iter()
            .map(|unknown| (unknown.name.as_str(), unknown.closest.as_deref()))
            .collect();
        assert_eq!(
            reported,
            vec![
                ("CONVEYOR_COLOUR", None),
                ("CONVEYOR_DRAIN_DEADLINE", Some(ENV_DRAIN_DEADLINE_SECS)),
                ("CONVEYOR_MAX_INFLIGHT", Some(ENV_MAX_IN_FLIGHT)),
            ]
        );
        let message = loaded.unknown_variables[2].to_string();
        assert!(
            message.contains("CONVEYOR_MAX_INFLIGHT")
                && message.contains("did you mean CONVEYOR_MAX_IN_FLIGHT?"),
            "{message}"
        );
        let message = loaded.unknown_variables[0].to_string();
        assert!(
            message.contains(ENV_QUEUE_URL),
            "lists what the worker reads: {message}"
        );
    }

    #[test]
    fn known_variables_are_not_reported() {
        let all = WORKER_VARIABLES
            .iter()
            .map(|variable| variable.name)
            .chain(OTHER_CONVEYOR_VARIABLES.iter().copied());
        assert!(unknown_variables(all, &[]).is_empty());
    }

    fn tempfile() -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("conveyor-worker-{}.toml", fastrand::u64(..)));
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}
