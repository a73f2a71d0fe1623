//! `wpd-demo`: the README's first command — starts `wpd` and a 1000-thread `wpd-target`, watches
//! one variable on every thread, shows live hits (thread, value, and the function and source
//! line of the store, as `wpctl events` names them), and prints what it measured.
//!
//! ```text
//! cargo build --release --workspace --bins && sudo target/release/wpd-demo [--threads N] [--seconds S]
//! ```
//!
//! `wpd` and `wpd-target` are taken from the directory of this executable. Both run under
//! guards: they are stopped when the demo ends, fails, or is interrupted with Ctrl-C.

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use tokio::time::Instant;
use wpd_proto::places::Places;
use wpd_proto::text::location_text;
use wpd_proto::v1::{
    DetachRequest, GetCapabilitiesRequest, GetStatsRequest, RemoveWatchpointRequest,
    StreamEventsRequest,
};
use wpd_tests::{
    Backend, Client, Daemon, Event, EventStream, TargetProc, describe_status, find_bin,
    hit_value_u64, rpc_ok, set_watchpoint_within, write_spec,
};

const USAGE: &str = "\
usage: wpd-demo [--threads N] [--seconds S] [--interval-ms M]

Starts wpd and wpd-target (N worker threads, default 1000, each storing to one
variable every M ms, default 50), sets one process-wide write watchpoint, shows
live hits (thread, value, function and source line) for S seconds (default 3)
and prints a summary.
Must run as root. wpd and wpd-target must sit beside this executable
(cargo build --release --workspace --bins).";

/// Hit lines printed one by one before switching to a counter.
const LIVE_HIT_LINES: usize = 15;

struct Args {
    threads: usize,
    seconds: u64,
    interval_ms: u64,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        threads: 1000,
        seconds: 3,
        interval_ms: 50,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<u64> {
            let v = it.next().ok_or_else(|| anyhow!("{name} needs a value"))?;
            v.parse().with_context(|| format!("{name} {v:?}"))
        };
        match arg.as_str() {
            "--threads" => args.threads = value("--threads")? as usize,
            "--seconds" => args.seconds = value("--seconds")?,
            "--interval-ms" => args.interval_ms = value("--interval-ms")?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}"),
        }
    }
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("wpd-demo: {e:#}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "wpd-demo: must run as root: wpd attaches to another process and programs its \
             debug registers.\n  try: sudo {}",
            std::env::args().collect::<Vec<_>>().join(" ")
        );
        return ExitCode::from(1);
    }
    for bin in ["wpd", "wpd-target"] {
        if let Err(e) = find_bin(bin) {
            eprintln!("wpd-demo: {e:#}");
            return ExitCode::from(1);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wpd-demo: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // On Ctrl-C the `run` future is dropped, and with it the guards of wpd and wpd-target.
    let result = runtime.block_on(async {
        tokio::select! {
            r = run(&args) => r,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("\ninterrupted: stopping wpd-target and wpd");
                Err(anyhow!("interrupted"))
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wpd-demo: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn step(n: u32, text: &str) {
    println!("\n[{n}/7] {text}");
}

fn fmt_dur(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

async fn run(args: &Args) -> Result<()> {
    step(1, "starting wpd on a private socket");
    let mut daemon = Daemon::start().await?;
    println!(
        "      wpd pid {} listening on {}",
        daemon.pid(),
        daemon.endpoint()
    );
    let mut client = daemon.client().await?;
    let result = demo(args, &mut client).await;
    if result.is_err() {
        eprintln!(
            "----- wpd log ({}) -----\n{}\n-----",
            daemon.log_path().display(),
            daemon.log_tail(8 * 1024)
        );
    }
    drop(client);
    result?;
    println!("      stopping wpd (SIGTERM)");
    let status = daemon.terminate(Duration::from_secs(10)).await?;
    println!("      wpd: {}", describe_status(&status));
    Ok(())
}

async fn demo(args: &Args, client: &mut Client) -> Result<()> {
    let caps = rpc_ok(
        "GetCapabilities",
        client.get_capabilities(GetCapabilitiesRequest {}),
    )
    .await?;
    println!(
        "      {} · {} debug-register slots per thread · kernel {} · {} CPUs · wpd {}",
        caps.arch, caps.slots_per_thread, caps.kernel, caps.cpus, caps.version
    );

    step(
        2,
        &format!("starting wpd-target with {} worker threads", args.threads),
    );
    let threads = args.threads.to_string();
    let interval_us = (args.interval_ms * 1000).to_string();
    let mut target =
        TargetProc::start(&["--threads", &threads, "--interval-us", &interval_us]).await?;
    let tids = target.tids()?;
    let workers: HashSet<i32> = tids.iter().copied().filter(|&t| t != target.pid).collect();
    println!(
        "      pid {} · {} threads · each worker stores a counter into VARS[0] at {:#x} every {} ms",
        target.pid,
        tids.len(),
        target.vars[0],
        args.interval_ms
    );

    step(3, "subscribing to the event stream");
    let mut events = EventStream::subscribe(
        client,
        StreamEventsRequest {
            pid: target.pid,
            watchpoint_ids: vec![],
            hits_only: false,
            // Hits come with their place (function, file:line), each place's fields
            // once per stream, as `wpctl events` asks for them.
            raw: false,
            places_once: true,
            lease: false,
            ..Default::default()
        },
    )
    .await?;
    // The places the stream has sent: the live lines below fill each hit's in.
    let mut places = Places::new();
    println!(
        "      subscribed to events of pid {} (hits named by function and line)",
        target.pid
    );

    step(
        4,
        "setting a process-wide 8-byte write watchpoint on VARS[0]",
    );
    let started = Instant::now();
    // The daemon's default backend (perf), as a plain `wpctl watch` would get.
    let spec = write_spec(Backend::Unspecified, target.pid, target.vars[0]);
    let resp = set_watchpoint_within(client, spec, Duration::from_secs(120)).await?;
    let rpc_wall = started.elapsed();
    let wp = resp.watchpoint.unwrap_or_default();
    let arm = Duration::from_nanos(resp.arm_duration_ns);
    println!(
        "      watchpoint #{} armed on {} threads in {} (wpd) · {} (SetWatchpoint round trip)",
        wp.id,
        wp.armed_threads,
        fmt_dur(arm),
        fmt_dur(rpc_wall)
    );

    step(5, "live hits");
    let mut per_thread: HashMap<i32, u64> = HashMap::new();
    let mut hits = 0u64;
    let first_deadline = Instant::now() + Duration::from_secs(10);
    while (hits as usize) < LIVE_HIT_LINES {
        let Some(ev) = events.next_before(first_deadline).await? else {
            println!("      (no hits within 10 s)");
            break;
        };
        if let Event::Hit(mut h) = ev {
            hits += 1;
            *per_thread.entry(h.tid).or_default() += 1;
            places.fill_hit(&mut h);
            let value = hit_value_u64(&h)
                .map(|v| v.to_string())
                .unwrap_or_else(|| format!("<{}>", h.value_error));
            // The store's place as `wpctl events` shows it: the function and file:line
            // (and the functions it was inlined into), the address only if wpd knew none.
            let place = match &h.location {
                Some(l) => format!("at {}", location_text(l)),
                None => format!("ip {:#x}", h.ip),
            };
            println!("      hit  tid {:>7}  value {value:>6}  {place}", h.tid);
        }
    }

    let tty = std::io::stdout().is_terminal();
    let watch_start = Instant::now();
    let end = watch_start + Duration::from_secs(args.seconds);
    let tick = if tty {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(1)
    };
    let mut next_tick = watch_start + tick;
    let show = |hits: u64, per_thread: &HashMap<i32, u64>, dropped: u64, newline: bool| {
        let secs = watch_start.elapsed().as_secs_f64().max(1e-3);
        let line = format!(
            "      {hits:>9} hits · {:>5} distinct threads · {dropped} dropped · {:.0} hits/s",
            per_thread.len(),
            hits as f64 / secs
        );
        if tty && !newline {
            print!("\r{line}");
            let _ = std::io::stdout().flush();
        } else {
            println!("{}{line}", if tty { "\r" } else { "" });
        }
    };
    let hits_before_counter = hits;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        match events.next_before(next_tick.min(end)).await? {
            Some(Event::Hit(h)) => {
                hits += 1;
                *per_thread.entry(h.tid).or_default() += 1;
            }
            Some(_) => {}
            None => {
                show(
                    hits - hits_before_counter,
                    &per_thread,
                    events.dropped,
                    false,
                );
                next_tick += tick;
            }
        }
    }
    show(
        hits - hits_before_counter,
        &per_thread,
        events.dropped,
        true,
    );

    step(6, "removing the watchpoint and detaching");
    let removed = rpc_ok(
        "RemoveWatchpoint",
        client.remove_watchpoint(RemoveWatchpointRequest { id: wp.id }),
    )
    .await?
    .watchpoint
    .unwrap_or_default();
    let id = wp.id;
    let mut in_flight = 0u64;
    let confirmed = events
        .wait_for(Duration::from_secs(5), "WatchpointRemoved", |ev| {
            Ok(match ev {
                Event::Hit(h) if h.watchpoint_id == id => {
                    in_flight += 1;
                    *per_thread.entry(h.tid).or_default() += 1;
                    None
                }
                Event::WatchpointRemoved(r) if r.watchpoint_id == id => Some(()),
                _ => None,
            })
        })
        .await;
    hits += in_flight;
    match confirmed {
        Ok(()) => {
            println!("      watchpoint #{id} removed ({in_flight} hits were still in flight)")
        }
        Err(e) => println!("      warning: {e:#}"),
    }
    let stats = rpc_ok("GetStats", client.get_stats(GetStatsRequest {})).await?;
    let detached = rpc_ok("Detach", client.detach(DetachRequest { pid: target.pid })).await?;
    println!(
        "      detached: {} watchpoints removed, {} threads released",
        detached.watchpoints_removed, detached.threads_released
    );
    target.ensure_alive()?;
    let (counter, _) = target.ping().await?;
    println!("      wpd-target still running (VARS[0] = {counter})");

    step(7, "summary");
    let mut counts: Vec<u64> = workers
        .iter()
        .map(|t| per_thread.get(t).copied().unwrap_or(0))
        .collect();
    counts.sort_unstable();
    let (min, median, max) = (
        counts.first().copied().unwrap_or(0),
        counts.get(counts.len() / 2).copied().unwrap_or(0),
        counts.last().copied().unwrap_or(0),
    );
    let hit_workers = workers
        .iter()
        .filter(|t| per_thread.contains_key(t))
        .count();
    let row = |k: &str, v: String| println!("      {k:<26} {v}");
    row("threads in the target", tids.len().to_string());
    row("threads armed", wp.armed_threads.to_string());
    row(
        "time to arm",
        format!(
            "{} (wpd) · {} (RPC wall time)",
            fmt_dur(arm),
            fmt_dur(rpc_wall)
        ),
    );
    row(
        "hits received",
        format!("{hits} (wpd delivered {} in total)", removed.hits),
    );
    row(
        "distinct threads that hit",
        format!(
            "{} ({hit_workers} of {} workers)",
            per_thread.len(),
            workers.len()
        ),
    );
    row(
        "hits per worker thread",
        format!("min {min} / median {median} / max {max}"),
    );
    row(
        "events dropped",
        format!(
            "{} for this subscriber · {} records lost in the kernel",
            events.dropped, stats.kernel_lost
        ),
    );

    println!("\n      stopping wpd-target");
    let status = target.quit().await?;
    println!("      wpd-target: {}", describe_status(&status));
    Ok(())
}
