//! `wpctl man`: the manual page (roff) of wpctl or of one subcommand,
//! generated from the command line's definition.

use clap::{Args, CommandFactory};

use crate::Cli;
use crate::error::Error;
use crate::output;

/// `wpctl man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// A subcommand (its page is `wpctl-SUBCOMMAND(1)`); none: wpctl(1)
    #[arg(value_name = "SUBCOMMAND")]
    pub subcommand: Option<String>,
}

/// Prints `wpctl(1)`, or `wpctl-SUBCOMMAND(1)`.
pub fn run(args: &ManArgs) -> Result<(), Error> {
    let mut top = Cli::command();
    top.build();
    let page = match &args.subcommand {
        None => top,
        Some(name) => {
            let sub = top
                .find_subcommand(name)
                .cloned()
                .ok_or_else(|| Error::Local(format!("wpctl has no subcommand {name:?}")))?;
            sub.name(format!("wpctl-{name}"))
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .map_err(|e| Error::Local(format!("rendering the manual page: {e}")))?;
    output::emit(String::from_utf8_lossy(&out).trim_end())
}
