//! `conveyor completions <shell>` and `conveyor man --out DIR`: the shell's completion script and the
//! man pages, generated from the same clap definitions as `--help` (they cannot drift from the binary).
//! Both run offline: no AWS configuration is loaded.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

use crate::cli::Cli;

/// Arguments of `conveyor completions`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  conveyor completions bash > ~/.local/share/bash-completion/completions/conveyor
  conveyor completions zsh > \"${fpath[1]}/_conveyor\"
  conveyor completions fish > ~/.config/fish/completions/conveyor.fish")]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Arguments of `conveyor man`.
#[derive(Debug, Args)]
#[command(after_help = "Example:
  conveyor man --out ~/.local/share/man/man1 && man conveyor-dlq-redrive")]
pub(crate) struct ManArgs {
    /// Directory to write the pages into (created if absent): conveyor.1 and one page per
    /// subcommand, e.g. conveyor-dlq-redrive.1.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Prints the completion script for `args.shell` on stdout.
pub(crate) fn completions(args: &CompletionsArgs) -> anyhow::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "conveyor", &mut script);
    crate::outln!("{}", String::from_utf8_lossy(&script).trim_end());
    Ok(())
}

/// Writes the man pages into `args.out` and says how many.
pub(crate) fn man(args: &ManArgs) -> anyhow::Result<()> {
    let out = &args.out;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    // No `.build()` before: `generate_to` disables the `help` subcommand first, so no pages for it.
    clap_mangen::generate_to(Cli::command(), out)
        .with_context(|| format!("cannot write the man pages into {}", out.display()))?;
    let pages = std::fs::read_dir(out)
        .with_context(|| format!("cannot list {}", out.display()))?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("conveyor"))
        .count();
    crate::outln!("wrote {pages} man pages into {}", out.display());
    Ok(())
}
