//! Park requests of the ptrace backend's tracers (`backend/ptrace/tracer.rs`):
//! two requests that reach a running tracee before its stop both end at
//! that stop. (A second request once took the first's place; the first
//! then waited for a stop that never came, until the park's 30 s bound: a
//! data breakpoint's removal right after a stop-all hit hung that long.)

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use wpd::backend::ptrace::protocol::{HitVerdict, ProgramResult, SlotProgram, TraceSink};
use wpd::backend::ptrace::shards::Shards;
use wpd::model::{Pid, SlotKey, Tid};

/// A sink that wants nothing of the tracee.
struct Quiet;

impl TraceSink for Quiet {
    fn thread_started(&self, _: Pid, _: Tid, _: Tid) -> Vec<SlotProgram> {
        Vec::new()
    }
    fn thread_armed(&self, _: Pid, _: Tid, _: &[(SlotProgram, ProgramResult)]) {}
    fn thread_exited(&self, _: Pid, _: Tid) {}
    fn hit(&self, _: Pid, _: Tid, _: Option<&libc::user_regs_struct>, _: &[SlotKey]) -> HitVerdict {
        HitVerdict::Continue
    }
    fn exec(&self, _: Pid, _: Tid) {}
}

/// The longest one round may take: a park ends within microseconds of the
/// tracee's stop; a lost one waits for the park bound (30 s).
const ROUND_BOUND: Duration = Duration::from_secs(10);

#[test]
fn two_parks_before_a_stop_both_end_at_it() {
    if !wpd_test_skip::require_root("ptrace of its child") {
        return;
    }
    // A running, single-threaded child.
    let mut child = Command::new("/bin/sh")
        .args(["-c", "while :; do :; done"])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn a child");
    let pid = child.id() as Pid;
    let sink: Arc<dyn TraceSink> = Arc::new(Quiet);
    let shards = Arc::new(Shards::new(1, Arc::downgrade(&sink)));
    let seized = shards.seize(pid, &[pid]);
    assert!(seized.iter().all(|(_, r)| r.is_ok()), "seize: {seized:?}");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for round in 0..50 {
            // Both requests sent at once: the second reaches the tracer
            // before the tracee's stop (most rounds).
            let (tx, rx) = std::sync::mpsc::channel();
            for _ in 0..2 {
                let (shards, tx) = (shards.clone(), tx.clone());
                std::thread::spawn(move || {
                    let _ = tx.send(shards.park(&[pid]));
                });
            }
            for _ in 0..2 {
                let stopped = rx.recv_timeout(ROUND_BOUND).unwrap_or_else(|_| {
                    panic!(
                        "round {round}: a park did not end within {ROUND_BOUND:?} (it waits \
                         for a stop that had come)"
                    )
                });
                assert_eq!(stopped, vec![pid], "round {round}: stopped");
            }
            shards.unpark(&[pid]);
            // Let it run before the next round.
            std::thread::sleep(Duration::from_millis(2));
        }
    }));
    let _ = child.kill();
    let _ = child.wait();
    drop(shards);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
