//! Policies: one watchpoint over every process a selector matches, now and later, each
//! process getting its own instance (the name resolved in it: its addresses differ under
//! ASLR). Targets are the tests' own C programs started under names of their own (a link
//! named for this test, a private copy, a cgroup this test made), so that a selector can
//! only ever match processes these tests started.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use tonic::Code;
use wpd_proto::v1::{
    InstanceSource, ListWatchpointsRequest, ListWatchpointsResponse, Policy, ProcessSelector,
    RemoveWatchpointRequest, SetPolicyRequest, WatchpointSpec,
};
use wpd_tests::{
    Backend, CTarget, Daemon, Event, EventStream, ctarget_path, expect_status, machine_skip,
    perf_events_of, poll_until, require_backend, rpc_ok, unique_temp_dir,
};

const ARM_TIMEOUT: Duration = Duration::from_secs(10);
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A name no other process has: `wpol<pid><n>` (at most 15 bytes, the kernel's comm).
pub(crate) fn unique_comm() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let s = format!(
        "wpol{}{}",
        std::process::id() % 1_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    );
    s.chars().take(15).collect()
}

/// `ct-pie` under the command name `comm`: a copy of its own in `dir`, its library beside
/// it (`$ORIGIN`). A file of the test's own: a policy by command name holds the programs it
/// has seen at their exec (`policy_hold.rs`), and only one daemon can hold a process, so a
/// program shared with other tests' daemons would be held by whichever saw it first.
fn copied_as(dir: &Path, comm: &str) -> Result<PathBuf> {
    let copy = dir.join(comm);
    std::fs::copy(ctarget_path("ct-pie"), &copy)
        .with_context(|| format!("copying ct-pie to {}", copy.display()))?;
    std::fs::copy(ctarget_path("libctlib.so"), dir.join("libctlib.so"))
        .context("copying libctlib.so")?;
    Ok(copy)
}

fn counter_spec() -> WatchpointSpec {
    WatchpointSpec {
        symbol: "counter".into(),
        access: wpd_proto::v1::Access::Write as i32,
        backend: Backend::Perf as i32,
        ..Default::default()
    }
}

pub(crate) async fn set_policy(
    client: &mut wpd_tests::Client,
    selector: ProcessSelector,
) -> Result<Policy> {
    let r = rpc_ok(
        "SetPolicy",
        client.set_policy(SetPolicyRequest {
            selector: Some(selector),
            spec: Some(counter_spec()),
        }),
    )
    .await?;
    r.policy.context("SetPolicy returned no policy")
}

async fn list(client: &mut wpd_tests::Client) -> Result<ListWatchpointsResponse> {
    rpc_ok(
        "ListWatchpoints",
        client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
    )
    .await
}

/// Waits until policy `id` has an instance in `pid`; returns its watchpoint id.
pub(crate) async fn instance_in(client: &mut wpd_tests::Client, id: u64, pid: i32) -> Result<u64> {
    let mut c = client.clone();
    poll_until(
        ARM_TIMEOUT,
        &format!("policy {id} to arm an instance in pid {pid}"),
        async || {
            let l = list(&mut c).await?;
            let p = l.policies.iter().find(|p| p.id == id);
            Ok(
                match p.and_then(|p| p.instances.iter().find(|i| i.pid == pid)) {
                    Some(i) => Ok(i.watchpoint_id),
                    None => Err(format!("{p:?}")),
                },
            )
        },
    )
    .await
}

/// The hit of watchpoint `wp` in `pid` that `set counter V` makes.
async fn hit_of(events: &mut EventStream, target: &mut CTarget, wp: u64, value: i64) -> Result<()> {
    target.cmd(&format!("set counter {value}")).await?;
    let pid = target.pid;
    events
        .wait_for(HIT_TIMEOUT, &format!("the hit in pid {pid}"), |e| {
            Ok(match e {
                Event::Hit(h) if h.pid == pid && h.watchpoint_id == wp => {
                    ensure!(
                        h.value == value.to_le_bytes().to_vec(),
                        "hit value {:?}, expected {value}",
                        h.value
                    );
                    // The main thread makes the store: its name is the process's.
                    ensure!(
                        !h.process_name.is_empty() && h.thread_name == h.process_name,
                        "hit names process {:?}, thread {:?}",
                        h.process_name,
                        h.thread_name
                    );
                    Some(())
                }
                _ => None,
            })
        })
        .await
}

/// By command name: the matching process running now gets an instance, one started later
/// from a program not seen yet gets one within the scan interval (at once where the kernel
/// reports the exec: found by its record there, by the scan elsewhere), and a later run of a
/// program seen is held at its exec; each with its own address; a process of another name
/// gets nothing (no instance, no hit); removing the policy removes every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_by_name_covers_processes_now_and_later() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-policy")?;
    let comm = unique_comm();
    let path = copied_as(&dir, &comm)?;
    let daemon = Daemon::start().await?;
    let mut first = CTarget::start_path(&path, &comm).await?;
    let mut other = CTarget::start("ct-pie").await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        let p = set_policy(
            &mut client,
            ProcessSelector {
                comm: comm.clone(),
                ..Default::default()
            },
        )
        .await?;
        ensure!(
            p.instances.len() == 1
                && p.instances[0].pid == first.pid
                && p.instances[0].found_by() == InstanceSource::SetPolicy,
            "SetPolicy should have armed pid {} only, found as it was set: {p:?}",
            first.pid
        );
        let wp1 = p.instances[0].watchpoint_id;
        hit_of(&mut events, &mut first, wp1, 11).await?;
        // A rename is seen (the kernel's COMM record): hits after it carry the new name. On
        // the per-CPU path a hit read from another CPU's ring before the rename's record may
        // still carry the old one, so up to ten stores are made.
        ensure!(
            first.cmd("rename wpren").await? == "RENAMED",
            "rename failed"
        );
        let mut names = Vec::new();
        for v in 12..22 {
            first.cmd(&format!("set counter {v}")).await?;
            let pid = first.pid;
            let name = events
                .wait_for(HIT_TIMEOUT, "the hit after the rename", |e| {
                    Ok(match e {
                        Event::Hit(h) if h.pid == pid && h.watchpoint_id == wp1 => {
                            Some(h.thread_name.clone())
                        }
                        _ => None,
                    })
                })
                .await?;
            let done = name == "wpren";
            names.push(name);
            if done {
                break;
            }
        }
        ensure!(
            names.last().is_some_and(|n| n == "wpren"),
            "after the rename the hits name threads {names:?}"
        );

        // Started after the policy was set, from a program the policy has not seen (a copy of
        // its own, under the same name: the first process's program is held at its execs
        // from now on, below): found from the kernel's exec record where the collectors see
        // every task (the per-thread path), at once; by the /proc scan elsewhere. The scan can
        // come first only in the few milliseconds between the exec and the drain reading its
        // record, so up to three processes are started in turn: one of them at least (in
        // practice the first) must be found by its record; where the record path is broken,
        // none is.
        let copy_dir = dir.join("copy");
        std::fs::create_dir(&copy_dir)?;
        let copy = copied_as(&copy_dir, &comm)?;
        let per_thread = perf_events_of(&daemon).await?.starts_with("per-thread");
        let want = if per_thread {
            InstanceSource::KernelRecord
        } else {
            InstanceSource::Scan
        };
        let mut found = Vec::new();
        let mut armed = None;
        for _ in 0..3 {
            let t = CTarget::start_path(&copy, &comm).await?;
            let wp = instance_in(&mut client, p.id, t.pid).await?;
            let l = list(&mut client).await?;
            let inst = l.policies[0]
                .instances
                .iter()
                .find(|i| i.pid == t.pid)
                .context("the later process's instance went")?;
            eprintln!(
                "a later process was armed {:.1} ms after the daemon saw it, found by {:?}",
                inst.latency_ns as f64 / 1e6,
                inst.found_by()
            );
            found.push(inst.found_by());
            if inst.found_by() == want {
                armed = Some((t, wp));
                break;
            }
        }
        let Some((mut later, wp2)) = armed else {
            bail!("later processes were found by {found:?}, never by {want:?}");
        };
        // Both programs seen now: a later run of either is held at its exec.
        for program in [&path, &copy] {
            let t = CTarget::start_path(program, &comm).await?;
            instance_in(&mut client, p.id, t.pid).await?;
            let l = list(&mut client).await?;
            let how = l.policies[0]
                .instances
                .iter()
                .find(|i| i.pid == t.pid)
                .map(|i| i.found_by());
            ensure!(
                how == Some(InstanceSource::ExecHold),
                "a later run of {} was found by {how:?}, not held at its exec",
                program.display()
            );
        }
        ensure!(wp2 != wp1, "both processes share watchpoint {wp1}");
        hit_of(&mut events, &mut later, wp2, 22).await?;
        let l = list(&mut client).await?;
        let w2 = l.watchpoints.iter().find(|w| w.id == wp2).unwrap();
        ensure!(
            w2.policy_id == p.id,
            "instance {wp2} names policy {}, not {}",
            w2.policy_id,
            p.id
        );

        // The process of another name: not attached, no hit.
        ensure!(
            !l.processes.iter().any(|q| q.pid == other.pid),
            "pid {} ({}) was attached by a policy for {comm}",
            other.pid,
            "ct-pie"
        );
        // Its store makes no hit: the next hit of `first` comes with none of it before, nor
        // in the 300 ms after (the per-CPU path's rings are read in any order).
        other.cmd("set counter 5").await?;
        first.cmd("set counter 23").await?;
        let (first_pid, other_pid) = (first.pid, other.pid);
        let no_hit_of_other = |e: &Event| -> Result<bool> {
            match e {
                Event::Hit(h) if h.pid == other_pid => {
                    bail!("pid {other_pid}, of another name, hit: {h:?}")
                }
                Event::Hit(h) => Ok(h.pid == first_pid && h.watchpoint_id == wp1),
                _ => Ok(false),
            }
        };
        events
            .wait_for(HIT_TIMEOUT, "the hit in the first process", |e| {
                Ok(no_hit_of_other(e)?.then_some(()))
            })
            .await?;
        let quiet = tokio::time::Instant::now() + Duration::from_millis(300);
        while let Some(e) = events.next_before(quiet).await? {
            no_hit_of_other(&e)?;
        }

        let removed = rpc_ok(
            "RemoveWatchpoint(policy)",
            client.remove_watchpoint(RemoveWatchpointRequest { id: p.id }),
        )
        .await?;
        ensure!(
            removed.watchpoint.map(|w| w.id) == Some(p.id),
            "removing policy {} answered another id",
            p.id
        );
        let l = list(&mut client).await?;
        ensure!(
            l.policies.is_empty() && l.watchpoints.is_empty(),
            "left after removing the policy: {l:?}"
        );
        // Nothing of it comes back for a new process of that name.
        let third = CTarget::start_path(&path, &comm).await?;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let l = list(&mut client).await?;
        ensure!(
            !l.processes.iter().any(|q| q.pid == third.pid),
            "pid {} attached after its policy was removed",
            third.pid
        );
        for t in [&mut first, &mut later] {
            t.cmd("set counter 1").await?;
        }
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// By executable (a private copy of the program) and by several pids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_by_executable_and_by_pids() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-policy")?;
    let exe = dir.join("ct-copy");
    std::fs::copy(ctarget_path("ct-pie"), &exe)?;
    let lib = ctarget_path("ct-pie").with_file_name("libctlib.so");
    std::fs::copy(&lib, dir.join("libctlib.so"))?;
    let daemon = Daemon::start().await?;
    let mut a = CTarget::start_path(&exe, "ct-copy").await?;
    let mut b = CTarget::start("ct-pie").await?;
    let mut c = CTarget::start("ct-pie").await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        let by_exe = set_policy(
            &mut client,
            ProcessSelector {
                exe: exe.display().to_string(),
                ..Default::default()
            },
        )
        .await?;
        ensure!(
            by_exe.instances.iter().map(|i| i.pid).collect::<Vec<_>>() == vec![a.pid],
            "the policy by executable armed {:?}, expected pid {} only",
            by_exe.instances,
            a.pid
        );
        hit_of(&mut events, &mut a, by_exe.instances[0].watchpoint_id, 3).await?;
        let by_pids = set_policy(
            &mut client,
            ProcessSelector {
                pids: vec![b.pid, c.pid],
                ..Default::default()
            },
        )
        .await?;
        let mut pids: Vec<i32> = by_pids.instances.iter().map(|i| i.pid).collect();
        pids.sort_unstable();
        let mut want = vec![b.pid, c.pid];
        want.sort_unstable();
        ensure!(
            pids == want,
            "the policy by pids armed {pids:?}, expected {want:?}"
        );
        for (t, v) in [(&mut b, 4), (&mut c, 5)] {
            let wp = by_pids
                .instances
                .iter()
                .find(|i| i.pid == t.pid)
                .unwrap()
                .watchpoint_id;
            hit_of(&mut events, t, wp, v).await?;
        }
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// A cgroup v2 directory this test makes, removed on drop (its processes moved out first).
pub(crate) struct TestCgroup {
    pub(crate) dir: PathBuf,
}

impl TestCgroup {
    pub(crate) fn new(root: &Path, name: &str) -> Result<TestCgroup> {
        let dir = root.join(name);
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        Ok(TestCgroup { dir })
    }

    fn child(&self, name: &str) -> Result<TestCgroup> {
        Self::new(&self.dir, name)
    }

    pub(crate) fn add(&self, pid: i32) -> Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", self.dir.display()))
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Killed targets leave the cgroup once reaped; retry briefly.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// By cgroup: processes in the directory or below it, including one moved in after the
/// policy was set; one outside stays untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_by_cgroup_covers_the_directory_and_below() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let Some(root) = cgroup2_root() else {
        machine_skip("no cgroup v2 here");
        return Ok(());
    };
    let name = format!("wpd-test-{}", unique_comm());
    let daemon = Daemon::start().await?;
    let mut inside = CTarget::start("ct-pie").await?;
    let mut below = CTarget::start("ct-pie").await?;
    let outside = CTarget::start("ct-pie").await?;
    let result = async {
        let cg = TestCgroup::new(&root, &name)?;
        let sub = cg.child("sub")?;
        cg.add(inside.pid)?;
        let r = async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
            let p = set_policy(
                &mut client,
                ProcessSelector {
                    cgroup: format!("/{name}"),
                    ..Default::default()
                },
            )
            .await?;
            ensure!(
                p.instances.iter().map(|i| i.pid).collect::<Vec<_>>() == vec![inside.pid],
                "the policy armed {:?}, expected pid {} only",
                p.instances,
                inside.pid
            );
            hit_of(&mut events, &mut inside, p.instances[0].watchpoint_id, 7).await?;
            // Moved into a child cgroup afterwards: found by the daemon's scan.
            sub.add(below.pid)?;
            let wp = instance_in(&mut client, p.id, below.pid).await?;
            hit_of(&mut events, &mut below, wp, 8).await?;
            let l = list(&mut client).await?;
            ensure!(
                !l.processes.iter().any(|q| q.pid == outside.pid),
                "pid {} outside the cgroup was attached",
                outside.pid
            );
            // A cgroup that does not exist: refused, nothing changes.
            let before = list(&mut client).await?;
            let r = client
                .set_policy(SetPolicyRequest {
                    selector: Some(ProcessSelector {
                        cgroup: format!("/{name}/no-such"),
                        ..Default::default()
                    }),
                    spec: Some(counter_spec()),
                })
                .await;
            expect_status(
                "SetPolicy with a missing cgroup",
                r,
                Code::InvalidArgument,
                &["is not a cgroup v2 directory"],
            )?;
            let after = list(&mut client).await?;
            ensure!(
                before.policies.len() == after.policies.len(),
                "a refused policy was kept"
            );
            Ok(())
        }
        .await;
        // Out of the test's cgroups before they are removed.
        let top = root.join("cgroup.procs");
        for pid in [inside.pid, below.pid] {
            let _ = std::fs::write(&top, pid.to_string());
        }
        drop(sub);
        drop(cg);
        r
    }
    .await;
    daemon.finish(result)
}

pub(crate) fn cgroup2_root() -> Option<PathBuf> {
    let s = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    s.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2"))
            .then(|| left.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

/// Bad policies are refused with a clear error and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_policies_are_refused() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let result = async {
        let mut client = daemon.client().await?;
        let cases: Vec<(ProcessSelector, WatchpointSpec, &str)> = vec![
            (
                ProcessSelector::default(),
                counter_spec(),
                "a policy needs a selector",
            ),
            (
                ProcessSelector {
                    comm: "x".into(),
                    ..Default::default()
                },
                WatchpointSpec {
                    pid: 5,
                    ..counter_spec()
                },
                "must have pid 0",
            ),
            (
                ProcessSelector {
                    exe: "relative/path".into(),
                    ..Default::default()
                },
                counter_spec(),
                "must be an absolute path",
            ),
            (
                ProcessSelector {
                    comm: "x".into(),
                    ..Default::default()
                },
                WatchpointSpec {
                    tids: vec![4],
                    ..counter_spec()
                },
                "cannot name threads",
            ),
        ];
        for (selector, spec, want) in cases {
            let r = client
                .set_policy(SetPolicyRequest {
                    selector: Some(selector.clone()),
                    spec: Some(spec),
                })
                .await;
            expect_status(
                &format!("SetPolicy {selector:?}"),
                r,
                Code::InvalidArgument,
                &[want],
            )?;
        }
        let l = list(&mut client).await?;
        if !l.policies.is_empty() {
            bail!("refused policies were kept: {:?}", l.policies);
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// An unprivileged user's policy learns nothing about processes that user
/// could not read: a root process running the executable the policy names
/// is neither matched nor reported (no pid, name or refusal text in the
/// user's listing), while the user's own process is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_policy_learns_nothing_of_processes_it_cannot_read() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    let dir = unique_temp_dir("wpd-policy-other")?;
    let exe = dir.join("ct-shared");
    std::fs::copy(ctarget_path("ct-pie"), &exe)?;
    let lib = ctarget_path("ct-pie").with_file_name("libctlib.so");
    std::fs::copy(&lib, dir.join("libctlib.so"))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let daemon = Daemon::start_open(&[]).await?;
    let roots = CTarget::start_path(&exe, "ct-shared").await?;
    let mut mine = CTarget::start_path_as(&exe, "ct-shared", NOBODY).await?;
    let result = async {
        let ep = daemon.endpoint();
        let out = wpd_tests::run_wpctl_as(
            Some(NOBODY),
            &[
                "--endpoint",
                &ep,
                "--json",
                "watch",
                "--exe",
                &exe.display().to_string(),
                "--symbol",
                "counter",
            ],
            Duration::from_secs(20),
        )
        .await?;
        ensure!(out.code == Some(0), "{out:?}");
        let listing = poll_until(
            Duration::from_secs(20),
            "the user's own process to be covered",
            async || {
                let out = wpd_tests::run_wpctl_as(
                    Some(NOBODY),
                    &["--endpoint", &ep, "--json", "list"],
                    Duration::from_secs(20),
                )
                .await?;
                let listed = listed_pids(&out.stdout)?;
                Ok(if listed.contains(&mine.pid) {
                    Ok((listed, out.stdout))
                } else {
                    Err(out.stdout)
                })
            },
        )
        .await?;
        let (listed, listing) = listing;
        ensure!(
            !listed.contains(&roots.pid),
            "the listing names root's process {}: {listing}",
            roots.pid
        );
        ensure!(
            !listing.to_lowercase().contains("permission"),
            "the listing reports a refusal: {listing}"
        );
        // The user's process is watched: its store is a hit.
        ensure!(mine.cmd("set counter 5").await? == "SET");
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// Every process id a `wpctl --json list` names: the values of its `pid`
/// fields and of its `pids` lists, wherever they are. Matching the pid's
/// digits in the text would also find them inside a timestamp.
fn listed_pids(listing: &str) -> Result<Vec<i32>> {
    fn walk(v: &serde_json::Value, out: &mut Vec<i32>) {
        match v {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    match (k.as_str(), v) {
                        ("pid", serde_json::Value::Number(n)) => {
                            out.extend(n.as_i64().map(|n| n as i32))
                        }
                        ("pids", serde_json::Value::Array(a)) => {
                            out.extend(a.iter().filter_map(|n| n.as_i64()).map(|n| n as i32))
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let v: serde_json::Value = serde_json::from_str(listing)
        .with_context(|| format!("the listing is not JSON: {listing}"))?;
    let mut out = Vec::new();
    walk(&v, &mut out);
    Ok(out)
}

/// By executable, every process of a short program is held at its exec
/// and armed before its first instruction: ten runs of a program that
/// stores `counter` three times at the top of `main` and exits (found a
/// few milliseconds after the exec, as by the kernel's records or the
/// scan, none of these stores would be seen): 10 of 10 processes, 30 of
/// 30 hits, each process's values 1, 2, 3 in order where the trap reads
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_by_executable_covers_a_process_from_its_first_instruction() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-quick")?;
    let exe = dir.join("quick");
    std::fs::copy(ctarget_path("ct-quick"), &exe)?;
    let daemon = Daemon::start().await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        set_policy(
            &mut client,
            ProcessSelector {
                exe: exe.display().to_string(),
                ..Default::default()
            },
        )
        .await?;
        let mut pids = Vec::new();
        for _ in 0..10 {
            let mut child = std::process::Command::new(&exe).spawn()?;
            pids.push(child.id() as i32);
            let st = child.wait()?;
            ensure!(st.success(), "the program failed: {st:?}");
        }
        // Values as the trap read them on the per-thread path; the per-CPU
        // path reads them after the fact, from a process gone by then.
        let at_trap = perf_events_of(&daemon).await?.starts_with("per-thread");
        let mut values: std::collections::HashMap<i32, Vec<Option<i64>>> = Default::default();
        let mut n = 0;
        let r = events
            .wait_for(HIT_TIMEOUT, "30 hits, 3 in each of the 10 processes", |e| {
                if let Event::Hit(h) = e
                    && pids.contains(&h.pid)
                {
                    // The value as the trap left it; none where the path
                    // reads it after the fact (per-CPU), from a process
                    // gone by then.
                    let v = <[u8; 8]>::try_from(h.value.as_slice()).map(i64::from_le_bytes);
                    values.entry(h.pid).or_default().push(v.ok());
                    n += 1;
                }
                Ok((n == 30).then_some(()))
            })
            .await;
        for pid in &pids {
            let got = values.get(pid).cloned().unwrap_or_default();
            ensure!(
                got.len() == 3 && (!at_trap || got[..] == [Some(1), Some(2), Some(3)]),
                "process {pid}: stores seen {got:?}, expected [1, 2, 3] ({} of 10 processes \
                 with a hit)",
                values.len()
            );
        }
        r
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}
