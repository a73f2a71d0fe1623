//! `wpctl completions`: a shell completion script, generated from the
//! command line's definition.

use clap::{Args, CommandFactory};

use crate::Cli;
use crate::error::Error;
use crate::output;

/// `wpctl completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Prints the script for `args.shell`.
pub fn run(args: &CompletionsArgs) -> Result<(), Error> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "wpctl", &mut out);
    output::emit(String::from_utf8_lossy(&out).trim_end())
}
