//! Policies hold their new processes at exec, before their first
//! instruction, until armed (`daemon/src/engine/policy_hold.rs`): by
//! command name and by cgroup from a program's second run, a storm of
//! 1,000 short processes every one covered and none left stopped, and a
//! daemon killed mid-storm that takes no process with it.
//!
//! The program is `ct-quick` (tests/c/quick.c): three stores of
//! `counter` at the top of `main`, then exit (with an argument N, it lives
//! N ms more). A process found after its exec (the kernel's records, the
//! scan) is armed milliseconds late: none of those stores would be seen.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use wpd_proto::v1::{GetCapabilitiesRequest, GetStatsRequest, ProcessSelector};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, ctarget_path, machine_skip, perf_events_of,
    require_backend, unique_temp_dir,
};

use crate::policies::{TestCgroup, cgroup2_root, instance_in, set_policy, unique_comm};

const HIT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one short process may take to end (held, armed, run) before
/// it is called stuck.
const RUN_BOUND: Duration = Duration::from_secs(10);

/// A private copy of `ct-quick` named `name`, in a directory removed on
/// drop.
struct Quick {
    dir: PathBuf,
    exe: PathBuf,
}

impl Quick {
    fn new(name: &str) -> Result<Quick> {
        let dir = unique_temp_dir("wpd-held")?;
        let exe = dir.join(name);
        std::fs::copy(ctarget_path("ct-quick"), &exe)
            .with_context(|| format!("copying ct-quick to {}", exe.display()))?;
        Ok(Quick { dir, exe })
    }
}

impl Drop for Quick {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A policy's selector naming the program at `exe`.
fn by_exe(exe: &Path) -> ProcessSelector {
    ProcessSelector {
        exe: exe.display().to_string(),
        ..Default::default()
    }
}

/// Runs `sh -c "{prefix}exec EXE {arg}"` (the shell's pid becomes the
/// program's) and waits for its end, at most [`RUN_BOUND`]: a process
/// still there then is reported with its state (`t`: left stopped) and
/// killed.
fn run(prefix: &str, exe: &Path, arg: &str) -> Result<i32> {
    let script = format!("{prefix}exec '{}' {arg}", exe.display());
    let child = Command::new("/bin/sh").arg("-c").arg(&script).spawn()?;
    let pid = child.id() as i32;
    wait_bounded(child).with_context(|| format!("`{script}` (pid {pid})"))?;
    Ok(pid)
}

/// Waits for `child` at most [`RUN_BOUND`]; fails unless it exited 0.
fn wait_bounded(mut child: Child) -> Result<()> {
    let pid = child.id();
    let until = Instant::now() + RUN_BOUND;
    loop {
        if let Some(st) = child.try_wait()? {
            ensure!(st.success(), "it ended with {st:?}");
            return Ok(());
        }
        if Instant::now() >= until {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let tracer = status.lines().find(|l| l.starts_with("TracerPid:"));
            let _ = child.kill();
            let _ = child.wait();
            bail!("not ended after {RUN_BOUND:?}: stat {stat:?}, {tracer:?}");
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Collects the hits of `pids` until each has 3; fails naming those
/// short of it. Each process's values must be 1, 2, 3 where the trap
/// reads them (`daemon`'s per-thread path; the per-CPU path reads them
/// after the fact, from a process gone by then or storing on).
async fn three_hits_each(daemon: &Daemon, events: &mut EventStream, pids: &[i32]) -> Result<()> {
    let at_trap = perf_events_of(daemon).await?.starts_with("per-thread");
    let mut values: HashMap<i32, Vec<Option<i64>>> = HashMap::new();
    let want = pids.len() * 3;
    let mut n = 0;
    // The other events, for a failure's message: what became of a process short of hits.
    let mut others = Vec::new();
    let r = events
        .wait_for(
            HIT_TIMEOUT,
            &format!("{want} hits, 3 in each process"),
            |e| {
                if let Event::Hit(h) = e {
                    if pids.contains(&h.pid) {
                        let v = <[u8; 8]>::try_from(h.value.as_slice()).map(i64::from_le_bytes);
                        values.entry(h.pid).or_default().push(v.ok());
                        n += 1;
                    }
                } else {
                    others.push(format!("{e:?}"));
                }
                Ok((n == want).then_some(()))
            },
        )
        .await;
    let short: Vec<(i32, usize)> = pids
        .iter()
        .map(|p| (*p, values.get(p).map_or(0, Vec::len)))
        .filter(|(_, n)| *n != 3)
        .collect();
    if !short.is_empty() {
        let s = daemon
            .client()
            .await?
            .get_stats(GetStatsRequest {})
            .await?
            .into_inner();
        let (p, _) = short[0];
        let of_first: Vec<&String> = others
            .iter()
            .filter(|e| e.contains(&format!("pid: {p},")) || e.contains(&format!("pid: {p} ")))
            .collect();
        bail!(
            "{} of {} processes without their 3 stores seen (pid, stores): {:?}; exec holds: {} \
             held, {} past the bound; the events of {p}: {of_first:?}; the wait: {}",
            short.len(),
            pids.len(),
            &short[..short.len().min(20)],
            s.exec_holds,
            s.exec_holds_past_bound,
            r.as_ref()
                .map_or_else(|e| format!("{e:#}"), |()| "ended".into())
        );
    }
    for (pid, got) in values.iter().filter(|_| at_trap) {
        ensure!(
            got[..] == [Some(1), Some(2), Some(3)],
            "process {pid}: values {got:?}, expected 1, 2, 3"
        );
    }
    r
}

/// A policy by command name or cgroup learns its program from a first
/// process found after its exec (alive long enough to be found), and holds
/// every later run of it at its exec: 10 of 10 short processes, 30 of 30
/// stores at the top of `main`. A run of the same file that the policy
/// does not match (another name, or outside the cgroup) is held and let
/// go, unarmed, and ends normally.
async fn held_from_the_second_run(
    daemon: &Daemon,
    selector: ProcessSelector,
    exe: &Path,
    matching: &str,
    other: (&str, &Path),
) -> Result<()> {
    let mut client = daemon.client().await?;
    let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
    let policy = set_policy(&mut client, selector).await?;
    // The first run lives 3 s after its stores: found after its exec.
    let first = {
        let script = format!("{matching}exec '{}' 3000", exe.display());
        let child = Command::new("/bin/sh").arg("-c").arg(&script).spawn()?;
        let pid = child.id() as i32;
        instance_in(&mut client, policy.id, pid).await?;
        wait_bounded(child)?;
        pid
    };
    let (other_prefix, other_exe) = other;
    let unmatched = run(other_prefix, other_exe, "")?;
    let mut pids = Vec::new();
    for _ in 0..10 {
        pids.push(run(matching, exe, "")?);
    }
    three_hits_each(daemon, &mut events, &pids).await?;
    // Nothing of the run the policy does not match.
    let l = client
        .list_watchpoints(wpd_proto::v1::ListWatchpointsRequest { pid: 0 })
        .await?
        .into_inner();
    let p = l
        .policies
        .iter()
        .find(|p| p.id == policy.id)
        .context("the policy is gone")?;
    ensure!(
        !p.instances.iter().any(|i| i.pid == unmatched),
        "the run the policy does not match (pid {unmatched}) was armed: {:?}",
        p.instances
    );
    ensure!(first != unmatched, "pids reused");
    Ok(())
}

/// By command name: the second and later runs of a program are held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_by_command_name_covers_a_programs_later_runs_from_their_first_instruction()
-> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let comm = unique_comm();
    let q = Quick::new(&comm)?;
    // The same file under another name: another command.
    let alias = q.dir.join("other-name");
    std::os::unix::fs::symlink(&q.exe, &alias)?;
    let daemon = Daemon::start().await?;
    let result = held_from_the_second_run(
        &daemon,
        ProcessSelector {
            comm: comm.clone(),
            ..Default::default()
        },
        &q.exe,
        "",
        ("", &alias),
    )
    .await;
    daemon.finish(result)
}

/// By cgroup: the program's runs in the cgroup are held; a run of it
/// outside is let go unarmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_by_cgroup_covers_a_programs_later_runs_from_their_first_instruction() -> Result<()>
{
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let Some(root) = cgroup2_root() else {
        machine_skip("no cgroup v2 here");
        return Ok(());
    };
    let name = format!("wpd-held-{}", unique_comm());
    let q = Quick::new("quick")?;
    let daemon = Daemon::start().await?;
    let result = async {
        let cg = TestCgroup::new(&root, &name)?;
        let into = format!("echo $$ > '{}'; ", cg.dir.join("cgroup.procs").display());
        held_from_the_second_run(
            &daemon,
            ProcessSelector {
                cgroup: format!("/{name}"),
                ..Default::default()
            },
            &q.exe,
            &into,
            ("", &q.exe),
        )
        .await
    }
    .await;
    daemon.finish(result)
}

/// Runs `n` processes of `exe` from `spawners` threads at once; returns
/// their pids, or the first failure (a process that failed, or was not
/// ended within [`RUN_BOUND`]: left stopped). `ran` counts the ended.
fn storm(exe: &Path, n: usize, spawners: usize, ran: Arc<AtomicUsize>) -> Result<Vec<i32>> {
    let threads: Vec<_> = (0..spawners)
        .map(|k| {
            let exe = exe.to_path_buf();
            let ran = ran.clone();
            std::thread::spawn(move || -> Result<Vec<i32>> {
                let mut pids = Vec::new();
                for _ in (k..n).step_by(spawners) {
                    let child = Command::new(&exe).spawn()?;
                    pids.push(child.id() as i32);
                    wait_bounded(child).with_context(|| format!("pid {}", pids.last().unwrap()))?;
                    ran.fetch_add(1, Ordering::Relaxed);
                }
                Ok(pids)
            })
        })
        .collect();
    let mut pids = Vec::new();
    for t in threads {
        pids.extend(
            t.join()
                .map_err(|_| anyhow::anyhow!("a spawner panicked"))??,
        );
    }
    Ok(pids)
}

/// A fork-and-exec storm of 1,000 short processes under one policy by
/// executable, from 4 spawners at once: every process ends normally, none
/// is left stopped, and each one's 3 stores at the top of `main` are seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_a_thousand_short_processes_is_covered_and_none_left_stopped() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let q = Quick::new("quick")?;
    let daemon = Daemon::start().await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        set_policy(&mut client, by_exe(&q.exe)).await?;
        let exe = q.exe.clone();
        let pids = tokio::task::spawn_blocking(move || {
            storm(&exe, 1000, 4, Arc::new(AtomicUsize::new(0)))
        })
        .await??;
        three_hits_each(&daemon, &mut events, &pids).await?;
        // Each was held, none past the bound; one program marked.
        let s = client.get_stats(GetStatsRequest {}).await?.into_inner();
        ensure!(
            (s.exec_hold_files, s.exec_holds, s.exec_holds_past_bound) == (1, 1000, 0),
            "exec holds: {} files, {} held, {} past the bound; expected 1, 1000, 0",
            s.exec_hold_files,
            s.exec_holds,
            s.exec_holds_past_bound
        );
        // What the capabilities say of each backend.
        let caps = client
            .get_capabilities(GetCapabilitiesRequest {})
            .await?
            .into_inner();
        for b in &caps.backends {
            let (kind, want) = if b.backend == Backend::Perf as i32 {
                ("perf", "held at exec, before their first instruction")
            } else {
                ("ptrace", "found after their exec")
            };
            ensure!(
                b.new_processes.starts_with(want),
                "{kind}: new_processes {:?}, expected it to start with {want:?}",
                b.new_processes
            );
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// The daemon SIGKILLed at a random moment of a storm, in 5 rounds: every
/// process of the storm (held at its exec, being armed, or running) ends
/// normally, none left stopped or traced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_storm_leaves_every_process_running() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let q = Quick::new("quick")?;
    for round in 0..5 {
        let mut daemon = Daemon::start().await?;
        let mut client = daemon.client().await?;
        set_policy(&mut client, by_exe(&q.exe)).await?;
        let ran = Arc::new(AtomicUsize::new(0));
        let exe = q.exe.clone();
        let r = ran.clone();
        let storm = tokio::task::spawn_blocking(move || storm(&exe, 300, 3, r));
        // A moment between the 20th and the 220th process.
        let at = 20 + (std::process::id() as usize * 7 + round * 53 + nanos()) % 200;
        while ran.load(Ordering::Relaxed) < at && !storm.is_finished() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        daemon.kill().await?;
        let pids = storm
            .await?
            .with_context(|| format!("round {round}: the daemon killed after {at} processes"))?;
        ensure!(
            pids.len() == 300,
            "round {round}: {} processes ran",
            pids.len()
        );
    }
    Ok(())
}

/// A few varying bits (a round's moment).
fn nanos() -> usize {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize)
}
