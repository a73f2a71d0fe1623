//! `wpd-bench`: end-to-end benchmark of wpd against the bare syscalls it
//! makes and against the peers (gdb, perf) on the same machine, in one run.
//!
//! ```text
//! cargo build --release --workspace --bins && target/release/wpd-bench [--threads 1000,10000] [--reps 3]
//! ```
//!
//! Measured, each against a baseline taken in the same run:
//! - mass-arm: one process-wide write watchpoint on an idle target of N
//!   threads, per backend (attach + arm), against the same syscalls in a
//!   bare loop with no daemon (the floor), `gdb -batch` and `perf stat`.
//! - hit cost: what one hit costs the writing thread, per backend, against
//!   the same writes with no watchpoint; and whether every hit was delivered.
//!
//! Timings are medians over `--reps` runs. Nothing here asserts a time.

use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use wpd_proto::v1::{GetStatsRequest, ListWatchpointsRequest};
use wpd_tests::{
    Backend, Daemon, TargetProc, attach, floor_collector, floor_perf_arm, floor_perf_track,
    set_watchpoint_within, write_spec,
};

const USAGE: &str =
    "usage: wpd-bench [--threads N[,N...]] [--reps R] [--writes W] [--no-peers] [--smoke]";

struct Args {
    threads: Vec<usize>,
    reps: usize,
    writes: u64,
    peers: bool,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        threads: vec![1000],
        reps: 3,
        writes: 200_000,
        peers: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--threads" => {
                a.threads = val()?
                    .split(',')
                    .map(|s| s.parse())
                    .collect::<Result<_, _>>()?
            }
            "--reps" => a.reps = val()?.parse()?,
            "--writes" => a.writes = val()?.parse()?,
            "--no-peers" => a.peers = false,
            // Seconds-long run for CI: checks the bench works, measures little.
            "--smoke" => {
                a.threads = vec![50];
                a.reps = 1;
                a.writes = 2_000;
                a.peers = false;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if a.reps == 0 || a.threads.contains(&0) {
        bail!("--reps and --threads must be positive");
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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

fn raise_nofile() {
    let lim = libc::rlimit {
        rlim_cur: 1 << 20,
        rlim_max: 1 << 20,
    };
    // SAFETY: plain setrlimit with a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

async fn run(args: Args) -> Result<()> {
    let cpus = wpd_cpus();
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
    println!("reps: {} (medians)\n", args.reps);
    println!("## mass-arm: one process-wide write watchpoint, idle target\n");
    println!("| threads | what | total ms | µs/thread | ratio to its floor |");
    println!("|---:|---|---:|---:|---:|");
    for &n in &args.threads {
        let floor_bp = median(rep(args.reps, || floor_perf(n, &cpus, false)).await?);
        let floor_perf_tracked = median(rep(args.reps, || floor_perf(n, &cpus, true)).await?);
        let floor_ptrace = median(rep(args.reps, || floor_ptrace(n)).await?);
        let wpd_perf = median(rep(args.reps, || wpd_arm(n, Backend::Perf)).await?);
        let wpd_ptrace = median(rep(args.reps, || wpd_arm(n, Backend::Ptrace)).await?);
        let row = |what: &str, t: f64, floor: Option<f64>| {
            println!(
                "| {n} | {what} | {t:.1} | {:.1} | {} |",
                t * 1e3 / n as f64,
                floor
                    .map(|f| format!("{:.2}×", t / f))
                    .unwrap_or_else(|| "–".into())
            );
        };
        row("floor: perf breakpoint syscalls, no daemon", floor_bp, None);
        row(
            "floor: perf breakpoint + thread-tracking syscalls",
            floor_perf_tracked,
            None,
        );
        row(
            "wpd, perf backend (attach + arm)",
            wpd_perf,
            Some(floor_perf_tracked),
        );
        row("floor: ptrace syscalls, no daemon", floor_ptrace, None);
        row(
            "wpd, ptrace backend (attach + arm)",
            wpd_ptrace,
            Some(floor_ptrace),
        );
        if args.peers {
            if let Some(t) = peer(n, Peer::Gdb).await? {
                row("gdb -batch: attach, watch, detach", t, None);
                println!(
                    "|  | wpd perf is {:.0}× faster than gdb |  |  |  |",
                    t / wpd_perf
                );
            }
            if let Some(t) = peer(n, Peer::PerfStat).await? {
                row("perf stat -e mem:ADDR:w -p PID", t, None);
            }
        }
        let _ = std::io::stdout().flush();
    }
    println!("\n## hit cost: what one hit costs the writing thread\n");
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
            if backend == Backend::Perf {
                "perf"
            } else {
                "ptrace"
            },
            (watched - base) / 1e3,
            writes
        );
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

/// An idle target with `n` threads in all (main + n-1 workers).
async fn idle_target(n: usize) -> Result<TargetProc> {
    let workers = (n - 1).to_string();
    TargetProc::start(&["--threads", &workers, "--interval-us", "1000000"]).await
}

fn wpd_cpus() -> Vec<i32> {
    let s =
        std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_else(|_| "0".into());
    let mut v = Vec::new();
    for part in s.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<i32>().ok()),
        }
    }
    v
}

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

/// The perf syscalls of a process-wide arm, in a bare loop; `tracked`: also
/// the thread-tracking events wpd opens at attach.
async fn floor_perf(n: usize, cpus: &[i32], tracked: bool) -> Result<f64> {
    let target = idle_target(n).await?;
    let tids = target.tids()?;
    let addr = target.vars[0];
    let collectors: Vec<OwnedFd> = cpus
        .iter()
        .map(|&c| floor_collector(c))
        .collect::<Result<_>>()?;
    let t0 = Instant::now();
    let mut fds = Vec::with_capacity(tids.len() * cpus.len());
    for &tid in &tids {
        for (i, &cpu) in cpus.iter().enumerate() {
            if tracked {
                fds.push(floor_perf_track(tid, cpu, &collectors[i])?);
            }
            fds.push(floor_perf_arm(tid, addr, cpu, &collectors[i])?);
        }
    }
    let t = ms(t0.elapsed());
    drop(fds);
    Ok(t)
}

/// The ptrace syscalls of a process-wide arm (seize, interrupt all, reap,
/// two pokes, continue), in a bare loop on one thread.
async fn floor_ptrace(n: usize) -> Result<f64> {
    let target = idle_target(n).await?;
    let tids = target.tids()?;
    let addr = target.vars[0];
    let t = tokio::task::spawn_blocking(move || ptrace_floor_blocking(&tids, addr)).await??;
    drop(target);
    Ok(t)
}

fn ptrace_floor_blocking(tids: &[i32], addr: u64) -> Result<f64> {
    const DR0: usize = 848;
    const DR7: usize = 848 + 7 * 8;
    let t0 = Instant::now();
    for &t in tids {
        // SAFETY: plain ptrace requests on threads of a process we started.
        unsafe {
            if libc::ptrace(libc::PTRACE_SEIZE, t, 0, 0) != 0 {
                bail!("PTRACE_SEIZE {t}: {}", std::io::Error::last_os_error());
            }
            libc::ptrace(libc::PTRACE_INTERRUPT, t, 0, 0);
        }
    }
    for &t in tids {
        let mut status = 0;
        // SAFETY: waiting for our own tracee.
        unsafe {
            libc::waitpid(t, &mut status, libc::__WALL);
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR0, addr);
            libc::ptrace(libc::PTRACE_POKEUSER, t, DR7, 0x90001u64);
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
async fn wpd_arm(n: usize, backend: Backend) -> Result<f64> {
    let target = idle_target(n).await?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let t0 = Instant::now();
    attach(&mut client, target.pid, backend).await?;
    let resp = set_watchpoint_within(
        &mut client,
        write_spec(backend, target.pid, target.vars[0]),
        Duration::from_secs(120),
    )
    .await?;
    let t = ms(t0.elapsed());
    let armed = resp.watchpoint.map(|w| w.armed_threads).unwrap_or(0) as usize;
    if armed < n {
        bail!("{backend:?}: armed {armed} of {n} threads");
    }
    drop(daemon);
    drop(target);
    Ok(t)
}

enum Peer {
    Gdb,
    PerfStat,
}

/// Wall time of a peer tool doing the same job, if it is installed.
async fn peer(n: usize, which: Peer) -> Result<Option<f64>> {
    let (tool, _) = match which {
        Peer::Gdb => ("gdb", ()),
        Peer::PerfStat => ("perf", ()),
    };
    if Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        println!("|  | {tool} not installed: skipped |  |  |  |");
        return Ok(None);
    }
    let target = idle_target(n).await?;
    let (pid, addr) = (target.pid.to_string(), target.vars[0]);
    let mut cmd = match which {
        Peer::Gdb => {
            let mut c = Command::new("gdb");
            c.args([
                "-batch",
                "-nx",
                "-p",
                &pid,
                "-ex",
                &format!("watch *(long*){addr:#x}"),
                "-ex",
                "detach",
            ]);
            c
        }
        Peer::PerfStat => {
            let mut c = Command::new("perf");
            c.args([
                "stat",
                "-e",
                &format!("mem:{addr:#x}/8:w"),
                "-p",
                &pid,
                "--",
                "true",
            ]);
            c
        }
    };
    let t0 = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        cmd.stdout(Stdio::null()).stderr(Stdio::null()).status()
    })
    .await??;
    let t = ms(t0.elapsed());
    drop(target);
    Ok(out.success().then_some(t))
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
        let list = client
            .list_watchpoints(ListWatchpointsRequest { pid: target.pid })
            .await?
            .into_inner();
        delivered = list.watchpoints.iter().map(|w| w.hits).sum::<u64>();
        if delivered >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = client.get_stats(GetStatsRequest {}).await?;
    drop(daemon);
    drop(target);
    Ok((median(base), median(watched), delivered / reps as u64))
}
