//! Fuzzers: a hit becomes a crash the fuzzer saves (the SIGNAL action), judged at the trap,
//! and fork servers stay fork servers (their children are covered by the server's
//! watchpoint, not attached one by one). Real AFL++ and libFuzzer from Debian's packages run
//! `tests/c/fuzzparse.c`, a parser whose bug is a silent store of an out-of-range value.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tonic::Code;
use wpd_proto::v1::{
    HitAction, HitCondition, ListWatchpointsRequest, Policy, SetWatchpointRequest,
    hit_condition::Op,
};
use wpd_tests::{
    Backend, CmdOutput, Daemon, Event, EventStream, TargetProc, TempDir, expect_status, poll_until,
    require_backend, rpc_ok, run_fuzzer, run_wpctl, set_watchpoint, write_spec,
};

const HIT_TIMEOUT: Duration = Duration::from_secs(10);
const SIGUSR1: i32 = libc::SIGUSR1;
/// The source of the fuzzing target, compiled by each test with the fuzzer's compiler.
const FUZZPARSE: &str = include_str!("../c/fuzzparse.c");
/// The seed: a valid input with an in-range level (16): the fuzzers must mutate it.
const SEED: &[u8] = b"WPL\x10M\x01";

/// A process-wide write watchpoint on `VARS[i]` of `target` whose hits send `signal` to the
/// writing thread when the value is 7.
fn signal_spec(
    backend: Backend,
    target: &TargetProc,
    i: usize,
    signal: i32,
) -> SetWatchpointRequest {
    let mut spec = write_spec(backend, target.pid, target.vars[i]);
    spec.action = HitAction::Signal as i32;
    spec.signal = signal;
    spec.condition = Some(HitCondition {
        value: String::new(),
        op: Op::Eq as i32,
        operand: 7,
        mask: 0,
    });
    SetWatchpointRequest { spec: Some(spec) }
}

async fn usr1_count(target: &mut TargetProc) -> Result<u64> {
    let reply = target.cmd("usr1count").await?;
    reply
        .strip_prefix("USR1 ")
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("unexpected reply to usr1count: {reply:?}"))
}

wpd_tests::both_backends!(
    /// The signal reaches the thread that stored, at the hit, and only when the condition
    /// holds (judged at the trap: in the BPF program on perf, in the stop on ptrace): stores
    /// of 5 send nothing, a store of 7 runs the target's SIGUSR1 handler once, before the
    /// store's command is answered; a writer that blocks the signal keeps it pending for
    /// itself (it is sent to the thread, not to the process). The target lives on (its
    /// handler caught the signal).
    the_signal_action_reaches_the_writer_when_the_condition_holds
);
async fn the_signal_action_reaches_the_writer_when_the_condition_holds(
    backend: Backend,
) -> Result<()> {
    let daemon = Daemon::start().await?;
    // Workers that almost never write: the stores are the main thread's.
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::for_pid(&mut client, target.pid).await?;
        let wp = rpc_ok(
            "SetWatchpoint",
            client.set_watchpoint(signal_spec(backend, &target, 2, SIGUSR1)),
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        let before = usr1_count(&mut target).await?;
        for _ in 0..3 {
            target.cmd("write 2 5").await?;
        }
        ensure!(
            usr1_count(&mut target).await? == before,
            "stores of 5 sent the signal"
        );
        // A thread other than the main one (the process's leader, where a signal sent to
        // the process would most likely land) stores 7.
        let (writer, on_writer) = thread_write(&mut target, 2, 7).await?;
        ensure!(
            writer != target.pid,
            "the writer is the main thread ({writer})"
        );
        // The handler ran at the store, on the storing thread, before it exited.
        ensure!(
            on_writer == 1,
            "the writer {writer}'s own handler ran {on_writer} times for its store of 7"
        );
        let after = usr1_count(&mut target).await?;
        ensure!(
            after == before + 1,
            "a store of 7 ran the handler {} times",
            after - before
        );
        let hit = events
            .wait_for(HIT_TIMEOUT, "the hit of the store of 7", |e| {
                Ok(match e {
                    Event::Hit(h) if h.watchpoint_id == wp.id => Some(h.clone()),
                    _ => None,
                })
            })
            .await?;
        ensure!(
            hit.tid == writer && hit.value == 7u64.to_le_bytes(),
            "the reported hit is not thread {writer}'s store of 7: {hit:?}"
        );
        // Sent to the thread, not to the process: a writer that blocks the signal keeps it
        // pending for itself alone (a signal sent to the process, even from the writer's own
        // context, would go to a thread that does not block it and run its handler there).
        let before = usr1_count(&mut target).await?;
        let reply = target.cmd("thread-write-blocked 2 7").await?;
        ensure!(
            reply.starts_with("THREAD-WROTE-BLOCKED") && reply.ends_with(" pending=1"),
            "the signal is not pending for the writer that blocks it: {reply:?}"
        );
        let after = usr1_count(&mut target).await?;
        ensure!(
            after == before,
            "another thread ran the handler for the blocking writer's store ({} times)",
            after - before
        );
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

/// `thread-write I V`: a new thread of `target` stores V into `VARS[I]`; (its tid, the SIGUSR1
/// its own handler ran).
async fn thread_write(target: &mut TargetProc, i: usize, v: u64) -> Result<(i32, u64)> {
    let reply = target.cmd(&format!("thread-write {i} {v}")).await?;
    let field = |k: &str| {
        reply
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|n| n.parse::<u64>().ok())
    };
    match (
        reply.starts_with("THREAD-WROTE"),
        field("tid="),
        field("usr1="),
    ) {
        (true, Some(tid), Some(n)) => Ok((tid as i32, n)),
        _ => bail!("unexpected reply to thread-write: {reply:?}"),
    }
}

wpd_tests::both_backends!(
    /// Every combination of action (report, signal), condition (none, `changed`, a comparison),
    /// ignore count, hit count and rate limit is armed (on perf, a program the kernel's
    /// verifier takes), and the signal reaches the writing thread at the hit when it should:
    /// each combination's watchpoint is set on a quiet variable, a new thread stores into it
    /// once, and its own handler must have run exactly when the action signals, the hit is
    /// not skipped and the comparison (`== 7`) or `changed` holds.
    every_combination_of_filter_and_action_is_armed
);
async fn every_combination_of_filter_and_action_is_armed(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let conditions = [
            None,
            Some(HitCondition {
                op: Op::Changed as i32,
                ..Default::default()
            }),
            Some(HitCondition {
                value: String::new(),
                op: Op::Eq as i32,
                operand: 7,
                mask: 0,
            }),
        ];
        let mut n = 0;
        for signal in [false, true] {
            for condition in &conditions {
                for ignore in [0u64, 2] {
                    for every in [0u64, 3] {
                        for rate in [0u32, 1000] {
                            let mut spec = write_spec(backend, target.pid, target.vars[3]);
                            if signal {
                                spec.action = HitAction::Signal as i32;
                                spec.signal = SIGUSR1;
                            }
                            spec.condition = condition.clone();
                            spec.ignore_count = ignore;
                            spec.hit_count = every;
                            spec.max_hits_per_second = rate;
                            let what = format!(
                                "signal {signal}, condition {condition:?}, ignore {ignore}, \
                                 every {every}, rate {rate}"
                            );
                            let wp = rpc_ok(
                                &format!("SetWatchpoint({what})"),
                                client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) }),
                            )
                            .await?
                            .watchpoint
                            .context("no watchpoint")?;
                            // The first store after the watchpoint is set: judged, then
                            // skipped by an ignore count of 2 or a hit count of 3 (which
                            // reports the 3rd, 6th, ...).
                            let (_, on_writer) = thread_write(&mut target, 3, 7).await?;
                            let expected = u64::from(signal && ignore == 0 && every <= 1);
                            ensure!(
                                on_writer == expected,
                                "{what}: the writer's handler ran {on_writer} times, not {expected}"
                            );
                            rpc_ok(
                                "RemoveWatchpoint",
                                client.remove_watchpoint(wpd_proto::v1::RemoveWatchpointRequest {
                                    id: wp.id,
                                }),
                            )
                            .await?;
                            // Back to a value the next `changed` sees change from.
                            target.cmd("write 3 0").await?;
                            n += 1;
                        }
                    }
                }
            }
        }
        ensure!(n == 48, "{n} combinations tried");
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

wpd_tests::both_backends!(
    /// A signal that cannot end a run at the hit is refused and sets nothing: SIGTRAP
    /// (debuggers own it), SIGKILL (no crash handler runs) and job control as bad requests;
    /// a signal the process ignores, or one a thread blocks (named), with SIGNAL_UNUSABLE.
    unusable_signals_are_refused
);
async fn unusable_signals_are_refused(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        ensure!(target.cmd("ignore-sig 12").await? == "IGNORED 12");
        ensure!(target.cmd("block-sig 10").await? == "BLOCKED 10");
        // Never usable: a bad request. Not usable in this process now: a precondition.
        let pid = target.pid.to_string();
        let cases: [(i32, Code, &[&str]); 5] = [
            (libc::SIGTRAP, Code::InvalidArgument, &["SIGTRAP"]),
            (libc::SIGKILL, Code::InvalidArgument, &["SIGKILL"]),
            (libc::SIGTSTP, Code::InvalidArgument, &["job control"]),
            (
                libc::SIGUSR2,
                Code::FailedPrecondition,
                &["ignores", "SIGUSR2"],
            ),
            (
                SIGUSR1,
                Code::FailedPrecondition,
                &["blocks", "SIGUSR1", &pid],
            ),
        ];
        for (sig, code, needles) in cases {
            let status = expect_status(
                &format!("SetWatchpoint with signal {sig}"),
                client
                    .set_watchpoint(signal_spec(backend, &target, 2, sig))
                    .await,
                code,
                needles,
            )?;
            if code == Code::FailedPrecondition {
                ensure!(
                    status_reason(&status).as_deref() == Some("SIGNAL_UNUSABLE"),
                    "signal {sig}: reason {:?}",
                    status_reason(&status)
                );
            }
        }
        let l = rpc_ok(
            "ListWatchpoints",
            client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
        )
        .await?;
        ensure!(
            l.watchpoints.is_empty(),
            "refusals left watchpoints: {:?}",
            l.watchpoints
        );
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

/// The `ErrorInfo` reason of a status, if it has one.
fn status_reason(status: &tonic::Status) -> Option<String> {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
}

/// A program that starts blocking the action's signal after the watchpoint was set would
/// keep the signal pending instead of crashing at the hit: the daemon notices within
/// seconds and removes the watchpoint, saying why; the target runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_the_program_later_blocks_removes_the_watchpoint() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::for_pid(&mut client, target.pid).await?;
        let wp = set_watchpoint(
            &mut client,
            signal_spec(Backend::Perf, &target, 2, SIGUSR1)
                .spec
                .context("no spec")?,
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        ensure!(target.cmd("block-sig 10").await? == "BLOCKED 10");
        let reason = events
            .wait_for(Duration::from_secs(10), "the watchpoint's removal", |e| {
                Ok(match e {
                    Event::WatchpointRemoved(r) if r.watchpoint_id == wp.id => {
                        Some(r.reason.clone())
                    }
                    _ => None,
                })
            })
            .await?;
        ensure!(
            reason.contains("blocks SIGUSR1"),
            "removed for another reason: {reason:?}"
        );
        target.ensure_alive()
    }
    .await;
    daemon.finish(result)
}

wpd_tests::both_backends!(
    /// A crash carries who wrote last: the target dies of the action's SIGABRT at a store of
    /// 7, and `ProcessCrashed` names the signal, the storing thread and, for each of the
    /// process's watchpoints, its last hits in it (here the two stores another watchpoint
    /// reported just before).
    a_crash_carries_the_last_hits
);
async fn a_crash_carries_the_last_hits(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let pid = target.pid;
        let mut events = EventStream::for_pid(&mut client, pid).await?;
        let log = set_watchpoint(&mut client, write_spec(backend, pid, target.vars[3]))
            .await?
            .watchpoint
            .context("no watchpoint")?;
        let crash = rpc_ok(
            "SetWatchpoint",
            client.set_watchpoint(signal_spec(backend, &target, 2, libc::SIGABRT)),
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        for v in [11u64, 12] {
            target.cmd(&format!("write 3 {v}")).await?;
            events
                .wait_for(HIT_TIMEOUT, &format!("the hit of the store of {v}"), |e| {
                    Ok(match e {
                        Event::Hit(h)
                            if h.watchpoint_id == log.id && h.value == v.to_le_bytes() =>
                        {
                            Some(())
                        }
                        _ => None,
                    })
                })
                .await?;
        }
        // The store of 7 ends the target: no answer comes.
        let _ = target.cmd_within("write 2 7", Duration::from_secs(2)).await;
        let crashed = events
            .wait_for(HIT_TIMEOUT, "ProcessCrashed", |e| {
                Ok(match e {
                    Event::ProcessCrashed(c) if c.pid == pid => Some(c.clone()),
                    _ => None,
                })
            })
            .await?;
        ensure!(
            crashed.signal == libc::SIGABRT && crashed.tid == pid && crashed.fatal,
            "not the main thread's death by SIGABRT: {crashed:?}"
        );
        let mut ids = crashed.watchpoint_ids.clone();
        ids.sort_unstable();
        ensure!(ids == vec![log.id, crash.id], "watchpoints {ids:?}");
        let logged: Vec<u64> = crashed
            .last_hits
            .iter()
            .filter(|h| h.watchpoint_id == log.id)
            .map(|h| u64::from_le_bytes(h.value.clone().try_into().unwrap_or_default()))
            .collect();
        ensure!(
            logged == vec![11, 12],
            "the crash's last hits of watchpoint {} are {logged:?}, not the stores 11 and 12",
            log.id
        );
        ensure!(
            crashed.last_hits.iter().all(|h| h.pid == pid),
            "hits of another process: {:?}",
            crashed.last_hits
        );
        use std::os::unix::process::ExitStatusExt;
        let status = target.wait_exit(Duration::from_secs(5)).await?;
        ensure!(
            status.signal() == Some(libc::SIGABRT),
            "the target ended with {status:?}, not by SIGABRT"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A unique command name for a fuzzing target (at most 15 bytes, the kernel's comm).
pub(crate) fn unique_comm(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
    .chars()
    .take(15)
    .collect()
}

/// Compiles `tests/c/fuzzparse.c` into `dir/name` with `compiler` and `flags`. A missing
/// compiler is a failure that names the package (`scripts/setup` installs it).
fn build_target(
    dir: &Path,
    name: &str,
    compiler: &str,
    flags: &[&str],
    package: &str,
) -> Result<PathBuf> {
    let src = dir.join("fuzzparse.c");
    std::fs::write(&src, FUZZPARSE)?;
    let out = dir.join(name);
    let o = std::process::Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .env("AFL_QUIET", "1")
        .output()
        .with_context(|| {
            format!("running {compiler} (Debian's {package}; scripts/setup installs it)")
        })?;
    ensure!(
        o.status.success(),
        "{compiler} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(out)
}

/// The level an input of the parser stores last, if it stores one (the parser's rules,
/// from `fuzzparse.c`).
fn levels_stored(input: &[u8]) -> Vec<u8> {
    if input.len() < 2 || &input[..2] != b"WP" {
        return Vec::new();
    }
    input[2..]
        .chunks_exact(2)
        .filter(|r| r[0] == b'L')
        .map(|r| r[1])
        .collect()
}

/// `wpctl watch` as a farm would type it: every process named `comm`, state.level, a crash
/// when a store makes it over 100; returns the policy.
async fn watch_level(daemon: &Daemon, comm: &str, follow_forks: bool) -> Result<Policy> {
    let endpoint = daemon.endpoint();
    let mut args = vec![
        "--endpoint",
        endpoint.as_str(),
        "--json",
        "watch",
        "--comm",
        comm,
        "--symbol",
        "state.level",
        "--condition",
        "> 100",
        "--action",
        "signal",
    ];
    if follow_forks {
        args.push("--follow-forks");
    }
    let out: CmdOutput = run_wpctl(&args, Duration::from_secs(20)).await?;
    ensure!(out.code == Some(0), "wpctl watch failed: {out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("wpctl --json watch printed {:?}", out.stdout))?;
    let id = v["policy"]["id"].as_u64().context("no policy id")?;
    let mut client = daemon.client().await?;
    policy(&mut client, id).await
}

async fn policy(client: &mut wpd_tests::Client, id: u64) -> Result<Policy> {
    let l = rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
    )
    .await?;
    l.policies
        .into_iter()
        .find(|p| p.id == id)
        .with_context(|| format!("no policy {id}"))
}

/// Processes named `comm` still alive.
fn alive_named(comm: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

/// After the fuzzer: no process of the target left, no instance and no attached process left
/// in the daemon.
pub(crate) async fn nothing_left(daemon: &Daemon, comm: &str, policy_id: u64) -> Result<()> {
    let mut client = daemon.client().await?;
    poll_until(
        Duration::from_secs(10),
        "no target process, instance or attachment left",
        async || {
            let alive = alive_named(comm);
            let l = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            let p = l
                .policies
                .iter()
                .find(|p| p.id == policy_id)
                .context("the policy is gone")?;
            let stats = rpc_ok(
                "GetStats",
                client.get_stats(wpd_proto::v1::GetStatsRequest::default()),
            )
            .await?;
            Ok(
                if alive.is_empty()
                    && p.instances.is_empty()
                    && l.processes.is_empty()
                    && stats.threads == 0
                    && stats.perf_fds == 0
                {
                    Ok(())
                } else {
                    Err(format!(
                        "alive {alive:?}, instances {:?}, {} threads and {} perf fds tracked, \
                         attached {:?}",
                        p.instances,
                        stats.threads,
                        stats.perf_fds,
                        l.processes.iter().map(|p| p.pid).collect::<Vec<_>>()
                    ))
                },
            )
        },
    )
    .await
}

/// AFL++ on a fork-server target whose parser silently stores an out-of-range level: alone
/// it finds no crash; with a policy on the target's name (`state.level > 100`, signal action,
/// fork-server children followed) it saves inputs that store such a level, each as a crash
/// by SIGABRT. The fork server is the policy's one instance: its thousands of children are
/// covered by its watchpoint (copied into them by the kernel inside fork), not attached one
/// by one. When AFL++ ends, nothing is left: no target process, instance or attachment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn afl_saves_the_inputs_that_break_the_invariant() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = TempDir::new("wpd-afl")?;
    let comm = unique_comm("fzafl");
    let bin = build_target(&dir, &comm, "afl-cc", &["-g", "-O1"], "afl++")?;
    let seeds = dir.join("in");
    std::fs::create_dir(&seeds)?;
    std::fs::write(seeds.join("seed"), SEED)?;
    // `limits`: how long afl-fuzz runs (`-V` seconds, `-E` executions).
    let afl = |out: &str, limits: &[&str]| {
        let mut c = tokio::process::Command::new("afl-fuzz");
        c.args(["-i", "in", "-o", out])
            .args(limits)
            .arg("--")
            .arg(&bin)
            .current_dir(&dir)
            .env("AFL_NO_UI", "1")
            .env("AFL_SKIP_CPUFREQ", "1")
            .env("AFL_NO_AFFINITY", "1")
            .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1");
        c
    };
    let crashes = |out: &str| crate::feedback::saved(&dir, out, "crashes");
    let stat = |out: &str, key: &str| -> Result<u64> {
        let s = std::fs::read_to_string(dir.join(out).join("default/fuzzer_stats"))?;
        s.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().parse().ok())?
            })
            .with_context(|| format!("no {key} in fuzzer_stats"))
    };

    // Alone: the bug is silent.
    let o = run_fuzzer(afl("alone", &["-V", "3"]), Duration::from_secs(60)).await?;
    ensure!(
        o.status.success(),
        "afl-fuzz failed: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    ensure!(
        crashes("alone")?.is_empty(),
        "AFL++ found crashes without wpd"
    );

    let daemon = Daemon::start().await?;
    let result = async {
        let maps_reads = async || -> Result<u64> {
            let mut c = daemon.client().await?;
            let s = rpc_ok(
                "GetStats",
                c.get_stats(wpd_proto::v1::GetStatsRequest::default()),
            )
            .await?;
            Ok(s.symbol_maps_reads)
        };
        let p = watch_level(&daemon, &comm, true).await?;
        let reads_before = maps_reads().await?;
        // 5,000 executions (seconds on an idle machine; a loaded one takes longer, 300 s at
        // most): the first crashes come within the first thousand.
        let o = run_fuzzer(
            afl("watched", &["-E", "5000", "-V", "300"]),
            Duration::from_secs(360),
        )
        .await?;
        ensure!(
            o.status.success(),
            "afl-fuzz failed: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        let found = crashes("watched")?;
        ensure!(!found.is_empty(), "AFL++ saved no crash with the policy on");
        for (name, input) in &found {
            ensure!(name.contains(",sig:06,"), "{name}: not a crash by SIGABRT");
            let levels = levels_stored(input);
            ensure!(
                levels.iter().any(|&l| l > 100),
                "{name}: the input {input:?} stores no level over 100 ({levels:?})"
            );
        }
        // Without wpd the input does not crash the target: the corruption stays silent.
        let replay = dir.join(format!("{comm}r"));
        std::fs::copy(&bin, &replay)?;
        let mut run = std::process::Command::new(&replay)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        {
            use std::io::Write;
            let mut stdin = run.stdin.take().context("no stdin")?;
            stdin.write_all(&found[0].1)?;
        }
        let status = run.wait()?;
        ensure!(
            status.success(),
            "the saved input crashes the target without wpd: {status:?}"
        );
        let execs = stat("watched", "execs_done")?;
        let made = policy(&mut daemon.client().await?, p.id)
            .await?
            .instances_made;
        // The fork server, and at most the few children it forked before its instance
        // was armed (a policy finds a new process within moments, not inside its fork).
        ensure!(
            (1..=8).contains(&made) && execs >= 1000,
            "{made} instances for {execs} executions: the children were not covered by \
             the fork server's watchpoint"
        );
        // No per-child work: the maps of the few instances are read, not a child's.
        let reads = maps_reads().await? - reads_before;
        ensure!(
            reads <= 4 * made,
            "{reads} reads of /proc/PID/maps for {made} instances and {execs} executions"
        );
        nothing_left(&daemon, &comm, p.id).await
    }
    .await;
    daemon.finish(result)
}

/// Children forked per round of the fork-storm test.
const STORM_CHILDREN: u64 = 15_000;
/// Rounds of it: the first warms the daemon's maps and allocator, the last two must not grow it.
const STORM_ROUNDS: usize = 3;
/// Resident memory the daemon may gain over the last two rounds (30,000 children): 3 MiB, so
/// that anything the daemon kept per child, 100 bytes or more, shows.
const STORM_RSS_SLACK_KIB: u64 = 3 * 1024;

/// A fork server's children by the ten thousand, each storing the watched level once (a hit
/// per child): every hit is delivered, and each round leaves the daemon as the one before it:
/// no child listed as covered, no fd more, the same threads and perf fds, and no resident memory
/// gained beyond a bound far below what the children would leave if the daemon kept anything
/// per child. The fork server stays the policy's one instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_storm_leaves_nothing_behind() -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = TempDir::new("wpd-forkstorm")?;
    let comm = unique_comm("fzstorm");
    let bin = build_target(
        &dir,
        &comm,
        "cc",
        &["-g", "-O0", "-DFUZZ_FORK_STORM"],
        "gcc",
    )?;
    let daemon = Daemon::start().await?;
    let endpoint = daemon.endpoint();
    let out = run_wpctl(
        &[
            "--endpoint",
            endpoint.as_str(),
            "--json",
            "watch",
            "--comm",
            &comm,
            "--symbol",
            "state.level",
            "--follow-forks",
        ],
        Duration::from_secs(20),
    )
    .await?;
    ensure!(out.code == Some(0), "wpctl watch failed: {out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout)?;
    let id = v["policy"]["id"].as_u64().context("no policy id")?;
    let mut server = tokio::process::Command::new(&bin)
        .arg(STORM_CHILDREN.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the fork server")?;
    let pid = server.id().context("no pid")? as i32;
    let result = async {
        let mut client = daemon.client().await?;
        poll_until(
            Duration::from_secs(20),
            "the fork server is the policy's instance",
            async || {
                let p = policy(&mut client, id).await?;
                Ok(if p.instances.iter().any(|i| i.pid == pid) {
                    Ok(())
                } else {
                    Err(format!("instances {:?}", p.instances))
                })
            },
        )
        .await?;
        let mut stdin = server.stdin.take().context("no stdin")?;
        let mut lines =
            tokio::io::BufReader::new(server.stdout.take().context("no stdout")?).lines();
        let hits0 = rpc_ok(
            "GetStats",
            client.get_stats(wpd_proto::v1::GetStatsRequest::default()),
        )
        .await?
        .hits;
        // After each round: (fds, RSS KiB, threads, perf fds).
        let mut after = Vec::new();
        for round in 1..=STORM_ROUNDS as u64 {
            stdin.write_all(b"r").await?;
            let line = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
                .await
                .context("the round did not end within 300 s")??;
            ensure!(
                line.as_deref() == Some("done"),
                "the fork server said {line:?}"
            );
            poll_until(
                Duration::from_secs(30),
                "every child's hit delivered and no child left covered",
                async || {
                    let s = rpc_ok(
                        "GetStats",
                        client.get_stats(wpd_proto::v1::GetStatsRequest::default()),
                    )
                    .await?;
                    let l = rpc_ok(
                        "ListWatchpoints",
                        client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
                    )
                    .await?;
                    let listed: usize = l.watchpoints.iter().map(|w| w.forked_children.len()).sum();
                    let covered = s.forked_children as usize + listed;
                    Ok(
                        if s.hits - hits0 == round * STORM_CHILDREN && covered == 0 {
                            Ok(())
                        } else {
                            Err(format!(
                                "{} hits of {} children, {covered} children still covered, \
                                 {} lost by the kernel",
                                s.hits - hits0,
                                round * STORM_CHILDREN,
                                s.kernel_lost
                            ))
                        },
                    )
                },
            )
            .await?;
            let s = rpc_ok(
                "GetStats",
                client.get_stats(wpd_proto::v1::GetStatsRequest::default()),
            )
            .await?;
            after.push((
                steady_fd_count(&daemon).await?,
                daemon.rss_kib()?,
                s.threads,
                s.perf_fds,
            ));
        }
        let p = policy(&mut client, id).await?;
        ensure!(
            p.instances_made == 1,
            "{} instances made: the children were not covered by the fork server's watchpoint",
            p.instances_made
        );
        let (first, last) = (after[0], after[STORM_ROUNDS - 1]);
        ensure!(
            last.0 <= first.0 && (first.2, first.3) == (last.2, last.3),
            "fds, threads and perf fds after round 1 {first:?}, after round {STORM_ROUNDS} \
             {last:?} (fds, RSS KiB, threads, perf fds)"
        );
        ensure!(
            last.1 <= first.1 + STORM_RSS_SLACK_KIB,
            "the daemon grew by {} KiB over {} children (rounds: {after:?})",
            last.1.saturating_sub(first.1),
            (STORM_ROUNDS as u64 - 1) * STORM_CHILDREN
        );
        drop(stdin);
        let status = tokio::time::timeout(Duration::from_secs(10), server.wait())
            .await
            .context("the fork server did not exit")??;
        ensure!(status.success(), "the fork server failed: {status:?}");
        nothing_left(&daemon, &comm, id).await
    }
    .await;
    let _ = server.start_kill();
    daemon.finish(result)
}

/// The daemon's open descriptors without the ones it holds for a moment (a policy's scan of
/// `/proc`, a connection being closed): the fewest seen over a fifth of a second. A descriptor
/// kept per child would be in every sample.
async fn steady_fd_count(daemon: &Daemon) -> Result<usize> {
    let mut fewest = daemon.fd_count()?;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        fewest = fewest.min(daemon.fd_count()?);
    }
    Ok(fewest)
}

/// libFuzzer in fork mode (`-fork=1`: jobs are processes of their own, started by the
/// fuzzer with fork and exec): the policy on the target's name gives each job an instance,
/// and the first store of a level over 100 is a deadly signal that libFuzzer saves as a
/// crash artifact, then stops. Nothing is left afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libfuzzer_saves_the_input_that_breaks_the_invariant() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = TempDir::new("wpd-libfuzzer")?;
    let comm = unique_comm("fzlf");
    let bin = build_target(
        &dir,
        &comm,
        "clang-19",
        &["-g", "-O1", "-fsanitize=fuzzer", "-DFUZZ_LIBFUZZER"],
        "clang-19, libfuzzer-19-dev and libclang-rt-19-dev",
    )?;
    let corpus = dir.join("corpus");
    let artifacts = dir.join("artifacts");
    std::fs::create_dir(&corpus)?;
    std::fs::create_dir(&artifacts)?;
    std::fs::write(corpus.join("seed"), SEED)?;
    // Alone, libFuzzer saves nothing: the bug is silent.
    let mut alone = tokio::process::Command::new(&bin);
    alone
        .arg("-max_total_time=3")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(&corpus)
        .current_dir(&dir);
    let o = run_fuzzer(alone, Duration::from_secs(60)).await?;
    ensure!(
        o.status.success() && std::fs::read_dir(&artifacts)?.next().is_none(),
        "libFuzzer alone ended with {:?} or saved an artifact: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let daemon = Daemon::start().await?;
    let result = async {
        let p = watch_level(&daemon, &comm, false).await?;
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.arg("-fork=1")
            .arg("-max_total_time=300") // it stops at the crash: seconds, unless loaded
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(&corpus)
            .current_dir(&dir);
        let o = run_fuzzer(cmd, Duration::from_secs(360)).await?;
        let log = String::from_utf8_lossy(&o.stderr);
        ensure!(
            log.contains("deadly signal"),
            "libFuzzer ended without a deadly signal ({:?}): {}",
            o.status,
            &log[log.len().saturating_sub(2000)..]
        );
        let mut saved = Vec::new();
        for e in std::fs::read_dir(&artifacts)? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with("crash-") {
                saved.push(std::fs::read(e.path())?);
            }
        }
        ensure!(!saved.is_empty(), "no crash artifact: {log}");
        for input in &saved {
            ensure!(
                levels_stored(input).iter().any(|&l| l > 100),
                "the saved input {input:?} stores no level over 100"
            );
        }
        ensure!(
            policy(&mut daemon.client().await?, p.id)
                .await?
                .instances_made
                >= 1,
            "no job got an instance"
        );
        nothing_left(&daemon, &comm, p.id).await
    }
    .await;
    daemon.finish(result)
}

#[test]
fn levels_follow_the_parsers_rules() {
    assert_eq!(levels_stored(b"WPL\x10M\x01"), vec![0x10]);
    assert_eq!(levels_stored(b"WPM\x01L\xc8L"), vec![0xc8]);
    assert!(levels_stored(b"XPL\xc8").is_empty());
}
