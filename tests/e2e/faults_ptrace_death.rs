//! The daemon dies while the ptrace backend stops threads; the target must
//! not (issue: "a killed daemon never kills a target").
//!
//! Rounds of: a C target whose 8 threads store into `counter` as fast as
//! they can (every store a hit), a ptrace watchpoint on it with stop
//! semantics (log, stop, stop-all, only-on-change, in turn), then the
//! daemon killed at a random moment of one of four kinds (while arming,
//! while threads are held at a hit, while detaching, while hits flow), by
//! SIGKILL, SIGABRT (what `abort()` does, and what a panic does) or a panic
//! of a tracer thread (a fault hook: the tracer detaches its tracees and
//! ends the daemon); every other round a new daemon is started after it.
//! Afterwards the target must be alive, every thread running (none in a
//! traced or group stop, none traced), its spinners still storing, and its
//! own job control must work (SIGSTOP stops it, SIGCONT resumes it).
//!
//! A round whose watchpoint was set must have seen hits before the kill,
//! and a round killed "while held" a hit that held its thread (a tracer
//! panic at the first hit ends the daemon at it: that daemon's death is
//! the proof of its hit).
//!
//! `WPD_KILL_ROUNDS` sets the number of rounds (default 12: three of each
//! kill point); `WPD_KILL_SEED` the seed of the random moments (printed at
//! the start, and in a failure's context: the same seed replays the same
//! choices); `scripts/soak-ptrace-death` runs 100 and prints the figures
//! for `docs/reliability.md`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::*;
use wpd_tests::{CTarget, Daemon, EventStream, require_backend, rpc_ok};

/// Where in a watchpoint's life the daemon dies.
#[derive(Debug, Clone, Copy)]
enum KillPoint {
    Arming,
    Held,
    Detaching,
    HitsFlowing,
}

/// How it dies.
#[derive(Debug, Clone, Copy)]
enum Death {
    Kill,
    Abort,
    TracerPanic,
}

/// A small PRNG (xorshift), seeded per run (`WPD_KILL_SEED`, else the
/// clock) and printed, for the random moments.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn signal(pid: i32, sig: i32) -> Result<()> {
    // SAFETY: kill(2) with a pid this test started.
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// (state letter, TracerPid) of every thread of `pid`.
fn thread_states(pid: i32) -> Result<Vec<(i32, char, i32)>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let task = task?;
        let tid: i32 = task.file_name().to_string_lossy().parse()?;
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.chars().next())
            .unwrap_or('?');
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let tracer = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        out.push((tid, state, tracer));
    }
    Ok(out)
}

/// The target after the daemon's death: alive, free, storing, and its own
/// job control intact.
async fn target_survived(t: &mut CTarget, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = t.try_status()? {
            bail!("{what}: the target died: {status:?}");
        }
        let states = thread_states(t.pid)?;
        let stuck: Vec<_> = states
            .iter()
            .filter(|(_, s, tracer)| matches!(s, 't' | 'T') || *tracer != 0)
            .collect();
        if stuck.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: 5 s after the daemon died, threads still stopped or traced: {stuck:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its spinners store on: no trap is left to kill it (they may wait a while for a CPU on
    // a loaded machine; a stuck one never moves).
    t.changes("counter").await.context(what.to_string())?;
    if let Some(status) = t.try_status()? {
        bail!("{what}: the target died: {status:?}");
    }
    // Job control as before.
    signal(t.pid, libc::SIGSTOP)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !thread_states(t.pid)?.iter().all(|(_, s, _)| *s == 'T') {
        ensure!(
            Instant::now() < deadline,
            "{what}: SIGSTOP did not stop every thread"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal(t.pid, libc::SIGCONT)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while thread_states(t.pid)?.iter().any(|(_, s, _)| *s == 'T') {
        ensure!(
            Instant::now() < deadline,
            "{what}: SIGCONT did not resume it"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reply = t.cmd("set initialized 9").await?;
    ensure!(
        reply.starts_with("SET"),
        "{what}: the target answered {reply:?}"
    );
    Ok(())
}

/// The watchpoint of stop semantics `which` (0–3).
fn spec(pid: i32, which: usize) -> (WatchpointSpec, &'static str) {
    let (action, on_change, name) = match which % 4 {
        0 => (HitAction::Log, false, "log"),
        1 => (HitAction::Stop, false, "stop"),
        2 => (HitAction::StopAll, false, "stop-all"),
        _ => (HitAction::Log, true, "on-change"),
    };
    (
        WatchpointSpec {
            pid,
            symbol: "counter".into(),
            access: Access::Write as i32,
            backend: Backend::Ptrace as i32,
            action: action as i32,
            only_on_change: on_change,
            ..Default::default()
        },
        name,
    )
}

/// Kills `daemon` as `death` says (a tracer panic needs the hook armed at
/// start: the daemon dies by itself then).
async fn kill(daemon: &mut Daemon, death: Death) -> Result<()> {
    match death {
        Death::Kill => {
            daemon.kill().await?;
        }
        Death::Abort => {
            signal(daemon.pid(), libc::SIGABRT)?;
        }
        // The tracer catches its panic, detaches its tracees and ends
        // the daemon.
        Death::TracerPanic => {}
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.is_running() {
        ensure!(
            Instant::now() < deadline,
            "the daemon did not die ({death:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn one_round(round: usize, rng: &mut Rng) -> Result<(KillPoint, Death, &'static str, f64)> {
    let point = [
        KillPoint::Arming,
        KillPoint::Held,
        KillPoint::Detaching,
        KillPoint::HitsFlowing,
    ][round % 4];
    let death = [Death::Kill, Death::Abort, Death::TracerPanic][(round / 4) % 3];
    // The panic comes at a hit: the first (the hitting thread is stopped
    // at it), or some way into a flow of hits. Not while arming: no hit comes before the arm is done.
    let panic_at = match point {
        // The first: with a stop action nothing else hits after it.
        KillPoint::Held => 1,
        // Within the window at the slowest rate (a stop per hit, resumed
        // by the test: a few hundred a second).
        _ => 20 + rng.below(40),
    }
    .to_string();
    let env: &[(&str, &str)] = match (death, point) {
        (Death::TracerPanic, KillPoint::HitsFlowing | KillPoint::Held) => {
            &[("WPD_FAULT_PANIC_AT_HIT", &panic_at)]
        }
        _ => &[],
    };
    let death = if env.is_empty() && matches!(death, Death::TracerPanic) {
        Death::Kill
    } else {
        death
    };
    let mut daemon = Daemon::start_with_env(&[], env).await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("spin 8").await?;
    // Every pairing of kill point and stop semantics in 16 rounds; a held
    // round's semantics hold the hitting thread (stop or stop-all).
    let which = match point {
        KillPoint::Held => 1 + (round / 4) % 2,
        _ => round + round / 4,
    };
    let (wspec, action) = spec(t.pid, which);
    let mut rate = 0.0;
    let result = async {
        let mut c = daemon.client().await?;
        let mut events = EventStream::subscribe(
            &mut c,
            StreamEventsRequest {
                pid: t.pid,
                hits_only: true,
                raw: true,
                ..Default::default()
            },
        )
        .await?;
        match point {
            KillPoint::Arming => {
                let mut c2 = c.clone();
                let set = tokio::spawn(async move {
                    c2.set_watchpoint(SetWatchpointRequest { spec: Some(wspec) })
                        .await
                });
                tokio::time::sleep(Duration::from_micros(rng.below(15_000))).await;
                kill(&mut daemon, death).await?;
                let _ = set.await;
            }
            KillPoint::Held | KillPoint::HitsFlowing | KillPoint::Detaching => {
                let wp = rpc_ok(
                    "SetWatchpoint",
                    c.set_watchpoint(SetWatchpointRequest { spec: Some(wspec) }),
                )
                .await?
                .watchpoint
                .context("no watchpoint")?;
                // Hits flow: measure their rate over a moment, and until the first hit (a
                // held one for a held round) came, 10 s at most: on a loaded machine the
                // target's threads may wait longer than the moment for a CPU.
                let t0 = Instant::now();
                let mut n = 0u64;
                let mut held = false;
                let window = Duration::from_millis(100 + rng.below(300));
                let waiting = |n: u64, held: bool| match point {
                    KillPoint::Held => !held,
                    _ => n == 0,
                };
                while t0.elapsed() < window
                    || (waiting(n, held) && t0.elapsed() < Duration::from_secs(10))
                {
                    match events
                        .next_before(tokio::time::Instant::now() + Duration::from_millis(50))
                        .await
                    {
                        Ok(Some(Event::Hit(h))) => {
                            n += 1;
                            if h.stopped {
                                if matches!(point, KillPoint::Held) {
                                    held = true;
                                    break; // held now: die here
                                }
                                let resumed = c
                                    .resume(ResumeRequest {
                                        pid: t.pid,
                                        tids: vec![],
                                    })
                                    .await;
                                match (resumed, death) {
                                    (Ok(_), _) => {}
                                    // Its tracer panicked: the daemon is going.
                                    (Err(_), Death::TracerPanic) => break,
                                    (Err(e), _) => bail!("Resume: {e}"),
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
                rate = n as f64 / t0.elapsed().as_secs_f64();
                // Hits came before the kill; a held round holds a thread when it dies. A
                // tracer panicking at the first hit ends the daemon before that hit is sent:
                // the daemon's death (checked by `kill`) shows the hit came.
                match (point, death) {
                    (KillPoint::Held, Death::TracerPanic) => {}
                    (KillPoint::Held, _) => ensure!(
                        held,
                        "no hit held a thread within 10 s ({n} hits, {action})"
                    ),
                    _ => ensure!(n > 0, "no hit within 10 s of arming ({action})"),
                }
                if matches!(point, KillPoint::Detaching) {
                    let mut c2 = c.clone();
                    let pid = t.pid;
                    let detach =
                        tokio::spawn(async move { c2.detach(DetachRequest { pid }).await });
                    tokio::time::sleep(Duration::from_micros(rng.below(5_000))).await;
                    kill(&mut daemon, death).await?;
                    let _ = detach.await;
                } else if matches!(death, Death::TracerPanic) {
                    // The hook fires at its hit; the daemon goes by itself.
                    kill(&mut daemon, death).await?;
                } else {
                    kill(&mut daemon, death).await?;
                }
                let _ = wp;
            }
        }
        target_survived(
            &mut t,
            &format!("round {round} ({point:?}, {death:?}, {action})"),
        )
        .await?;
        // Every other round: a new daemon, which must find the target as
        // it was and work on it.
        if round % 2 == 1 {
            let again = Daemon::start().await?;
            let mut c = again.client().await?;
            let (wspec, _) = spec(t.pid, 0);
            rpc_ok(
                "SetWatchpoint after the restart",
                c.set_watchpoint(SetWatchpointRequest { spec: Some(wspec) }),
            )
            .await?;
            rpc_ok("Detach", c.detach(DetachRequest { pid: t.pid })).await?;
            drop(again);
            target_survived(&mut t, &format!("round {round}, after the restart")).await?;
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        daemon.print_log("the round failed");
    }
    result.map(|()| (point, death, action, rate))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_dies_never_takes_a_target_with_it() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let rounds: usize = std::env::var("WPD_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let seed = match std::env::var("WPD_KILL_SEED") {
        Ok(v) => {
            let v = v.trim();
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            }
            .with_context(|| format!("WPD_KILL_SEED={v:?} is not a number"))?
        }
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
    } | 1;
    eprintln!("seed {seed:#x} (WPD_KILL_SEED={seed:#x} replays it)");
    let mut rng = Rng(seed);
    let mut rates = Vec::new();
    for round in 0..rounds {
        let (point, death, action, rate) = one_round(round, &mut rng)
            .await
            .with_context(|| format!("round {round} (seed {seed:#x})"))?;
        eprintln!(
            "round {round}: {point:?} {death:?} {action}: survived ({rate:.0} hits/s before)"
        );
        if rate > 0.0 {
            rates.push(rate);
        }
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    eprintln!(
        "SUMMARY rounds={rounds} targets_lost=0 hits_per_s_median={:.0} hits_per_s_min={:.0}",
        rates.get(rates.len() / 2).copied().unwrap_or(0.0),
        rates.first().copied().unwrap_or(0.0)
    );
    Ok(())
}
