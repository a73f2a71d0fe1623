//! `wpctl`: the command-line client of `wpd` — clap definitions, dispatch, and error → exit code.
//!
//! All logic lives in the daemon: each subcommand parses its flags, makes one
//! call, and prints the answer (plain text, or JSON with `--json`). With
//! several endpoints, `fleet` makes the call on every daemon at once.

mod cmd;
mod endpoints;
mod error;
mod fleet;
mod output;
mod since;

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use wpd_proto::connect::Target;
use wpd_proto::v1::{Access, Backend, HitAction};

use crate::cmd::Ctx;
use crate::error::{EXIT_CODES_HELP, Error, Exit};
use crate::since::Since;

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
    /// --endpoint given. With several endpoints, caps, list, stats, threads, watch, unwatch,
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
        value_parser = parse_timeout,
    )]
    pub timeout: Duration,

    /// File holding the daemon's token, sent as `authorization: Bearer` (TCP
    /// endpoints; the Unix socket identifies callers by their credentials)
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
    Attach(AttachArgs),
    /// Remove a process's watchpoints and stop tracking it (it keeps running)
    Detach(DetachArgs),
    /// Set a hardware watchpoint on a process (all threads, or chosen ones)
    Watch(Box<WatchArgs>),
    /// Remove a watchpoint and print its final hit count
    Unwatch(UnwatchArgs),
    /// List watchpoints and attached processes
    List(ListArgs),
    /// Show the debug-register slots of each thread of a process
    Threads(ThreadsArgs),
    /// Follow hits and thread/process lifecycle events, one line each
    Events(EventsArgs),
    /// Resume threads held stopped after a hit (watchpoints with --action stop or stop-all)
    Resume(ResumeArgs),
    /// Show a watchpoint's last hits, kept by the daemon (who wrote it last?)
    Last(LastArgs),
    /// Show an aggregate-mode watchpoint's hits counted per instruction and thread
    Aggregates(LastArgs),
    /// Stop threads of a process and hold them until `wpctl resume` (ptrace backend)
    Pause(PauseArgs),
    /// Show the call stack of a held thread, symbolized (ptrace backend)
    Stack(StackArgs),
    /// Run the Debug Adapter Protocol adapter for IDEs (stdin/stdout, or --listen)
    Dap(DapArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(CompletionsArgs),
    /// Print the manual page (roff) of wpctl or of one subcommand, generated from this command line's definition
    Man(ManArgs),
    /// Show daemon counters
    Stats,
    /// Resolve a name in a process (address, size, type, module), or say what is at an address
    Symbol(SymbolArgs),
    /// Check that the daemon serves (the standard gRPC health check), e.g. as a liveness probe
    ///
    /// Exit status 0 when the daemon answers SERVING for wpd.v1.Watchpoints; 3 when it cannot
    /// be reached or answers anything else.
    Health,
}

/// `wpctl symbol`.
#[derive(Debug, Args)]
pub struct SymbolArgs {
    /// Process
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// A name (`[MODULE:]NAME[.MEMBER][[INDEX]][+OFFSET]`) or an address (0x…)
    #[arg(value_name = "NAME|ADDR")]
    pub what: String,
}

/// `--on-exec` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnExecArg {
    /// Resolve the name again in the new program and arm it there (the default)
    Resolve,
    /// Remove the watchpoint
    Remove,
}

/// `wpctl attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Process to attach to
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// How to program the debug registers (default: the daemon's default)
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// Allow pid 1 (the init process, whose stop or death takes the system with it)
    #[arg(long)]
    pub allow_init: bool,
}

/// `wpctl detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// Process to detach from
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
}

/// `wpctl watch`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(true)
    .args(["pids", "comm", "exe", "cgroup"])))]
pub struct WatchArgs {
    /// Target process (attached first if needed). Repeat for several: a policy over those
    /// processes
    #[arg(long = "pid", value_name = "PID", value_parser = pid_parser())]
    pub pids: Vec<i32>,
    /// A policy: every process whose command name (/proc/PID/comm, 15 bytes) is NAME, now and
    /// later, each getting its own instance (the symbol resolved in it)
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// A policy: every process running the executable PATH, now and later
    #[arg(long, value_name = "PATH")]
    pub exe: Option<String>,
    /// A policy: every process in the cgroup v2 directory PATH or below it, now and later
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Arm only these threads (repeat or comma-separate); default: every thread, including future ones
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
    /// Address to watch: hex with 0x prefix, or decimal
    #[arg(long, value_name = "ADDR", value_parser = parse_addr,
          required_unless_present = "symbol", conflicts_with = "symbol")]
    pub addr: Option<u64>,
    /// Variable to watch, by name: `[MODULE:]NAME[.MEMBER][[INDEX]][+OFFSET]`, e.g. `counter`,
    /// `libfoo.so:stats.flags[2]`; a global or static of the program or of any library it
    /// loaded. With --access exec, a function
    #[arg(long, value_name = "NAME")]
    pub symbol: Option<String>,
    /// Bytes to watch (default: 8 from --addr; the object's size for --symbol; exec: 1). A
    /// range one slot cannot watch (longer than 8 bytes, or unaligned) takes several slots
    /// on every thread, up to the 4 a thread has (32 aligned bytes)
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(1..))]
    pub len: Option<u32>,
    /// With each hit, the accessing thread's call chain, up to DEPTH frames (default 16; code
    /// built without frame pointers gives a short chain)
    #[arg(long, value_name = "DEPTH", num_args = 0..=1, default_missing_value = "16",
          value_parser = clap::value_parser!(u32).range(1..=127))]
    pub backtrace: Option<u32>,
    /// What becomes of a watchpoint set by --symbol when the process calls exec
    #[arg(long, value_enum)]
    pub on_exec: Option<OnExecArg>,
    /// Access that triggers the watchpoint
    #[arg(long, value_enum, default_value_t = AccessArg::Write)]
    pub access: AccessArg,
    /// Backend to use if the process is not attached yet
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// What a hit does (stop and stop-all need the ptrace backend; `wpctl resume` continues)
    #[arg(long, value_enum, default_value_t = ActionArg::Log)]
    pub action: ActionArg,
    /// Report a hit only when the watched bytes changed, with old and new value (ptrace backend)
    #[arg(long)]
    pub on_change: bool,
    /// Allow pid 1 (the init process, whose stop or death takes the system with it)
    #[arg(long)]
    pub allow_init: bool,
    /// Report (and, with a stop action, stop on) only hits where the value satisfies this:
    /// `OP N` with OP one of == != < <= > >= (`'>= 0x10'`), optionally masked first
    /// (`'&0xff == 3'`), or `changed`. Unsigned, on the watched bytes (one slot at most)
    #[arg(long, value_name = "COND", value_parser = parse_condition)]
    pub condition: Option<wpd_proto::v1::HitCondition>,
    /// Skip the first N hits (those whose condition held)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub ignore: u64,
    /// Report every Nth hit (after --ignore)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub hit_count: Option<u64>,
    /// Report at most N hits per second; the others are dropped and counted
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rate: Option<u32>,
    /// Keep its last N reported hits in the daemon for `wpctl last` (default 16, at most 4096)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub keep: Option<u32>,
    /// Fork-server children too: every process it forks (and they fork) gets the watchpoint
    /// inside fork(), from its first instruction (perf backend; an exec drops it)
    #[arg(long, conflicts_with = "tids")]
    pub follow_forks: bool,
    /// Only threads whose name matches GLOB (`pool-*`), now and later: threads join when
    /// created or renamed with a matching name and leave when renamed to another (perf)
    #[arg(long, value_name = "GLOB", conflicts_with_all = ["tids", "follow_forks"])]
    pub thread_name: Option<String>,
    /// Count hits per instruction and thread in the daemon instead of streaming each
    /// (`wpctl aggregates ID`); only --exemplars samples a second are streamed
    #[arg(long)]
    pub aggregate: bool,
    /// Hits streamed per second in aggregate mode (default 10, at most 10000)
    #[arg(long, value_name = "N", requires = "aggregate",
          value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub exemplars: Option<u32>,
}

/// `--condition`: see [`wpd_proto::condition::parse`].
pub fn parse_condition(s: &str) -> Result<wpd_proto::v1::HitCondition, String> {
    wpd_proto::condition::parse(s)
}

/// `wpctl unwatch`.
#[derive(Debug, Args)]
pub struct UnwatchArgs {
    /// Watchpoint to remove
    #[arg(
        value_name = "ID",
        required_unless_present = "id",
        conflicts_with = "id"
    )]
    pub id_pos: Option<u64>,
    /// Watchpoint to remove (same as the positional ID)
    #[arg(long = "id", value_name = "ID")]
    pub id: Option<u64>,
}

impl UnwatchArgs {
    /// The id, given either way.
    pub fn id(&self) -> u64 {
        self.id
            .or(self.id_pos)
            .expect("clap requires --id or a positional ID")
    }
}

/// `wpctl list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this process
    #[arg(long, value_parser = pid_parser())]
    pub pid: Option<i32>,
}

/// `wpctl threads`.
#[derive(Debug, Args)]
pub struct ThreadsArgs {
    /// Attached process
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// Only these threads (repeat or comma-separate)
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
    /// Ask the kernel which slots are really free (marks refused slots foreign)
    #[arg(long)]
    pub probe: bool,
}

/// `wpctl resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// Process whose held threads to resume
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// Only these threads (repeat or comma-separate); default: every held thread
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
}

/// `wpctl completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `wpctl man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// A subcommand (its page is `wpctl-SUBCOMMAND(1)`); none: wpctl(1)
    #[arg(value_name = "SUBCOMMAND")]
    pub subcommand: Option<String>,
}

/// `wpctl last`.
#[derive(Debug, Args)]
pub struct LastArgs {
    /// Watchpoint
    #[arg(value_name = "ID")]
    pub id: u64,
    /// Only the last N of those kept
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,
    /// Leave the hits unsymbolized
    #[arg(long)]
    pub raw: bool,
}

/// `wpctl pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// Process whose threads to stop
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// Only these threads (repeat or comma-separate); default: every thread
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
}

/// `wpctl stack`.
#[derive(Debug, Args)]
pub struct StackArgs {
    /// Process
    #[arg(long, value_parser = pid_parser())]
    pub pid: i32,
    /// A thread of it held stopped (after a hit with a stop action, or `wpctl pause`)
    #[arg(long, value_parser = pid_parser())]
    pub tid: i32,
    /// Frames to show, the innermost included
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub depth: u32,
}

/// `wpctl dap`.
#[derive(Debug, Args)]
pub struct DapArgs {
    /// Serve DAP on a Unix socket (unix:PATH, made mode 0600) or a loopback
    /// TCP address (tcp://127.0.0.1:PORT or tcp://[::1]:PORT; port 0 picks one
    /// and prints it on stderr), one debug session per connection, instead of
    /// one session on stdin/stdout. Only connections of the adapter's own
    /// user are served (a session acts with the adapter's rights); other
    /// addresses are refused: there is no TLS for DAP (reach the adapter
    /// from another host through an SSH-forwarded Unix socket)
    #[arg(long, value_name = "unix:PATH|tcp://127.0.0.1:PORT")]
    pub listen: Option<String>,
    /// With --listen: sessions served at once; further connections are
    /// refused with an error response and a log line
    #[arg(long, default_value_t = wpd_dap::listen::DEFAULT_MAX_SESSIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_sessions: u32,
    /// Scheduling of the adapter: realtime (SCHED_FIFO priority 1, where the
    /// caller may: with every thread of a big target stopping at a hit, the
    /// daemon's real-time threads would otherwise keep the adapter off the
    /// CPUs until the stop is done), or normal
    #[arg(long, value_enum, default_value_t = DapPriority::Realtime)]
    pub priority: DapPriority,
}

/// `wpctl dap --priority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DapPriority {
    /// SCHED_FIFO priority 1 when allowed, else normal.
    Realtime,
    /// The default scheduling.
    Normal,
}

/// `wpctl events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events of this process
    #[arg(long, value_parser = pid_parser())]
    pub pid: Option<i32>,
    /// Only hits of these watchpoints (repeat or comma-separate); lifecycle events still show
    #[arg(long = "id", value_name = "ID", value_delimiter = ',')]
    pub ids: Vec<u64>,
    /// Leave out lifecycle events; keep hits and drop notices
    #[arg(long)]
    pub hits_only: bool,
    /// Exit after printing N events
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Raw instruction pointers: no function, file:line or module names
    #[arg(long)]
    pub raw: bool,
    /// First replay past events from the daemon's journal (wpd --state-dir), then follow live
    /// ones: those after sequence number N (`1234`), since a time (`2026-12-02T10:00:00Z`,
    /// RFC 3339), or of a last stretch of time (`10m`, `90s`, `2h`, `1h30m`, `2d`)
    #[arg(long, value_name = "SPEC", value_parser = since::parse_arg)]
    pub since: Option<Since>,
}

/// `--access` values. `read` is passed through as ACCESS_READ so that the
/// daemon can explain when the hardware cannot do it (it is never widened).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccessArg {
    /// Any store to the watched bytes
    Write,
    /// Any load or store
    #[value(alias = "read-write", alias = "readwrite")]
    Rw,
    /// Instruction fetch at the address (--len 1)
    #[value(alias = "execute")]
    Exec,
    /// Loads only (not supported by x86-64 hardware; the daemon refuses it there)
    Read,
}

impl From<AccessArg> for Access {
    fn from(a: AccessArg) -> Access {
        match a {
            AccessArg::Write => Access::Write,
            AccessArg::Rw => Access::ReadWrite,
            AccessArg::Exec => Access::Exec,
            AccessArg::Read => Access::Read,
        }
    }
}

/// `--action` values: what a hit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ActionArg {
    /// Report the hit; the thread keeps running
    Log,
    /// Report the hit and hold the hitting thread stopped until `wpctl resume`
    Stop,
    /// Report the hit and hold every thread of the process stopped until `wpctl resume`
    StopAll,
}

impl From<ActionArg> for HitAction {
    fn from(a: ActionArg) -> HitAction {
        match a {
            ActionArg::Log => HitAction::Log,
            ActionArg::Stop => HitAction::Stop,
            ActionArg::StopAll => HitAction::StopAll,
        }
    }
}

/// `--backend` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// perf_event_open hardware breakpoints; the target never stops
    Perf,
    /// PTRACE_POKEUSER of the debug registers
    Ptrace,
}

/// Proto value of an optional `--backend` (unset: the daemon's default).
pub fn backend_value(b: Option<BackendArg>) -> i32 {
    let b = match b {
        None => Backend::Unspecified,
        Some(BackendArg::Perf) => Backend::Perf,
        Some(BackendArg::Ptrace) => Backend::Ptrace,
    };
    b as i32
}

/// The daemon's address: the text as given (for messages) and its parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// As given on the command line or in WPD_ENDPOINT.
    pub text: String,
    /// Where to connect.
    pub target: Target,
}

impl Default for Endpoint {
    fn default() -> Self {
        let text = format!("unix:{}", wpd_proto::DEFAULT_SOCKET);
        Endpoint {
            target: Target::Unix(PathBuf::from(wpd_proto::DEFAULT_SOCKET)),
            text,
        }
    }
}

impl FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        Ok(Endpoint {
            target: s.parse()?,
            text: s.to_string(),
        })
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Process and thread ids: positive 32-bit integers.
fn pid_parser() -> clap::builder::RangedI64ValueParser<i32> {
    clap::value_parser!(i32).range(1..)
}

/// Parses an address: `0x`-prefixed hex or decimal, `_` allowed as a separator.
pub fn parse_addr(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    if t.is_empty() {
        return Err("empty address".into());
    }
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if h.is_empty() {
            return Err("no hex digits after 0x".into());
        }
        return u64::from_str_radix(h, 16).map_err(|e| match e.kind() {
            std::num::IntErrorKind::PosOverflow => "address does not fit in 64 bits".into(),
            _ => format!("{h:?} is not a hex number"),
        });
    }
    t.parse::<u64>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow => "address does not fit in 64 bits".into(),
        _ if t.starts_with('-') => "address cannot be negative".into(),
        _ if t.chars().all(|c| c.is_ascii_hexdigit()) => {
            format!("{t:?} is not a decimal number (write hex with a 0x prefix: 0x{t})")
        }
        _ => format!("{t:?} is neither 0x-prefixed hex nor decimal"),
    })
}

/// Parses `--timeout`: positive seconds, fractions allowed.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err("timeout must be more than 0 seconds".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

async fn dispatch(ctx: &Ctx, command: &Command) -> Result<(), Error> {
    match command {
        Command::Caps => cmd::caps::run(ctx).await,
        Command::Attach(a) => cmd::attach::run(ctx, a).await,
        Command::Detach(a) => cmd::detach::run(ctx, a).await,
        Command::Watch(a) => cmd::watch::run(ctx, a).await,
        Command::Unwatch(a) => cmd::unwatch::run(ctx, a).await,
        Command::List(a) => cmd::list::run(ctx, a).await,
        Command::Threads(a) => cmd::threads::run(ctx, a).await,
        Command::Events(a) => cmd::events::run(ctx, a).await,
        Command::Resume(a) => cmd::resume::run(ctx, a).await,
        Command::Last(a) => cmd::last::run(ctx, a).await,
        Command::Aggregates(a) => cmd::aggregates::run(ctx, a).await,
        Command::Completions(a) => {
            let mut out = Vec::new();
            clap_complete::generate(a.shell, &mut Cli::command(), "wpctl", &mut out);
            output::emit(String::from_utf8_lossy(&out).trim_end())
        }
        Command::Man(a) => {
            let mut top = Cli::command();
            top.build();
            let page = match &a.subcommand {
                None => top,
                Some(name) => {
                    let sub = top.find_subcommand(name).cloned().ok_or_else(|| {
                        error::Error::Local(format!("wpctl has no subcommand {name:?}"))
                    })?;
                    sub.name(format!("wpctl-{name}"))
                }
            };
            let mut out = Vec::new();
            clap_mangen::Man::new(page)
                .render(&mut out)
                .map_err(|e| error::Error::Local(format!("rendering the manual page: {e}")))?;
            output::emit(String::from_utf8_lossy(&out).trim_end())
        }
        Command::Pause(a) => cmd::pause::run(ctx, a).await,
        Command::Stack(a) => cmd::stack::run(ctx, a).await,
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
        eprintln!("{}", err.to_json());
    } else {
        eprintln!("wpctl: {}", err.message());
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
        let all = endpoints_in(&args);
        if all.len() > cli.endpoints.len() {
            cli.endpoints = all;
        }
    }
    let mut hosts = match hosts(&cli, given) {
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

/// Every `--endpoint` of a command line that clap accepted, in order. clap
/// keeps only those after the subcommand when a global option is given on
/// both sides of it (`wpctl --endpoint A list --endpoint B`); the command line
/// has them all. Stops at `--`.
fn endpoints_in(args: &[String]) -> Vec<Endpoint> {
    let mut found = Vec::new();
    let mut words = args.iter().skip(1);
    while let Some(w) = words.next() {
        let value = match w.as_str() {
            "--" => break,
            "--endpoint" => words.next().map(String::as_str),
            _ => w.strip_prefix("--endpoint="),
        };
        found.extend(value.and_then(|v| v.parse().ok()));
    }
    found
}

/// The daemons to talk to: the `--endpoint`s given on the command line and
/// the lines of `--endpoints-file`; without either, `WPD_ENDPOINT` or the
/// default socket. `given`: `--endpoint` was on the command line. Token and
/// CA files are read here, once each.
fn hosts(cli: &Cli, given: bool) -> Result<Vec<fleet::Host>, Error> {
    let mut files = Files::default();
    let global_token = cli.token_file.as_deref();
    let global_ca = cli.tls_ca.as_deref();
    let mut hosts = Vec::new();
    let mut add = |name: Option<String>,
                   endpoint: Endpoint,
                   token_file: Option<&std::path::Path>,
                   tls_ca: Option<&std::path::Path>|
     -> Result<(), Error> {
        let label = name.unwrap_or_else(|| fleet::default_label(&endpoint));
        if hosts.iter().any(|h: &fleet::Host| h.label == label) {
            return Err(Error::Local(format!(
                "two endpoints would both be tagged [{label}]: give each a name in an \
                 --endpoints-file, or list each endpoint once"
            )));
        }
        let ctx = Ctx {
            endpoint,
            json: cli.json,
            timeout: cli.timeout,
            token: token_file.map(|p| files.token(p)).transpose()?,
            connect: wpd_proto::connect::Options {
                tls_ca_pem: tls_ca.map(|p| files.ca(p)).transpose()?,
            },
        };
        hosts.push(fleet::Host { label, ctx });
        Ok(())
    };
    if cli.endpoints_file.is_none() || given {
        for endpoint in &cli.endpoints {
            add(None, endpoint.clone(), global_token, global_ca)?;
        }
    }
    if let Some(path) = &cli.endpoints_file {
        let entries = endpoints::load(path).map_err(|e| Error::Local(e.to_string()))?;
        for e in entries {
            add(
                e.name,
                e.endpoint,
                e.token_file.as_deref().or(global_token),
                e.tls_ca.as_deref().or(global_ca),
            )?;
        }
    }
    Ok(hosts)
}

/// Token and CA files, each read once however many hosts use it.
#[derive(Debug, Default)]
struct Files {
    tokens: Vec<(PathBuf, String)>,
    cas: Vec<(PathBuf, Vec<u8>)>,
}

impl Files {
    /// The token in `path` (trimmed), or why it cannot be used.
    fn token(&mut self, path: &std::path::Path) -> Result<String, Error> {
        if let Some((_, t)) = self.tokens.iter().find(|(p, _)| p == path) {
            return Ok(t.clone());
        }
        let t = std::fs::read_to_string(path)
            .map_err(|e| Error::Local(format!("cannot read token file {}: {e}", path.display())))?;
        let t = t.trim();
        if t.len() > wpd_proto::MAX_TOKEN_LEN {
            return Err(Error::Local(format!(
                "token file {} holds a {}-byte token; wpd accepts tokens of at most {} bytes",
                path.display(),
                t.len(),
                wpd_proto::MAX_TOKEN_LEN
            )));
        }
        self.tokens.push((path.to_path_buf(), t.to_string()));
        Ok(t.to_string())
    }

    /// The PEM in `path`.
    fn ca(&mut self, path: &std::path::Path) -> Result<Vec<u8>, Error> {
        if let Some((_, pem)) = self.cas.iter().find(|(p, _)| p == path) {
            return Ok(pem.clone());
        }
        let pem = std::fs::read(path)
            .map_err(|e| Error::Local(format!("cannot read CA file {}: {e}", path.display())))?;
        self.cas.push((path.to_path_buf(), pem.clone()));
        Ok(pem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("wpctl").chain(args.iter().copied()))
    }

    fn watch_args(args: &[&str]) -> Result<WatchArgs, clap::Error> {
        let mut all = vec!["watch", "--pid", "1", "--addr", "0x10"];
        all.extend_from_slice(args);
        match parse(&all)?.command {
            Command::Watch(w) => Ok(*w),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn addresses() {
        fn check(input: &str, expected: Result<u64, &str>) {
            let got = parse_addr(input);
            match expected {
                Ok(v) => assert_eq!(got, Ok(v), "parse_addr({input:?})"),
                Err(part) => {
                    let msg = got.expect_err(input);
                    assert!(msg.contains(part), "parse_addr({input:?}) = {msg:?}");
                    assert!(!msg.contains('\n'));
                }
            }
        }
        check("0x55d0c0a01040", Ok(0x55d0c0a01040));
        check("0X10", Ok(16));
        check("0xDEADbeef", Ok(0xdead_beef));
        check("4096", Ok(4096));
        check("0", Ok(0));
        check("0x7fff_ffff_f000", Ok(0x7fff_ffff_f000));
        check("0xffffffffffffffff", Ok(u64::MAX));
        check(" 0x10 ", Ok(16));
        check("", Err("empty address"));
        check("0x", Err("no hex digits"));
        check("0xzz", Err("not a hex number"));
        check("0x1ffffffffffffffff", Err("64 bits"));
        check("18446744073709551616", Err("64 bits"));
        check("-1", Err("negative"));
        check("55d0c0a01040", Err("0x55d0c0a01040"));
        check("abc", Err("0xabc"));
        check("foo", Err("neither"));
    }

    #[test]
    fn address_errors_are_usage_errors() {
        let err = parse(&["watch", "--pid", "1", "--addr", "0xzz"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert_eq!(err.exit_code(), Exit::Usage as i32);
    }

    #[test]
    fn access_kinds() {
        fn check(input: &str, expected: Access) {
            let w = watch_args(&["--access", input]).unwrap();
            assert_eq!(Access::from(w.access), expected, "--access {input}");
        }
        check("write", Access::Write);
        check("rw", Access::ReadWrite);
        check("read-write", Access::ReadWrite);
        check("exec", Access::Exec);
        // Not widened to rw: the daemon explains why it cannot be done.
        check("read", Access::Read);
        assert_eq!(Access::from(watch_args(&[]).unwrap().access), Access::Write);
        assert!(watch_args(&["--access", "bogus"]).is_err());
    }

    #[test]
    fn watch_by_name_or_by_address() {
        let by_name = |args: &[&str]| {
            let mut all = vec!["watch", "--pid", "1"];
            all.extend_from_slice(args);
            parse(&all).map(|c| match c.command {
                Command::Watch(w) => w,
                other => panic!("parsed as {other:?}"),
            })
        };
        let w = by_name(&["--symbol", "libfoo.so:stats.flags[2]"]).unwrap();
        assert_eq!(w.symbol.as_deref(), Some("libfoo.so:stats.flags[2]"));
        assert_eq!((w.addr, w.len), (None, None));
        assert!(
            by_name(&[]).is_err(),
            "one of --addr and --symbol is needed"
        );
        assert!(
            by_name(&["--symbol", "x", "--addr", "0x10"]).is_err(),
            "not both"
        );
        let w = by_name(&["--symbol", "x", "--backtrace"]).unwrap();
        assert_eq!(w.backtrace, Some(16), "--backtrace alone: 16 frames");
        let w = by_name(&["--symbol", "x", "--backtrace", "40", "--on-exec", "remove"]).unwrap();
        assert_eq!(
            (w.backtrace, w.on_exec),
            (Some(40), Some(OnExecArg::Remove))
        );
        assert!(by_name(&["--symbol", "x", "--backtrace", "128"]).is_err());
    }

    #[test]
    fn conditions_parse() {
        use wpd_proto::v1::hit_condition::Op;
        let c = |s: &str| parse_condition(s).map(|c| (c.op, c.operand, c.mask));
        assert_eq!(c("== 42"), Ok((Op::Eq as i32, 42, 0)));
        assert_eq!(c(">=0x10"), Ok((Op::Ge as i32, 16, 0)));
        assert_eq!(c("&0xff != 3"), Ok((Op::Ne as i32, 3, 0xff)));
        assert_eq!(c(" < 1_000 "), Ok((Op::Lt as i32, 1000, 0)));
        assert_eq!(c("CHANGED"), Ok((Op::Changed as i32, 0, 0)));
        for bad in ["", "42", "= 1", "== -1", "== x", "&0 == 1", "&0xff", "=> 3"] {
            assert!(parse_condition(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn watch_defaults_and_lists() {
        let w = watch_args(&["--tid", "5,6", "--tid", "7", "--backend", "ptrace"]).unwrap();
        assert_eq!(
            w.len, None,
            "8 bytes from --addr, the object's size for --symbol"
        );
        assert_eq!(w.tids, vec![5, 6, 7]);
        assert_eq!(backend_value(w.backend), Backend::Ptrace as i32);
        assert_eq!(watch_args(&["--len", "2"]).unwrap().len, Some(2));
        assert_eq!(
            watch_args(&["--len", "24"]).unwrap().len,
            Some(24),
            "a range of several slots"
        );
        assert!(watch_args(&["--len", "0"]).is_err());
        assert!(watch_args(&["--tid", "0"]).is_err());
        assert_eq!(backend_value(None), Backend::Unspecified as i32);
    }

    #[test]
    fn watch_actions() {
        let w = watch_args(&[]).unwrap();
        assert_eq!(HitAction::from(w.action), HitAction::Log);
        assert!(!w.on_change);
        let w = watch_args(&["--action", "stop", "--on-change"]).unwrap();
        assert_eq!(HitAction::from(w.action), HitAction::Stop);
        assert!(w.on_change);
        let w = watch_args(&["--action", "stop-all", "--backend", "ptrace"]).unwrap();
        assert_eq!(HitAction::from(w.action), HitAction::StopAll);
        assert_eq!(backend_value(w.backend), Backend::Ptrace as i32);
        assert!(watch_args(&["--action", "pause"]).is_err());
        assert!(watch_args(&["--on-change", "yes"]).is_err());
    }

    #[test]
    fn resume_args() {
        fn resume(args: &[&str]) -> Result<ResumeArgs, clap::Error> {
            let mut all = vec!["resume"];
            all.extend_from_slice(args);
            match parse(&all)?.command {
                Command::Resume(r) => Ok(r),
                other => panic!("parsed as {other:?}"),
            }
        }
        let r = resume(&["--pid", "123"]).unwrap();
        assert_eq!((r.pid, r.tids), (123, vec![]));
        let r = resume(&["--pid", "123", "--tid", "124,125", "--tid", "126"]).unwrap();
        assert_eq!(r.tids, vec![124, 125, 126]);
        assert!(resume(&[]).is_err());
        assert!(resume(&["--pid", "0"]).is_err());
        assert!(resume(&["--pid", "1", "--tid", "-3"]).is_err());
    }

    #[test]
    fn unwatch_takes_id_either_way() {
        fn id(args: &[&str]) -> Result<u64, clap::Error> {
            match parse(args)?.command {
                Command::Unwatch(u) => Ok(u.id()),
                other => panic!("parsed as {other:?}"),
            }
        }
        assert_eq!(id(&["unwatch", "7"]).unwrap(), 7);
        assert_eq!(id(&["unwatch", "--id", "8"]).unwrap(), 8);
        assert!(id(&["unwatch"]).is_err());
        assert!(id(&["unwatch", "7", "--id", "8"]).is_err());
    }

    #[test]
    fn endpoints() {
        fn check(input: &str, expected: Result<Target, &str>) {
            let got = input.parse::<Endpoint>();
            match expected {
                Ok(t) => {
                    let e = got.unwrap_or_else(|m| panic!("{input:?}: {m}"));
                    assert_eq!(e.target, t, "{input:?}");
                    assert_eq!(e.to_string(), input.trim());
                }
                Err(part) => {
                    let msg = got.expect_err(input);
                    assert!(msg.contains(part), "{input:?}: {msg}");
                }
            }
        }
        check(
            "unix:/run/wpd/wpd.sock",
            Ok(Target::Unix("/run/wpd/wpd.sock".into())),
        );
        check("unix:///tmp/w.sock", Ok(Target::Unix("/tmp/w.sock".into())));
        check("/tmp/w.sock", Ok(Target::Unix("/tmp/w.sock".into())));
        check("https://h:9", Ok(Target::Tls("https://h:9".into())));
        check(
            "tcp://127.0.0.1:7000",
            Ok(Target::Tcp("http://127.0.0.1:7000".into())),
        );
        check("tcp://localhost", Err("HOST:PORT"));
        check("unix:", Err("empty"));
        check("wpd.sock", Err("neither"));

        let d = Endpoint::default();
        assert_eq!(d.text, format!("unix:{}", wpd_proto::DEFAULT_SOCKET));
        assert_eq!(d.target, Target::Unix(wpd_proto::DEFAULT_SOCKET.into()));
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

    #[test]
    fn endpoints_on_both_sides_of_the_subcommand() {
        let args = |a: &[&str]| -> Vec<String> {
            std::iter::once("wpctl")
                .chain(a.iter().copied())
                .map(String::from)
                .collect()
        };
        let texts = |a: &[&str]| -> Vec<String> {
            endpoints_in(&args(a)).into_iter().map(|e| e.text).collect()
        };
        assert_eq!(
            texts(&["--endpoint", "tcp://a:1", "list", "--endpoint=https://b:2"]),
            ["tcp://a:1", "https://b:2"]
        );
        assert_eq!(
            texts(&["--json", "stats", "--endpoint", "unix:/x.sock"]),
            ["unix:/x.sock"]
        );
        assert_eq!(
            texts(&["--endpoint", "tcp://a:1", "--", "--endpoint", "tcp://c:3"]),
            ["tcp://a:1"]
        );
        assert!(texts(&["caps"]).is_empty());
    }

    /// `wpctl --help` matches tests/snapshots/help.txt; `UPDATE_SNAPSHOTS=1`
    /// rewrites the file instead.
    #[test]
    fn help_snapshot() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/help.txt");
        // Trailing spaces (clap leaves some on blank lines) are dropped so
        // that editors cannot break the comparison.
        let help: String = Cli::command()
            .render_long_help()
            .to_string()
            .lines()
            .map(|l| l.trim_end().to_string() + "\n")
            .collect();
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
            std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
            std::fs::write(path, &help).unwrap();
            return;
        }
        let expected = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{path}: {e} (run with UPDATE_SNAPSHOTS=1 to create it)"))
            .replace("\r\n", "\n");
        assert!(
            help == expected,
            "`wpctl --help` changed; rerun with UPDATE_SNAPSHOTS=1 to accept.\n--- expected\n{expected}\n--- got\n{help}"
        );
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
