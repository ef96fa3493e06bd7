//! Walking Terraform files parsed by the `hcl` crate: finding modules and files, blocks, attributes
//! and literals. Used by `tests/tests/infra.rs` to hold `infra/` to the code.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use hcl::expr::TemplateExpr;
use hcl::{Block, Body, Expression};

// ---------------------------------------------------------------------------------------------
// Finding and parsing files
// ---------------------------------------------------------------------------------------------

/// The repository's `infra/` folder.
pub fn infra_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../infra")
}

/// `infra/modules/<name>`.
pub fn module_dir(name: &str) -> PathBuf {
    infra_dir().join("modules").join(name)
}

/// Every file under `dir` (recursively) whose name ends with one of `suffixes`, sorted.
/// `.terraform` directories (left by `terraform init`) hold downloaded code, not ours: skipped.
pub fn files_under(dir: &Path, suffixes: &[&str]) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = fs::read_dir(&current).with_context(|| format!("cannot list {}", current.display()))?;
        for entry in entries {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                if name != ".terraform" {
                    pending.push(path);
                }
            } else if suffixes.iter().any(|suffix| name.ends_with(suffix)) {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// One `.tf` file, parsed.
pub fn parse_file(path: &Path) -> Result<Body> {
    let text = fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    hcl::parse(&text).with_context(|| format!("{} does not parse as HCL", path.display()))
}

/// The `.tf` files directly in `dir` (one Terraform module), parsed.
pub fn parse_module(dir: &Path) -> Result<Vec<Body>> {
    let mut bodies = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "tf") {
            bodies.push(parse_file(&path)?);
        }
    }
    ensure!(!bodies.is_empty(), "no .tf files in {}", dir.display());
    Ok(bodies)
}

// ---------------------------------------------------------------------------------------------
// Walking the syntax tree
// ---------------------------------------------------------------------------------------------

/// Blocks of one kind (`resource`, `statement`, ...) directly in `body`.
pub fn blocks<'a>(body: &'a Body, identifier: &'a str) -> impl Iterator<Item = &'a Block> + 'a {
    body.blocks()
        .filter(move |block| block.identifier() == identifier)
}

/// Blocks of one kind across the files of a module.
pub fn blocks_in<'a>(bodies: &'a [Body], identifier: &'a str) -> impl Iterator<Item = &'a Block> + 'a {
    bodies.iter().flat_map(move |body| blocks(body, identifier))
}

/// A block's first label (`resource "<this>" "name"`).
pub fn first_label(block: &Block) -> Option<&str> {
    block.labels().first().map(|label| label.as_str())
}

/// The one `resource "<kind>"` block of a module.
pub fn single_resource<'a>(bodies: &'a [Body], kind: &str) -> Result<&'a Block> {
    let found: Vec<&Block> = blocks_in(bodies, "resource")
        .filter(|block| first_label(block) == Some(kind))
        .collect();
    match found.as_slice() {
        [block] => Ok(block),
        _ => bail!("expected exactly one resource \"{kind}\", found {}", found.len()),
    }
}

/// The one nested block of a kind (`ttl`, `lifecycle`, ...) in `body`.
pub fn single_block<'a>(body: &'a Body, identifier: &str) -> Result<&'a Block> {
    let found: Vec<&Block> = body
        .blocks()
        .filter(|block| block.identifier() == identifier)
        .collect();
    match found.as_slice() {
        [block] => Ok(block),
        _ => bail!("expected exactly one `{identifier}` block, found {}", found.len()),
    }
}

/// The expression of attribute `key` directly in `body`.
pub fn attr<'a>(body: &'a Body, key: &str) -> Option<&'a Expression> {
    body.attributes()
        .find(|attribute| attribute.key() == key)
        .map(|attribute| attribute.expr())
}

/// [`attr`], or an error naming the missing attribute.
pub fn required_attr<'a>(body: &'a Body, key: &str) -> Result<&'a Expression> {
    attr(body, key).with_context(|| format!("attribute `{key}` is missing"))
}

/// A string literal, or the raw text of a quoted template such as `"${var.x}:*"`.
pub fn as_string(expr: &Expression) -> Option<String> {
    match expr {
        Expression::String(text) => Some(text.clone()),
        Expression::TemplateExpr(template) => match template.as_ref() {
            TemplateExpr::QuotedString(text) => Some(text.clone()),
            TemplateExpr::Heredoc(_) => None,
        },
        _ => None,
    }
}

/// A string attribute's value, or an error.
pub fn string_attr(body: &Body, key: &str) -> Result<String> {
    as_string(required_attr(body, key)?).with_context(|| format!("`{key}` is not a string literal"))
}

/// A whole-number literal.
pub fn as_number(expr: &Expression) -> Option<u64> {
    match expr {
        Expression::Number(number) => number.as_u64(),
        _ => None,
    }
}

/// `var.name` → `name`; `module.queue.visibility_timeout_seconds` → `["module", "queue", ...]`.
pub fn traversal_path(expr: &Expression) -> Option<Vec<String>> {
    let Expression::Traversal(traversal) = expr else {
        return None;
    };
    let Expression::Variable(root) = &traversal.expr else {
        return None;
    };
    let mut path = vec![root.as_str().to_owned()];
    for operator in &traversal.operators {
        match operator {
            hcl::expr::TraversalOperator::GetAttr(name) => path.push(name.as_str().to_owned()),
            _ => return None,
        }
    }
    Some(path)
}

/// Every string literal inside `expr`, however deeply nested (lists, function arguments,
/// conditionals, ...). Template strings come back as their raw text.
pub fn string_literals(expr: &Expression, out: &mut Vec<String>) {
    if let Some(text) = as_string(expr) {
        out.push(text);
        return;
    }
    match expr {
        Expression::Array(items) => items.iter().for_each(|item| string_literals(item, out)),
        Expression::Object(object) => object.values().for_each(|value| string_literals(value, out)),
        Expression::FuncCall(call) => call.args.iter().for_each(|arg| string_literals(arg, out)),
        Expression::Parenthesis(inner) => string_literals(inner, out),
        Expression::Conditional(conditional) => {
            string_literals(&conditional.true_expr, out);
            string_literals(&conditional.false_expr, out);
        }
        Expression::ForExpr(for_expr) => {
            string_literals(&for_expr.collection_expr, out);
            string_literals(&for_expr.value_expr, out);
        }
        _ => {}
    }
}

/// The `default` of `variable "<name>"` in a module.
pub fn variable_default<'a>(bodies: &'a [Body], name: &str) -> Result<&'a Expression> {
    let variable = blocks_in(bodies, "variable")
        .find(|block| first_label(block) == Some(name))
        .with_context(|| format!("variable \"{name}\" is not declared"))?;
    attr(variable.body(), "default").with_context(|| format!("variable \"{name}\" has no default"))
}

/// The numeric `default` of `variable "<name>"`.
pub fn variable_default_number(bodies: &[Body], name: &str) -> Result<u64> {
    let default = variable_default(bodies, name)?;
    as_number(default).with_context(|| format!("variable \"{name}\"'s default is not a number"))
}
