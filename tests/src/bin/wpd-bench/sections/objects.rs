//! Objects: what a watchpoint armed by a code event costs per object (the
//! thread held at `conn_new`'s return, the object armed on every thread, the
//! thread released; the object disarmed at `free`) in a target creating
//! 10,000 objects a second, against the same target alone and under gdb
//! doing the same job: a breakpoint on `conn_new`'s `ret` instruction whose
//! commands set `watch -l ((struct conn *)$rax)->state` and continue, and a
//! breakpoint on `conn_free` whose commands delete it (gdb ignores the
//! commands after `finish` in a command list, so the return is caught at
//! the `ret` itself). The kernel's floor of the job is measured in the same
//! run: `tests/c/objfloor.c`, a bare tracer doing the kernel's part of what
//! wpd does for one object (a uretprobe signalling the thread, a breakpoint
//! opened at that stop and closed at the next, a uprobe at `free`) and
//! nothing else.

use crate::*;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use wpd_proto::v1::GetStatsRequest;
use wpd_tests::{CTarget, Daemon, ctarget_path, run_wpctl};

/// One paced run: mean ns in conn_new and in conn_free, total wall ns.
#[derive(Debug, Clone, Copy)]
struct Pace {
    new_ns: f64,
    free_ns: f64,
    wall_ns: f64,
}

fn parse_pace(line: &str) -> Result<Pace> {
    let field = |k: &str| -> Result<f64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .with_context(|| format!("no {k}= in {line:?}"))?
            .parse::<f64>()
            .with_context(|| format!("bad {k}= in {line:?}"))
    };
    Ok(Pace {
        new_ns: field("new_ns")?,
        free_ns: field("free_ns")?,
        wall_ns: field("wall_ns")?,
    })
}

/// The target alone.
async fn bare(n: usize, us: u64) -> Result<Pace> {
    let out = tokio::process::Command::new(ctarget_path("ct-objects"))
        .args(["pace", &n.to_string(), &us.to_string()])
        .output()
        .await?;
    parse_pace(String::from_utf8_lossy(&out.stdout).trim())
}

/// The target under `ct-objfloor`: the kernel's part of the job alone.
async fn floor(n: usize, us: u64) -> Result<Pace> {
    let out = tokio::process::Command::new(ctarget_path("ct-objfloor"))
        .arg(ctarget_path("ct-objects"))
        .args([n.to_string(), us.to_string()])
        .kill_on_drop(true)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "ct-objfloor: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    parse_pace(
        text.lines()
            .find(|l| l.starts_with("PACE "))
            .with_context(|| format!("no PACE line from ct-objfloor: {text:?}"))?,
    )
}

/// How the target is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// Every thread (the default scope); the target has one thread.
    Default,
    /// `--scope creator`.
    Creator,
    /// Every thread, with this many sleeping threads started after the
    /// attach (created by the main thread: the same tracer thread holds
    /// them, and arms each object on all of them at the stop).
    SleepersAfter(u32),
    /// Every thread, with this many sleeping threads started before the
    /// attach (seized at attach, spread over the tracer threads: the
    /// tracer holding the creator opens the other tracers' breakpoints).
    SleepersBefore(u32),
}

/// What a run under wpd gave: the target's times, the daemon's mean hold
/// per object (GetStats), and how many objects were armed at their stop.
struct WpdRun {
    pace: Pace,
    hold_ns: f64,
    at_stop: f64,
}

/// The target with `--on-return conn_new --expr '$ret->state' --disarm-on
/// free`, as `v` says.
async fn with_wpd(n: usize, us: u64, v: Variant) -> Result<WpdRun> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-objects").await?;
    if let Variant::SleepersBefore(k) = v {
        t.cmd(&format!("sleepers {k}")).await?;
    }
    let pid = t.pid.to_string();
    let mut args = vec![
        "--endpoint".to_string(),
        daemon.endpoint(),
        "watch".into(),
        "--pid".into(),
        pid,
        "--backend".into(),
        "ptrace".into(),
        "--on-return".into(),
        "conn_new".into(),
        "--expr".into(),
        "$ret->state".into(),
        "--disarm-on".into(),
        "free".into(),
    ];
    if v == Variant::Creator {
        args.extend(["--scope".into(), "creator".into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_wpctl(&args, Duration::from_secs(30)).await?;
    if out.code != Some(0) {
        bail!("wpctl watch: {out:?}");
    }
    if let Variant::SleepersAfter(k) = v {
        t.cmd(&format!("sleepers {k}")).await?;
    }
    t.send(&format!("pace {n} {us}"))?;
    let line = t
        .reply(Duration::from_secs(600))
        .await?
        .context("no PACE line")?;
    let pace = parse_pace(&line)?;
    let mut client = daemon.client().await?;
    let stats = client
        .get_stats(GetStatsRequest::default())
        .await?
        .into_inner();
    let o = stats.objects.unwrap_or_default();
    if o.armed < n as u64 {
        bail!("{} of {n} objects armed: {o:?}", o.armed);
    }
    Ok(WpdRun {
        pace,
        hold_ns: o.mean_hold_ns as f64,
        at_stop: o.armed_at_stop as f64 / o.armed.max(1) as f64,
    })
}

/// The target under gdb.
async fn with_gdb(
    n: usize,
    us: u64,
    timeout: Duration,
) -> Result<std::result::Result<Pace, String>> {
    let exe = ctarget_path("ct-objects");
    let dis = tokio::process::Command::new("gdb")
        .args(["-batch", "-nx", "-ex", "disassemble conn_new"])
        .arg(&exe)
        .output()
        .await;
    let Ok(dis) = dis else {
        return Ok(Err(
            "gdb is not installed (scripts/setup installs it)".into()
        ));
    };
    let text = String::from_utf8_lossy(&dis.stdout);
    let ret = text
        .lines()
        .find(|l| l.trim_end().ends_with("ret"))
        .and_then(|l| l.split('<').nth(1))
        .and_then(|l| l.split('>').next())
        .context("no ret in conn_new's disassembly")?
        .to_string();
    let script = format!(
        "set pagination off\nset confirm off\nbreak *conn_new{ret}\ncommands\nsilent\n\
         watch -l ((struct conn *)$rax)->state\ncontinue\nend\nbreak conn_free\ncommands\n\
         silent\ndelete $bpnum\ncontinue\nend\nrun\n"
    );
    let dir = wpd_tests::unique_temp_dir("wpd-bench-objects")?;
    let path = dir.join("objects.gdb");
    std::fs::write(&path, script)?;
    let mut cmd = tokio::process::Command::new("gdb");
    cmd.args(["-batch", "-nx", "-x"])
        .arg(&path)
        .arg("--args")
        .arg(&exe)
        .args(["pace", &n.to_string(), &us.to_string()])
        .kill_on_drop(true);
    let out = match tokio::time::timeout(timeout, cmd.output()).await {
        Err(_) => {
            return Ok(Err(format!(
                "did not finish within {} s",
                timeout.as_secs()
            )));
        }
        Ok(r) => r?,
    };
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().find(|l| l.starts_with("PACE ")) {
        Some(l) => Ok(Ok(parse_pace(l)?)),
        None => Ok(Err(format!(
            "no PACE line: {}",
            text.lines().last().unwrap_or("")
        ))),
    }
}

pub(crate) async fn section_objects(args: &Args) -> Result<()> {
    let us = 100; // 10,000 objects a second
    let n = if args.smoke { 500 } else { 10_000 };
    let n_gdb = n / 5;
    println!(
        "## objects: a target creating 10,000 objects a second (`conn_new` then `free`), \
         per object (medians of {} runs)\n",
        args.reps
    );
    println!(
        "| how | objects | in conn_new, µs | in conn_free, µs | per object, µs | wall for the run, s | slowdown |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let variants = [
        (
            Variant::Default,
            "wpd (ptrace): `--on-return conn_new --expr '$ret->state' --disarm-on free`",
        ),
        (
            Variant::Creator,
            "wpd (ptrace), the same with `--scope creator`",
        ),
        (
            Variant::SleepersAfter(4),
            "wpd (ptrace), every thread, 4 more threads started after the attach",
        ),
        (
            Variant::SleepersBefore(4),
            "wpd (ptrace), every thread, 4 more threads started before the attach",
        ),
    ];
    let mut bares = Vec::new();
    let mut floors = Vec::new();
    let mut wpds: Vec<Vec<WpdRun>> = variants.iter().map(|_| Vec::new()).collect();
    let mut gdbs = Vec::new();
    let mut gdb_why = None;
    for _ in 0..args.reps {
        bares.push(bare(n, us).await?);
        floors.push(floor(n, us).await?);
        for (i, (v, _)) in variants.iter().enumerate() {
            wpds[i].push(with_wpd(n, us, *v).await?);
        }
        if args.peers {
            match with_gdb(n_gdb, us, args.peer_timeout).await? {
                Ok(p) => gdbs.push(p),
                Err(why) => gdb_why = Some(why),
            }
        }
    }
    let med = |v: &[Pace], f: fn(&Pace) -> f64| median(v.iter().map(f).collect());
    let bare_wall = med(&bares, |p| p.wall_ns) / n as f64;
    let row = |what: &str, v: &[Pace], count: usize| {
        let new = med(v, |p| p.new_ns) / 1e3;
        let free = med(v, |p| p.free_ns) / 1e3;
        let wall = med(v, |p| p.wall_ns);
        println!(
            "| {what} | {count} | {new:.2} | {free:.2} | {:.2} | {:.2} | {:.2}× |",
            new + free,
            wall / 1e9,
            wall / count as f64 / bare_wall
        );
        new + free
    };
    let b = row("alone", &bares, n);
    let mut ws = Vec::new();
    for (i, (_, what)) in variants.iter().enumerate() {
        let paces: Vec<Pace> = wpds[i].iter().map(|r| r.pace).collect();
        ws.push(row(what, &paces, n));
    }
    let w = ws[0];
    let f = row(
        "the kernel's floor: the same probes, stop and breakpoints from a bare tracer \
         (`ct-objfloor`, no wpd)",
        &floors,
        n,
    );
    let g = if gdbs.is_empty() {
        println!(
            "| gdb | {n_gdb} | {} |  |  |  |  |",
            gdb_why.unwrap_or_else(|| "--no-peers".into())
        );
        None
    } else {
        Some(row(
            "gdb: `break *conn_new+RET` + `watch -l` + `continue`, `break conn_free` + `delete`",
            &gdbs,
            n_gdb,
        ))
    };
    println!();
    for (i, (v, _)) in variants.iter().enumerate() {
        println!(
            "- {v:?}: the daemon's hold per object (from the probe's stop to the release, \
             GetStats mean_hold_ns) {:.1} µs; armed at the stop by the tracer: {:.0} % of \
             the objects",
            median(wpds[i].iter().map(|r| r.hold_ns).collect()) / 1e3,
            median(wpds[i].iter().map(|r| r.at_stop * 100.0).collect()),
        );
    }
    println!();
    println!(
        "Per object beyond the target's own time: wpd {:.1} µs (every thread; {:.1} µs with \
         --scope creator){}",
        w - b,
        ws[1] - b,
        match g {
            Some(g) => format!(
                ", gdb {:.1} µs: gdb takes {:.0}× as long",
                g - b,
                (g - b) / (w - b).max(1e-9)
            ),
            None => String::new(),
        }
    );
    println!();
    println!(
        "The kernel's floor: {:.1} µs per object beyond the target's own time; wpd (every \
         thread) is {:.2}× the floor{}",
        f - b,
        (w - b) / (f - b).max(1e-9),
        match g {
            Some(g) => format!(
                "; gdb is {:.0}× the floor, the most any tool arming each object at a stop \
                 could gain on gdb here",
                (g - b) / (f - b).max(1e-9)
            ),
            None => String::new(),
        }
    );
    println!();
    Ok(())
}
