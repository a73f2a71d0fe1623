//! End-to-end tests of `wpctl` against a real daemon: its output for watch/list/threads/events
//! and its documented exit codes (0 ok, 3 no daemon, 4 invalid argument, 5 not found).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use wpd_proto::v1::ListWatchpointsRequest;
use wpd_tests::{
    Backend, CmdOutput, Daemon, TargetProc, ensure_unchanged, numbers_in, require_root_perf,
    rpc_ok, run_wpctl, set_watchpoint, snapshot, write_spec,
};

const WPCTL_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `wpctl --endpoint <daemon> args...`.
async fn wpctl(daemon: &Daemon, args: &[&str]) -> Result<CmdOutput> {
    let endpoint = daemon.endpoint();
    let mut all = vec!["--endpoint", endpoint.as_str()];
    all.extend_from_slice(args);
    run_wpctl(&all, WPCTL_TIMEOUT).await
}

fn ensure_exit(out: &CmdOutput, code: i32, what: &str) -> Result<()> {
    ensure!(
        out.code == Some(code),
        "{what}: expected exit code {code}, got {:?}\nstdout: {}\nstderr: {}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// True if some object in `v` has an `id` equal to `id` (as a number, or as a string, which is
/// how the protobuf JSON mapping writes 64-bit integers).
fn json_has_id(v: &Value, id: u64) -> bool {
    match v {
        Value::Object(map) => {
            let here = match map.get("id") {
                Some(Value::Number(n)) => n.as_u64() == Some(id),
                Some(Value::String(s)) => s.parse::<u64>().ok() == Some(id),
                _ => false,
            };
            here || map.values().any(|x| json_has_id(x, id))
        }
        Value::Array(items) => items.iter().any(|x| json_has_id(x, id)),
        _ => false,
    }
}

/// `watch` prints the new id and "armed on N threads"; `list --json` is JSON holding it;
/// `threads --pid` lists every thread; `unwatch --id` removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpctl_watch_list_threads_unwatch() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid.to_string();
            let addr = format!("{:#x}", target.vars[1]);
            let tids = target.tids()?;

            let out = wpctl(
                &daemon,
                &["watch", "--pid", &pid, "--addr", &addr, "--len", "8"],
            )
            .await?;
            ensure_exit(&out, 0, "wpctl watch")?;
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(list.watchpoints.len() == 1, "listed after watch: {list:?}");
            let wp = &list.watchpoints[0];
            let spec = wp.spec.clone().unwrap_or_default();
            ensure!(
                spec.address == target.vars[1] && spec.length == 8 && spec.pid == target.pid,
                "wpctl watch set {spec:?}"
            );
            ensure!(
                numbers_in(&out.stdout).contains(&(wp.id as i64)),
                "`wpctl watch` output does not show the id {}: {:?}",
                wp.id,
                out.stdout
            );
            let armed = format!("armed on {} threads", tids.len());
            ensure!(
                out.stdout.contains(&armed),
                "no {armed:?} in {:?}",
                out.stdout
            );

            let out = wpctl(&daemon, &["list", "--json"]).await?;
            ensure_exit(&out, 0, "wpctl list --json")?;
            let json: Value = serde_json::from_str(&out.stdout)
                .with_context(|| format!("`wpctl list --json` is not JSON: {:?}", out.stdout))?;
            ensure!(
                json_has_id(&json, wp.id),
                "watchpoint {} not in {json}",
                wp.id
            );

            let out = wpctl(&daemon, &["threads", "--pid", &pid]).await?;
            ensure_exit(&out, 0, "wpctl threads")?;
            let shown = numbers_in(&out.stdout);
            for tid in &tids {
                ensure!(
                    shown.contains(&(*tid as i64)),
                    "tid {tid} missing from {:?}",
                    out.stdout
                );
            }
            ensure!(
                out.stdout.lines().filter(|l| !l.trim().is_empty()).count() > tids.len(),
                "expected a header and one row per thread: {:?}",
                out.stdout
            );

            let id = wp.id.to_string();
            let out = wpctl(&daemon, &["unwatch", "--id", &id]).await?;
            ensure_exit(&out, 0, "wpctl unwatch")?;
            let snap = snapshot(&mut client, target.pid).await?;
            ensure!(
                snap.watchpoints.is_empty(),
                "still listed after unwatch: {snap:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// `events --count 3 --pid P` prints three lines and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpctl_events_stops_after_count() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "4"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            // The workers keep storing, so hits keep coming whenever wpctl subscribes.
            set_watchpoint(
                &mut client,
                write_spec(Backend::Unspecified, target.pid, target.vars[0]),
            )
            .await?;
            let pid = target.pid.to_string();
            let out = wpctl(&daemon, &["events", "--count", "3", "--pid", &pid]).await?;
            ensure_exit(&out, 0, "wpctl events --count 3")?;
            let lines = out.stdout.lines().filter(|l| !l.trim().is_empty()).count();
            ensure!(
                lines == 3,
                "expected 3 lines, got {lines}: {:?}",
                out.stdout
            );
            Ok(())
        }
        .await,
    )
}

/// A range needing more slots than a thread has exits 4 with a one-line
/// error and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpctl_bad_spec_exits_4() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let before = snapshot(&mut client, target.pid).await?;
            let pid = target.pid.to_string();
            let out = wpctl(
                &daemon,
                &["watch", "--pid", &pid, "--addr", "0x1001", "--len", "40"],
            )
            .await?;
            ensure_exit(&out, 4, "wpctl watch --addr 0x1001 --len 40")?;
            ensure!(
                out.stderr.contains("need 8 debug-register slots"),
                "the refusal names the slots needed: {:?}",
                out.stderr
            );
            let lines: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect();
            ensure!(
                lines.len() == 1,
                "expected one line on stderr: {:?}",
                out.stderr
            );
            let after = snapshot(&mut client, target.pid).await?;
            ensure_unchanged("wpctl watch --addr 0x1001 --len 40", &before, &after)?;
            Ok(())
        }
        .await,
    )
}

/// `unwatch` of an unknown id exits 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpctl_unknown_id_exits_5() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let out = wpctl(&daemon, &["unwatch", "--id", "999999"]).await?;
            ensure_exit(&out, 5, "wpctl unwatch --id 999999")
        }
        .await,
    )
}

/// Without a daemon at the endpoint wpctl exits 3 (needs neither root nor a daemon).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpctl_without_daemon_exits_3() -> Result<()> {
    let out = run_wpctl(
        &["--endpoint", "unix:/nonexistent.sock", "caps"],
        WPCTL_TIMEOUT,
    )
    .await?;
    ensure_exit(&out, 3, "wpctl caps without a daemon")?;
    ensure!(!out.stderr.trim().is_empty(), "no explanation on stderr");
    Ok(())
}

/// Whether this CPU has the fast-string modes an armed breakpoint turns off (`erms`, `fsrm`).
fn cpu_has_fast_strings() -> Result<bool> {
    let info = std::fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
    Ok(info
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "erms" || f == "fsrm")))
}

/// The first watchpoint on a glibc process says that its large memsets will run slowly
/// while armed and how to start it so they do not (kernel-facts §14); the second watchpoint
/// does not repeat it, and a process started with the tunable gets no such warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpctl_watch_warns_of_slow_memset() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let fast = cpu_has_fast_strings()?;
    let daemon = Daemon::start().await?;
    let plain = TargetProc::start(&["--threads", "2"]).await?;
    let bin = wpd_tests::find_bin("wpd-target")?;
    let bin = bin.to_str().context("target path is not UTF-8")?;
    let tuned = TargetProc::start_via(
        std::path::Path::new("env"),
        &[
            "GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=1000000000000",
            bin,
            "--threads",
            "2",
        ],
    )
    .await?;
    daemon.finish(
        async {
            let first = watch_var(&daemon, &plain, 0).await?;
            ensure_exit(&first, 0, "first wpctl watch")?;
            ensure!(
                warns_of_memset(&first) == fast,
                "first watch of a glibc process on a CPU {} fast strings: expected {} warning, \
                 got stderr {:?}",
                if fast { "with" } else { "without" },
                if fast { "a" } else { "no" },
                first.stderr
            );
            let second = watch_var(&daemon, &plain, 1).await?;
            ensure_exit(&second, 0, "second wpctl watch")?;
            ensure!(
                !warns_of_memset(&second),
                "the second watch repeats the warning: {:?}",
                second.stderr
            );

            let out = watch_var(&daemon, &tuned, 0).await?;
            ensure_exit(&out, 0, "wpctl watch of the tuned process")?;
            ensure!(
                !warns_of_memset(&out),
                "a process started with the tunable is warned: {:?}",
                out.stderr
            );
            Ok(())
        }
        .await,
    )
}

/// `wpctl watch --pid T --addr VAR` of the target's variable `var`.
async fn watch_var(daemon: &Daemon, t: &TargetProc, var: usize) -> Result<CmdOutput> {
    let pid = t.pid.to_string();
    let addr = format!("{:#x}", t.vars[var]);
    wpctl(daemon, &["watch", "--pid", &pid, "--addr", &addr]).await
}

/// Whether `wpctl watch` warned of slow memsets and named the cure.
fn warns_of_memset(out: &CmdOutput) -> bool {
    out.stderr.contains("rep stosb")
        && out
            .stderr
            .contains("GLIBC_TUNABLES=glibc.cpu.x86_rep_stosb_threshold=")
}
