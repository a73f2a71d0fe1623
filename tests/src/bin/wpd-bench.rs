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
//!
//! Timings are medians over `--reps` runs unless a table says otherwise.
//! Nothing here asserts a time.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use wpd_proto::v1::{
    GetCapabilitiesRequest, GetStatsRequest, GetStatsResponse, ListThreadsRequest,
    ListWatchpointsRequest, RemoveWatchpointRequest, StreamEventsRequest, WatchpointSpec,
};
use wpd_tests::{
    Backend, Client, Daemon, Event, TargetProc, attach, floor_collector, floor_perf_arm,
    floor_perf_inherit, floor_perf_track, floor_probe_slot, set_watchpoint_within, write_spec,
};

const USAGE: &str = "usage: wpd-bench [--threads N[,N...]] [--spin-threads N[,N...]] [--reps R] \
     [--writes W] [--no-peers] \
     [--only S,..|--skip S,..] [--churn-threads K[,K...]] [--window-ms MS] [--rpc-pairs P] \
     [--list-calls L] [--peer-timeout-s S] [--smoke]\n\
     sections: arm spin hitcost churn throughput memory rpc ledger";

const SECTIONS: [&str; 8] = [
    "arm",
    "spin",
    "hitcost",
    "churn",
    "throughput",
    "memory",
    "rpc",
    "ledger",
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
    {
        bail!(
            "--reps, --threads, --spin-threads, --churn-threads, --rpc-pairs, --list-calls and --window-ms must be positive"
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
fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur.min(lim.rlim_max)
}

/// `None` when `events_per_thread_cpu` perf fds per thread and CPU for `n`
/// threads fit in the fd limit; otherwise why the measurement is skipped.
fn perf_fds_skip(n: usize, cpus: usize, events_per_thread_cpu: usize) -> Option<String> {
    let needed = (n * cpus * events_per_thread_cpu + cpus + 256) as u64;
    let limit = nofile_limit();
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

// ---------------------------------------------------------------------------------------------
// Targets and /proc
// ---------------------------------------------------------------------------------------------

/// What the target's threads do while they are armed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Load {
    /// Workers store once a second and sleep.
    Idle,
    /// Workers spin (storing to `VARS[0]` every ~1000 spins) under SCHED_IDLE.
    Spin,
}

/// A target with `n` threads in all (main + n-1 workers).
async fn target(n: usize, load: Load) -> Result<TargetProc> {
    let workers = (n - 1).to_string();
    match load {
        Load::Idle => TargetProc::start(&["--threads", &workers, "--interval-us", "1000000"]).await,
        Load::Spin => {
            let t = TargetProc::start(&["--threads", &workers, "--spin", "--sched-idle"]).await?;
            // Let every spinner run for a while first: right after READY
            // they have just left the gate and the scheduler's queue is
            // in another state than it is for a busy process. Both the
            // floors and wpd then meet the same steady state.
            tokio::time::sleep(SPIN_SETTLE).await;
            Ok(t)
        }
    }
}

/// How long a spinning target runs before a measurement starts.
const SPIN_SETTLE: Duration = Duration::from_millis(500);

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The name and the CPU time (user + system, µs) in one `/proc/.../stat`
/// text; clock-tick resolution.
fn stat_name_cpu_us(stat: &str) -> Option<(&str, f64)> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    // Fields after the comm: state is field 3, utime 14, stime 15.
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((&stat[open + 1..close], ticks * 1e6 / hz))
}

/// CPU time (user + system) a process has used so far, all its threads
/// (dead ones included), in µs; clock-tick resolution (`/proc/PID/stat`).
fn proc_cpu_us(pid: i32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    stat_name_cpu_us(&stat)
        .map(|(_, us)| us)
        .with_context(|| format!("bad {path}"))
}

/// CPU time (user + system, µs) of a process's live threads, summed by
/// role: the thread name with any `-N` suffix removed (`wpd-tracer-0` →
/// `wpd-tracer`). Threads that already exited are not counted.
fn thread_cpu_us_by_role(pid: i32) -> Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(stat) = std::fs::read_to_string(e?.path().join("stat")) else {
            continue; // exited meanwhile
        };
        let Some((comm, us)) = stat_name_cpu_us(&stat) else {
            continue;
        };
        let role = match comm.rsplit_once('-') {
            Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => head,
            _ => comm,
        };
        *out.entry(role.to_string()).or_insert(0.0) += us;
    }
    Ok(out)
}

/// Resident memory of a process: VmRSS and the part of it that is perf
/// ring buffers (mappings of `anon_inode:[perf_event]` in smaps), KiB; and
/// the size of those mappings.
#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    rss: u64,
    rings: u64,
    rings_mapped: u64,
}

impl Mem {
    fn without_rings(self) -> i64 {
        self.rss as i64 - self.rings as i64
    }
}

fn mem_of(pid: i32) -> Result<Mem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let (mut rings, mut rings_mapped) = (0, 0);
    let mut in_perf = false;
    let kib = |v: &str| {
        v.split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: "start-end perms offset dev inode [path]".
            in_perf = line.contains("anon_inode:[perf_event]");
        } else if in_perf && let Some(v) = line.strip_prefix("Rss:") {
            rings += kib(v);
        } else if in_perf && let Some(v) = line.strip_prefix("Size:") {
            rings_mapped += kib(v);
        }
    }
    Ok(Mem {
        rss,
        rings,
        rings_mapped,
    })
}

async fn stats(client: &mut Client) -> Result<GetStatsResponse> {
    Ok(client.get_stats(GetStatsRequest {}).await?.into_inner())
}

/// Polls GetStats until `done` holds (every 20 ms), or fails after `timeout`.
async fn wait_stats(
    client: &mut Client,
    timeout: Duration,
    what: &str,
    done: impl Fn(&GetStatsResponse) -> bool,
) -> Result<GetStatsResponse> {
    let deadline = Instant::now() + timeout;
    loop {
        let s = stats(client).await?;
        if done(&s) {
            return Ok(s);
        }
        ensure!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last GetStats: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Arms `n` threads of a fresh daemon with one process-wide watchpoint at
/// `addr`; the watchpoint id.
async fn arm_all(
    client: &mut Client,
    backend: Backend,
    target: &TargetProc,
    addr: u64,
    n: usize,
) -> Result<u64> {
    attach(client, target.pid, backend).await?;
    let resp = set_watchpoint_within(
        client,
        write_spec(backend, target.pid, addr),
        Duration::from_secs(300),
    )
    .await?;
    let wp = resp.watchpoint.context("no watchpoint")?;
    ensure!(
        wp.armed_threads as usize >= n,
        "{backend:?}: armed {} of {n} threads",
        wp.armed_threads
    );
    Ok(wp.id)
}

// ---------------------------------------------------------------------------------------------
// mass-arm
// ---------------------------------------------------------------------------------------------

async fn section_arm(args: &Args, cpus: &[i32], load: Load) -> Result<()> {
    let t0 = Instant::now();
    match load {
        Load::Idle => println!("## mass-arm: one process-wide write watchpoint, idle target\n"),
        Load::Spin => println!(
            "## mass-arm: one process-wide write watchpoint, spinning target (SCHED_IDLE spinners)\n"
        ),
    }
    println!(
        "| threads | what | total ms (median) | min–max ms | µs/thread | ratio to its floor |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    flush();
    let sizes = match load {
        Load::Idle => &args.threads,
        Load::Spin => &args.spin_threads,
    };
    for &n in sizes {
        let row = |what: &str, t: Spread, floor: Option<f64>| {
            let range = if t.min < t.max {
                format!("{:.1}–{:.1}", t.min, t.max)
            } else {
                "–".into()
            };
            println!(
                "| {n} | {what} | {:.1} | {range} | {:.1} | {} |",
                t.med,
                t.med * 1e3 / n as f64,
                floor
                    .map(|f| format!("{:.2}×", t.med / f))
                    .unwrap_or_else(|| "–".into())
            );
            flush();
        };
        let skip = |what: &str, why: &str| {
            println!("| {n} | {what}: {why} |  |  |  |  |");
            flush();
        };
        let mut wpd_perf = None;
        match perf_fds_skip(n, cpus.len(), 1) {
            Some(why) => skip("floor: perf breakpoint syscalls", &why),
            None => {
                let t = spread(rep(args.reps, || floor_perf(n, load, cpus, false, false)).await?);
                row("floor: perf breakpoint syscalls, no daemon", t, None);
            }
        }
        match perf_fds_skip(n, cpus.len(), 2) {
            Some(why) => {
                skip("floor: perf breakpoint + thread-tracking syscalls", &why);
                skip("wpd, perf backend", &why);
                let (t, outcome) = wpd_perf_refusal(n, load).await?;
                println!("| {n} | wpd, perf backend, asked anyway: {outcome} | {t:.1} |  |  |  |");
                flush();
            }
            None => {
                let floor =
                    spread(rep(args.reps, || floor_perf(n, load, cpus, true, false)).await?);
                row(
                    "floor: perf breakpoint + thread-tracking syscalls",
                    floor,
                    None,
                );
                let per_cpu =
                    spread(rep(args.reps, || floor_perf(n, load, cpus, true, true)).await?);
                row(
                    "floor: the same, one opener thread per CPU, no daemon",
                    per_cpu,
                    Some(floor.med),
                );
                let t = spread(rep(args.reps, || wpd_arm(n, load, Backend::Perf)).await?);
                row("wpd, perf backend (attach + arm)", t, Some(floor.med));
                println!(
                    "| {n} | wpd perf is {:.2}× the per-CPU openers (medians) |  |  |  |  |",
                    t.med / per_cpu.med
                );
                wpd_perf = Some(t);
            }
        }
        let floor_bare = spread(rep(args.reps, || floor_ptrace(n, load, false)).await?);
        row("floor: ptrace syscalls, no daemon", floor_bare, None);
        let floor_probe = spread(rep(args.reps, || floor_ptrace(n, load, true)).await?);
        row(
            "floor: free-slot check + ptrace syscalls, no daemon",
            floor_probe,
            None,
        );
        let wpd_ptrace = spread(rep(args.reps, || wpd_arm(n, load, Backend::Ptrace)).await?);
        row(
            "wpd, ptrace backend (attach + arm)",
            wpd_ptrace,
            Some(floor_probe.med),
        );
        if args.peers && load == Load::Idle {
            match peers(n, Peer::Gdb, args).await? {
                Ok(t) => {
                    row("gdb -batch: attach, watch, detach", t, None);
                    let perf = wpd_perf
                        .map(|p| format!("{:.1}× wpd perf, ", t.med / p.med))
                        .unwrap_or_default();
                    println!(
                        "| {n} | gdb takes {perf}{:.1}× wpd ptrace (medians) |  |  |  |  |",
                        t.med / wpd_ptrace.med,
                    );
                    flush();
                }
                Err(why) => println!("| {n} | gdb -batch: {why} |  |  |  |  |"),
            }
            match peers(n, Peer::PerfStat, args).await? {
                Ok(t) => row("perf stat -e mem:ADDR:w -p PID", t, None),
                Err(why) => println!("| {n} | perf stat: {why} |  |  |  |  |"),
            }
        }
        flush();
    }
    section_done(t0);
    Ok(())
}

/// Moves the calling thread to `SCHED_FIFO` priority 1, as wpd runs its
/// threads (`--priority realtime`, the default), with
/// `SCHED_RESET_ON_FORK` so that the targets and peers the bench starts run
/// at normal priority. Every thread of the bench runs so (the runtime's
/// start hook): the floors get the same scheduling as the daemon they are
/// compared with, and the client that times the daemon is not the one
/// waiting. At normal priority next to 1,000 busy `SCHED_IDLE` threads,
/// a process waited up to 0.35 s for a CPU after its reply had come
/// (`perf sched timehist`), which is the machine's scheduler, not wpd.
/// False if the kernel refused (no `CAP_SYS_NICE`).
fn realtime_thread() -> bool {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: changes only the calling thread's policy.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &p) == 0 }
}

/// The perf syscalls of a process-wide arm, in a bare loop; `tracked`: also
/// the thread-tracking events wpd opens at attach. `per_cpu`: the threads
/// cut into one contiguous range per CPU, each range opened by its own
/// thread (as wpd's arm passes do); otherwise one loop on one thread.
async fn floor_perf(
    n: usize,
    load: Load,
    cpus: &[i32],
    tracked: bool,
    per_cpu: bool,
) -> Result<f64> {
    let target = target(n, load).await?;
    let tids = target.tids()?;
    let addr = target.vars[QUIET_VAR];
    let collectors: Vec<OwnedFd> = cpus
        .iter()
        .map(|&c| floor_collector(c))
        .collect::<Result<_>>()?;
    let open_range = |tids: &[i32]| -> Result<Vec<OwnedFd>> {
        let mut fds = Vec::with_capacity(tids.len() * cpus.len() * 2);
        for &tid in tids {
            for (i, &cpu) in cpus.iter().enumerate() {
                if tracked {
                    fds.push(floor_perf_track(tid, cpu, &collectors[i])?);
                }
                fds.push(floor_perf_arm(tid, addr, cpu, &collectors[i])?);
            }
        }
        Ok(fds)
    };
    let t0 = Instant::now();
    let fds = if per_cpu {
        let size = tids.len().div_ceil(cpus.len().max(1));
        std::thread::scope(|s| {
            let handles: Vec<_> = tids
                .chunks(size)
                .map(|range| {
                    s.spawn(|| {
                        realtime_thread();
                        open_range(range)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| anyhow::anyhow!("an opener panicked"))?
                })
                .collect::<Result<Vec<_>>>()
        })?
    } else {
        vec![open_range(&tids)?]
    };
    let t = ms(t0.elapsed());
    drop(fds);
    Ok(t)
}

/// The ptrace syscalls of a process-wide arm (seize, interrupt all, reap,
/// two pokes, continue), in a bare loop on one thread.
async fn floor_ptrace(n: usize, load: Load, probe: bool) -> Result<f64> {
    let target = target(n, load).await?;
    let tids = target.tids()?;
    let addr = target.vars[QUIET_VAR];
    let t =
        tokio::task::spawn_blocking(move || ptrace_floor_blocking(&tids, addr, probe)).await??;
    drop(target);
    Ok(t)
}

const DR0: usize = 848;
const DR7: usize = 848 + 7 * 8;
/// DR7: slot 0 enabled (L0), write, 8 bytes.
const DR7_W8_SLOT0: u64 = 0x90001;

/// `probe`: stop every thread and check its free slot before writing any
/// register, as wpd does (see `floor_probe_slot`).
fn ptrace_floor_blocking(tids: &[i32], addr: u64, probe: bool) -> Result<f64> {
    let t0 = Instant::now();
    for &t in tids {
        // SAFETY: plain ptrace request on a thread of a process we started.
        if unsafe { libc::ptrace(libc::PTRACE_SEIZE, t, 0, 0) } != 0 {
            bail!("PTRACE_SEIZE {t}: {}", std::io::Error::last_os_error());
        }
    }
    for &t in tids {
        // SAFETY: as above.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, t, 0, 0) };
    }
    if probe {
        // wpd's order: every thread stopped, every free slot checked, then
        // the registers written.
        for &t in tids {
            let mut status = 0;
            // SAFETY: waiting for our own tracee.
            unsafe { libc::waitpid(t, &mut status, libc::__WALL) };
        }
        for &t in tids {
            ensure!(floor_probe_slot(t)?, "thread {t} has no free slot");
        }
    }
    for &t in tids {
        let mut status = 0;
        // SAFETY: waiting for (if not yet) and programming our own tracee.
        unsafe {
            if !probe {
                libc::waitpid(t, &mut status, libc::__WALL);
            }
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR0, addr);
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR7, DR7_W8_SLOT0);
            libc::ptrace(libc::PTRACE_CONT, t, 0, 0);
        }
    }
    let t = ms(t0.elapsed());
    // Clean up (not timed): DR7 = 0 before detaching, or the target dies
    // on its next hit.
    for &t in tids {
        // SAFETY: as above.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, t, 0, 0) };
    }
    for &t in tids {
        let mut status = 0;
        // SAFETY: as above.
        unsafe {
            libc::waitpid(t, &mut status, libc::__WALL);
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR7, 0u64);
            libc::ptrace(libc::PTRACE_DETACH, t, 0, 0);
        }
    }
    Ok(t)
}

/// wpd's attach + process-wide arm, as a client sees it.
async fn wpd_arm(n: usize, load: Load, backend: Backend) -> Result<f64> {
    let target = target(n, load).await?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let t0 = Instant::now();
    arm_all(&mut client, backend, &target, target.vars[QUIET_VAR], n).await?;
    let t = ms(t0.elapsed());
    drop(daemon);
    drop(target);
    Ok(t)
}

/// Where the perf backend's fds cannot fit: how long wpd takes to say so
/// (an attach of the `n`-thread target), and what it said.
async fn wpd_perf_refusal(n: usize, load: Load) -> Result<(f64, String)> {
    let target = target(n, load).await?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let t0 = Instant::now();
    let r = client
        .attach(wpd_proto::v1::AttachRequest {
            pid: target.pid,
            backend: Backend::Perf as i32,
            ..Default::default()
        })
        .await;
    let t = ms(t0.elapsed());
    let outcome = match r {
        Ok(_) => "attached (the limit was enough)".to_string(),
        Err(s) => {
            let reason = tonic_types::StatusExt::get_details_error_info(&s)
                .map(|i| i.reason)
                .unwrap_or_default();
            let first = s.message().split(" (nothing").next().unwrap_or_default();
            format!("refused, {:?} / {reason}: {first}", s.code())
        }
    };
    drop(daemon);
    drop(target);
    Ok((t, outcome))
}

/// `--reps` runs of a peer: their spread, or why there is none.
async fn peers(n: usize, which: Peer, args: &Args) -> Result<Result<Spread, String>> {
    let mut v = Vec::new();
    for _ in 0..args.reps {
        match peer(n, which, args.peer_timeout).await? {
            PeerResult::Took(t) => v.push(t),
            other => return Ok(Err(other.describe())),
        }
    }
    Ok(Ok(spread(v)))
}

#[derive(Clone, Copy)]
enum Peer {
    Gdb,
    PerfStat,
}

enum PeerResult {
    Took(f64),
    NotInstalled,
    Failed(String),
    TimedOut(Duration),
}

impl PeerResult {
    fn describe(&self) -> String {
        match self {
            PeerResult::Took(t) => format!("{t:.1} ms"),
            PeerResult::NotInstalled => "not installed: skipped".into(),
            PeerResult::Failed(why) => format!("failed ({why})"),
            PeerResult::TimedOut(d) => format!("did not finish within {} s: killed", d.as_secs()),
        }
    }
}

/// Wall time of a peer tool doing the same job, if it is installed.
async fn peer(n: usize, which: Peer, timeout: Duration) -> Result<PeerResult> {
    let tool = match which {
        Peer::Gdb => "gdb",
        Peer::PerfStat => "perf",
    };
    if std::process::Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        return Ok(PeerResult::NotInstalled);
    }
    let target = target(n, Load::Idle).await?;
    let (pid, addr) = (target.pid.to_string(), target.vars[QUIET_VAR]);
    let mut cmd = tokio::process::Command::new(tool);
    match which {
        Peer::Gdb => cmd.args([
            "-batch",
            "-nx",
            "-p",
            &pid,
            "-ex",
            &format!("watch *(long*){addr:#x}"),
            "-ex",
            "detach",
        ]),
        Peer::PerfStat => cmd.args([
            "stat",
            "-e",
            &format!("mem:{addr:#x}/8:w"),
            "-p",
            &pid,
            "--",
            "true",
        ]),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let t0 = Instant::now();
    let out = match tokio::time::timeout(timeout, cmd.status()).await {
        Err(_) => return Ok(PeerResult::TimedOut(timeout)),
        Ok(r) => r?,
    };
    let t = ms(t0.elapsed());
    drop(target);
    Ok(if out.success() {
        PeerResult::Took(t)
    } else {
        PeerResult::Failed(out.to_string())
    })
}

// ---------------------------------------------------------------------------------------------
// hit cost
// ---------------------------------------------------------------------------------------------

async fn section_hit_cost(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    println!("## hit cost: what one hit costs the writing thread\n");
    println!(
        "| backend | ns per write, no watchpoint | ns per write, watched | cost of one hit (µs) | hits delivered |"
    );
    println!("|---|---:|---:|---:|---:|");
    for backend in [Backend::Perf, Backend::Ptrace] {
        // A ptrace hit stops the thread (tens of µs): fewer writes.
        let writes = if backend == Backend::Ptrace {
            (args.writes / 20).max(100)
        } else {
            args.writes
        };
        let (base, watched, delivered) = hit_cost(backend, writes, args.reps).await?;
        println!(
            "| {} | {base:.1} | {watched:.1} | {:.2} | {delivered} of {} |",
            backend_name(backend),
            (watched - base) / 1e3,
            writes
        );
        flush();
    }
    section_done(t0);
    Ok(())
}

/// (ns per write without a watchpoint, with one, hits delivered).
async fn hit_cost(backend: Backend, writes: u64, reps: usize) -> Result<(f64, f64, u64)> {
    let mut target = TargetProc::start(&["--threads", "1", "--interval-us", "1000000"]).await?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let bench = |r: String| -> Result<f64> {
        let ns: f64 = r
            .strip_prefix("BENCH ns=")
            .with_context(|| format!("unexpected reply {r:?}"))?
            .parse()?;
        Ok(ns / writes as f64)
    };
    let cmd = format!("bench-writes 3 {writes}");
    let mut base = Vec::new();
    for _ in 0..reps {
        base.push(bench(
            target
                .cmd_within(&cmd, Duration::from_secs(300))
                .await?
                .context("no reply")?,
        )?);
    }
    attach(&mut client, target.pid, backend).await?;
    set_watchpoint_within(
        &mut client,
        write_spec(backend, target.pid, target.vars[3]),
        Duration::from_secs(30),
    )
    .await?;
    let mut watched = Vec::new();
    for _ in 0..reps {
        watched.push(bench(
            target
                .cmd_within(&cmd, Duration::from_secs(300))
                .await?
                .context("no reply")?,
        )?);
    }
    // Let the daemon drain what is in flight, then count.
    let expected = writes * reps as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut delivered = 0;
    while Instant::now() < deadline {
        delivered = wp_hits(&mut client, target.pid).await?;
        if delivered >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stats(&mut client).await?;
    drop(daemon);
    drop(target);
    Ok((median(base), median(watched), delivered / reps as u64))
}

/// Hits the daemon counted on the watchpoints of `pid`.
async fn wp_hits(client: &mut Client, pid: i32) -> Result<u64> {
    let list = client
        .list_watchpoints(ListWatchpointsRequest { pid })
        .await?
        .into_inner();
    Ok(list.watchpoints.iter().map(|w| w.hits).sum())
}

// ---------------------------------------------------------------------------------------------
// thread churn (+ ledger hold times)
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Churn {
    /// No watchpoint.
    Bare,
    /// 4 breakpoints, inherit=1, cpu=-1, opened by the bench on each creator.
    KernelInherit,
    /// wpd's event layout opened by the bench on each creator, no daemon:
    /// per CPU a thread-tracking event and 4 breakpoints, all inherited.
    Layout,
    /// A bare ptrace tracer in the bench (one thread, no daemon): the
    /// creators seized with `PTRACE_O_TRACECLONE`, each new thread's 4
    /// addresses and DR7 poked at its first stop: what the ptrace backend
    /// cannot avoid.
    PtraceTracer,
    /// 4 process-wide wpd watchpoints.
    Wpd(Backend),
}

impl Churn {
    fn describe(self) -> &'static str {
        match self {
            Churn::Bare => "no watchpoint",
            Churn::KernelInherit => "floor: 4 kernel-inherited breakpoints (inherit=1, cpu=-1)",
            Churn::Layout => "floor: wpd's perf event layout, inherited, no daemon",
            Churn::PtraceTracer => {
                "floor: bare ptrace tracer (clone stops, 4 addresses + DR7 poked per thread), no daemon"
            }
            Churn::Wpd(Backend::Ptrace) => "wpd, 4 process-wide watchpoints, ptrace backend",
            Churn::Wpd(_) => "wpd, 4 process-wide watchpoints, perf backend",
        }
    }
}

/// (p50, p99, max) ledger hold times, ns.
type Holds = (u64, u64, u64);

struct ChurnRun {
    /// µs of wall time per create+join (window / completed create+joins).
    us_per_op: f64,
    ops: u64,
    /// wpd only: holds after attach + arm (before the churn), after the churn.
    holds: Option<(Holds, Holds)>,
    /// wpd only: records the kernel dropped (ring full) during the churn.
    lost: u64,
}

fn holds(s: &GetStatsResponse) -> Holds {
    (
        s.ledger_hold_p50_ns,
        s.ledger_hold_p99_ns,
        s.ledger_hold_max_ns,
    )
}

async fn churn_once(k: usize, cfg: Churn, window: Duration, cpus: &[i32]) -> Result<ChurnRun> {
    let mut target = TargetProc::start(&["--churn", "--threads", &k.to_string()]).await?;
    // Before churn-start, the creators are the only threads but main.
    let creators = target.worker_tids()?;
    ensure!(
        creators.len() == k,
        "expected {k} creators, found {creators:?}"
    );
    let watch: Vec<u64> = target.vars[4..8].to_vec();
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut wpd: Option<(Daemon, Client, GetStatsResponse)> = None;
    let mut tracer: Option<std::thread::JoinHandle<Result<()>>> = None;
    match cfg {
        Churn::Bare => {}
        Churn::KernelInherit => {
            for &t in &creators {
                for &a in &watch {
                    fds.push(floor_perf_inherit(t, a)?);
                }
            }
        }
        Churn::Layout => {
            let collectors: Vec<OwnedFd> = cpus
                .iter()
                .map(|&c| floor_collector(c))
                .collect::<Result<_>>()?;
            for &t in &creators {
                for (i, &cpu) in cpus.iter().enumerate() {
                    fds.push(floor_perf_track(t, cpu, &collectors[i])?);
                    for &a in &watch {
                        fds.push(floor_perf_arm(t, a, cpu, &collectors[i])?);
                    }
                }
            }
            fds.extend(collectors);
        }
        Churn::PtraceTracer => {
            tracer = Some(bare_tracer(creators.clone(), watch.clone())?);
        }
        Churn::Wpd(backend) => {
            let daemon = Daemon::start().await?;
            let mut client = daemon.client().await?;
            attach(&mut client, target.pid, backend).await?;
            for &a in &watch {
                set_watchpoint_within(
                    &mut client,
                    write_spec(backend, target.pid, a),
                    Duration::from_secs(60),
                )
                .await?;
            }
            let before = stats(&mut client).await?;
            wpd = Some((daemon, client, before));
        }
    }
    target.cmd("churn-start").await?;
    tokio::time::sleep(window / 5).await;
    target.cmd("churn-stats").await?; // starts the measured window
    tokio::time::sleep(window).await;
    let reply = target
        .cmd_within("churn-stats", Duration::from_secs(60))
        .await?
        .context("no reply to churn-stats")?;
    let ops: u64 = field(&reply, "n")?;
    let ns: f64 = field(&reply, "ns")?;
    ensure!(ops > 0, "no thread was created in {window:?} ({reply})");
    let mut run = ChurnRun {
        us_per_op: ns / 1e3 / ops as f64,
        ops,
        holds: None,
        lost: 0,
    };
    if let Some((daemon, mut client, before)) = wpd {
        let after = stats(&mut client).await?;
        ensure!(
            after.watchpoints == 4 && after.processes == 1,
            "the daemon lost its watchpoints during the churn: {after:?}"
        );
        run.holds = Some((holds(&before), holds(&after)));
        run.lost = after.kernel_lost - before.kernel_lost;
        drop(target);
        drop(daemon);
    } else if let Some(t) = tracer {
        // Killed, every tracee ends, and the tracer with them.
        drop(target);
        t.join()
            .map_err(|_| anyhow::anyhow!("the bare tracer panicked"))??;
    }
    drop(fds);
    Ok(run)
}

/// DR7 with slots 0-3 enabled (L0-L3), each a write watch of 8 bytes.
const DR7_W8_SLOTS0_3: u64 = 0x9999_0055;

/// Starts the bare ptrace tracer of [`Churn::PtraceTracer`] on `creators`:
/// a thread that seizes them (new threads are attached by the kernel) and
/// programs DR0-DR3 = `addrs` and DR7 on every new thread at its first
/// stop; other stops are resumed at once, signals passed on. It ends when
/// every tracee has gone (the target is killed after the window).
fn bare_tracer(creators: Vec<i32>, addrs: Vec<u64>) -> Result<std::thread::JoinHandle<Result<()>>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || -> Result<()> {
        realtime_thread();
        let seized = (|| {
            for &t in &creators {
                // SAFETY: plain ptrace request on a thread of a process we started.
                let r = unsafe {
                    libc::ptrace(
                        libc::PTRACE_SEIZE,
                        t,
                        0,
                        libc::PTRACE_O_TRACECLONE as libc::c_long,
                    )
                };
                ensure!(
                    r == 0,
                    "PTRACE_SEIZE {t}: {}",
                    std::io::Error::last_os_error()
                );
            }
            Ok(())
        })();
        let ok = seized.is_ok();
        let _ = tx.send(seized);
        if !ok {
            return Ok(());
        }
        let mut armed: std::collections::HashSet<i32> = creators.iter().copied().collect();
        loop {
            let mut status = 0;
            // SAFETY: waiting for our own tracees. `__WNOTHREAD`: only this
            // thread's, never the bench's children (targets, daemons),
            // whose exits belong to their handles.
            let t = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::__WNOTHREAD) };
            if t < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Ok(()); // ECHILD: every tracee is gone
            }
            if !libc::WIFSTOPPED(status) {
                armed.remove(&t);
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            let event = status >> 16;
            let deliver = if event != 0 {
                if event == libc::PTRACE_EVENT_STOP && armed.insert(t) {
                    // A new thread's first stop: its registers.
                    for (i, &a) in addrs.iter().take(4).enumerate() {
                        // SAFETY: poking our own stopped tracee's user area.
                        unsafe { libc::ptrace(libc::PTRACE_POKEUSER, t, DR0 + 8 * i, a) };
                    }
                    // SAFETY: as above.
                    unsafe { libc::ptrace(libc::PTRACE_POKEUSER, t, DR7, DR7_W8_SLOTS0_3) };
                }
                0
            } else if sig == libc::SIGTRAP {
                0
            } else {
                sig
            };
            // SAFETY: restarting our own stopped tracee.
            unsafe { libc::ptrace(libc::PTRACE_CONT, t, 0, deliver as libc::c_long) };
        }
    });
    rx.recv()
        .map_err(|_| anyhow::anyhow!("the bare tracer ended before seizing"))??;
    Ok(h)
}

fn field<T: std::str::FromStr>(line: &str, key: &str) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .with_context(|| format!("no {key}= in {line:?}"))?
        .parse()
        .with_context(|| format!("bad {key}= in {line:?}"))
}

async fn section_churn(args: &Args, cpus: &[i32]) -> Result<()> {
    let t0 = Instant::now();
    let mut cfgs = vec![Churn::Wpd(Backend::Perf), Churn::Wpd(Backend::Ptrace)];
    if args.has("churn") {
        cfgs = vec![
            Churn::Bare,
            Churn::KernelInherit,
            Churn::Layout,
            Churn::Wpd(Backend::Perf),
            Churn::PtraceTracer,
            Churn::Wpd(Backend::Ptrace),
        ];
    }
    // results[k index][cfg index] = runs
    let mut results: Vec<Vec<Vec<ChurnRun>>> = Vec::new();
    for &k in &args.churn_threads {
        let mut per_cfg: Vec<Vec<ChurnRun>> = cfgs.iter().map(|_| Vec::new()).collect();
        // Interleaved: every configuration once per rep.
        for _ in 0..args.reps {
            for (i, &cfg) in cfgs.iter().enumerate() {
                per_cfg[i].push(
                    churn_once(k, cfg, args.window, cpus)
                        .await
                        .with_context(|| format!("churn, {k} creators, {cfg:?}"))?,
                );
            }
        }
        results.push(per_cfg);
    }
    if args.has("churn") {
        println!(
            "## thread churn: create + join while 4 watchpoints are set ({} ms windows)\n",
            args.window.as_millis()
        );
        println!(
            "| creators | what | µs per create+join | extra µs vs none | ratio to kernel-inherit floor | create+joins in window | kernel records lost |"
        );
        println!("|---:|---|---:|---:|---:|---:|---:|");
        for (ki, &k) in args.churn_threads.iter().enumerate() {
            let med: Vec<f64> = results[ki]
                .iter()
                .map(|runs| median(runs.iter().map(|r| r.us_per_op).collect()))
                .collect();
            let bare = med[0];
            let floor = med[1];
            let tracer_floor = cfgs.iter().position(|&c| c == Churn::PtraceTracer);
            for (i, &cfg) in cfgs.iter().enumerate() {
                let runs = &results[ki][i];
                let ops = median(runs.iter().map(|r| r.ops as f64).collect());
                let lost = match cfg {
                    Churn::Wpd(_) => runs.iter().map(|r| r.lost).max().unwrap_or(0).to_string(),
                    _ => "–".into(),
                };
                println!(
                    "| {k} | {} | {:.1} | {} | {} | {ops:.0} | {lost} |",
                    cfg.describe(),
                    med[i],
                    if cfg == Churn::Bare {
                        "–".to_string()
                    } else {
                        format!("{:+.1}", med[i] - bare)
                    },
                    match (cfg, tracer_floor) {
                        (Churn::Bare | Churn::KernelInherit, _) => "–".to_string(),
                        (Churn::Wpd(Backend::Ptrace), Some(t)) => format!(
                            "{:.2}× ({:.2}× the bare ptrace tracer)",
                            med[i] / floor,
                            med[i] / med[t]
                        ),
                        _ => format!("{:.2}×", med[i] / floor),
                    }
                );
            }
        }
        flush();
    }
    if args.has("ledger") {
        println!("\n## ledger lock hold times under thread churn (GetStats)\n");
        println!(
            "| creators | backend | after attach + 4 arms: p50 / p99 / max ns | after the churn: p50 / p99 / max ns | create+joins during the run |"
        );
        println!("|---:|---|---|---|---:|");
        for (ki, &k) in args.churn_threads.iter().enumerate() {
            for (i, &cfg) in cfgs.iter().enumerate() {
                let Churn::Wpd(backend) = cfg else { continue };
                let runs = &results[ki][i];
                let pick = |f: &dyn Fn(&ChurnRun) -> u64| {
                    median(runs.iter().map(|r| f(r) as f64).collect()) as u64
                };
                let b = (
                    pick(&|r| r.holds.map_or(0, |h| h.0.0)),
                    pick(&|r| r.holds.map_or(0, |h| h.0.1)),
                    pick(&|r| r.holds.map_or(0, |h| h.0.2)),
                );
                let a = (
                    pick(&|r| r.holds.map_or(0, |h| h.1.0)),
                    pick(&|r| r.holds.map_or(0, |h| h.1.1)),
                    pick(&|r| r.holds.map_or(0, |h| h.1.2)),
                );
                println!(
                    "| {k} | {} | {} / {} / {} | {} / {} / {} | {} |",
                    backend_name(backend),
                    b.0,
                    b.1,
                    b.2,
                    a.0,
                    a.1,
                    a.2,
                    pick(&|r| r.ops)
                );
            }
        }
        if args.reps > 1 {
            println!(
                "\nEach figure is the median over {} runs (one fresh daemon per run).",
                args.reps
            );
        }
        flush();
    }
    section_done(t0);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// hit throughput
// ---------------------------------------------------------------------------------------------

/// What a subscriber counted.
#[derive(Default)]
struct SubCounts {
    hits: AtomicU64,
    dropped: AtomicU64,
    lost: AtomicU64,
    /// ns since the subscriber's start when the last hit arrived.
    last_hit_ns: AtomicU64,
}

struct ThroughputRun {
    writers: usize,
    secs: f64,
    base_rate: f64,
    stores: u64,
    daemon_hits: u64,
    sub_hits: u64,
    dropped: u64,
    records_lost: u64,
    kernel_lost: u64,
    subscriber_dropped: u64,
    lag_ms: f64,
    daemon_cpu_us: f64,
    daemon_idle_cpu_us: f64,
    bench_cpu_us: f64,
    /// Daemon CPU over the hits, by thread role (µs).
    daemon_cpu_by_role: BTreeMap<String, f64>,
}

async fn throughput_once(
    backend: Backend,
    writers: usize,
    window: Duration,
) -> Result<ThroughputRun> {
    let mut target = TargetProc::start(&["--threads", "1", "--interval-us", "1000000"]).await?;
    let hammer_cmd = format!("hammer {HAMMER_VAR} {writers} {}", window.as_millis());
    let reply_timeout = window + Duration::from_secs(120);
    let hammer = async |t: &mut TargetProc| -> Result<(u64, f64)> {
        let r = t
            .cmd_within(&hammer_cmd, reply_timeout)
            .await?
            .context("no reply to hammer")?;
        Ok((field(&r, "stores")?, field::<f64>(&r, "ns")? / 1e9))
    };
    let (base_stores, base_secs) = hammer(&mut target).await?;
    let daemon = Daemon::start().await?;
    let dpid = daemon.pid();
    let mut client = daemon.client().await?;
    attach(&mut client, target.pid, backend).await?;
    let wp = set_watchpoint_within(
        &mut client,
        write_spec(backend, target.pid, target.vars[HAMMER_VAR]),
        Duration::from_secs(30),
    )
    .await?
    .watchpoint
    .context("no watchpoint")?;
    // The subscriber: its own connection, hits of this watchpoint only.
    let mut sub_client = daemon.client().await?;
    let mut stream = sub_client
        .stream_events(StreamEventsRequest {
            pid: target.pid,
            watchpoint_ids: vec![wp.id],
            hits_only: true,
        })
        .await?
        .into_inner();
    let counts = Arc::new(SubCounts::default());
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let sub_start = Instant::now();
    let task = {
        let counts = counts.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stop_rx => return Ok(()),
                    msg = stream.message() => match msg? {
                        None => bail!("the event stream ended"),
                        Some(m) => match m.event {
                            Some(Event::Hit(_)) => {
                                counts.hits.fetch_add(1, Ordering::Relaxed);
                                counts.last_hit_ns.store(
                                    sub_start.elapsed().as_nanos() as u64,
                                    Ordering::Relaxed,
                                );
                            }
                            Some(Event::Dropped(d)) => {
                                counts.dropped.fetch_add(d.count, Ordering::Relaxed);
                            }
                            Some(Event::RecordsLost(l)) => {
                                counts.lost.fetch_add(l.count, Ordering::Relaxed);
                            }
                            _ => {}
                        },
                    },
                }
            }
        })
    };
    // Baseline: the daemon's CPU over the same time with no hit.
    let c0 = proc_cpu_us(dpid)?;
    tokio::time::sleep(window).await;
    let daemon_idle_cpu_us = proc_cpu_us(dpid)? - c0;
    let s0 = stats(&mut client).await?;
    let (c1, b1) = (proc_cpu_us(dpid)?, proc_cpu_us(std::process::id() as i32)?);
    let roles1 = thread_cpu_us_by_role(dpid)?;
    let (stores, secs) = hammer(&mut target).await?;
    let hammer_end = sub_start.elapsed();
    // Wait until everything arrived, or nothing moved for 2 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (u64::MAX, u64::MAX);
    let mut still_since = Instant::now();
    loop {
        let now = (
            counts.hits.load(Ordering::Relaxed),
            wp_hits(&mut client, target.pid).await?,
        );
        if now.0 >= stores && now.1 >= stores {
            break;
        }
        if now != last {
            last = now;
            still_since = Instant::now();
        } else if still_since.elapsed() > Duration::from_secs(2) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (c2, b2) = (proc_cpu_us(dpid)?, proc_cpu_us(std::process::id() as i32)?);
    let mut daemon_cpu_by_role = thread_cpu_us_by_role(dpid)?;
    for (role, us) in daemon_cpu_by_role.iter_mut() {
        *us -= roles1.get(role).copied().unwrap_or(0.0);
    }
    daemon_cpu_by_role.retain(|_, us| *us > 0.0);
    let s1 = stats(&mut client).await?;
    let daemon_hits = wp_hits(&mut client, target.pid).await?;
    let _ = stop_tx.send(());
    task.await??;
    let last_hit = Duration::from_nanos(counts.last_hit_ns.load(Ordering::Relaxed));
    drop(target);
    drop(daemon);
    Ok(ThroughputRun {
        writers,
        secs,
        base_rate: base_stores as f64 / base_secs,
        stores,
        daemon_hits,
        sub_hits: counts.hits.load(Ordering::Relaxed),
        dropped: counts.dropped.load(Ordering::Relaxed),
        records_lost: counts.lost.load(Ordering::Relaxed),
        kernel_lost: s1.kernel_lost - s0.kernel_lost,
        subscriber_dropped: s1.subscriber_dropped - s0.subscriber_dropped,
        lag_ms: ms(last_hit.saturating_sub(hammer_end)),
        daemon_cpu_us: c2 - c1,
        daemon_idle_cpu_us,
        bench_cpu_us: b2 - b1,
        daemon_cpu_by_role,
    })
}

async fn section_throughput(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let ncpu = wpd_tests::online_cpus().len().max(1);
    let mut writer_counts = vec![1];
    if ncpu > 1 {
        writer_counts.push(ncpu);
    }
    println!(
        "## hit throughput: writers store to a watched variable for {} ms; one gRPC subscriber\n",
        args.window.as_millis()
    );
    println!(
        "| backend | writers | stores/s, no watchpoint | stores (= hits made) | hits counted by wpd | hits received by subscriber | lost: EventsDropped / RecordsLost (stream); subscriber_dropped / kernel_lost (GetStats) | hits/s received | last hit after the writers stopped (ms) | daemon CPU µs per hit | daemon CPU over the same time, no hits (ms) | subscriber (bench) CPU µs per hit | daemon CPU µs per hit by thread |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|");
    for backend in [Backend::Perf, Backend::Ptrace] {
        for &w in &writer_counts {
            // One run per configuration (a run is the window); the median
            // over reps of hits/s picks the row.
            let mut runs = Vec::new();
            for _ in 0..args.reps {
                runs.push(throughput_once(backend, w, args.window).await?);
            }
            runs.sort_by(|a, b| {
                (a.sub_hits as f64 / a.secs).total_cmp(&(b.sub_hits as f64 / b.secs))
            });
            let r = &runs[runs.len() / 2];
            let per_hit = |cpu: f64| {
                if r.daemon_hits == 0 {
                    "–".to_string()
                } else {
                    format!("{:.2}", cpu / r.daemon_hits as f64)
                }
            };
            let by_role = r
                .daemon_cpu_by_role
                .iter()
                .map(|(role, us)| format!("{role} {}", per_hit(*us)))
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "| {} | {} | {:.0} | {} | {} | {} | {} / {} / {} / {} | {:.0} | {:.1} | {} | {:.0} | {} | {} |",
                backend_name(backend),
                r.writers,
                r.base_rate,
                r.stores,
                r.daemon_hits,
                r.sub_hits,
                r.dropped,
                r.records_lost,
                r.subscriber_dropped,
                r.kernel_lost,
                r.sub_hits as f64 / r.secs,
                r.lag_ms,
                per_hit(r.daemon_cpu_us),
                r.daemon_idle_cpu_us / 1e3,
                per_hit(r.bench_cpu_us),
                if by_role.is_empty() {
                    "–".to_string()
                } else {
                    by_role
                },
            );
            flush();
        }
    }
    if args.reps > 1 {
        println!(
            "\nEach row is the run with the median hits/s of {} runs.",
            args.reps
        );
    }
    section_done(t0);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// memory
// ---------------------------------------------------------------------------------------------

struct MemRun {
    before: Mem,
    attached: Mem,
    exited: Mem,
    exited2: Mem,
}

/// One attach + arm of an `n`-thread idle target, then its exit; the daemon's
/// memory while attached and after the daemon has seen the exit.
async fn mem_cycle(
    daemon: &Daemon,
    client: &mut Client,
    backend: Backend,
    n: usize,
    settle: Duration,
) -> Result<(Mem, Mem)> {
    let mut target = target(n, Load::Idle).await?;
    arm_all(client, backend, &target, target.vars[QUIET_VAR], n).await?;
    wait_stats(
        client,
        Duration::from_secs(60),
        "every thread tracked",
        |s| s.threads as usize >= n,
    )
    .await?;
    tokio::time::sleep(settle).await;
    let attached = mem_of(daemon.pid())?;
    target.send("quit")?;
    target.wait_exit(Duration::from_secs(300)).await?;
    wait_stats(
        client,
        Duration::from_secs(300),
        "the process's exit",
        |s| s.processes == 0 && s.threads == 0,
    )
    .await?;
    tokio::time::sleep(settle).await;
    Ok((attached, mem_of(daemon.pid())?))
}

async fn mem_once(backend: Backend, n: usize, settle: Duration) -> Result<MemRun> {
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    client
        .get_capabilities(GetCapabilitiesRequest {})
        .await?
        .into_inner();
    stats(&mut client).await?;
    tokio::time::sleep(settle).await;
    let before = mem_of(daemon.pid())?;
    let (attached, exited) = mem_cycle(&daemon, &mut client, backend, n, settle).await?;
    let (_, exited2) = mem_cycle(&daemon, &mut client, backend, n, settle).await?;
    Ok(MemRun {
        before,
        attached,
        exited,
        exited2,
    })
}

async fn section_memory(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    println!(
        "## daemon memory: RSS before attach, with N tracked threads, after the process exits\n"
    );
    println!(
        "| backend | threads | RSS before attach KiB | RSS attached + 1 watchpoint KiB | KiB per tracked thread, rings excluded | RSS after exit KiB | after a 2nd attach + exit KiB | after exit − before KiB | perf rings resident / mapped KiB (before, attached, after) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for &n in &args.threads {
        for backend in [Backend::Perf, Backend::Ptrace] {
            if backend == Backend::Perf
                && let Some(why) = perf_fds_skip(n, wpd_tests::online_cpus().len(), 2)
            {
                println!("| perf | {n} | {why} |  |  |  |  |  |  |");
                continue;
            }
            // One run: RSS is deterministic enough, and a 10,000-thread
            // cycle takes seconds.
            let r = mem_once(backend, n, args.settle).await?;
            let per_thread =
                (r.attached.without_rings() - r.before.without_rings()) as f64 / n as f64;
            let rings = |m: Mem| format!("{} / {}", m.rings, m.rings_mapped);
            println!(
                "| {} | {n} | {} | {} | {per_thread:.2} | {} | {} | {:+} | {}, {}, {} |",
                backend_name(backend),
                r.before.rss,
                r.attached.rss,
                r.exited.rss,
                r.exited2.rss,
                r.exited.without_rings() - r.before.without_rings(),
                rings(r.before),
                rings(r.attached),
                rings(r.exited),
            );
            flush();
        }
    }
    section_done(t0);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// RPC latency
// ---------------------------------------------------------------------------------------------

/// Latencies (µs) of `count` calls of `f`.
async fn lat<F, Fut>(count: usize, mut f: F) -> Result<Vec<f64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut v = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        f().await?;
        v.push(us(t0.elapsed()));
    }
    Ok(v)
}

/// The perf syscalls of a thread-scoped set (one breakpoint per CPU) and
/// remove (close them), `pairs` times: (set µs, remove µs).
fn perf_pair_floor(
    tid: i32,
    addr: u64,
    cpus: &[i32],
    pairs: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let collectors: Vec<OwnedFd> = cpus
        .iter()
        .map(|&c| floor_collector(c))
        .collect::<Result<_>>()?;
    let (mut set, mut rm) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let t0 = Instant::now();
        let fds = cpus
            .iter()
            .enumerate()
            .map(|(i, &cpu)| floor_perf_arm(tid, addr, cpu, &collectors[i]))
            .collect::<Result<Vec<_>>>()?;
        set.push(us(t0.elapsed()));
        let t0 = Instant::now();
        drop(fds);
        rm.push(us(t0.elapsed()));
    }
    Ok((set, rm))
}

/// The ptrace syscalls of a thread-scoped set (interrupt, wait, poke DR0 and
/// DR7, continue) and remove (interrupt, wait, poke DR7, continue) on a
/// thread already seized (not timed), `pairs` times: (set µs, remove µs).
fn ptrace_pair_floor(tid: i32, addr: u64, pairs: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    // SAFETY (every block below): plain ptrace requests on a thread of a
    // process we started, and waitpid on our own tracee.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
        bail!("PTRACE_SEIZE {tid}: {}", std::io::Error::last_os_error());
    }
    let stop = || {
        let mut status = 0;
        // SAFETY: see above.
        unsafe {
            libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0);
            libc::waitpid(tid, &mut status, libc::__WALL);
        }
    };
    let (mut set, mut rm) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let t0 = Instant::now();
        stop();
        // SAFETY: see above.
        unsafe {
            libc::ptrace(libc::PTRACE_POKEUSER, tid, DR0, addr);
            libc::ptrace(libc::PTRACE_POKEUSER, tid, DR7, DR7_W8_SLOT0);
            libc::ptrace(libc::PTRACE_CONT, tid, 0, 0);
        }
        set.push(us(t0.elapsed()));
        let t0 = Instant::now();
        stop();
        // SAFETY: see above.
        unsafe {
            libc::ptrace(libc::PTRACE_POKEUSER, tid, DR7, 0u64);
            libc::ptrace(libc::PTRACE_CONT, tid, 0, 0);
        }
        rm.push(us(t0.elapsed()));
    }
    stop();
    // SAFETY: see above.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0) };
    Ok((set, rm))
}

/// What ListThreads must at least do without a daemon: list
/// `/proc/PID/task` and read every thread's comm. µs.
fn list_floor(pid: i32) -> Result<f64> {
    let t0 = Instant::now();
    let dir = format!("/proc/{pid}/task");
    let mut names = 0usize;
    for e in std::fs::read_dir(&dir)? {
        let e = e?;
        if let Ok(c) = std::fs::read_to_string(e.path().join("comm")) {
            names += c.len();
        }
    }
    std::hint::black_box(names);
    Ok(us(t0.elapsed()))
}

async fn section_rpc(args: &Args, cpus: &[i32]) -> Result<()> {
    let t0 = Instant::now();
    println!(
        "## RPC latency: SetWatchpoint/RemoveWatchpoint on one thread ({} pairs), ListThreads ({} calls)\n",
        args.rpc_pairs, args.list_calls
    );
    println!("| threads | call | p50 µs | p99 µs | p50 ratio to its floor |");
    println!("|---:|---|---:|---:|---:|");
    let row = |n: usize, what: &str, v: (f64, f64), floor: Option<f64>| {
        format!(
            "| {n} | {what} | {:.1} | {:.1} | {} |",
            v.0,
            v.1,
            floor
                .map(|f| format!("{:.2}×", v.0 / f))
                .unwrap_or_else(|| "–".into())
        )
    };
    for &n in &args.threads {
        let target = target(n, Load::Idle).await?;
        let pid = target.pid;
        let workers = target.worker_tids()?;
        // A worker in the middle (not the main thread: it reads stdin).
        let tid = workers.get(workers.len() / 2).copied().unwrap_or(pid);
        let addr = target.vars[QUIET_VAR];
        let pairs = args.rpc_pairs;
        // Floors first: the ptrace one needs the thread untraced.
        let (pf_set, pf_rm) = perf_pair_floor(tid, addr, cpus, pairs)?;
        let (pt_set, pt_rm) =
            tokio::task::spawn_blocking(move || ptrace_pair_floor(tid, addr, pairs)).await??;
        let mut lf = Vec::new();
        for _ in 0..args.list_calls {
            lf.push(list_floor(pid)?);
        }
        let lf = p50_p99(lf);
        let mut grpc = Vec::new();
        let mut rows = Vec::new();
        for backend in [Backend::Perf, Backend::Ptrace] {
            if backend == Backend::Perf
                && let Some(why) = perf_fds_skip(n, cpus.len(), 2)
            {
                rows.push(format!("| {n} | wpd perf: {why} |  |  |  |"));
                continue;
            }
            let daemon = Daemon::start().await?;
            let mut client = daemon.client().await?;
            arm_all(&mut client, backend, &target, addr, n).await?;
            // The gRPC round trip: a call that does next to nothing.
            grpc.extend(
                lat(pairs, || {
                    let mut c = client.clone();
                    async move {
                        c.get_capabilities(GetCapabilitiesRequest {}).await?;
                        Ok(())
                    }
                })
                .await?,
            );
            let (mut set, mut rm) = (Vec::new(), Vec::new());
            for i in 0..pairs {
                // Thread-scoped, in a slot the process-wide watchpoint leaves free.
                let spec = WatchpointSpec {
                    tids: vec![tid],
                    address: target.vars[4 + i % 4],
                    ..write_spec(backend, pid, 0)
                };
                let t1 = Instant::now();
                let wp = set_watchpoint_within(&mut client, spec, Duration::from_secs(30))
                    .await?
                    .watchpoint
                    .context("no watchpoint")?;
                set.push(us(t1.elapsed()));
                ensure!(wp.armed_threads == 1, "armed {} threads", wp.armed_threads);
                let t1 = Instant::now();
                client
                    .remove_watchpoint(RemoveWatchpointRequest { id: wp.id })
                    .await?;
                rm.push(us(t1.elapsed()));
            }
            let list = lat(args.list_calls, || {
                let mut c = client.clone();
                async move {
                    let r = c
                        .list_threads(ListThreadsRequest {
                            pid,
                            tids: vec![],
                            probe: false,
                        })
                        .await?
                        .into_inner();
                    ensure!(
                        r.threads.len() >= n,
                        "ListThreads listed {}",
                        r.threads.len()
                    );
                    Ok(())
                }
            })
            .await?;
            drop(daemon);
            let name = backend_name(backend);
            let (fs, fr) = if backend == Backend::Ptrace {
                (p50_p99(pt_set.clone()), p50_p99(pt_rm.clone()))
            } else {
                (p50_p99(pf_set.clone()), p50_p99(pf_rm.clone()))
            };
            let (set, rm, list) = (p50_p99(set), p50_p99(rm), p50_p99(list));
            rows.push(row(
                n,
                &format!("floor: {name} syscalls of a one-thread set, no daemon"),
                fs,
                None,
            ));
            rows.push(row(
                n,
                &format!("wpd {name}: SetWatchpoint, 1 thread"),
                set,
                Some(fs.0),
            ));
            rows.push(row(
                n,
                &format!("floor: {name} syscalls of a one-thread remove, no daemon"),
                fr,
                None,
            ));
            rows.push(row(
                n,
                &format!("wpd {name}: RemoveWatchpoint, 1 thread"),
                rm,
                Some(fr.0),
            ));
            rows.push(row(
                n,
                &format!("wpd {name}: ListThreads, all threads"),
                list,
                Some(lf.0),
            ));
        }
        let grpc = p50_p99(grpc);
        println!(
            "{}",
            row(n, "floor: gRPC round trip (GetCapabilities)", grpc, None)
        );
        println!(
            "{}",
            row(
                n,
                "floor: list /proc/PID/task + read every comm, no daemon",
                lf,
                None,
            )
        );
        for r in rows {
            println!("{r}");
        }
        drop(target);
        flush();
    }
    section_done(t0);
    Ok(())
}
