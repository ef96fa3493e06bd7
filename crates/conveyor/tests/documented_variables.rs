//! Every variable `docs/configuration.md` lists is read by the code that the guide says reads it: a
//! static check on the sources, so a documented setting that nothing reads (as
//! `CONVEYOR_IDEMPOTENCY_TABLE` was, issue 55) fails here instead of being silently ignored.
//!
//! The guide's table is the worker's (rows marked "(the example application" are read by the example
//! application); its "On Lambda:" paragraph lists the Lambda adapter's. A variable counts as read in a set
//! of crates when their non-test code calls `var(..)` / `var_os(..)` with it (the literal, or a `const`
//! holding it), or lists that `const` in the worker's variable table (`Variable::new(..)`). Naming it in a
//! message, a doc comment or the worker's list of variables it merely tolerates does not count.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Who the guide says reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reader {
    Worker,
    Lambda,
    ExampleApplication,
}

impl Reader {
    /// The source folders whose code must read the variable.
    fn folders(self) -> &'static [&'static str] {
        match self {
            // The shared names (the log format, the idempotency table) are constants in the core.
            Reader::Worker => &["crates/conveyor-worker/src", "crates/conveyor-core/src"],
            Reader::Lambda => &["crates/conveyor-lambda/src", "crates/conveyor-core/src"],
            // The example application, and the library calls it makes to read its settings.
            Reader::ExampleApplication => &["examples/src", "crates/conveyor-s3/src"],
        }
    }
}

/// The `CONVEYOR_*` names in `text` (a `CONVEYOR_TENANT_*` wildcard stays as `CONVEYOR_TENANT_`).
fn names_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("CONVEYOR_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// What the guide documents: (variable, who reads it).
fn documented() -> BTreeSet<(String, Reader)> {
    let guide = std::fs::read_to_string(root().join("docs/configuration.md"))
        .unwrap_or_else(|error| panic!("reading docs/configuration.md: {error}"));
    let mut documented = BTreeSet::new();
    let mut table_names = Vec::new();
    for row in guide.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(variable), Some(meaning)) = (cells.get(1), cells.get(3)) else {
            continue;
        };
        let reader = if meaning.starts_with("(the example application") {
            Reader::ExampleApplication
        } else {
            Reader::Worker
        };
        for name in names_in(variable) {
            table_names.push(name.clone());
            documented.insert((name, reader));
        }
    }
    let lambda: String = guide
        .lines()
        .skip_while(|line| !line.starts_with("On Lambda:"))
        .take_while(|line| !line.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!lambda.is_empty(), "the guide's \"On Lambda:\" paragraph is gone");
    for name in names_in(&lambda) {
        if name.ends_with('_') {
            // `CONVEYOR_TENANT_*`: the table's variables of that prefix.
            for full in table_names.iter().filter(|full| full.starts_with(&name)) {
                documented.insert((full.clone(), Reader::Lambda));
            }
        } else {
            documented.insert((name, Reader::Lambda));
        }
    }
    documented
}

/// The non-test, non-comment lines of the `.rs` files under `folder`.
fn code_lines(folder: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let mut folders = vec![folder.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder)
            .unwrap_or_else(|error| panic!("reading {}: {error}", folder.display()))
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|extension| extension != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
            let mut previous_is_cfg_test = false;
            for line in text.lines() {
                let trimmed = line.trim();
                // A `#[cfg(test)] mod tests` ends the file's code.
                if previous_is_cfg_test
                    && (trimmed.starts_with("mod ") || trimmed.starts_with("pub(crate) mod "))
                {
                    lines.pop();
                    break;
                }
                previous_is_cfg_test = trimmed == "#[cfg(test)]";
                if !trimmed.starts_with("//") {
                    lines.push(trimmed.to_owned());
                }
            }
        }
    }
    lines
}

/// The arguments of every `var(`, `var_os(` and `Variable::new(` call in `line`, each reduced to its last
/// path segment (`conveyor_core::runtime::ENV_LOG_FORMAT` → `ENV_LOG_FORMAT`).
fn read_arguments(line: &str) -> Vec<String> {
    let mut arguments = Vec::new();
    for call in ["var(", "var_os(", "Variable::new("] {
        let mut rest = line;
        while let Some(at) = rest.find(call) {
            let before = rest[..at].chars().last();
            let tail = &rest[at + call.len()..];
            rest = tail;
            // `env_var(` or `my_var(` are other functions.
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let end = tail.find([')', ',']).unwrap_or(tail.len());
            let argument = tail[..end].trim().trim_start_matches('&');
            let last = argument.rsplit("::").next().unwrap_or(argument);
            arguments.push(last.trim_matches('"').to_owned());
        }
    }
    arguments
}

/// The `const` names holding `variable` in `lines` (`const ENV_X: &str = "CONVEYOR_X";`).
fn constants_holding(lines: &[String], variable: &str) -> Vec<String> {
    let literal = format!("\"{variable}\";");
    lines
        .iter()
        .filter(|line| line.contains("const ") && line.ends_with(&literal))
        .filter_map(|line| {
            let after = &line[line.find("const ")? + "const ".len()..];
            Some(after[..after.find(':')?].trim().to_owned())
        })
        .collect()
}

fn is_read(variable: &str, reader: Reader) -> bool {
    let lines: Vec<String> = reader
        .folders()
        .iter()
        .flat_map(|folder| code_lines(&root().join(folder)))
        .collect();
    let mut accepted = constants_holding(&lines, variable);
    accepted.push(variable.to_owned());
    lines
        .iter()
        .flat_map(|line| read_arguments(line))
        .any(|argument| accepted.contains(&argument))
}

#[test]
fn every_documented_variable_is_read_by_what_the_guide_says_reads_it() {
    let documented = documented();
    assert!(
        documented.len() > 20,
        "the guide's variables were not found: {documented:?}"
    );
    let unread: Vec<String> = documented
        .iter()
        .filter(|(variable, reader)| !is_read(variable, *reader))
        .map(|(variable, reader)| format!("{variable} ({reader:?})"))
        .collect();
    assert!(
        unread.is_empty(),
        "docs/configuration.md lists variables that nothing of theirs reads (read them, refuse them, or \
         take them out of the guide): {unread:?}"
    );
}

#[test]
fn the_check_tells_a_read_from_a_mention() {
    assert_eq!(
        read_arguments("let table = std::env::var(ENV_IDEMPOTENCY_TABLE).ok();"),
        vec!["ENV_IDEMPOTENCY_TABLE"]
    );
    assert_eq!(
        read_arguments("if let Some(value) = var(conveyor_core::runtime::X) {"),
        vec!["X"]
    );
    assert_eq!(
        read_arguments("Variable::new(ENV_QUEUE_URL, Form::QueueUrls),"),
        vec!["ENV_QUEUE_URL"]
    );
    assert!(read_arguments("\"CONVEYOR_IDEMPOTENCY_TABLE\",").is_empty());
    assert!(read_arguments("let x = my_var(\"CONVEYOR_A\");").is_empty());
    assert_eq!(
        constants_holding(
            &["pub const ENV_A: &str = \"CONVEYOR_A\";".to_owned()],
            "CONVEYOR_A"
        ),
        vec!["ENV_A"]
    );
}
