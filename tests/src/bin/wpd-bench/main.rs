//! `wpd-bench`: end-to-end benchmark of wpd against the bare syscalls it
//! makes, against the kernel's own mechanisms and against the peers (gdb,
//! perf) on the same machine, in one run.
//!
//! ```text
//! cargo build --release --workspace --bins && target/release/wpd-bench [--threads 1000,10000] [--reps 3]
//! ```
//!
//! Sections (all by default; `--only a,b` or `--skip a,b` to choose):
//! - `arm`: one process-wide write watchpoint on an idle target of N
//!   threads, per backend (attach + arm), against the same syscalls in a
//!   bare loop with no daemon (the floor), `gdb -batch` and `perf stat`.
//! - `spin`: the same on a target whose N threads spin (SCHED_IDLE, so that
//!   the CPUs are always busy with them but the daemon still gets one);
//!   sizes from `--spin-threads` (default 1000: at 10,000 spinning threads
//!   on 2 CPUs, the ptrace rows alone take minutes per repetition).
//! - `hitcost`: what one hit costs the writing thread, per backend, against
//!   the same writes with no watchpoint; and whether every hit was delivered.
//! - `churn`: µs per thread create+join while K threads churn, with no
//!   watchpoint, with 4 process-wide wpd watchpoints (per backend), and with
//!   4 breakpoints inherited by the kernel itself (`perf bench breakpoint
//!   thread -b 4`, the floor).
//! - `throughput`: writers store as fast as they can to a watched variable;
//!   hits per second a gRPC subscriber receives, losses, daemon CPU per hit.
//! - `memory`: daemon RSS before attach, with N tracked threads, after exit.
//! - `rpc`: SetWatchpoint / RemoveWatchpoint on one thread and ListThreads
//!   on an N-thread process, p50/p99, against a gRPC round trip and the bare
//!   syscalls.
//! - `ledger`: ledger lock hold times (GetStats) before and after the churn.
//! - `symbols`: hit throughput with symbolized against raw hits;
//!   SetWatchpoint by name against by address on an N-thread C target; 1,000
//!   distinct hitting instructions symbolized (time, `/proc` reads, cache
//!   sizes).
//! - `dap`: an IDE session through `wpctl dap` on a 1,000-thread C target
//!   (attach + arm, first stop, continue → next stop, threads + stackTrace)
//!   against the same steps over gRPC directly.
//! - `steps`: next, stepIn, stepOut and an instruction step in one thread
//!   of a 1,000-thread C target (`ct-step`), request → `stopped`, through
//!   `wpctl dap` (the others running, and held), gRPC Step directly (its
//!   legs per step) and lldb-dap 19 (a peer: `--no-peers` leaves it out),
//!   sessions alternating; failed sessions counted, never waited on.
//! - `farm`: one policy over many processes, fds and kernel memory per
//!   watched thread, a fork server's children.
//! - `fleet`: recovery after a SIGKILL with N armed threads, the journal's
//!   cost at full hit rate.
//! - `journal`: the journal's cost at full hit rate alone (as in `fleet`).
//! - `export`: export of a backlog to NATS JetStream against the rate it
//!   was produced at, and the daemon's CPU per exported event.
//! - `fuzzers`: AFL++ (fork server) and libFuzzer (fork mode) on a parser,
//!   alone and with a policy on its state (log on every store, a condition
//!   judged at the trap, the signal action), runs alternating; daemon CPU
//!   per execution; the kernel's floor, a fork with an inherited breakpoint
//!   against a bare fork.
//! - `objects`: watchpoints armed by a code event (`--on-return`), per
//!   object, in a target creating 10,000 objects a second, against the
//!   target alone and gdb doing the same (`break` + `watch -l` + `continue`).
//! - `drain`: the daemon at rest (CPU and wake-ups a second with nothing
//!   tracked, one process watched, a policy), its CPU per child of a
//!   forking process, and what a hit costs a thread storing now and then.
//! - `pending`: a dlopen + dlclose of a library in a process not attached,
//!   attached with nothing pending, and with a pending code event (the
//!   probe at its dynamic linker's debugger hook).
//! - `closes`: a Detach of a process with 100 code breakpoints and a
//!   SIGTERM of the daemon holding them, against 100 uprobes closed at once
//!   with no daemon (the floor) and one after another.
//! - `holds`: exec-to-exit of a short program with no policy, with a
//!   policy naming it (held at its exec until armed), held and let go
//!   unarmed, and with a policy naming another program (not held).
//! - `unpriv`: an ordinary user's daemon (no flags) beside root's: arming
//!   64 and 512 threads, and hits per second.
//!
//! Timings are medians over `--reps` runs unless a table says otherwise.
//! Nothing here asserts a time.

mod procstat;
mod sections;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use procstat::*;
use sections::{
    arm::*, churn::*, closes::*, dap::*, drain::*, farm::*, feedback::*, fleet::*, fuzzers::*,
    hitcost::*, holds::*, memory::*, objects::*, pending::*, rpc::*, steps::*, symbols::*,
    throughput::*, unpriv::*,
};
use wpd_tests::Backend;

const USAGE: &str = "usage: wpd-bench [--threads N[,N...]] [--spin-threads N[,N...]] [--reps R] \
     [--writes W] [--no-peers] \
     [--only S,..|--skip S,..] [--churn-threads K[,K...]] [--window-ms MS] [--rpc-pairs P] \
     [--list-calls L] [--peer-timeout-s S] [--fuzz-secs S] [--persistent-secs S] [--smoke]\n\
     sections: arm spin hitcost churn throughput memory rpc ledger symbols dap steps farm fleet journal export fuzzers drain objects pending closes holds unpriv feedback";

const SECTIONS: [&str; 23] = [
    "arm",
    "spin",
    "hitcost",
    "churn",
    "throughput",
    "memory",
    "rpc",
    "ledger",
    "symbols",
    "dap",
    "steps",
    "farm",
    "fleet",
    "journal",
    "export",
    "fuzzers",
    "drain",
    "objects",
    "pending",
    "closes",
    "holds",
    "unpriv",
    "feedback",
];

/// Variable watched where no thread of the target writes (idle workers write
/// `VARS[0]`, churned threads too).
const QUIET_VAR: usize = 2;
/// Variable the `hammer` threads write (throughput).
const HAMMER_VAR: usize = 3;

struct Args {
    threads: Vec<usize>,
    /// Thread counts of the spinning-target mass-arm (slow: every ptrace
    /// stop waits for a spinner to be scheduled).
    spin_threads: Vec<usize>,
    reps: usize,
    writes: u64,
    peers: bool,
    sections: BTreeSet<String>,
    churn_threads: Vec<usize>,
    /// Churn window and hammer duration.
    window: Duration,
    rpc_pairs: usize,
    list_calls: usize,
    peer_timeout: Duration,
    /// Pause before a memory reading (lets the daemon finish what it does).
    settle: Duration,
    /// `--smoke`: sections that have no list argument run small.
    smoke: bool,
    /// Seconds of each fuzzer run: fork server and libFuzzer, then AFL++'s
    /// persistent mode (whose calibration takes the first seconds).
    fuzz_secs: u64,
    persistent_secs: u64,
}

impl Args {
    fn has(&self, section: &str) -> bool {
        self.sections.contains(section)
    }
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    Ok(s.split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?)
}

fn sections(s: &str) -> Result<BTreeSet<String>> {
    let set: BTreeSet<String> = s.split(',').map(|w| w.trim().to_string()).collect();
    for w in &set {
        ensure!(
            SECTIONS.contains(&w.as_str()),
            "unknown section {w:?} (sections: {})",
            SECTIONS.join(" ")
        );
    }
    Ok(set)
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        threads: vec![1000],
        spin_threads: vec![1000],
        reps: 3,
        writes: 200_000,
        peers: true,
        sections: SECTIONS.iter().map(|s| s.to_string()).collect(),
        churn_threads: vec![1, 2],
        window: Duration::from_millis(2000),
        rpc_pairs: 200,
        list_calls: 50,
        peer_timeout: Duration::from_secs(300),
        settle: Duration::from_millis(500),
        smoke: false,
        fuzz_secs: 10,
        persistent_secs: 30,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--threads" => a.threads = list(&val()?)?,
            "--spin-threads" => a.spin_threads = list(&val()?)?,
            "--reps" => a.reps = val()?.parse()?,
            "--writes" => a.writes = val()?.parse()?,
            "--no-peers" => a.peers = false,
            "--only" => a.sections = sections(&val()?)?,
            "--skip" => {
                for s in sections(&val()?)? {
                    a.sections.remove(&s);
                }
            }
            "--churn-threads" => a.churn_threads = list(&val()?)?,
            "--window-ms" => a.window = Duration::from_millis(val()?.parse()?),
            "--rpc-pairs" => a.rpc_pairs = val()?.parse()?,
            "--list-calls" => a.list_calls = val()?.parse()?,
            "--peer-timeout-s" => a.peer_timeout = Duration::from_secs(val()?.parse()?),
            "--fuzz-secs" => a.fuzz_secs = val()?.parse()?,
            "--persistent-secs" => a.persistent_secs = val()?.parse()?,
            // Seconds-long run for CI: checks every section works, measures little.
            "--smoke" => {
                a.threads = vec![50];
                a.spin_threads = vec![50];
                a.reps = 1;
                a.writes = 2_000;
                a.peers = false;
                a.churn_threads = vec![1];
                a.window = Duration::from_millis(150);
                a.rpc_pairs = 20;
                a.list_calls = 10;
                a.settle = Duration::from_millis(50);
                a.fuzz_secs = 2;
                a.persistent_secs = 2;
                a.smoke = true;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if a.reps == 0
        || a.threads.contains(&0)
        || a.spin_threads.contains(&0)
        || a.churn_threads.contains(&0)
        || a.rpc_pairs == 0
        || a.list_calls == 0
        || a.window.is_zero()
        || a.fuzz_secs == 0
        || a.persistent_secs == 0
    {
        bail!(
            "--reps, --threads, --spin-threads, --churn-threads, --rpc-pairs, --list-calls, --window-ms, --fuzz-secs and --persistent-secs must be positive"
        );
    }
    Ok(a)
}

thread_local! {
    static WARM: Warm = const { Warm(std::cell::Cell::new(0)) };
}

/// A variable of the bench itself, never written: target of the warm-up
/// breakpoint.
struct Warm(std::cell::Cell<u64>);

impl Warm {
    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median and range of repeated measurements.
#[derive(Clone, Copy)]
struct Spread {
    med: f64,
    min: f64,
    max: f64,
}

fn spread(v: Vec<f64>) -> Spread {
    Spread {
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        med: median(v),
    }
}

/// (p50, p99) of `v`.
fn p50_p99(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let p99 = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    (v[v.len() / 2], v[p99])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn backend_name(b: Backend) -> &'static str {
    if b == Backend::Ptrace {
        "ptrace"
    } else {
        "perf"
    }
}

fn main() -> ExitCode {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("wpd-bench: must run as root (perf breakpoints on other processes, ptrace)");
        return ExitCode::from(2);
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("wpd-bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    raise_nofile();
    if !realtime_thread() {
        eprintln!(
            "wpd-bench: SCHED_FIFO refused; timings on busy targets include the bench's own wait for a CPU"
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| {
            realtime_thread();
        })
        .enable_all()
        .build();
    let result = match rt {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wpd-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Raises RLIMIT_NOFILE as far as the kernel allows (`fs.nr_open`): the
/// floors hold one perf fd per thread and CPU (40,000 at 10,000 threads).
fn raise_nofile() {
    let max = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(1 << 20);
    let lim = libc::rlimit {
        rlim_cur: max,
        rlim_max: max,
    };
    // SAFETY: plain setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        eprintln!(
            "wpd-bench: cannot raise RLIMIT_NOFILE to {max}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The soft RLIMIT_NOFILE of this process (the daemon inherits it and can
/// raise it no further than the hard limit, which is the same here unless
/// this process could raise it).
/// `None` when `events_per_thread_cpu` perf fds per thread and CPU for `n`
/// threads fit in the fd limit; otherwise why the measurement is skipped.
fn perf_fds_skip(n: usize, cpus: usize, events_per_thread_cpu: usize) -> Option<String> {
    let needed = (n * cpus * events_per_thread_cpu + cpus + 256) as u64;
    let limit = wpd_tests::nofile_limit();
    (needed > limit).then(|| {
        format!(
            "skipped: needs ≥ {needed} perf fds, RLIMIT_NOFILE here is {limit} (and cannot be raised)"
        )
    })
}

fn flush() {
    let _ = std::io::stdout().flush();
}

/// Prints how long a section took (for planning runs; not a measurement)
/// and the load average (other work on the machine shows there).
fn section_done(t0: Instant) {
    println!(
        "\n_section wall time: {:.1} s; /proc/loadavg at its end: {}_\n",
        t0.elapsed().as_secs_f64(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    flush();
}

async fn run(args: Args) -> Result<()> {
    let cpus = wpd_tests::online_cpus();
    // The kernel's first breakpoint after a while with none open costs
    // 12–20 ms once (kernel-facts §6). Keep one open on this thread for the
    // whole run so that no measurement pays it.
    let warm = WARM.with(|w| w.addr());
    let _warm = wpd_tests::ForeignBreakpoint::open(0, warm, 8)?;
    println!("# wpd-bench");
    println!(
        "machine: {} CPUs, {}, kernel {}",
        cpus.len(),
        cpu_model(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "reps: {} (medians); sections: {}\n",
        args.reps,
        SECTIONS
            .iter()
            .filter(|s| args.has(s))
            .copied()
            .collect::<Vec<_>>()
            .join(" ")
    );
    flush();
    if args.has("arm") {
        section_arm(&args, &cpus, Load::Idle).await?;
    }
    if args.has("spin") {
        section_arm(&args, &cpus, Load::Spin).await?;
    }
    if args.has("hitcost") {
        section_hit_cost(&args).await?;
    }
    if args.has("churn") || args.has("ledger") {
        section_churn(&args, &cpus).await?;
    }
    if args.has("throughput") {
        section_throughput(&args).await?;
    }
    if args.has("memory") {
        section_memory(&args).await?;
    }
    if args.has("rpc") {
        section_rpc(&args, &cpus).await?;
    }
    if args.has("symbols") {
        section_symbols(&args).await?;
    }
    if args.has("dap") {
        section_dap(&args).await?;
    }
    if args.has("steps") {
        section_steps(&args).await?;
    }
    if args.has("farm") {
        section_farm(&args).await?;
    }
    if args.has("fleet") {
        section_fleet(&args).await?;
    }
    // Part of `fleet` too: run once.
    if args.has("journal") && !args.has("fleet") {
        section_journal(&args).await?;
    }
    if args.has("export") {
        section_export(&args).await?;
    }
    if args.has("fuzzers") {
        section_fuzzers(&args).await?;
    }
    if args.has("drain") {
        section_drain(&args).await?;
    }
    if args.has("objects") {
        section_objects(&args).await?;
    }
    if args.has("pending") {
        section_pending(&args).await?;
    }
    if args.has("closes") {
        section_closes(&args).await?;
    }
    if args.has("holds") {
        section_holds(&args).await?;
    }
    if args.has("unpriv") {
        section_unpriv(&args).await?;
    }
    if args.has("feedback") {
        section_feedback(&args).await?;
    }
    Ok(())
}

async fn rep<F, Fut>(reps: usize, mut f: F) -> Result<Vec<f64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<f64>>,
{
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        v.push(f().await?);
    }
    Ok(v)
}
