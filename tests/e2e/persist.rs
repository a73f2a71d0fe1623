//! Watchpoints and policies kept in the state directory: set again after a
//! SIGKILL (a policy also covering processes started after the restart), a
//! watchpoint whose process is gone reported (listed and published), a
//! SIGTERM that removes everything from the targets but keeps the saved
//! state, a removed policy that does not come back, and a forged saved
//! state whose claimed rights are not trusted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::stream_events_response::Event as E;
use wpd_proto::v1::*;
use wpd_tests::{
    Backend, CTarget, Client, Daemon, ctarget_path, poll_until, require_root_perf, rpc_ok,
    unique_temp_dir,
};

const WAIT: Duration = Duration::from_secs(15);

fn counter_spec(pid: i32) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: "counter".into(),
        access: Access::Write as i32,
        backend: Backend::Perf as i32,
        ..Default::default()
    }
}

/// `ct-pie` started under the command name `comm` (a link in `dir`).
async fn start_as(dir: &Path, comm: &str) -> Result<CTarget> {
    let link: PathBuf = dir.join(comm);
    if !link.exists() {
        std::os::unix::fs::symlink(ctarget_path("ct-pie"), &link)?;
    }
    CTarget::start_path(&link, comm).await
}

async fn list(c: &mut Client) -> Result<ListWatchpointsResponse> {
    rpc_ok(
        "ListWatchpoints",
        c.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
    )
    .await
}

async fn watch(c: &mut Client, pid: i32) -> Result<u64> {
    Ok(rpc_ok(
        "SetWatchpoint",
        c.set_watchpoint(SetWatchpointRequest {
            spec: Some(counter_spec(pid)),
        }),
    )
    .await?
    .watchpoint
    .context("no watchpoint")?
    .id)
}

async fn policy(c: &mut Client, comm: &str) -> Result<u64> {
    Ok(rpc_ok(
        "SetPolicy",
        c.set_policy(SetPolicyRequest {
            selector: Some(ProcessSelector {
                comm: comm.into(),
                ..Default::default()
            }),
            spec: Some(counter_spec(0)),
        }),
    )
    .await?
    .policy
    .context("no policy")?
    .id)
}

/// Waits until a watchpoint on `pid` is listed; returns its id.
async fn watched(c: &mut Client, pid: i32) -> Result<u64> {
    poll_until(WAIT, &format!("a watchpoint on {pid}"), async || {
        let l = list(c).await?;
        Ok(
            match l
                .watchpoints
                .iter()
                .find(|w| w.spec.as_ref().is_some_and(|s| s.pid == pid))
            {
                Some(w) => Ok(w.id),
                None => Err(format!("{} watchpoints", l.watchpoints.len())),
            },
        )
    })
    .await
}

/// Stores into the target's `counter` until a hit of `pid` arrives on
/// `events`.
async fn hits(c: &mut Client, t: &mut CTarget, v: i64) -> Result<()> {
    let mut s = rpc_ok(
        "StreamEvents",
        c.stream_events(StreamEventsRequest {
            pid: t.pid,
            hits_only: true,
            raw: true,
            ..Default::default()
        }),
    )
    .await?;
    t.cmd(&format!("set counter {v}")).await?;
    let m = tokio::time::timeout(WAIT, s.message())
        .await
        .context("no hit")??
        .context("stream ended")?;
    ensure!(
        matches!(&m.event, Some(E::Hit(h)) if h.pid == t.pid),
        "{m:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_everything_is_set_again_or_reported() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-persist")?;
    let comm = format!("wpers{}", std::process::id() % 1_000_000);
    let mut first = Daemon::start().await?;
    let mut a = CTarget::start("ct-pie").await?;
    let mut gone = CTarget::start("ct-pie").await?;
    let mut early = start_as(&dir, &comm).await?;
    let result = async {
        let mut c = first.client().await?;
        let a_id = watch(&mut c, a.pid).await?;
        let gone_id = watch(&mut c, gone.pid).await?;
        let pol = policy(&mut c, &comm).await?;
        watched(&mut c, early.pid).await?;
        first.kill().await?;
        // Its process ends while no daemon runs.
        gone.cmd("quit").await?;
        let gone_pid = gone.pid;
        drop(gone);

        let second = Daemon::restart_from(&first, &[]).await?;
        let result = async {
            let mut c = second.client().await?;
            // The watchpoint (under its id) and the policy's instance, set
            // again.
            ensure!(watched(&mut c, a.pid).await? == a_id, "a new id for {a_id}");
            watched(&mut c, early.pid).await?;
            hits(&mut c, &mut a, 11).await?;
            hits(&mut c, &mut early, 12).await?;
            let l = list(&mut c).await?;
            ensure!(
                l.policies.len() == 1
                    && l.policies[0]
                        .selector
                        .as_ref()
                        .is_some_and(|s| s.comm == comm),
                "{:?}",
                l.policies
            );
            ensure!(
                l.policies[0].id == pol,
                "policy {pol} came back as {}",
                l.policies[0].id
            );
            // Nothing new reuses an id of the last run.
            let fresh = watch(&mut c, early.pid).await;
            ensure!(
                fresh.is_err() || fresh.as_ref().is_ok_and(|&id| id > pol),
                "{fresh:?}"
            );
            // The one whose process is gone: listed, and published.
            ensure!(l.not_restored.len() == 1, "{:?}", l.not_restored);
            let n = &l.not_restored[0];
            ensure!(
                n.saved_id == gone_id
                    && n.spec.as_ref().is_some_and(|s| s.pid == gone_pid)
                    && n.reason.contains("gone"),
                "{n:?}"
            );
            let mut replay = rpc_ok(
                "StreamEvents(after 0)",
                c.stream_events(StreamEventsRequest {
                    after_seq: Some(0),
                    ..Default::default()
                }),
            )
            .await?;
            let removed = poll_until(WAIT, "the removal event", async || {
                let m = tokio::time::timeout(WAIT, replay.message())
                    .await
                    .context("nothing replayed")??
                    .context("stream ended")?;
                Ok(match m.event {
                    Some(E::WatchpointRemoved(r)) if r.watchpoint_id == gone_id => Ok(r),
                    other => Err(format!("{other:?}")),
                })
            })
            .await?;
            ensure!(
                removed.pid == gone_pid && removed.reason.contains("not set again"),
                "{removed:?}"
            );
            // A process started after the restart is covered by the policy.
            let mut late = start_as(&dir, &comm).await?;
            watched(&mut c, late.pid).await?;
            hits(&mut c, &mut late, 13).await?;
            Ok(())
        }
        .await;
        second.finish(result)
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    first.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_keeps_the_saved_state_and_a_removed_policy_stays_removed() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-persist")?;
    let comm = format!("wperT{}", std::process::id() % 1_000_000);
    let mut first = Daemon::start().await?;
    let mut t = start_as(&dir, &comm).await?;
    let result = async {
        let mut c = first.client().await?;
        policy(&mut c, &comm).await?;
        watched(&mut c, t.pid).await?;
        let st = first.terminate(Duration::from_secs(10)).await?;
        ensure!(st.success(), "wpd exited {st:?}");
        ensure!(
            first.state_dir().join("watchpoints.pb").exists(),
            "the saved state is gone"
        );

        let mut second = Daemon::restart_from(&first, &[]).await?;
        let mut c = second.client().await?;
        let id = watched(&mut c, t.pid).await?;
        hits(&mut c, &mut t, 21).await?;
        let pol = list(&mut c).await?.policies[0].id;
        rpc_ok(
            "RemoveWatchpoint(policy)",
            c.remove_watchpoint(RemoveWatchpointRequest { id: pol }),
        )
        .await?;
        ensure!(id != pol, "instance and policy are different ids");
        second.kill().await?;

        let third = Daemon::restart_from(&second, &[]).await?;
        let mut c = third.client().await?;
        // Give a restore the time it would take, then nothing must be there.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let l = list(&mut c).await?;
        ensure!(
            l.policies.is_empty() && l.watchpoints.is_empty() && l.not_restored.is_empty(),
            "{l:?}"
        );
        drop(third);
        drop(second);
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    first.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_never_share_a_state_directory() -> Result<()> {
    let first = Daemon::start().await?;
    let result = async {
        let dir = unique_temp_dir("wpd-persist-second")?;
        let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
            .arg("--listen")
            .arg(format!("unix:{}", dir.join("wpd.sock").display()))
            .env("WPD_STATE_FILE", dir.join("ptrace-armed"))
            .env("WPD_STATE_DIR", first.state_dir())
            .kill_on_drop(true)
            .output()
            .await?;
        let _ = std::fs::remove_dir_all(&dir);
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success()
                && err.contains(&format!("another wpd (pid {})", first.pid()))
                && err.contains("--state-dir"),
            "{out:?}"
        );
        // The first one is untouched.
        let mut c = first.client().await?;
        list(&mut c).await?;
        Ok(())
    }
    .await;
    first.finish(result)
}

/// A second daemon on the socket or the ptrace state file of a running one
/// is refused before it reads, cleans up or removes anything of the first
/// one's: the state file listing the first daemon's ptrace attachments is
/// still there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_is_refused_before_touching_the_first_ones_files() -> Result<()> {
    let first = Daemon::start().await?;
    let result = async {
        let state_file = first.state_file().to_path_buf();
        // As a daemon with an attachment would have it (a pid that does not
        // exist: recovery would only remove the file).
        std::fs::write(&state_file, "pid 2147483000 start 0\n")?;
        let run = |socket: std::path::PathBuf| {
            let state_file = state_file.clone();
            async move {
                let dir = unique_temp_dir("wpd-second")?;
                let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
                    .arg("--listen")
                    .arg(format!("unix:{}", socket.display()))
                    .arg("--state-dir")
                    .arg(dir.join("state"))
                    .env("WPD_STATE_FILE", &state_file)
                    .kill_on_drop(true)
                    .output()
                    .await?;
                let _ = std::fs::remove_dir_all(&dir);
                anyhow::Ok(out)
            }
        };
        // Same socket.
        let out = run(first.socket_path().to_path_buf()).await?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("another daemon is already listening"),
            "{out:?}"
        );
        ensure!(
            state_file.exists(),
            "the second daemon removed the first one's state file"
        );
        // Another socket, the same ptrace state file.
        let other = unique_temp_dir("wpd-second-sock")?;
        let out = run(other.join("wpd.sock")).await?;
        let _ = std::fs::remove_dir_all(&other);
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success()
                && err.contains(&format!("another wpd (pid {})", first.pid()))
                && err.contains("ptrace state file"),
            "{out:?}"
        );
        ensure!(
            state_file.exists(),
            "the second daemon removed the first one's state file"
        );
        // The first one still answers on its socket.
        let mut c = first.client().await?;
        list(&mut c).await?;
        Ok(())
    }
    .await;
    first.finish(result)
}

/// The inode of a user namespace made with `unshare -U` and let die: a
/// number that names no namespace now (and may name another later).
fn dead_user_namespace() -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut child = std::process::Command::new("unshare")
        .args(["-U", "sleep", "60"])
        .spawn()
        .context("unshare -U")?;
    let path = format!("/proc/{}/ns/user", child.id());
    // The child is in its namespace once its exec of sleep is done.
    let own = std::fs::metadata("/proc/self/ns/user")?.ino();
    let mut ino = own;
    for _ in 0..500 {
        ino = std::fs::metadata(&path).map(|m| m.ino()).unwrap_or(own);
        if ino != own {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    ensure!(ino != own, "unshare -U made no namespace");
    Ok(ino)
}

/// A saved policy on processes named `comm`, set by `caller`.
fn forged_policy(id: u64, comm: &str, caller: SavedCaller) -> SavedEntry {
    SavedEntry {
        id,
        caller: Some(caller),
        set_at_ns: 1,
        what: Some(saved_entry::What::Policy(SavedPolicy {
            selector: Some(ProcessSelector {
                comm: comm.into(),
                ..Default::default()
            }),
            spec: Some(counter_spec(0)),
        })),
    }
}

/// Waits until policy `id` covers `pid` (Ok(true)) or refused it
/// (Ok(false)).
async fn covered(c: &mut Client, id: u64, pid: i32) -> Result<bool> {
    poll_until(WAIT, &format!("policy {id} to judge {pid}"), async || {
        let l = list(c).await?;
        let p = l.policies.iter().find(|p| p.id == id);
        Ok(match p {
            Some(p) if p.instances.iter().any(|i| i.pid == pid) => Ok(true),
            Some(p) if p.refusals.iter().any(|r| r.pid == pid) => Ok(false),
            Some(p) => Err(format!("{p:?}")),
            None => Err(format!("no policy {id}: {:?}", l.policies)),
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rights_read_back_are_not_trusted_after_a_restart() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-forged")?;
    let state = dir.join("state");
    let tag = std::process::id() % 100_000;
    let (root_comm, forged_comm, ns_comm) = (
        format!("wroot{tag}"),
        format!("wforg{tag}"),
        format!("wnsid{tag}"),
    );
    let dead_ns = dead_user_namespace()?;
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    const INIT_USERNS: u64 = 0xEFFF_FFFD;
    let root = SavedCaller {
        uid: 0,
        gid: 0,
        cap_prm: u64::MAX,
        cap_eff: u64::MAX,
        userns: INIT_USERNS,
        privileged: true,
        ..Default::default()
    };
    let saved = SavedState {
        boot_id: boot_id.trim().into(),
        entries: vec![
            // Root of the initial namespace: provable, set again as it was.
            forged_policy(5, &root_comm, root),
            // A forged claim: uid 4242 "privileged" with every capability.
            forged_policy(
                6,
                &forged_comm,
                SavedCaller {
                    uid: 4242,
                    gid: 4242,
                    ..root
                },
            ),
            // Root of a namespace that is gone: its capabilities meant
            // something only there.
            forged_policy(
                7,
                &ns_comm,
                SavedCaller {
                    userns: dead_ns,
                    privileged: false,
                    ..root
                },
            ),
            // Set from a pid namespace nested in the daemon's: it covered
            // that namespace only, which a restart cannot tell from another.
            forged_policy(
                8,
                &root_comm,
                SavedCaller {
                    pid_namespace_level: 1,
                    ..root
                },
            ),
            // Ids no daemon gives.
            forged_policy(0, &root_comm, root),
            forged_policy(u64::MAX, &root_comm, root),
        ],
        written_at_ns: 1,
        next_id: u64::MAX,
    };
    std::fs::create_dir_all(&state)?;
    std::fs::write(
        state.join("watchpoints.pb"),
        prost::Message::encode_to_vec(&saved),
    )?;
    let daemon = Daemon::start_with_state_dir(&state, &[]).await?;
    let result = async {
        let mut c = daemon.client().await?;
        // Root processes under each name: only root's policy may watch one.
        let forged_t = start_as(&dir, &forged_comm).await?;
        let ns_t = start_as(&dir, &ns_comm).await?;
        let mut root_t = start_as(&dir, &root_comm).await?;
        ensure!(covered(&mut c, 5, root_t.pid).await?, "root's policy");
        hits(&mut c, &mut root_t, 3).await?;
        // The others are restored as the plain users they can be proven to
        // be: a root process is not theirs, so they neither cover it nor
        // hear of it (an unprivileged caller learns nothing of processes
        // it could not read). The policy thread has looked at every process
        // once root's was covered; a full /proc pass follows each second.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let l = list(&mut c).await?;
        for (id, t, who) in [
            (6, &forged_t, "a forged privileged uid 4242"),
            (7, &ns_t, "root of a dead namespace"),
        ] {
            let p = l
                .policies
                .iter()
                .find(|p| p.id == id)
                .with_context(|| format!("policy {id} not restored: {:?}", l.policies))?;
            ensure!(
                !p.instances.iter().any(|i| i.pid == t.pid),
                "{who} watches a root process: {p:?}"
            );
        }
        let l = list(&mut c).await?;
        let mut bad: Vec<u64> = l.not_restored.iter().map(|n| n.saved_id).collect();
        bad.sort_unstable();
        ensure!(bad == vec![0, 8, u64::MAX], "{:?}", l.not_restored);
        ensure!(
            l.not_restored.iter().all(|n| if n.saved_id == 8 {
                n.reason.contains("pid namespace nested in the daemon's")
            } else {
                n.reason.contains("out of range")
            }),
            "{:?}",
            l.not_restored
        );
        // The next id goes on after the valid ones (the saved next id was
        // out of range), and nothing overflows.
        let fresh = watch(&mut c, root_t.pid).await?;
        ensure!(fresh > 8 && fresh < 100, "next id {fresh}");
        Ok(())
    }
    .await;
    let result = daemon.finish(result);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_policies_come_back_and_watchpoints_do_not() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-reboot")?;
    let state = dir.join("state");
    let comm = format!("wboot{}", std::process::id() % 100_000);
    let mut live = CTarget::start("ct-pie").await?;
    let root = SavedCaller {
        uid: 0,
        gid: 0,
        cap_prm: u64::MAX,
        cap_eff: u64::MAX,
        userns: 0xEFFF_FFFD,
        privileged: true,
        ..Default::default()
    };
    let start_time = {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", live.pid))?;
        let rest = stat.rsplit_once(')').context("stat")?.1;
        rest.split_whitespace()
            .nth(19)
            .context("starttime")?
            .parse()?
    };
    // Saved in another boot (the boot id differs), for a pid that is alive
    // now with the same start time: after a reboot that says nothing.
    let saved = SavedState {
        boot_id: "00000000-0000-0000-0000-000000000000".into(),
        entries: vec![
            forged_policy(3, &comm, root),
            SavedEntry {
                id: 4,
                caller: Some(root),
                set_at_ns: 1,
                what: Some(saved_entry::What::Watchpoint(SavedWatchpoint {
                    spec: Some(counter_spec(live.pid)),
                    start_time,
                })),
            },
        ],
        written_at_ns: 1,
        next_id: 5,
    };
    std::fs::create_dir_all(&state)?;
    std::fs::write(
        state.join("watchpoints.pb"),
        prost::Message::encode_to_vec(&saved),
    )?;
    let daemon = Daemon::start_with_state_dir(&state, &[]).await?;
    let result = async {
        let mut c = daemon.client().await?;
        let mut t = start_as(&dir, &comm).await?;
        ensure!(
            covered(&mut c, 3, t.pid).await?,
            "root's policy after a reboot"
        );
        hits(&mut c, &mut t, 5).await?;
        let l = poll_until(WAIT, "the watchpoint reported", async || {
            let l = list(&mut c).await?;
            Ok(if l.not_restored.is_empty() {
                Err("nothing listed yet".to_string())
            } else {
                Ok(l)
            })
        })
        .await?;
        ensure!(
            l.not_restored.len() == 1
                && l.not_restored[0].saved_id == 4
                && l.not_restored[0].reason.contains("restarted"),
            "{:?}",
            l.not_restored
        );
        ensure!(
            !l.watchpoints
                .iter()
                .any(|w| w.spec.as_ref().is_some_and(|s| s.pid == live.pid)),
            "the watchpoint of another boot was set again"
        );
        live.cmd("set counter 1").await?;
        Ok(())
    }
    .await;
    let result = daemon.finish(result);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The state directory is private whatever the umask (the daemon is started with umask 022
/// here, as `sudo` gives one): every directory 0700, every file 0600 once it has journaled
/// events and saved a watchpoint; a directory others may write to, or another user's, is
/// refused at start with what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_directory_is_private_and_others_are_refused() -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !require_root_perf() {
        return Ok(());
    }
    // SAFETY: umask only changes this process's file-creation mask; the
    // daemon inherits it.
    let old = unsafe { libc::umask(0o022) };
    let daemon = Daemon::start().await;
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let daemon = daemon?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        watch(&mut c, t.pid).await?;
        ensure!(t.cmd("set counter 1").await? == "SET");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut seen = 0;
        let mut stack = vec![daemon.state_dir().to_path_buf()];
        while let Some(dir) = stack.pop() {
            let m = std::fs::symlink_metadata(&dir)?;
            ensure!(
                m.mode() & 0o777 == 0o700,
                "{} is {:o}",
                dir.display(),
                m.mode() & 0o777
            );
            for e in std::fs::read_dir(&dir)? {
                let p = e?.path();
                let m = std::fs::symlink_metadata(&p)?;
                if m.is_dir() {
                    stack.push(p);
                } else {
                    seen += 1;
                    ensure!(
                        m.mode() & 0o777 == 0o600,
                        "{} is {:o}",
                        p.display(),
                        m.mode() & 0o777
                    );
                }
            }
        }
        ensure!(seen >= 4, "only {seen} files in the state directory");
        // Refused: writable by everyone, then another user's.
        let dir = unique_temp_dir("wpd-open-state")?;
        let state = dir.join("state");
        std::fs::create_dir_all(&state)?;
        for (mode, owner, want) in [
            (0o777, 0, "writable by everyone"),
            (0o700, 65534, "belongs to uid 65534"),
        ] {
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode))?;
            std::os::unix::fs::chown(&state, Some(owner), None)?;
            let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
                .args([
                    "--listen",
                    &format!("unix:{}", dir.join("x.sock").display()),
                ])
                .args(["--state-dir", &state.display().to_string()])
                .env("WPD_STATE_FILE", dir.join("pa"))
                .kill_on_drop(true)
                .output()
                .await?;
            let err = String::from_utf8_lossy(&out.stderr);
            ensure!(
                !out.status.success() && err.contains(want),
                "{want}: {out:?}"
            );
            ensure!(
                !dir.join("pa.lock").exists(),
                "{want}: the refused daemon left its ptrace lock file behind"
            );
        }
        // Refused: a directory of root's reached through another user's link
        // in a sticky directory all may write (the link's owner could repoint
        // it); nothing made behind the link, no lock left.
        let sticky = dir.join("sticky");
        let roots = dir.join("roots");
        std::fs::create_dir_all(&sticky)?;
        std::fs::create_dir_all(&roots)?;
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777))?;
        std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o700))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let link = sticky.join("lnk");
        std::os::unix::fs::symlink(&roots, &link)?;
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534))?;
        let out = tokio::process::Command::new(wpd_tests::bin_path("wpd"))
            .args([
                "--listen",
                &format!("unix:{}", dir.join("y.sock").display()),
            ])
            .args(["--state-dir", &link.join("sub").display().to_string()])
            .env("WPD_STATE_FILE", dir.join("pa"))
            .kill_on_drop(true)
            .output()
            .await?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("symbolic link of uid 65534"),
            "a state directory below another user's link: {out:?}"
        );
        ensure!(
            !roots.join("sub").exists() && !dir.join("pa.lock").exists(),
            "the refused daemon made the directory behind the link or left its lock"
        );
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
    .await;
    daemon.finish(result)
}
