//! Pending code events: a code event on a function of a library the process
//! has not loaded yet (`wpctl break --pending`, `wpctl watch --on-return ...
//! --pending`, `CodeEvent.pending`). `tests/c/plugins.c` loads
//! `libplugin.so` with dlopen on command; the plugin's constructor calls
//! `plugin_work` before dlopen returns. A pending breakpoint set before the
//! load is armed at the loader's debugger hook, before the constructor
//! runs: the constructor's call is its first stop (its stack shows
//! `plugin_init`), then the calls of several threads. A pending
//! `--on-return` watch arms the object `plugin_new` returns and catches the
//! first store into it. Without `--pending` the refusal names the flag; a
//! dlclose and a second dlopen keep the breakpoint; a pending event goes
//! with its process's exit. A source line of the plugin (`plugin.c:LINE`)
//! is pending the same way (no loaded module's line table names the file)
//! and stops the worker threads once loaded; when two modules built from
//! that source are loaded one after the other (`libplugin.so`, then
//! `libplugin2.so`), the first takes it and the second's calls never stop;
//! when one dlopen loads two such modules (`libplugin3.so`, its names
//! renamed, and `libplugin2.so`, which it needs), the one the dynamic
//! linker loaded first (the library opened) takes it, whatever their
//! addresses, and the other's copy of the line never stops;
//! a pending line the loaded plugin has no code at goes at the load,
//! saying why. Refusals without
//! `--pending` (a file no line table names, a function no module defines)
//! name the flag; a process without the loader's hook (a static program
//! without a C library) is refused pending events and left as it was.
//! Everything waits on events, never on time.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{
    GetThreadStackRequest, ListWatchpointsRequest, ResumeRequest, WatchpointResolved,
};
use wpd_tests::{
    Backend, CTarget, CmdOutput, Daemon, Event, EventStream, line_of, require_backend, rpc_ok,
    run_wpctl,
};

const CLI_TIMEOUT: Duration = Duration::from_secs(20);
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

async fn wpctl(daemon: &Daemon, args: &[&str]) -> Result<CmdOutput> {
    let ep = daemon.endpoint();
    let mut all = vec!["--endpoint", ep.as_str()];
    all.extend_from_slice(args);
    run_wpctl(&all, CLI_TIMEOUT).await
}

fn ensure_ok(out: &CmdOutput, what: &str) -> Result<()> {
    ensure!(
        out.code == Some(0),
        "{what}: exit {:?}\nstdout: {}\nstderr: {}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// The id in `breakpoint 7: ...` / `watchpoint 7: ...`.
fn id_of(line: &str) -> Result<u64> {
    line.split_once(' ')
        .and_then(|(_, r)| r.split(':').next())
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no id in {line:?}"))
}

/// `Watchpoint.pending_reason` of `id` as `wpctl --json list` shows it.
async fn pending_reason(daemon: &Daemon, pid: i32, id: u64) -> Result<String> {
    let out = wpctl(daemon, &["--json", "list", "--pid", &pid.to_string()]).await?;
    ensure_ok(&out, "wpctl --json list")?;
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).with_context(|| format!("not JSON: {:?}", out.stdout))?;
    let w = v["watchpoints"]
        .as_array()
        .and_then(|a| a.iter().find(|w| w["id"] == id))
        .with_context(|| format!("{id} is not listed: {v}"))?;
    ensure!(w["pending"] == true, "{id} is not pending: {w}");
    w["pending_reason"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no pending_reason: {w}"))
}

/// Waits for the `WatchpointResolved` of `id`.
/// `wpctl break --pending libplugin.so:plugin_work` on `pid`: the id.
async fn pending_plugin_break(daemon: &Daemon, pid: i32) -> Result<u64> {
    let p = pid.to_string();
    let at = "libplugin.so:plugin_work";
    let out = wpctl(daemon, &["break", "--pid", &p, "--pending", at]).await?;
    ensure_ok(&out, "wpctl break --pending")?;
    id_of(out.stdout.lines().next().unwrap_or_default())
}

async fn resolved(events: &mut EventStream, id: u64) -> Result<WatchpointResolved> {
    events
        .wait_for(EVENT_TIMEOUT, "a WatchpointResolved", |e| match e {
            Event::WatchpointResolved(r) if r.watchpoint_id == id => Ok(Some(r.clone())),
            _ => Ok(None),
        })
        .await
}

/// Waits for a stop at breakpoint `id`: (tid, count).
async fn stop_at(events: &mut EventStream, id: u64) -> Result<(i32, u64)> {
    events
        .wait_for(EVENT_TIMEOUT, "a BreakpointHit", |e| match e {
            Event::BreakpointHit(b) if b.watchpoint_id == id => Ok(Some((b.tid, b.count))),
            _ => Ok(None),
        })
        .await
}

async fn resume(daemon: &Daemon, pid: i32, tid: i32) -> Result<()> {
    let mut client = daemon.client().await?;
    rpc_ok(
        "Resume",
        client.resume(ResumeRequest {
            pid,
            tids: vec![tid],
        }),
    )
    .await?;
    Ok(())
}

/// The function names of `tid`'s stack, innermost first.
async fn stack(daemon: &Daemon, pid: i32, tid: i32) -> Result<Vec<String>> {
    let mut client = daemon.client().await?;
    let s = rpc_ok(
        "GetThreadStack",
        client.get_thread_stack(GetThreadStackRequest {
            pid,
            tid,
            depth: 16,
            ..Default::default()
        }),
    )
    .await?;
    Ok(s.frames.into_iter().map(|f| f.function).collect())
}

/// A build of `plugin.c` as `ct-plugins` drives it.
struct Plugin {
    /// Its copy of `plugin_work`, by its name in that build.
    work_fn: &'static str,
    /// The target's answer to the load whose constructor's call is the
    /// breakpoint's.
    loaded: &'static str,
    /// The command whose threads call its copy (`work T N`), and the
    /// first word of the answer.
    work: &'static str,
    worked: &'static str,
}

/// `libplugin.so`, loaded by `load`.
const LIBPLUGIN: Plugin = Plugin {
    work_fn: "plugin_work",
    loaded: "LOADED calls=1",
    work: "work",
    worked: "WORKED",
};

/// `libplugin3.so` (its names renamed), loaded by `load3` with
/// `libplugin2.so`, whose constructor's call ran too (`calls2=1`).
const LIBPLUGIN3: Plugin = Plugin {
    work_fn: "plugin3_work",
    loaded: "LOADED3 calls=1 calls2=1",
    work: "work3",
    worked: "WORKED3",
};

/// The first stop at breakpoint `id` after a load: `plugin`'s
/// constructor calling its copy of `plugin_work` inside dlopen, on the
/// main thread, as the breakpoint's `count`th hit (that copy innermost,
/// `plugin_init` below it); resumed, the load completes (`plugin.loaded`).
async fn constructors_call(
    daemon: &Daemon,
    t: &mut CTarget,
    events: &mut EventStream,
    plugin: &Plugin,
    id: u64,
    count: u64,
) -> Result<()> {
    let pid = t.pid;
    let (tid, n) = stop_at(events, id).await?;
    ensure!(
        tid == pid && n == count,
        "the first stop is the constructor's call, in dlopen, on the main thread {pid}, \
         hit {count}: tid {tid}, count {n}"
    );
    let frames = stack(daemon, pid, tid).await?;
    ensure!(
        frames.first().is_some_and(|f| f == plugin.work_fn)
            && frames.iter().any(|f| f == "plugin_init"),
        "the constructor's call of {}: {frames:?}",
        plugin.work_fn
    );
    resume(daemon, pid, tid).await?;
    let reply = t.reply(EVENT_TIMEOUT).await?;
    ensure!(reply.as_deref() == Some(plugin.loaded), "{reply:?}");
    Ok(())
}

/// `work N 1` (`plugin.work`): each of the `n` worker threads stops once
/// at breakpoint `id` (never the main thread, no thread twice, `plugin`'s
/// copy of `plugin_work` innermost and `worker` below it) and is resumed;
/// the hits are counted `first`, `first + 1`, ... in some order; then the
/// target answers `WORKED n=N`.
async fn each_worker_stops_once(
    daemon: &Daemon,
    t: &mut CTarget,
    events: &mut EventStream,
    plugin: &Plugin,
    id: u64,
    n: u64,
    first: u64,
) -> Result<()> {
    let pid = t.pid;
    t.send(&format!("{} {n} 1", plugin.work))?;
    let mut tids = Vec::new();
    let mut counts = Vec::new();
    for _ in 0..n {
        let (tid, count) = stop_at(events, id).await?;
        ensure!(
            tid != pid && !tids.contains(&tid),
            "{tid} (count {count}) in {tids:?}"
        );
        tids.push(tid);
        counts.push(count);
        let frames = stack(daemon, pid, tid).await?;
        ensure!(
            frames.first().is_some_and(|f| f == plugin.work_fn)
                && frames.iter().any(|f| f == "worker"),
            "{frames:?}"
        );
        resume(daemon, pid, tid).await?;
    }
    counts.sort_unstable();
    ensure!(
        counts.iter().copied().eq(first..first + n),
        "the workers' hits are counted {first}..{}: {counts:?}",
        first + n - 1
    );
    let reply = t.reply(EVENT_TIMEOUT).await?;
    ensure!(
        reply.as_deref() == Some(format!("{} n={n}", plugin.worked).as_str()),
        "{reply:?}"
    );
    Ok(())
}

/// Without `--pending` a function of a library not loaded is refused with
/// one line naming the flag, and nothing is set (not even the loader
/// hook); with it the breakpoint is listed pending, armed at the dlopen
/// before the plugin's constructor runs (its call of `plugin_work` is the
/// first stop, on the thread calling dlopen, with `plugin_init` on its
/// stack), then every worker thread's first call stops too; the loader hook
/// is closed once nothing is pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_breakpoint_catches_the_constructors_call() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let at = "libplugin.so:plugin_work";

            let out = wpctl(&daemon, &["break", "--pid", &p, at]).await?;
            ensure!(out.code == Some(5), "refusal exit code: {out:?}");
            let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
            ensure!(
                lines.len() == 1
                    && lines[0].starts_with("wpctl: ")
                    && lines[0].contains("has not loaded a module \"libplugin.so\"")
                    && lines[0].contains("--pending"),
                "{:?}",
                out.stderr
            );
            let out = wpctl(
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &p,
                    "--on-return",
                    "libplugin.so:plugin_new",
                    "--expr",
                    "$ret->state",
                ],
            )
            .await?;
            ensure!(
                out.code == Some(5) && out.stderr.contains("--pending"),
                "{out:?}"
            );
            let mut client = daemon.client().await?;
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(l.watchpoints.is_empty(), "a refusal left {l:?}");
            ensure!(
                !daemon.log().contains("loader hook set"),
                "a refusal opened the loader hook"
            );

            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", at]).await?;
            ensure_ok(&out, "wpctl break --pending")?;
            ensure!(
                out.stdout.contains(&format!("{at} in pid {pid}: pending")),
                "{:?}",
                out.stdout
            );
            let id = id_of(out.stdout.lines().next().unwrap_or_default())?;
            let out = wpctl(&daemon, &["list", "--pid", &p]).await?;
            ensure_ok(&out, "wpctl list")?;
            let row = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("{id} ")))
                .with_context(|| format!("no row {id}: {:?}", out.stdout))?;
            ensure!(
                row.contains(" pending ")
                    && row.contains(" break ")
                    && row.ends_with(&format!("{at} (pending: not loaded yet)")),
                "{row:?}"
            );
            ensure!(daemon.log().contains("loader hook set"), "no loader hook");

            // A second one, removed before the load.
            let out = wpctl(
                &daemon,
                &["break", "--pid", &p, "--pending", "libplugin.so:plugin_new"],
            )
            .await?;
            ensure_ok(&out, "wpctl break --pending plugin_new")?;
            let other = id_of(out.stdout.lines().next().unwrap_or_default())?;
            let out = wpctl(&daemon, &["unwatch", &other.to_string()]).await?;
            ensure_ok(&out, "wpctl unwatch (pending)")?;
            ensure!(
                out.stdout.starts_with(&format!(
                    "removed pending breakpoint {other} (libplugin.so:plugin_new in pid {pid})"
                )),
                "{:?}",
                out.stdout
            );

            // The load: armed before the constructor's call.
            t.send("load")?;
            let r = resolved(&mut events, id).await?;
            let (_, line) = line_of("plugin_work");
            let place = r.breakpoint.context("no place")?;
            ensure!(
                r.reason == "loaded"
                    && place.function == "plugin_work"
                    && place.line == line
                    && place.module.ends_with("/libplugin.so"),
                "{place:?}"
            );
            constructors_call(&daemon, &mut t, &mut events, &LIBPLUGIN, id, 1).await?;

            // Every worker thread's call stops.
            each_worker_stops_once(&daemon, &mut t, &mut events, &LIBPLUGIN, id, 3, 2).await?;

            // Listed at its place now; the hook is gone.
            let out = wpctl(&daemon, &["list", "--pid", &p]).await?;
            ensure_ok(&out, "wpctl list")?;
            ensure!(
                out.stdout.contains("plugin_work (plugin.c:") && !out.stdout.contains("pending"),
                "{:?}",
                out.stdout
            );
            ensure!(
                daemon.log().contains("loader hook closed"),
                "hook left open"
            );

            // dlclose, then dlopen again: the probe (on the file's inode and
            // offset) is there again, before the constructor.
            let reply = t.cmd("unload").await?;
            ensure!(reply == "UNLOADED", "{reply}");
            t.send("load")?;
            constructors_call(&daemon, &mut t, &mut events, &LIBPLUGIN, id, 5).await?;
            Ok(())
        }
        .await,
    )
}

/// A pending `--on-return` watch: once the plugin is loaded, the object
/// `plugin_new` returns is armed before the caller's first store into it,
/// which is a hit with its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_on_return_watch_catches_the_first_store() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let out = wpctl(
                &daemon,
                &[
                    "watch",
                    "--pid",
                    &p,
                    "--on-return",
                    "libplugin.so:plugin_new",
                    "--expr",
                    "$ret->state",
                    "--pending",
                ],
            )
            .await?;
            ensure_ok(&out, "wpctl watch --on-return --pending")?;
            ensure!(out.stdout.contains("pending"), "{:?}", out.stdout);
            let id = id_of(out.stdout.lines().next().unwrap_or_default())?;

            let reply = t.cmd("load").await?;
            ensure!(reply == "LOADED calls=1", "{reply}");
            let r = resolved(&mut events, id).await?;
            ensure!(r.reason == "loaded" && r.breakpoint.is_none(), "{r:?}");
            let reply = t.cmd("new").await?;
            ensure!(reply == "NEW", "{reply}");
            let (_, line) = line_of("plugin_first");
            let hit = events
                .wait_for(EVENT_TIMEOUT, "the first store's hit", |e| match e {
                    Event::Hit(h) => Ok(Some(h.clone())),
                    _ => Ok(None),
                })
                .await?;
            let mut v = [0u8; 8];
            v[..hit.value.len().min(8)].copy_from_slice(&hit.value[..hit.value.len().min(8)]);
            ensure!(u64::from_le_bytes(v) == 0xdead, "{hit:?}");
            let loc = hit.location.clone().unwrap_or_default();
            ensure!(
                loc.function == "main" && loc.line == line,
                "the store in plugins.c:{line}: {loc:?}"
            );
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            let w = l
                .watchpoints
                .iter()
                .find(|w| w.id == id)
                .context("the watch is not listed")?;
            ensure!(
                !w.pending && w.objects.as_ref().is_some_and(|o| o.armed == 1),
                "{w:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// A pending event, at a function or at a line, goes at an exec (its
/// library names the old program's), with a `WatchpointRemoved` saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_event_goes_at_exec() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let id = pending_plugin_break(&daemon, pid).await?;
            let (file, line) = line_of("plugin_work");
            let at = format!("{file}:{line}");
            let p = pid.to_string();
            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", &at]).await?;
            ensure_ok(&out, "wpctl break --pending FILE:LINE")?;
            let by_line = id_of(out.stdout.lines().next().unwrap_or_default())?;
            t.send("exec")?;
            // Both go, in either order.
            let mut left = vec![id, by_line];
            while !left.is_empty() {
                let (gone, reason) = events
                    .wait_for(EVENT_TIMEOUT, "their WatchpointRemoved", |e| match e {
                        Event::WatchpointRemoved(r) if left.contains(&r.watchpoint_id) => {
                            Ok(Some((r.watchpoint_id, r.reason.clone())))
                        }
                        _ => Ok(None),
                    })
                    .await?;
                ensure!(reason.contains("exec"), "{gone}: {reason:?}");
                left.retain(|&x| x != gone);
            }
            let ready = t.reply(EVENT_TIMEOUT).await?;
            ensure!(
                ready
                    .as_deref()
                    .is_some_and(|r| r == format!("READY pid={pid}")),
                "{ready:?}"
            );
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid }),
            )
            .await?;
            ensure!(l.watchpoints.is_empty(), "still listed: {l:?}");
            // The new program loads the plugin: nothing of the old event
            // holds it.
            let reply = t.cmd("load").await?;
            ensure!(reply == "LOADED calls=1", "{reply}");
            Ok(())
        }
        .await,
    )
}

/// A pending event goes with its process: after the exit nothing is
/// listed, and the loader hook went with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_event_goes_with_its_process() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let id = pending_plugin_break(&daemon, pid).await?;
            t.send("quit")?;
            events
                .wait_for(EVENT_TIMEOUT, "ProcessExited", |e| {
                    Ok(matches!(e, Event::ProcessExited(x) if x.pid == pid).then_some(()))
                })
                .await?;
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                l.watchpoints.iter().all(|w| w.id != id),
                "still listed: {l:?}"
            );
            let out = wpctl(&daemon, &["unwatch", &id.to_string()]).await?;
            ensure!(out.code != Some(0), "removed after the exit: {out:?}");
            Ok(())
        }
        .await,
    )
}

/// A FILE:LINE of the plugin: without `--pending` it is refused in one
/// line (`SOURCE_NOT_LOADED`: no line table of the loaded modules names
/// the file; the closest file is named) that names the flag, leaving
/// nothing; with it the breakpoint is pending, listed by its FILE:LINE,
/// armed at the dlopen at that line's first instruction in `plugin_work`
/// (the constructor's call is its first stop), then holds each worker
/// thread's call; removed, it leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_line_breakpoint_stops_the_worker_threads() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            use wpd_proto::v1::{CodeEvent, HitAction, SetWatchpointRequest, WatchpointSpec};
            let pid = t.pid;
            let p = pid.to_string();
            let (file, line) = line_of("plugin_work");
            ensure!(file == "plugin.c", "{file}");
            let at = format!("{file}:{line}");

            let out = wpctl(&daemon, &["break", "--pid", &p, &at]).await?;
            ensure!(out.code == Some(5), "refusal exit code: {out:?}");
            let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
            ensure!(
                lines.len() == 1
                    && lines[0].starts_with(&format!("wpctl: no code at {at} in process {pid}"))
                    && lines[0].contains("no line table names that file")
                    && lines[0].contains("closest: ")
                    && lines[0].contains("plugins.c")
                    && lines[0].contains("--pending"),
                "{:?}",
                out.stderr
            );
            let mut client = daemon.client().await?;
            let spec = WatchpointSpec {
                pid,
                action: HitAction::Stop as i32,
                code_event: Some(CodeEvent {
                    file: file.into(),
                    line,
                    stop: true,
                    ..Default::default()
                }),
                ..Default::default()
            };
            let st = client
                .set_watchpoint(SetWatchpointRequest {
                    spec: Some(spec.clone()),
                })
                .await
                .err()
                .context("set without pending")?;
            ensure!(
                st.code() == tonic::Code::NotFound
                    && wpd_tests::leaks::reason(&st) == wpd_proto::reason::SOURCE_NOT_LOADED,
                "{st:?}"
            );
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(l.watchpoints.is_empty(), "a refusal left {l:?}");
            ensure!(
                !daemon.log().contains("loader hook set"),
                "a refusal opened the loader hook"
            );

            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", &at]).await?;
            ensure_ok(&out, "wpctl break --pending FILE:LINE")?;
            ensure!(
                out.stdout.contains(&format!("{at} in pid {pid}: pending")),
                "{:?}",
                out.stdout
            );
            ensure!(
                out.stderr
                    .contains(&format!("pending: no line table names \"{file}\""))
                    && out.stderr.contains("whose line table has that line"),
                "{:?}",
                out.stderr
            );
            let id = id_of(out.stdout.lines().next().unwrap_or_default())?;
            let out = wpctl(&daemon, &["list", "--pid", &p]).await?;
            ensure_ok(&out, "wpctl list")?;
            let row = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("{id} ")))
                .with_context(|| format!("no row {id}: {:?}", out.stdout))?;
            ensure!(
                row.contains(" pending ")
                    && row.contains(" break ")
                    && row.ends_with(&format!("{at} (pending: not loaded yet)")),
                "{row:?}"
            );
            ensure!(daemon.log().contains("loader hook set"), "no loader hook");
            let why = pending_reason(&daemon, pid, id).await?;
            ensure!(
                why.starts_with("no line table names \"plugin.c\""),
                "{why:?}"
            );

            t.send("load")?;
            let r = resolved(&mut events, id).await?;
            let place = r.breakpoint.context("no place")?;
            ensure!(
                r.reason == "loaded"
                    && place.function == "plugin_work"
                    && place.line == line
                    && place.file.ends_with("/plugin.c")
                    && place.module.ends_with("/libplugin.so"),
                "{place:?}"
            );
            constructors_call(&daemon, &mut t, &mut events, &LIBPLUGIN, id, 1).await?;
            each_worker_stops_once(&daemon, &mut t, &mut events, &LIBPLUGIN, id, 3, 2).await?;

            let out = wpctl(&daemon, &["list", "--pid", &p]).await?;
            ensure_ok(&out, "wpctl list")?;
            ensure!(
                out.stdout.contains(&format!("plugin_work ({at})"))
                    && !out.stdout.contains("pending"),
                "{:?}",
                out.stdout
            );
            ensure!(
                daemon.log().contains("loader hook closed"),
                "hook left open"
            );
            let out = wpctl(&daemon, &["unwatch", &id.to_string()]).await?;
            ensure_ok(&out, "wpctl unwatch")?;
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(l.watchpoints.is_empty(), "left {l:?}");
            t.send("work 2 1")?;
            let reply = t.reply(EVENT_TIMEOUT).await?;
            ensure!(reply.as_deref() == Some("WORKED n=2"), "{reply:?}");
            Ok(())
        }
        .await,
    )
}

/// `id`'s row of `wpctl --json list --pid PID`.
async fn listed(daemon: &Daemon, pid: i32, id: u64) -> Result<serde_json::Value> {
    let out = wpctl(daemon, &["--json", "list", "--pid", &pid.to_string()]).await?;
    ensure_ok(&out, "wpctl --json list")?;
    let v: serde_json::Value =
        serde_json::from_str(&out.stdout).with_context(|| format!("not JSON: {:?}", out.stdout))?;
    v["watchpoints"]
        .as_array()
        .and_then(|a| a.iter().find(|w| w["id"] == id))
        .cloned()
        .with_context(|| format!("{id} is not listed: {v}"))
}

/// Two modules built from the same source (`libplugin.so`, then
/// `libplugin2.so`) both name `plugin.c` in their line tables: a pending
/// `plugin.c:LINE` goes to the first one loaded, with one probe there
/// (listed and announced with that module; the constructor's call stops).
/// The second module is loaded while the loader hook is still open (a
/// pending breakpoint on `libplugin2.so:plugin_new` keeps it so, and
/// resolves at that load, which shows the daemon looked at the module):
/// the line breakpoint stays where it is, and neither the second module's
/// constructor nor its threads' calls of its own `plugin_work` stop or
/// count; the next call in the first module is the breakpoint's second
/// hit. Removed, nothing is left and neither module stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_line_goes_to_the_first_module_that_names_its_file() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let (file, line) = line_of("plugin_work");
            ensure!(file == "plugin.c", "{file}");
            let at = format!("{file}:{line}");
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, pid).await?;

            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", &at]).await?;
            ensure_ok(&out, "wpctl break --pending FILE:LINE")?;
            let id = id_of(out.stdout.lines().next().unwrap_or_default())?;
            let second = "libplugin2.so:plugin_new";
            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", second]).await?;
            ensure_ok(&out, "wpctl break --pending libplugin2.so:plugin_new")?;
            let witness = id_of(out.stdout.lines().next().unwrap_or_default())?;

            // The first module takes it.
            t.send("load")?;
            let r = resolved(&mut events, id).await?;
            let place = r.breakpoint.context("no place")?;
            ensure!(
                r.reason == "loaded"
                    && place.function == "plugin_work"
                    && place.line == line
                    && place.module.ends_with("/libplugin.so"),
                "{place:?}"
            );
            constructors_call(&daemon, &mut t, &mut events, &LIBPLUGIN, id, 1).await?;
            let w = listed(&daemon, pid, id).await?;
            let address = w["breakpoint"]["address"].clone();
            ensure!(
                w["pending"] == false
                    && w["hits"] == 1
                    && w["breakpoint"]["module"]
                        .as_str()
                        .is_some_and(|m| m.ends_with("/libplugin.so"))
                    && w["breakpoint"]["line"] == line
                    && address.is_string(),
                "{w}"
            );
            let why = pending_reason(&daemon, pid, witness).await?;
            ensure!(!why.is_empty(), "the witness has no reason");
            ensure!(
                !daemon.log().contains("loader hook closed"),
                "the hook closed while {witness} is pending"
            );

            // The second module, loaded with the hook open: its constructor's
            // call of its own plugin_work is not held (else no LOADED2).
            t.send("load2")?;
            let r = resolved(&mut events, witness).await?;
            let place = r.breakpoint.context("no place for the witness")?;
            ensure!(
                place.function == "plugin_new" && place.module.ends_with("/libplugin2.so"),
                "{place:?}"
            );
            let reply = t.reply(EVENT_TIMEOUT).await?;
            ensure!(
                reply.as_deref() == Some("LOADED2 calls=1"),
                "libplugin2.so's constructor: {reply:?}"
            );
            let reply = t.cmd("work2 2 1").await?;
            ensure!(reply == "WORKED2 n=2", "{reply}");
            let w = listed(&daemon, pid, id).await?;
            ensure!(
                w["hits"] == 1
                    && w["breakpoint"]["address"] == address
                    && w["breakpoint"]["module"]
                        .as_str()
                        .is_some_and(|m| m.ends_with("/libplugin.so")),
                "after libplugin2.so's calls: {w}"
            );
            ensure!(
                daemon.log().contains("loader hook closed"),
                "hook left open"
            );

            // The first module's next call is its second hit.
            each_worker_stops_once(&daemon, &mut t, &mut events, &LIBPLUGIN, id, 1, 2).await?;

            for which in [id, witness] {
                let out = wpctl(&daemon, &["unwatch", &which.to_string()]).await?;
                ensure_ok(&out, "wpctl unwatch")?;
            }
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(l.watchpoints.is_empty(), "left {l:?}");
            let reply = t.cmd("work 2 1").await?;
            ensure!(reply == "WORKED n=2", "{reply}");
            let reply = t.cmd("work2 2 1").await?;
            ensure!(reply == "WORKED2 n=2", "{reply}");
            Ok(())
        }
        .await,
    )
}

/// One dlopen, two modules built from the same source: `load3` opens
/// `libplugin3.so`, which needs `libplugin2.so`, and the dynamic linker
/// maps both before its hook is called. A pending `plugin.c:LINE` set
/// before goes to the one the linker loaded first (its list of loaded
/// objects: the library opened, then those it needs), `libplugin3.so`,
/// whatever the addresses (the library needed is mapped after, usually
/// below) and though `libplugin2.so`'s constructor runs first: announced
/// and listed with `libplugin3.so`, its constructor's call is the first
/// stop and its threads' calls stop; `libplugin2.so`'s copy of the line
/// (its constructor's call, its threads' calls) never stops nor counts.
/// Removed, neither stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_line_in_one_load_of_two_modules_goes_to_the_first_loaded() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let (file, line) = line_of("plugin_work");
            ensure!(file == "plugin.c", "{file}");
            let at = format!("{file}:{line}");
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, pid).await?;

            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", &at]).await?;
            ensure_ok(&out, "wpctl break --pending FILE:LINE")?;
            let id = id_of(out.stdout.lines().next().unwrap_or_default())?;
            let why = pending_reason(&daemon, pid, id).await?;
            ensure!(
                why.starts_with("no line table names \"plugin.c\""),
                "{why:?}"
            );

            // One load, both modules: libplugin3.so takes it.
            t.send("load3")?;
            let r = resolved(&mut events, id).await?;
            let place = r.breakpoint.context("no place")?;
            ensure!(
                r.reason == "loaded"
                    && place.function == "plugin3_work"
                    && place.line == line
                    && place.file.ends_with("/plugin.c")
                    && place.module.ends_with("/libplugin3.so"),
                "the library opened, loaded before the one it needs, takes it: {place:?}"
            );
            // libplugin2.so's constructor ran first, not held (else no
            // LOADED3, or a first stop in its copy): calls2=1.
            constructors_call(&daemon, &mut t, &mut events, &LIBPLUGIN3, id, 1).await?;
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
            ensure!(
                maps.contains("/libplugin2.so") && maps.contains("/libplugin3.so"),
                "one load mapped both: {maps}"
            );
            let w = listed(&daemon, pid, id).await?;
            let address = w["breakpoint"]["address"].clone();
            ensure!(
                w["pending"] == false
                    && w["hits"] == 1
                    && w["breakpoint"]["function"] == "plugin3_work"
                    && w["breakpoint"]["module"]
                        .as_str()
                        .is_some_and(|m| m.ends_with("/libplugin3.so"))
                    && w["breakpoint"]["line"] == line
                    && address.is_string(),
                "{w}"
            );
            let out = wpctl(&daemon, &["list", "--pid", &p]).await?;
            ensure_ok(&out, "wpctl list")?;
            ensure!(
                out.stdout.contains(&format!("plugin3_work ({at})"))
                    && !out.stdout.contains("pending"),
                "{:?}",
                out.stdout
            );
            ensure!(
                daemon.log().contains("loader hook closed"),
                "hook left open"
            );

            // libplugin2.so's copy: its threads are not held (else no
            // WORKED2), nothing counts.
            let reply = t.cmd("work2 2 1").await?;
            ensure!(reply == "WORKED2 n=2", "{reply}");
            let w = listed(&daemon, pid, id).await?;
            ensure!(
                w["hits"] == 1 && w["breakpoint"]["address"] == address,
                "after libplugin2.so's calls: {w}"
            );

            // libplugin3.so's copy: each thread stops, hits 2 and 3.
            each_worker_stops_once(&daemon, &mut t, &mut events, &LIBPLUGIN3, id, 2, 2).await?;
            let w = listed(&daemon, pid, id).await?;
            ensure!(w["hits"] == 3, "{w}");

            let out = wpctl(&daemon, &["unwatch", &id.to_string()]).await?;
            ensure_ok(&out, "wpctl unwatch")?;
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(l.watchpoints.is_empty(), "left {l:?}");
            let reply = t.cmd("work3 2 1").await?;
            ensure!(reply == "WORKED3 n=2", "{reply}");
            let reply = t.cmd("work2 2 1").await?;
            ensure!(reply == "WORKED2 n=2", "{reply}");
            Ok(())
        }
        .await,
    )
}

/// A function named alone that no loaded module defines is refused in one
/// line that says so and names `--pending` with `LIBRARY:NAME`
/// (`UNKNOWN_SYMBOL`, its closest names); a pending line of the plugin's
/// source that has no code (its opening comment) goes at the load, with a
/// `WatchpointRemoved` saying why; a misspelled pending name stays, its
/// reason naming the plugin's function among the closest once the plugin
/// is loaded; removed, the loader hook goes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_pending_and_a_line_without_code_goes_at_the_load() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let out = wpctl(&daemon, &["break", "--pid", &p, "plugin_work"]).await?;
            ensure!(out.code == Some(5), "refusal exit code: {out:?}");
            let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
            ensure!(
                lines.len() == 1
                    && lines[0].starts_with("wpctl: no function named \"plugin_work\" in the ")
                    && lines[0].contains(&format!("process {pid} has loaded"))
                    && lines[0].contains("--pending LIBRARY:plugin_work"),
                "{:?}",
                out.stderr
            );
            let out = wpctl(&daemon, &["--json", "break", "--pid", &p, "plugin_work"]).await?;
            ensure!(
                out.code == Some(5) && out.stderr.contains(wpd_proto::reason::UNKNOWN_SYMBOL),
                "{out:?}"
            );
            ensure!(
                !daemon.log().contains("loader hook set"),
                "a refusal opened the loader hook"
            );

            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, pid).await?;
            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", "plugin.c:1"]).await?;
            ensure_ok(&out, "wpctl break --pending plugin.c:1")?;
            let id = id_of(out.stdout.lines().next().unwrap_or_default())?;
            // A misspelled name: the plugin's own name is not among the
            // closest until the plugin is loaded, then it is.
            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", "plugin_wrok"]).await?;
            ensure_ok(&out, "wpctl break --pending plugin_wrok")?;
            let typo = id_of(out.stdout.lines().next().unwrap_or_default())?;
            let why = pending_reason(&daemon, pid, typo).await?;
            ensure!(
                why.starts_with("no function named \"plugin_wrok\"")
                    && !why.contains("plugin_work"),
                "{why:?}"
            );
            t.send("load")?;
            let reason = events
                .wait_for(EVENT_TIMEOUT, "its WatchpointRemoved", |e| match e {
                    Event::WatchpointRemoved(r) if r.watchpoint_id == id => {
                        Ok(Some(r.reason.clone()))
                    }
                    _ => Ok(None),
                })
                .await?;
            ensure!(
                reason.contains("its module was loaded, but it cannot be armed")
                    && reason.contains("no code at plugin.c:1"),
                "{reason:?}"
            );
            let reply = t.reply(EVENT_TIMEOUT).await?;
            ensure!(reply.as_deref() == Some("LOADED calls=1"), "{reply:?}");
            let why = pending_reason(&daemon, pid, typo).await?;
            ensure!(
                why.starts_with("no function named \"plugin_wrok\"")
                    && why.contains("closest: ")
                    && why.contains("plugin_work"),
                "{why:?}"
            );
            let out = wpctl(&daemon, &["unwatch", &typo.to_string()]).await?;
            ensure_ok(&out, "wpctl unwatch (pending)")?;
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(l.watchpoints.is_empty(), "left {l:?}");
            ensure!(
                daemon.log().contains("loader hook closed"),
                "hook left open"
            );
            Ok(())
        }
        .await,
    )
}

/// A process no dynamic linker runs (`ct-nolibc`: static, no C library)
/// has no loader hook to wait at: a pending event is refused
/// (FAILED_PRECONDITION, `NO_LOADER_HOOK`) in one line that says why, and
/// leaves nothing: nothing listed, the process not left attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_without_a_loader_hook_refuses_pending_events() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-nolibc").await?;
    daemon.finish(
        async {
            let pid = t.pid;
            let p = pid.to_string();
            let at = "libplugin.so:plugin_work";
            let out = wpctl(&daemon, &["break", "--pid", &p, "--pending", at]).await?;
            ensure!(out.code == Some(8), "refusal exit code: {out:?}");
            let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
            ensure!(
                lines.len() == 1
                    && lines[0].contains(&format!(
                        "process {pid} has no dynamic linker's debugger hook (_dl_debug_state"
                    )),
                "{:?}",
                out.stderr
            );
            let out = wpctl(&daemon, &["--json", "break", "--pid", &p, "--pending", at]).await?;
            ensure!(
                out.code == Some(8) && out.stderr.contains(wpd_proto::reason::NO_LOADER_HOOK),
                "{out:?}"
            );
            let out = wpctl(&daemon, &["--json", "list"]).await?;
            ensure_ok(&out, "wpctl --json list")?;
            let v: serde_json::Value = serde_json::from_str(&out.stdout)
                .with_context(|| format!("not JSON: {:?}", out.stdout))?;
            ensure!(
                v["watchpoints"].as_array().is_none_or(|a| a.is_empty())
                    && v["processes"].as_array().is_none_or(|a| a.is_empty()),
                "the refusals left something: {v}"
            );
            ensure!(
                !daemon.log().contains("loader hook set"),
                "a refusal opened the loader hook"
            );
            Ok(())
        }
        .await,
    )
}
