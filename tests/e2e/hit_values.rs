//! Whose value a hit reports. Two threads of `ct-pie` store into `counter`
//! without pause (`spin 2`: each stores its own count, one more each time),
//! so the other thread's store often lands between one thread's trap and the
//! daemon's look at memory. On the ptrace backend every store stops its
//! thread, so each thread's hits, in order, must show its own count going
//! up by one: a value the other thread stored, shown as this one's, breaks
//! the sequence.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::RemoveWatchpointRequest;
use wpd_tests::{
    Backend, CTarget, Daemon, Event, EventStream, attach, hit_value_u64, hits_only,
    require_backend, rpc_ok, set_watchpoint, write_spec,
};

/// Hits read: reading memory at the stop showed the other thread's value in
/// one hit of eight here (kernel-facts §26), so a run without the decoded
/// store sees it thousands of times.
const HITS: usize = 30_000;
/// Time to read them (about 2 s here; more on a loaded machine).
const READ_TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ptrace_hit_shows_the_value_its_own_thread_stored() -> Result<()> {
    own_values("ct-pie").await
}

/// The same without symbols: the store is found from the start of its
/// function's call frame information entry (`.eh_frame`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ptrace_hit_shows_its_own_value_in_a_stripped_program() -> Result<()> {
    own_values("ct-stripped").await
}

async fn own_values(variant: &str) -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start(variant).await?;
    t.cmd("spin 2").await?;
    let result = async {
        let mut client = daemon.client().await?;
        attach(&mut client, t.pid, Backend::Ptrace).await?;
        let mut events = EventStream::subscribe(&mut client, hits_only(t.pid)).await?;
        let wp = set_watchpoint(
            &mut client,
            write_spec(Backend::Ptrace, t.pid, t.addr("counter")),
        )
        .await?
        .watchpoint
        .context("SetWatchpoint answered no watchpoint")?;
        // Each thread's values in the order of its hits. A subscriber that
        // falls behind is told where it lost events (`EventsDropped`, in
        // order): the sequences start again there.
        let mut last: HashMap<i32, u64> = HashMap::new();
        let mut threads = HashSet::new();
        let (mut hits, mut compared, mut broken) = (0, 0, Vec::new());
        events
            .wait_for(READ_TIMEOUT, &format!("{HITS} hits"), |ev| {
                match ev {
                    Event::Hit(h) => {
                        hits += 1;
                        threads.insert(h.tid);
                        let v = hit_value_u64(h)
                            .with_context(|| format!("a hit without 8 bytes: {h:?}"))?;
                        if let Some(prev) = last.insert(h.tid, v) {
                            compared += 1;
                            if v != prev + 1 {
                                broken.push((h.tid, prev, v));
                            }
                        }
                    }
                    Event::Dropped(_) => last.clear(),
                    _ => {}
                }
                Ok((hits >= HITS).then_some(()))
            })
            .await?;
        rpc_ok(
            "RemoveWatchpoint",
            client.remove_watchpoint(RemoveWatchpointRequest { id: wp.id }),
        )
        .await?;
        ensure!(
            threads.len() == 2,
            "hits came from threads {threads:?}, not from the two spinners"
        );
        ensure!(
            compared >= HITS / 2,
            "only {compared} hits followed another of their thread with no loss between \
             ({} events dropped)",
            events.dropped
        );
        ensure!(
            broken.is_empty(),
            "{} of {compared} hits showed a value that does not follow their thread's \
             previous one (tid, previous, shown; first 10): {:?}",
            broken.len(),
            &broken[..broken.len().min(10)]
        );
        eprintln!(
            "{variant}: {hits} hits of two threads; in {compared} that followed another of \
             their thread, the value was one more ({} events dropped)",
            events.dropped
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}
