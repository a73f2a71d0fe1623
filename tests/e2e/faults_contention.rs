//! Fault injection: hundreds of concurrent clients fighting over four slots (fault 6).
//!
//! Every test runs the real daemon against real targets it starts itself, bounds every wait,
//! relies on the harness guards to kill everything on any path, and ends by checking that the
//! targets survived (no SIGTRAP, `ping` answers) and that nothing leaked (`wpd_tests::leaks`).
//!
//! `concurrent_clients` reads `WPD_FAULTS_CLIENTS` (default 200) and `WPD_FAULTS_SECS`
//! (default 30, at most 60; ptrace uses an eighth of the clients and a third of the time); CI
//! uses the defaults.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use tokio::time::Instant;
use tonic::Code;
use wpd_proto::v1::{
    ListThreadsResponse, ListWatchpointsRequest, RemoveWatchpointRequest, SetWatchpointRequest,
    SlotState,
};
use wpd_tests::leaks::*;
use wpd_tests::{
    Backend, Client, Daemon, ForeignBreakpoint, TargetProc, attach, both_backends, list_threads,
    rpc, rpc_ok, status_line, write_spec,
};

// ---------------------------------------------------------------------------------------------
// 6. Many concurrent clients fight over four slots
// ---------------------------------------------------------------------------------------------

/// Default number of concurrent clients (perf; ptrace uses an eighth).
const DEFAULT_CLIENTS: u64 = 200;
/// Default duration of the churn (perf; ptrace runs a third of it).
const DEFAULT_SECS: u64 = 30;
/// Upper bounds of the environment overrides: the run must stay bounded.
const MAX_CLIENTS: u64 = 1000;
const MAX_SECS: u64 = 60;
/// Watchpoints one client holds at most at once.
const MAX_HELD: usize = 2;
/// Threads of the contested target: the main thread and 8 workers.
const CHURN_THREADS: usize = 9;

fn env_u64(name: &str, default: u64, max: u64) -> Result<u64> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => {
            let n: u64 = v
                .trim()
                .parse()
                .with_context(|| format!("${name}={v:?} is not a number"))?;
            ensure!(n >= 1, "${name} must be at least 1");
            if n > max {
                eprintln!("${name}={n} capped at {max}");
            }
            Ok(n.min(max))
        }
    }
}

/// xorshift64*: deterministic per client, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    set_ok: AtomicU64,
    exhausted: AtomicU64,
    removed: AtomicU64,
    unexpected_count: AtomicU64,
    unexpected: Mutex<Vec<String>>,
}

impl Tally {
    fn unexpected(&self, what: String) {
        self.unexpected_count.fetch_add(1, Ordering::Relaxed);
        let mut v = self.unexpected.lock().unwrap();
        if v.len() < 20 {
            v.push(what);
        }
    }
}

/// What one churning client needs to know about the target.
struct Contested {
    backend: Backend,
    pid: i32,
    tids: Vec<i32>,
    vars: Vec<u64>,
    deadline: Instant,
}

/// One client: until the deadline, sets (mostly thread-scoped, sometimes process-wide)
/// watchpoints on variables nobody stores to and removes them again, holding at most
/// [`MAX_HELD`]; then removes what it holds. Success and OUT_OF_SLOTS are expected; every
/// other outcome is tallied as unexpected.
async fn churn_client(mut client: Client, n: usize, c: Arc<Contested>, tally: Arc<Tally>) {
    let mut rng = Rng::new(n as u64 + 1);
    let mut held: Vec<u64> = Vec::new();
    while Instant::now() < c.deadline {
        if held.len() < MAX_HELD && (held.is_empty() || rng.below(3) != 0) {
            let mut spec = write_spec(c.backend, c.pid, c.vars[1 + rng.below(7) as usize]);
            let wide = rng.below(8) == 0;
            if !wide {
                spec.tids = vec![c.tids[rng.below(c.tids.len() as u64) as usize]];
            }
            let what = format!("client {n}: SetWatchpoint(tids {:?})", spec.tids);
            match rpc(client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) })).await {
                Ok(Ok(resp)) => {
                    let w = resp.watchpoint.unwrap_or_default();
                    let want = if wide { CHURN_THREADS as u32 } else { 1 };
                    if w.armed_threads != want {
                        tally.unexpected(format!(
                            "{what}: armed on {} threads, expected {want}",
                            w.armed_threads
                        ));
                    }
                    tally.set_ok.fetch_add(1, Ordering::Relaxed);
                    held.push(w.id);
                }
                Ok(Err(s))
                    if s.code() == Code::ResourceExhausted
                        && reason(&s) == wpd_proto::reason::OUT_OF_SLOTS =>
                {
                    tally.exhausted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(s)) => tally.unexpected(format!(
                    "{what}: {} (reason {:?})",
                    status_line(&s),
                    reason(&s)
                )),
                Err(e) => tally.unexpected(format!("{what}: {e:#}")),
            }
        } else {
            let id = held.remove(rng.below(held.len() as u64) as usize);
            remove_tallied(&mut client, n, id, &tally).await;
        }
        tokio::time::sleep(Duration::from_micros(rng.below(2000))).await;
    }
    for id in held {
        remove_tallied(&mut client, n, id, &tally).await;
    }
}

async fn remove_tallied(client: &mut Client, n: usize, id: u64, tally: &Tally) {
    match rpc(client.remove_watchpoint(RemoveWatchpointRequest { id })).await {
        Ok(Ok(_)) => {
            tally.removed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(s)) => tally.unexpected(format!(
            "client {n}: RemoveWatchpoint({id}) of its own watchpoint: {}",
            status_line(&s)
        )),
        Err(e) => tally.unexpected(format!("client {n}: RemoveWatchpoint({id}): {e:#}")),
    }
}

/// What is wrong with one `ListThreads` answer taken during the churn: a thread listed twice
/// or not of the target, a thread without exactly 4 slots, more than 4 slots held
/// (non-FREE, non-FOREIGN), one watchpoint in two slots of a thread, or a held slot without
/// a watchpoint id.
fn slot_violations(list: &ListThreadsResponse, tids: &HashSet<i32>) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for t in &list.threads {
        if !seen.insert(t.tid) {
            out.push(format!("thread {} listed twice", t.tid));
        }
        if !tids.contains(&t.tid) {
            out.push(format!("thread {} is not a thread of the target", t.tid));
        }
        let indices: Vec<u32> = t.slots.iter().map(|s| s.index).collect();
        if indices != [0, 1, 2, 3] {
            out.push(format!("thread {}: slots {indices:?}", t.tid));
        }
        let held: Vec<_> = t
            .slots
            .iter()
            .filter(|s| !matches!(s.state(), SlotState::Free | SlotState::Foreign))
            .collect();
        if held.len() > 4 {
            out.push(format!(
                "thread {}: {} slots held: {t:?}",
                t.tid,
                held.len()
            ));
        }
        let mut ids = HashSet::new();
        for s in &held {
            let needs_id = matches!(s.state(), SlotState::Ours | SlotState::Pending);
            if needs_id && s.watchpoint_id == 0 {
                out.push(format!("thread {}: slot {} held by id 0", t.tid, s.index));
            }
            if needs_id && !ids.insert(s.watchpoint_id) {
                out.push(format!(
                    "thread {}: watchpoint {} in two slots: {t:?}",
                    t.tid, s.watchpoint_id
                ));
            }
        }
    }
    if seen != *tids {
        out.push(format!("listed threads {seen:?}, target has {tids:?}"));
    }
    out
}

both_backends!(
    /// 6. Many clients, each on its own connection, set and remove thread-scoped and
    /// process-wide watchpoints on one 9-thread target for 30 s (ptrace 10 s): only successes and
    /// OUT_OF_SLOTS refusals, a ledger that never shows an impossible thread, and at the end
    /// every slot free (ptrace: free or RETAINED, the kernel's residue of a ptrace
    /// breakpoint) and no FOREIGN slot when the kernel is asked.
    concurrent_clients
);

async fn concurrent_clients(backend: Backend) -> Result<()> {
    let clients = env_u64("WPD_FAULTS_CLIENTS", DEFAULT_CLIENTS, MAX_CLIENTS)?;
    let secs = env_u64("WPD_FAULTS_SECS", DEFAULT_SECS, MAX_SECS)?;
    // ptrace arming stops the threads it arms: fewer clients keep the run bounded.
    let (clients, secs) = match backend {
        Backend::Ptrace => ((clients / 8).max(1), (secs / 3).max(1)),
        _ => (clients, secs),
    };
    let clients = clients as usize;
    let daemon = Daemon::start().await?;
    let mut target = TargetProc::start(&["--threads", "8"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut base = Baseline::take(&daemon, &mut client).await?;
            let pid = target.pid;
            attach(&mut client, pid, backend).await?;
            let tids = target.tids()?;
            ensure!(tids.len() == CHURN_THREADS, "target threads {tids:?}");
            let tid_set: HashSet<i32> = tids.iter().copied().collect();

            // Connections first, one at a time (the listen backlog is finite), each used once.
            let mut conns = Vec::with_capacity(clients);
            for _ in 0..clients {
                let mut c = daemon.client().await?;
                get_stats(&mut c).await?;
                conns.push(c);
            }
            // The RSS baseline of this test includes the open connections: memory the daemon
            // frees when they close stays with the allocator (~32 KiB per HTTP/2 connection
            // measured here: +2 MiB for 25, +7.6-8.5 MiB for 200, +13 MiB for 400, and
            // repeated rounds converge: +8.2, +1.7, +0.5, +0.3 MiB), which is not a leak. The
            // churn itself must stay within the slack; the fd baseline stays the one taken
            // before any connection, and must come back exactly.
            base.rss_kib = daemon_rss_kib(daemon.pid())?;

            churn(&daemon, backend, &target, conns, secs, base).await?;

            // Everything removed: nothing listed, every slot free.
            let listed = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?
            .watchpoints;
            ensure!(listed.is_empty(), "still listed: {listed:?}");
            let free_states: &[SlotState] = match backend {
                Backend::Ptrace => &[SlotState::Free, SlotState::Retained],
                _ => &[SlotState::Free],
            };
            for probe in [false, true] {
                let list = list_threads(&mut client, pid, probe).await?;
                for t in &list.threads {
                    ensure!(
                        t.slots.iter().all(|s| free_states.contains(&s.state())),
                        "thread {} (probe {probe}) should have only {free_states:?} slots: \
                         {t:?}",
                        t.tid
                    );
                }
                let listed: HashSet<i32> = list.threads.iter().map(|t| t.tid).collect();
                ensure!(listed == tid_set, "ListThreads lists {listed:?}");
            }
            if backend == Backend::Perf {
                // The kernel agrees: four breakpoints of our own fit on every thread.
                for &tid in &tids {
                    let held = (4..8)
                        .map(|i| ForeignBreakpoint::open(tid, target.vars[i], 8))
                        .collect::<Result<Vec<_>>>()
                        .with_context(|| format!("thread {tid}: a slot is still held"))?;
                    drop(held);
                }
            }

            ensure_survived(&mut target).await?;
            detach(&mut client, pid).await?;
            ensure_clean(&daemon, &mut client, base, &[pid]).await?;
            let (c, _) = target.ping().await?;
            target.wait_counter_above(c, Duration::from_secs(5)).await?;
            ensure_survived(&mut target).await
        }
        .await,
    )
}

/// Runs one [`churn_client`] per connection in `conns` for `secs` seconds while polling
/// `ListThreads`; fails on any unexpected outcome or impossible ledger state.
async fn churn(
    daemon: &Daemon,
    backend: Backend,
    target: &TargetProc,
    conns: Vec<Client>,
    secs: u64,
    base: Baseline,
) -> Result<()> {
    let clients = conns.len();
    let pid = target.pid;
    let tids = target.tids()?;
    let tid_set: HashSet<i32> = tids.iter().copied().collect();
    let contested = Arc::new(Contested {
        backend,
        pid,
        tids,
        vars: target.vars.clone(),
        deadline: Instant::now() + Duration::from_secs(secs),
    });
    let tally = Arc::new(Tally::default());
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(n, c)| tokio::spawn(churn_client(c, n, contested.clone(), tally.clone())))
        .collect();

    // Meanwhile, the ledger as ListThreads shows it.
    let done = Arc::new(AtomicBool::new(false));
    let mut poll_client = daemon.client().await?;
    let poller = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut polls = 0u64;
            let mut bad: Vec<String> = Vec::new();
            while !done.load(Ordering::Relaxed) {
                match list_threads(&mut poll_client, pid, false).await {
                    Ok(list) => bad.extend(slot_violations(&list, &tid_set)),
                    Err(e) => bad.push(format!("ListThreads during the churn: {e:#}")),
                }
                polls += 1;
                if bad.len() >= 20 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (polls, bad)
        })
    };

    let join_all = async {
        for t in tasks {
            t.await.context("a client task panicked")?;
        }
        anyhow::Ok(())
    };
    // Every RPC has a 10 s timeout and a client makes at most MAX_HELD + 1 after the deadline.
    let bound = Duration::from_secs(secs) + Duration::from_secs(30);
    let joined = tokio::time::timeout(bound, join_all).await;
    done.store(true, Ordering::Relaxed);
    let (polls, bad) = poller.await.context("the poller panicked")?;
    joined.map_err(|_| anyhow!("the clients did not finish within {bound:?}"))??;

    let unexpected = tally.unexpected.lock().unwrap().clone();
    let (set_ok, exhausted, removed) = (
        tally.set_ok.load(Ordering::Relaxed),
        tally.exhausted.load(Ordering::Relaxed),
        tally.removed.load(Ordering::Relaxed),
    );
    eprintln!(
        "{backend:?}: {clients} clients for {secs} s: {set_ok} set, {exhausted} OUT_OF_SLOTS, \
         {removed} removed, {} unexpected; {polls} ListThreads polls; daemon RSS {} KiB \
         (baseline {} KiB)",
        tally.unexpected_count.load(Ordering::Relaxed),
        daemon_rss_kib(daemon.pid()).unwrap_or(0),
        base.rss_kib,
    );
    ensure!(
        unexpected.is_empty(),
        "{} unexpected outcomes, first ones:\n  {}",
        tally.unexpected_count.load(Ordering::Relaxed),
        unexpected.join("\n  ")
    );
    ensure!(
        bad.is_empty(),
        "ListThreads showed impossible slots during the churn:\n  {}",
        bad.join("\n  ")
    );
    ensure!(polls > 0, "ListThreads was never polled");
    ensure!(set_ok > 0, "no SetWatchpoint ever succeeded");
    ensure!(
        removed == set_ok,
        "{set_ok} watchpoints set but {removed} removed"
    );
    Ok(())
}
