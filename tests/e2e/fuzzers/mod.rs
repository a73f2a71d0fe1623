//! Fuzzers: a hit becomes a crash the fuzzer saves (the SIGNAL action), judged at the trap,
//! and fork servers stay fork servers (their children are covered by the server's
//! watchpoint, not attached one by one). Real AFL++ and libFuzzer from Debian's packages run
//! `tests/c/fuzzparse.c`, a parser whose bug is a silent store of an out-of-range value.
//! The signal action itself, on the test target, is in `signal_action.rs`.

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
const FUZZPARSE: &str = include_str!("../../c/fuzzparse.c");
/// The seed: a valid input with an in-range level (16): the fuzzers must mutate it.
const SEED: &[u8] = b"WPL\x10M\x01";

mod signal_action;

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
