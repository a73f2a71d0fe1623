//! Without root: an ordinary user's daemon (no flags, no capabilities:
//! the perf backend's per-CPU path, its rings owned by events on the
//! daemon's own thread) beside root's (the per-thread path, BPF), in one
//! run: a process-wide watchpoint armed on 64 and 512 threads of a process
//! of the daemon's user, and hits per second with two writers storing as
//! fast as they can.

use crate::*;
use std::time::Instant;

use anyhow::{Context, Result};
use wpd_tests::{Daemon, TargetProc, run_wpctl_as};

/// `nobody` on Debian.
const USER: u32 = 65534;

/// One daemon's figures: arming (ms, median) per thread count, and hits
/// per second.
struct Figures {
    arms: Vec<(usize, f64)>,
    hits_per_s: f64,
    stores_per_s: f64,
}

/// `wpctl --endpoint EP --json ARGS` as the daemon's user: its JSON.
async fn wpctl(uid: Option<u32>, ep: &str, args: &[&str]) -> Result<serde_json::Value> {
    let mut all = vec!["--endpoint", ep, "--json"];
    all.extend_from_slice(args);
    let out = run_wpctl_as(uid, &all, Duration::from_secs(120)).await?;
    anyhow::ensure!(out.code == Some(0), "wpctl {args:?}: {out:?}");
    Ok(serde_json::from_str(&out.stdout)?)
}

async fn measure(user: bool, threads: &[usize], reps: usize, window_ms: u64) -> Result<Figures> {
    // The daemon is asked as its own user: an ordinary user's daemon cannot
    // read a root caller's namespaces.
    let (daemon, uid) = if user {
        (Daemon::start_with_no_flags_as(USER).await?, Some(USER))
    } else {
        (Daemon::start().await?, None)
    };
    let ep = daemon.endpoint();
    let start = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if user {
            TargetProc::start_as(USER, &args).await
        } else {
            TargetProc::start(&args).await
        }
    };
    let watch = async |pid: i32, addr: u64| -> Result<(u64, f64)> {
        let v = wpctl(
            uid,
            &ep,
            &[
                "watch",
                "--pid",
                &pid.to_string(),
                "--addr",
                &format!("{addr:#x}"),
            ],
        )
        .await?;
        let id = v["watchpoint"]["id"].as_u64().context("no watchpoint id")?;
        let ns = v["arm_duration_ns"].as_f64().context("no arm duration")?;
        Ok((id, ns / 1e6))
    };
    let mut arms = Vec::new();
    for &n in threads {
        let t = start(vec![
            "--threads".into(),
            n.to_string(),
            "--interval-us".into(),
            "1000000".into(),
        ])
        .await?;
        let mut v = Vec::new();
        for _ in 0..reps {
            let (id, arm_ms) = watch(t.pid, t.vars[QUIET_VAR]).await?;
            v.push(arm_ms);
            wpctl(uid, &ep, &["unwatch", &id.to_string()]).await?;
        }
        arms.push((n, median(v)));
        drop(t);
    }
    let mut t = start(vec![
        "--threads".into(),
        "1".into(),
        "--interval-us".into(),
        "1000000".into(),
    ])
    .await?;
    watch(t.pid, t.vars[HAMMER_VAR]).await?;
    let hits = async || -> Result<u64> {
        wpctl(uid, &ep, &["stats"]).await?["hits"]
            .as_u64()
            .context("no hits in stats")
    };
    let before = hits().await?;
    let r = t
        .cmd_within(
            &format!("hammer {HAMMER_VAR} 2 {window_ms}"),
            Duration::from_millis(window_ms) + Duration::from_secs(60),
        )
        .await?
        .context("no reply to hammer")?;
    let stores: u64 = wpd_tests::field(&r, "stores")?;
    let secs = wpd_tests::field::<f64>(&r, "ns")? / 1e9;
    // The rings drained: the count stops growing.
    let mut after = hits().await?;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = hits().await?;
        if now == after {
            break;
        }
        after = now;
    }
    drop(t);
    drop(daemon);
    Ok(Figures {
        arms,
        hits_per_s: (after - before) as f64 / secs,
        stores_per_s: stores as f64 / secs,
    })
}

pub(crate) async fn section_unpriv(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let threads: Vec<usize> = if args.smoke { vec![16] } else { vec![64, 512] };
    let window_ms = if args.smoke { 200 } else { 2000 };
    println!("## without root: an ordinary user's daemon beside root's\n");
    println!(
        "The user's daemon started with no flags as uid {USER} (perf's per-CPU path, its rings \
         owned by events on its own thread), root's with none either (the per-thread path, \
         BPF); each watches a `wpd-target` of its own user. Arming: a process-wide write \
         watchpoint set (`wpctl watch`, the time the daemon reports), ms, median of {}. Hits: two writers storing for {} ms \
         as fast as they can (`hammer`), hits the daemon counted per second.\n",
        args.reps, window_ms
    );
    let user = measure(true, &threads, args.reps, window_ms).await?;
    let root = measure(false, &threads, args.reps, window_ms).await?;
    println!("| daemon | what | figure | / root's |");
    println!("|---|---|---:|---:|");
    for (i, &n) in threads.iter().enumerate() {
        let (u, r) = (user.arms[i].1, root.arms[i].1);
        println!("| root (per-thread, BPF) | arm {n} threads, ms | {r:.1} | 1.00 |");
        println!(
            "| user (per-CPU, own rings) | arm {n} threads, ms | {u:.1} | {:.2} |",
            u / r
        );
    }
    println!(
        "| root (per-thread, BPF) | hits per second (stores per second) | {:.0} ({:.0}) | 1.00 |",
        root.hits_per_s, root.stores_per_s
    );
    println!(
        "| user (per-CPU, own rings) | hits per second (stores per second) | {:.0} ({:.0}) | {:.2} |",
        user.hits_per_s,
        user.stores_per_s,
        user.hits_per_s / root.hits_per_s
    );
    flush();
    section_done(t0);
    Ok(())
}
