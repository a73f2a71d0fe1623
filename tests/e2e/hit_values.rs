//! Whose value a hit reports. Two threads of `ct-pie` store into `counter`
//! without pause (`spin 2`: each stores its own count, one more each time),
//! so the other thread's store often lands between one thread's trap and the
//! daemon's look at memory. Each thread's hits, in the order of their
//! times, must show its own count going up by one: a value the other thread
//! stored, shown as this one's, breaks the sequence. On ptrace every store
//! stops its thread; on perf the registers the breakpoint recorded at the
//! trap tell what the store wrote, on both of its paths (the per-thread
//! path's program read the bytes a little after the store, and the per-CPU
//! path reads them when the daemon reads the sample: before, 0.6% and all
//! of the hits here showed another value).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{RemoveWatchpointRequest, ResolveSymbolRequest};
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
    own_values("ct-pie", Backend::Ptrace, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_perf_hit_shows_the_value_its_own_thread_stored() -> Result<()> {
    own_values("ct-pie", Backend::Perf, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_cpu_perf_hit_shows_the_value_its_own_thread_stored() -> Result<()> {
    own_values("ct-pie", Backend::Perf, &["--perf-events", "per-cpu"]).await
}

/// The same without symbols: the store is found from the start of its
/// function's call frame information entry (`.eh_frame`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ptrace_hit_shows_its_own_value_in_a_stripped_program() -> Result<()> {
    own_values("ct-stripped", Backend::Ptrace, &[]).await
}

async fn own_values(variant: &str, backend: Backend, args: &[&str]) -> Result<()> {
    if !require_backend(backend) {
        return Ok(());
    }
    let daemon = Daemon::start_with_args(args).await?;
    let mut t = CTarget::start(variant).await?;
    t.cmd("spin 2").await?;
    let result = async {
        let mut client = daemon.client().await?;
        attach(&mut client, t.pid, backend).await?;
        if backend == Backend::Perf {
            // perf's drain does not wait for a module to load: the hits
            // before the program's file is loaded (started by the first
            // hit) keep the value as read. Resolving a name loads it first.
            let r = rpc_ok(
                "ResolveSymbol(counter)",
                client.resolve_symbol(ResolveSymbolRequest {
                    pid: t.pid,
                    name: "counter".into(),
                    ..Default::default()
                }),
            )
            .await?;
            let at = r.symbol.map(|s| s.address);
            ensure!(
                at == Some(t.addr("counter")),
                "counter resolved to {at:x?}, the program says {:#x}",
                t.addr("counter")
            );
        }
        let mut events = EventStream::subscribe(&mut client, hits_only(t.pid)).await?;
        let wp = set_watchpoint(&mut client, write_spec(backend, t.pid, t.addr("counter")))
            .await?
            .watchpoint
            .context("SetWatchpoint answered no watchpoint")?;
        // Each thread's values in the order of its stores (their times: the
        // per-CPU path reads its CPUs' rings one after the other, so a thread
        // that moved between CPUs has its hits read out of order).
        let mut stores: HashMap<i32, Vec<(u64, u64)>> = HashMap::new();
        let mut hits = 0;
        events
            .wait_for(READ_TIMEOUT, &format!("{HITS} hits"), |ev| {
                if let Event::Hit(h) = ev {
                    hits += 1;
                    let v = hit_value_u64(h)
                        .with_context(|| format!("a hit without 8 bytes: {h:?}"))?;
                    stores.entry(h.tid).or_default().push((h.time_ns, v));
                }
                Ok((hits >= HITS).then_some(()))
            })
            .await?;
        let threads: HashSet<i32> = stores.keys().copied().collect();
        // One more than the thread's previous value: compared. More: hits
        // between them were lost (a subscriber that fell behind, a full
        // ring). Not more: a value another thread stored, or the thread's
        // own read late, shown as this store's.
        let (mut compared, mut gaps, mut broken) = (0, 0, Vec::new());
        for (tid, s) in &mut stores {
            s.sort_unstable();
            for w in s.windows(2) {
                let ((_, prev), (_, v)) = (w[0], w[1]);
                if v == prev + 1 {
                    compared += 1;
                } else if v > prev {
                    gaps += 1;
                } else {
                    broken.push((*tid, prev, v));
                }
            }
        }
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
             ({gaps} gaps; {} events dropped)",
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
             their thread, the value was one more ({gaps} gaps; {} events dropped)",
            events.dropped
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}
