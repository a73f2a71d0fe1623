//! `wpctl`: the command-line client of `wpd` — the top-level parser
//! (global options, the subcommands), dispatch, and error → exit code.
//!
//! All logic lives in the daemon: each subcommand (`cmd/`, its options and
//! its `run` side by side) parses its flags, makes one call, and prints the
//! answer (plain text, or JSON with `--json`). With several endpoints,
//! `fleet` makes the call on every daemon at once.

mod args;
mod cmd;
mod credentials;
mod endpoints;
mod error;
mod fleet;
mod hosts;
mod output;
mod since;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::cmd::Ctx;
use crate::endpoints::Endpoint;
use crate::error::{EXIT_CODES_HELP, Error, Exit};

/// Control the wpd hardware-watchpoint daemon.
#[derive(Debug, Parser)]
#[command(
    name = "wpctl",
    version,
    after_help = EXIT_CODES_HELP,
)]
pub struct Cli {
    /// Daemon endpoint: unix:PATH, an absolute socket path, tcp://HOST:PORT or
    /// https://HOST:PORT (TLS). Repeat it to run the command on several daemons at once (see
    /// --endpoints-file)
    #[arg(
        long = "endpoint",
        global = true,
        help_heading = "Global options",
        env = "WPD_ENDPOINT",
        hide_env_values = true,
        value_name = "ENDPOINT",
        action = ArgAction::Append,
        default_values_t = [Endpoint::default()],
    )]
    pub endpoints: Vec<Endpoint>,

    /// Daemons to run the command on, one per line: `[NAME] ENDPOINT [token-file=FILE]
    /// [tls-ca=FILE]` (`#` comments; relative paths from the file's directory), after any
    /// --endpoint given. A line's daemon gets the token of its own token-file= only, never
    /// --token-file's. With several endpoints, caps, list, stats, threads, watch, unwatch,
    /// events and health run on every daemon at once: each output line starts with
    /// `[NAME]` (or `[HOST:PORT]`), each JSON record has a "host" field, and a daemon that
    /// fails is named on stderr while the others go on (exit status 9)
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "FILE"
    )]
    pub endpoints_file: Option<PathBuf>,

    /// Print JSON on stdout (JSON Lines for `events` and for several endpoints) and JSON
    /// errors on stderr
    #[arg(long, global = true, help_heading = "Global options")]
    pub json: bool,

    /// Seconds to wait for the daemon to answer a call (not the event stream)
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "SECS",
        default_value = "30",
        value_parser = args::parse_timeout,
    )]
    pub timeout: Duration,

    /// File holding the token of the daemons named by --endpoint (or WPD_ENDPOINT), sent as
    /// `authorization: Bearer` (TCP endpoints; the Unix socket identifies callers by their
    /// credentials). Never sent to the lines of --endpoints-file, which name their own. The
    /// file must be yours and private (`chmod 600`); over plaintext tcp:// the token goes to
    /// a loopback address only (use https:// beyond this machine)
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "WPD_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<std::path::PathBuf>,

    /// PEM file of the CA that signed the daemon's certificate (https:// endpoints)
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "WPD_TLS_CA",
        value_name = "FILE"
    )]
    pub tls_ca: Option<std::path::PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands, one rpc each.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what this host and daemon can do (slots, lengths, access kinds, backends)
    Caps,
    /// Start tracking every thread of a process
    Attach(cmd::attach::AttachArgs),
    /// Remove a process's watchpoints and stop tracking it (it keeps running)
    Detach(cmd::detach::DetachArgs),
    /// Set a hardware watchpoint on a process (all threads, or chosen ones)
    Watch(Box<cmd::watch::WatchArgs>),
    /// Set a code breakpoint: hold the thread that reaches a function or a source line
    ///
    /// The thread stays held until `wpctl resume`; `wpctl stack --locals` shows where it is.
    /// `wpctl unwatch ID` removes the breakpoint (threads it holds stay held until resumed). It
    /// lives until then, but not across a restart of the daemon. Needs the ptrace backend.
    Break(Box<cmd::breakpoint::BreakArgs>),
    /// Remove a watchpoint or breakpoint and print its final hit count
    Unwatch(cmd::unwatch::UnwatchArgs),
    /// List watchpoints and attached processes
    List(cmd::list::ListArgs),
    /// Show the debug-register slots of each thread of a process
    Threads(cmd::threads::ThreadsArgs),
    /// Follow hits and thread/process lifecycle events, one line each
    Events(cmd::events::EventsArgs),
    /// Resume threads held stopped after a hit (watchpoints with --action stop or stop-all)
    Resume(cmd::resume::ResumeArgs),
    /// Show a watchpoint's last hits, kept by the daemon (who wrote it last?)
    Last(cmd::last::LastArgs),
    /// Show an aggregate-mode watchpoint's hits counted per instruction and thread
    Aggregates(cmd::last::LastArgs),
    /// Stop threads of a process and hold them until `wpctl resume` (ptrace backend)
    Pause(cmd::pause::PauseArgs),
    /// Show the call stack of a held thread, symbolized (ptrace backend)
    Stack(cmd::stack::StackArgs),
    /// Step a held thread: a line (--over), --into a call, --out of the function, one --instruction (ptrace backend)
    Step(cmd::step::StepArgs),
    /// Run the Debug Adapter Protocol adapter for IDEs (stdin/stdout, or --listen)
    Dap(cmd::dap::DapArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(cmd::completions::CompletionsArgs),
    /// Print the manual page (roff) of wpctl or of one subcommand, generated from this command line's definition
    Man(cmd::man::ManArgs),
    /// Show daemon counters
    Stats,
    /// Resolve a name in a process (address, size, type, module), or say what is at an address
    Symbol(cmd::symbol::SymbolArgs),
    /// Check that the daemon serves (the standard gRPC health check), e.g. as a liveness probe
    ///
    /// Exit status 0 when the daemon answers SERVING for wpd.v1.Watchpoints; 3 when it cannot
    /// be reached or answers anything else.
    Health,
}

async fn dispatch(ctx: &Ctx, command: &Command) -> Result<(), Error> {
    match command {
        Command::Caps => cmd::caps::run(ctx).await,
        Command::Attach(a) => cmd::attach::run(ctx, a).await,
        Command::Detach(a) => cmd::detach::run(ctx, a).await,
        Command::Watch(a) => cmd::watch::run(ctx, a).await,
        Command::Break(a) => cmd::breakpoint::run(ctx, a).await,
        Command::Unwatch(a) => cmd::unwatch::run(ctx, a).await,
        Command::List(a) => cmd::list::run(ctx, a).await,
        Command::Threads(a) => cmd::threads::run(ctx, a).await,
        Command::Events(a) => cmd::events::run(ctx, a).await,
        Command::Resume(a) => cmd::resume::run(ctx, a).await,
        Command::Last(a) => cmd::last::run(ctx, a).await,
        Command::Aggregates(a) => cmd::aggregates::run(ctx, a).await,
        Command::Completions(a) => cmd::completions::run(a),
        Command::Man(a) => cmd::man::run(a),
        Command::Pause(a) => cmd::pause::run(ctx, a).await,
        Command::Stack(a) => cmd::stack::run(ctx, a).await,
        Command::Step(a) => cmd::step::run(ctx, a).await,
        Command::Dap(a) => cmd::dap::run(ctx, a).await,
        Command::Stats => cmd::stats::run(ctx).await,
        Command::Symbol(a) => cmd::symbol::run(ctx, a).await,
        Command::Health => cmd::health::run(ctx).await,
    }
}

/// Prints an error on stderr: `wpctl: <message>`, or `{"error": {...}}` with `--json`.
pub(crate) fn report(err: &Error, json: bool) {
    if err.is_quiet() {
        return;
    }
    if json {
        output::warn(&output::json_line(&err.to_json()));
    } else {
        output::warn(&format!("wpctl: {}", err.message()));
    }
}

fn main() -> ExitCode {
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (mut cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            // --help and --version print to stdout and succeed; anything else is a usage error.
            let _ = e.print();
            return if e.exit_code() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(Exit::Usage as u8)
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wpctl: cannot start the async runtime: {e}");
            return ExitCode::from(Exit::Other as u8);
        }
    };
    let given = matches.value_source("endpoints") == Some(ValueSource::CommandLine);
    if given {
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let all = hosts::endpoints_in(&args);
        if all.len() > cli.endpoints.len() {
            cli.endpoints = all;
        }
    }
    let token_given = matches.value_source("token_file") == Some(ValueSource::CommandLine);
    let mut hosts = match hosts::hosts(&cli, given, token_given) {
        Ok(hosts) => hosts,
        Err(err) => {
            report(&err, cli.json);
            return ExitCode::from(err.exit() as u8);
        }
    };
    let no_daemon = matches!(cli.command, Command::Completions(_) | Command::Man(_));
    if hosts.len() > 1 && !no_daemon {
        if let Some(name) = fleet::single_daemon_only(&cli.command) {
            let err = Error::Local(format!(
                "wpctl {name} acts on one daemon (processes and ids differ between hosts): \
                 give a single endpoint"
            ));
            report(&err, cli.json);
            return ExitCode::from(err.exit() as u8);
        }
        let exit = runtime.block_on(fleet::run(hosts, cli.command, cli.json));
        return ExitCode::from(exit as u8);
    }
    let ctx = hosts.swap_remove(0).ctx;
    match runtime.block_on(dispatch(&ctx, &cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            report(&err, cli.json);
            ExitCode::from(err.exit() as u8)
        }
    }
}

/// Parses a command line (without the program name), for unit tests.
#[cfg(test)]
pub(crate) fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("wpctl").chain(args.iter().copied()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::since::Since;
    use clap::CommandFactory;
    use wpd_proto::connect::Target;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_follow_the_subcommand() {
        let cli = parse(&[
            "caps",
            "--json",
            "--endpoint",
            "tcp://h:1",
            "--timeout",
            "2.5",
        ])
        .unwrap();
        assert!(cli.json);
        assert_eq!(cli.endpoints.len(), 1);
        assert_eq!(cli.endpoints[0].target, Target::Tcp("http://h:1".into()));
        assert_eq!(cli.timeout, Duration::from_millis(2500));
        assert!(parse(&["caps", "--timeout", "0"]).is_err());
        assert!(parse(&["caps", "--endpoint", "nowhere"]).is_err());
        if std::env::var_os("WPD_ENDPOINT").is_none() {
            let cli = parse(&["stats"]).unwrap();
            assert_eq!(cli.endpoints, vec![Endpoint::default()]);
            assert_eq!(cli.timeout, Duration::from_secs(30));
            assert!(!cli.json);
        }
    }

    #[test]
    fn endpoints_repeat_and_since_parses() {
        let cli = parse(&[
            "--endpoint",
            "tcp://a:1",
            "list",
            "--endpoint",
            "https://b:2",
            "--endpoints-file",
            "/etc/wpd/farm",
        ])
        .unwrap();
        // clap keeps the subcommand's side only; `endpoints_in` finds both.
        let targets: Vec<_> = cli.endpoints.iter().map(|e| e.target.clone()).collect();
        assert_eq!(targets, [Target::Tls("https://b:2".into())]);
        assert_eq!(
            cli.endpoints_file.as_deref(),
            Some(std::path::Path::new("/etc/wpd/farm"))
        );
        let cli = parse(&[
            "--endpoint",
            "tcp://a:1",
            "--endpoint",
            "https://b:2",
            "list",
        ])
        .unwrap();
        let targets: Vec<_> = cli.endpoints.iter().map(|e| e.target.clone()).collect();
        assert_eq!(
            targets,
            [
                Target::Tcp("http://a:1".into()),
                Target::Tls("https://b:2".into())
            ]
        );
        assert!(parse(&["--endpoint", "tcp://a:1", "--endpoint", "nowhere", "list"]).is_err());
        let since = |spec: &str| match parse(&["events", "--since", spec])?.command {
            Command::Events(a) => Ok(a.since),
            other => panic!("parsed as {other:?}"),
        };
        assert_eq!(since("42").unwrap(), Some(Since::AfterSeq(42)));
        assert_eq!(
            since("90s").unwrap(),
            Some(Since::Age(Duration::from_secs(90)))
        );
        let err: clap::Error = since("soon").unwrap_err();
        assert_eq!(err.exit_code(), Exit::Usage as i32);
        assert!(
            err.to_string().contains("neither a sequence number"),
            "{err}"
        );
        assert!(matches!(
            parse(&["health"]).unwrap().command,
            Command::Health
        ));
    }

    /// `wpctl --help` matches tests/snapshots/help.txt; `UPDATE_EXPECT=1`
    /// rewrites the file instead.
    #[test]
    fn help_snapshot() {
        // Trailing spaces (clap leaves some on blank lines) are dropped so
        // that editors cannot break the comparison.
        let help: String = Cli::command()
            .render_long_help()
            .to_string()
            .lines()
            .map(|l| l.trim_end().to_string() + "\n")
            .collect();
        expect_test::expect_file!["../tests/snapshots/help.txt"].assert_eq(&help);
    }
}

#[cfg(test)]
mod generated_docs {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn completions_and_manual_pages_cover_every_subcommand() {
        let mut out = Vec::new();
        clap_complete::generate(
            clap_complete::Shell::Bash,
            &mut Cli::command(),
            "wpctl",
            &mut out,
        );
        let bash = String::from_utf8(out).unwrap();
        let mut top = Cli::command();
        top.build();
        for sub in top.get_subcommands() {
            let name = sub.get_name();
            assert!(bash.contains(name), "bash completion lacks {name}");
            let mut page = Vec::new();
            clap_mangen::Man::new(sub.clone().name(format!("wpctl-{name}")))
                .render(&mut page)
                .unwrap();
            let page = String::from_utf8(page).unwrap();
            assert!(page.contains(&format!(".TH wpctl-{name}")), "{page}");
        }
        assert!(bash.contains("--endpoint") && bash.contains("--symbol"));
    }
}
