//! Pending code events: what a process pays per dlopen + dlclose of a
//! library while it has a pending code event (a probe at its dynamic
//! linker's `_dl_debug_state`, which stops the loading thread twice per
//! dlopen and twice per dlclose while the daemon looks for the pending
//! names), against the same process not attached and attached with
//! nothing pending (no probe); and with a pending source line instead,
//! for which every module's line tables are read at each stop.

use crate::*;
use std::time::Instant;

use anyhow::{Context, Result};
use wpd_proto::v1::{CodeEvent, RemoveWatchpointRequest, SetWatchpointRequest, WatchpointSpec};
use wpd_tests::{Backend, CTarget, Daemon, attach, rpc_ok};

/// µs per dlopen + dlclose of `libplugin.so`, median over `reps` runs of
/// `n` cycles.
async fn cycles(t: &mut CTarget, n: u64, reps: usize) -> Result<f64> {
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let reply = t.cmd(&format!("cycle {n}")).await?;
        let ns: f64 = reply
            .strip_prefix("CYCLE ns=")
            .with_context(|| format!("unexpected reply {reply:?}"))?
            .parse()?;
        v.push(ns / n as f64 / 1e3);
    }
    Ok(median(v))
}

pub(crate) async fn section_pending(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let n: u64 = if args.smoke { 20 } else { 500 };
    println!("## pending: what a pending code event costs a process per dlopen + dlclose\n");
    println!(
        "`ct-plugins` loads and unloads `libplugin.so` {n} times (`cycle {n}`); median of {} runs.\n",
        args.reps
    );
    println!("| process | µs per dlopen + dlclose | / not attached |");
    println!("|---|---:|---:|");
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    // Warm the page cache and the loader's paths.
    t.cmd("cycle 5").await?;
    let bare = cycles(&mut t, n, args.reps).await?;
    println!("| not attached | {bare:.1} | 1.00 |");
    attach(&mut client, t.pid, Backend::Ptrace).await?;
    let attached = cycles(&mut t, n, args.reps).await?;
    println!(
        "| attached (ptrace), nothing pending | {attached:.1} | {:.2} |",
        attached / bare
    );
    // Pending through every cycle: a library never loaded (no module is
    // opened), a function no module defines (every module's symbols, and
    // the closest names, at each stop), a source file no line table names
    // (every module's list of source files, read once per file).
    let rows: [(&str, CodeEvent); 3] = [
        (
            "a pending MODULE:NAME (loader hook)",
            CodeEvent {
                function: "libnever.so:never".into(),
                ..Default::default()
            },
        ),
        (
            "a pending NAME, in no module",
            CodeEvent {
                function: "never_defined".into(),
                ..Default::default()
            },
        ),
        (
            "a pending FILE:LINE, in no line table",
            CodeEvent {
                file: "never.c".into(),
                line: 1,
                ..Default::default()
            },
        ),
    ];
    for (what, code) in rows {
        let set = rpc_ok(
            "SetWatchpoint(pending)",
            client.set_watchpoint(SetWatchpointRequest {
                spec: Some(WatchpointSpec {
                    pid: t.pid,
                    code_event: Some(CodeEvent {
                        stop: true,
                        pending: true,
                        ..code
                    }),
                    ..Default::default()
                }),
            }),
        )
        .await?;
        let us = cycles(&mut t, n, args.reps).await?;
        println!("| {what} | {us:.1} | {:.2} |", us / bare);
        let id = set.watchpoint.map(|w| w.id).context("no watchpoint")?;
        rpc_ok(
            "RemoveWatchpoint(pending)",
            client.remove_watchpoint(RemoveWatchpointRequest { id }),
        )
        .await?;
    }
    flush();
    drop(t);
    drop(daemon);
    section_done(t0);
    Ok(())
}
