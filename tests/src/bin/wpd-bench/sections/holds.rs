//! Exec holds: what holding a policy's new processes at their exec, until
//! armed, adds to an exec. Exec-to-exit of a short program (`ct-quick`:
//! three stores at the top of `main`, then exit), spawned and waited for
//! by this process one after another, with no policy (the floor), with a
//! policy by executable naming it (held and armed: the stores are
//! counted), with a policy by command name that learnt the file but does
//! not match the run (held and let go: the hold alone), and with a policy
//! naming another program (not held: what every other program pays).

use crate::*;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{ProcessSelector, RemoveWatchpointRequest, SetPolicyRequest, WatchpointSpec};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, ctarget_path, poll_until, rpc_ok, unique_temp_dir,
};

/// Exec-to-exit of `n` runs of `exe` (µs each).
fn runs(exe: &Path, n: usize) -> Result<(Vec<f64>, Vec<i32>)> {
    let mut us = Vec::with_capacity(n);
    let mut pids = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut child = Command::new(exe).spawn()?;
        let st = child.wait()?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
        ensure!(st.success(), "{} failed: {st:?}", exe.display());
        pids.push(child.id() as i32);
    }
    Ok((us, pids))
}

async fn set_policy(client: &mut wpd_tests::Client, selector: ProcessSelector) -> Result<u64> {
    let r = rpc_ok(
        "SetPolicy",
        client.set_policy(SetPolicyRequest {
            selector: Some(selector),
            spec: Some(WatchpointSpec {
                symbol: "counter".into(),
                access: wpd_proto::v1::Access::Write as i32,
                backend: Backend::Perf as i32,
                ..Default::default()
            }),
        }),
    )
    .await?;
    r.policy.map(|p| p.id).context("no policy")
}

async fn remove(client: &mut wpd_tests::Client, id: u64) -> Result<()> {
    rpc_ok(
        "RemoveWatchpoint(policy)",
        client.remove_watchpoint(RemoveWatchpointRequest { id }),
    )
    .await?;
    Ok(())
}

pub(crate) async fn section_holds(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let n = if args.smoke { 40 } else { 1000 };
    println!("## holds: what holding a new process at its exec adds to the exec\n");
    println!(
        "Exec-to-exit of `ct-quick` (three stores of `counter` at the top of `main`, then exit), \
         spawned and waited for {n} times one after another; µs. Perf backend.\n"
    );
    println!("| policy | held | p50 µs | p99 µs | p50 added µs | p50 / none | stores seen |");
    println!("|---|---|---:|---:|---:|---:|---|");
    let dir = unique_temp_dir("wpd-bench-holds")?;
    let comm = format!("wbh{}", std::process::id() % 100_000);
    let exe = dir.join(&comm);
    std::fs::copy(ctarget_path("ct-quick"), &exe)?;
    let alias = dir.join("another-name");
    std::os::unix::fs::symlink(&exe, &alias)?;
    let other = dir.join("other");
    std::fs::copy(ctarget_path("ct-quick"), &other)?;
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
    // Warm the page cache and the loader.
    runs(&exe, 20)?;
    let (none, _) = runs(&exe, n)?;
    let (none50, none99) = p50_p99(none);
    let row = |what: &str, held: &str, v: Vec<f64>, seen: String| {
        let (p50, p99) = p50_p99(v);
        println!(
            "| {what} | {held} | {p50:.0} | {p99:.0} | {:.0} | {:.2} | {seen} |",
            p50 - none50,
            p50 / none50
        );
    };
    println!("| none | no | {none50:.0} | {none99:.0} | 0 | 1.00 | |");
    // Another program named: this one is not held.
    let id = set_policy(
        &mut client,
        ProcessSelector {
            exe: other.display().to_string(),
            ..Default::default()
        },
    )
    .await?;
    let (v, _) = runs(&exe, n)?;
    row(
        "by executable, naming another program",
        "no",
        v,
        String::new(),
    );
    remove(&mut client, id).await?;
    // Named: held and armed; every store counted.
    let id = set_policy(
        &mut client,
        ProcessSelector {
            exe: exe.display().to_string(),
            ..Default::default()
        },
    )
    .await?;
    let (v, pids) = runs(&exe, n)?;
    let mut per: HashMap<i32, usize> = HashMap::new();
    let want = pids.len() * 3;
    let mut got = 0;
    let _ = events
        .wait_for(Duration::from_secs(30), "the stores", |e| {
            if let Event::Hit(h) = e
                && pids.contains(&h.pid)
            {
                *per.entry(h.pid).or_default() += 1;
                got += 1;
            }
            Ok((got >= want).then_some(()))
        })
        .await;
    let full = per.values().filter(|&&k| k == 3).count();
    row(
        "by executable, naming it",
        "yes, armed",
        v,
        format!("{got} of {want} ({full} of {} processes)", pids.len()),
    );
    remove(&mut client, id).await?;
    // Learnt by a command-name policy from a run found after its exec;
    // runs under another name are held, match nothing, and go on.
    let id = set_policy(
        &mut client,
        ProcessSelector {
            comm: comm.clone(),
            ..Default::default()
        },
    )
    .await?;
    let mut first = Command::new(&exe).arg("2000").spawn()?;
    let fpid = first.id() as i32;
    let mut c = client.clone();
    poll_until(
        Duration::from_secs(10),
        "the command-name policy to find its first process",
        async || {
            let l = rpc_ok(
                "ListWatchpoints",
                c.list_watchpoints(wpd_proto::v1::ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            let found = l
                .policies
                .iter()
                .any(|p| p.id == id && p.instances.iter().any(|i| i.pid == fpid));
            Ok(if found {
                Ok(())
            } else {
                Err(format!("pid {fpid} not armed yet"))
            })
        },
    )
    .await?;
    first.wait()?;
    let (v, _) = runs(&alias, n)?;
    row(
        "by command name, the file learnt, the run not matching",
        "yes, let go",
        v,
        String::new(),
    );
    remove(&mut client, id).await?;
    flush();
    drop(events);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
    section_done(t0);
    Ok(())
}
