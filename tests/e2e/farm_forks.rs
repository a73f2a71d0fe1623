//! Fork servers: with `follow_forks` a process-wide perf watchpoint is copied by the kernel
//! into every child inside fork(), so each child's first store to the watched variable is a
//! hit carrying the child's own pid (nothing is polled, nothing is armed after the fork).
//! Without it, children are left alone (`faults_fork.rs`).

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use tonic::Code;
use wpd_proto::v1::{ListWatchpointsRequest, SetWatchpointRequest};
use wpd_tests::{
    Backend, Daemon, Event, EventStream, TargetProc, expect_status, poll_until, require_backend,
    rpc_ok, set_watchpoint, write_spec,
};

/// Children forked in a row.
const CHILDREN: usize = 5;
/// Stores each child of `wpd-target`'s `fork` makes (values 1..=50).
const CHILD_STORES: usize = 50;
const HIT_TIMEOUT: Duration = Duration::from_secs(10);

fn child_pid(reply: &str) -> Result<i32> {
    match reply
        .strip_prefix("FORKED pid=")
        .and_then(|p| p.trim().parse().ok())
    {
        Some(p) => Ok(p),
        None => bail!("unexpected reply to fork: {reply:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forked_children_carry_the_watchpoint_from_their_first_store() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    // Workers that almost never write: the hits to look at are the children's.
    let mut target = TargetProc::start(&["--threads", "2", "--interval-us", "1000000"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        let mut spec = write_spec(Backend::Perf, target.pid, target.vars[0]);
        spec.follow_forks = true;
        let wp = set_watchpoint(&mut client, spec)
            .await?
            .watchpoint
            .unwrap_or_default();
        ensure!(
            wp.spec.as_ref().is_some_and(|s| s.follow_forks),
            "the watchpoint does not say it follows forks: {wp:?}"
        );
        let caps = rpc_ok(
            "GetCapabilities",
            client.get_capabilities(wpd_proto::v1::GetCapabilitiesRequest {}),
        )
        .await?;
        // Values read at the trap (per-thread path) or later (per-CPU path).
        let exact = caps
            .backends
            .iter()
            .any(|b| b.backend == Backend::Perf as i32 && b.events.starts_with("per-thread"));
        for _ in 0..CHILDREN {
            let child = child_pid(&target.cmd("fork").await?)?;
            // The child stores 1, 2, ..., 50: every store is a hit, the first included.
            let mut values = Vec::new();
            while values.len() < CHILD_STORES {
                let v = events
                    .wait_for(HIT_TIMEOUT, &format!("child {child}'s stores"), |e| {
                        Ok(match e {
                            Event::Hit(h) if h.pid == child && h.watchpoint_id == wp.id => {
                                Some(h.value.clone())
                            }
                            _ => None,
                        })
                    })
                    .await?;
                values.push(v);
            }
            if exact {
                let want: Vec<Vec<u8>> = (1..=CHILD_STORES as u64)
                    .map(|v| v.to_le_bytes().to_vec())
                    .collect();
                ensure!(
                    values == want,
                    "child {child}'s hits carry {values:?}, not its stores 1..=50 in order"
                );
            }
            let reply = target.cmd(&format!("wait-child {child}")).await?;
            ensure!(
                reply == format!("CHILD pid={child} code=0"),
                "child {child} did not exit cleanly: {reply:?}"
            );
        }
        // Exited children are not listed as carrying it.
        let mut c = client.clone();
        poll_until(
            Duration::from_secs(5),
            "no forked child listed once they all exited",
            async || {
                let l = rpc_ok(
                    "ListWatchpoints",
                    c.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
                )
                .await?;
                let w = l.watchpoints.iter().find(|w| w.id == wp.id);
                Ok(match w {
                    Some(w) if w.forked_children.is_empty() => Ok(()),
                    other => Err(format!("{other:?}")),
                })
            },
        )
        .await?;
        target.ensure_alive()?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Listed threads and the ptrace backend cannot follow forks: refused, nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_forks_is_refused_where_it_cannot_work() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "1"]).await?;
    let result = async {
        let mut client = daemon.client().await?;
        let mut spec = write_spec(Backend::Perf, target.pid, target.vars[0]);
        spec.follow_forks = true;
        spec.tids = vec![target.pid];
        let r = client
            .set_watchpoint(SetWatchpointRequest {
                spec: Some(spec.clone()),
            })
            .await;
        expect_status(
            "follow_forks with tids",
            r,
            Code::InvalidArgument,
            &["process-wide"],
        )?;
        spec.tids.clear();
        spec.backend = Backend::Ptrace as i32;
        let r = client
            .set_watchpoint(SetWatchpointRequest { spec: Some(spec) })
            .await;
        expect_status(
            "follow_forks on ptrace",
            r,
            Code::InvalidArgument,
            &["following forks", "perf"],
        )?;
        let l = rpc_ok(
            "ListWatchpoints",
            client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
        )
        .await?;
        ensure!(
            l.watchpoints.is_empty() && l.processes.is_empty(),
            "refusals left {l:?}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}
