//! Configuration errors shared by the runtimes' settings (`conveyor_worker::config::WorkerConfig`,
//! `conveyor_lambda::LambdaConfig`), validated at start-up with errors that say what to change, and
//! the serde forms of their durations.

use std::fmt;

/// One invalid setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The setting's name, as in the config file.
    pub field: String,
    /// What is wrong and what to change.
    pub problem: String,
}

/// Every invalid setting found, so one start-up shows them all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The problems, in field order.
    pub problems: Vec<ConfigProblem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration:")?;
        for problem in &self.problems {
            write!(f, "\n  - {}: {}", problem.field, problem.problem)?;
        }
        Ok(())
    }
}

/// Collects problems while validating, so one start-up reports them all.
#[derive(Debug, Default)]
pub struct Problems(Vec<ConfigProblem>);

impl Problems {
    /// Records `problem` for `field` unless `ok`.
    pub fn check(&mut self, ok: bool, field: &str, problem: impl FnOnce() -> String) {
        if !ok {
            self.0.push(ConfigProblem {
                field: field.to_owned(),
                problem: problem(),
            });
        }
    }

    /// Every problem recorded, or `Ok` when there is none.
    pub fn finish(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: self.0 })
        }
    }
}
/// Serialises a `Duration` as whole seconds (accepting fractions).
pub mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// The serde `with` function.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(value.as_secs_f64())
    }

    /// The serde `with` function.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let seconds = f64::deserialize(deserializer)?;
        Duration::try_from_secs_f64(seconds).map_err(serde::de::Error::custom)
    }
}

/// Serialises an optional `Duration` as whole seconds (accepting fractions).
pub mod optional_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// The serde `with` function.
    pub fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_some(&value.as_secs_f64()),
            None => serializer.serialize_none(),
        }
    }

    /// The serde `with` function.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        match Option::<f64>::deserialize(deserializer)? {
            Some(seconds) => Duration::try_from_secs_f64(seconds)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

/// Serialises a `Duration` as milliseconds.
pub mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// The serde `with` function.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(value.as_millis() as u64)
    }

    /// The serde `with` function.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(deserializer)?))
    }
}
