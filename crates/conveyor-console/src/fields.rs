//! A submitted form as name/value pairs (forms here repeat names: one `id` per selected message), and
//! the typed reading of its values: every handler parses what it uses into its type before it acts, and
//! a value that does not parse is refused with a [`FieldError`] that names the field. A malformed value
//! never counts as absent: absent means "not given", a bad value means "nothing is done".

use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use crate::html::problem;

/// The fields of an `application/x-www-form-urlencoded` body or query, in order.
#[derive(Debug, Default, Deserialize)]
#[serde(transparent)]
pub(crate) struct Fields(Vec<(String, String)>);

/// A field whose value cannot be used: which field, what it held, and what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    /// The field's name, as the form sends it.
    pub(crate) field: &'static str,
    /// Its value, as given (shortened when long).
    pub(crate) given: String,
    /// What it must be.
    pub(crate) expected: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the field {:?} is {:?}, which cannot be used: it must be {}",
            self.field, self.given, self.expected
        )
    }
}

impl FieldError {
    /// A field `field` holding `given`, which must be `expected`.
    pub(crate) fn new(field: &'static str, given: &str, expected: impl Into<String>) -> Self {
        let given = match given.char_indices().nth(64) {
            Some((end, _)) => format!("{}…", &given[..end]),
            None => given.to_owned(),
        };
        Self {
            field,
            given,
            expected: expected.into(),
        }
    }

    /// The 400 page saying so, titled `title`: nothing was done.
    pub(crate) fn refusal(&self, title: &str) -> Response {
        problem(
            StatusCode::BAD_REQUEST,
            title,
            &format!("Nothing was done: {self}. Correct it and submit again."),
        )
    }
}

impl Fields {
    /// Fields from name/value pairs (tests and confirmations).
    #[cfg(test)]
    pub(crate) fn of(pairs: &[(&str, &str)]) -> Self {
        Self(
            pairs
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
        )
    }

    /// Fields from owned name/value pairs (tests).
    #[cfg(test)]
    pub(crate) fn of_owned(pairs: Vec<(String, String)>) -> Self {
        Self(pairs)
    }

    /// The name/value pairs, in order (tests).
    #[cfg(test)]
    pub(crate) fn pairs(&self) -> Vec<(String, String)> {
        self.0.clone()
    }

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

    /// `name` as a whole number from `min` to `max` (`unit` says of what, for the message): `Ok(None)`
    /// when absent or blank, `Err` naming the field when it is anything but such a number (a sign, a
    /// fraction, a number out of range).
    pub(crate) fn whole(
        &self,
        name: &'static str,
        min: u64,
        max: u64,
        unit: &str,
    ) -> Result<Option<u64>, FieldError> {
        let Some(text) = self.get(name) else {
            return Ok(None);
        };
        let expected = || format!("a whole number of {unit} from {min} to {max}");
        if !text.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(FieldError::new(name, text, expected()));
        }
        match text.parse::<u64>() {
            Ok(number) if (min..=max).contains(&number) => Ok(Some(number)),
            _ => Err(FieldError::new(name, text, expected())),
        }
    }

    /// `name` as one of `choices`: `Ok(None)` when absent or blank, `Err` naming the field otherwise.
    pub(crate) fn choice(
        &self,
        name: &'static str,
        choices: &[&'static str],
    ) -> Result<Option<&'static str>, FieldError> {
        let Some(text) = self.get(name) else {
            return Ok(None);
        };
        choices
            .iter()
            .find(|choice| **choice == text)
            .copied()
            .map(Some)
            .ok_or_else(|| FieldError::new(name, text, format!("one of {}", choices.join(", "))))
    }

    /// Every field except the CSRF value and `confirm`, to carry through a confirmation form.
    pub(crate) fn carried(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .iter()
            .filter(|(key, _)| key != "csrf" && key != "confirm")
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_number_is_an_error_naming_the_field_never_an_absent_one() {
        let fields = Fields::of(&[
            ("older", "-1"),
            ("newer", "200000000000000000000000"),
            ("max", " 7 "),
            ("rate", ""),
            ("half", "1.5"),
            ("plus", "+3"),
        ]);
        let error = fields.whole("older", 0, 10, "minutes").unwrap_err();
        assert_eq!(error.field, "older");
        assert!(error.to_string().contains("\"older\""), "{error}");
        assert!(fields.whole("newer", 0, 10, "minutes").is_err());
        assert_eq!(fields.whole("max", 1, 200, "messages"), Ok(Some(7)));
        assert_eq!(fields.whole("rate", 1, 500, "messages"), Ok(None));
        assert_eq!(fields.whole("absent", 1, 500, "messages"), Ok(None));
        assert!(fields.whole("half", 0, 10, "seconds").is_err());
        assert!(fields.whole("plus", 0, 10, "seconds").is_err());
        assert!(
            fields.whole("max", 8, 200, "messages").is_err(),
            "below the range"
        );
    }
}
