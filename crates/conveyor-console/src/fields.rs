//! A submitted form as name/value pairs: forms here repeat names (one `id` per selected message).

use serde::Deserialize;

/// The fields of an `application/x-www-form-urlencoded` body or query, in order.
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub(crate) struct Fields(Vec<(String, String)>);

impl Fields {
    /// The first value of `name`, trimmed; `None` when absent or blank.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.trim())
            .filter(|value| !value.is_empty())
    }

    /// Every non-blank value of `name`.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(key, _)| key == name)
            .map(|(_, value)| value.trim())
            .filter(|value| !value.is_empty())
            .collect()
    }

    /// `name` as a number; `None` when absent, blank or not a number.
    pub(crate) fn number(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(|value| value.parse().ok())
    }

    /// Every field except the CSRF value and `confirm`, to carry through a confirmation form.
    pub(crate) fn carried(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .filter(|(key, _)| key != "csrf" && key != "confirm")
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }
}
