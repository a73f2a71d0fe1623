//! Code breakpoints: a thread that reaches one is held and reported, after
//! its ignore and hit counts.

use super::super::CodeSpec;
use super::{Armer, OTHER, Rig, breakpoint, record, spec};
use crate::backend::CodeHold;
use crate::events::EventKind;
use crate::model::HitAction;

/// The `count` of each `BreakpointHit` code breakpoint `id` kept.
fn kept_counts(rig: &Rig, id: crate::model::WatchId) -> Vec<u64> {
    let (events, pid, _) = rig.core.breakpoint_recent(id, 0).unwrap();
    assert_eq!(pid, rig.pid);
    events
        .iter()
        .map(|e| match &e.kind {
            EventKind::BreakpointHit {
                id: hit,
                tid,
                count,
                ..
            } => {
                assert_eq!((*hit, *tid), (id, rig.pid));
                *count
            }
            other => panic!("not a breakpoint hit: {other:?}"),
        })
        .collect()
}

#[test]
fn a_code_breakpoint_holds_the_thread_and_arms_nothing() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(breakpoint("malloc"));
    let place = view.place.clone().expect("a breakpoint's place");
    assert_eq!(place.function, "malloc");
    assert!(place.module.contains("libc.so"), "{place:?}");
    let p = probes.event();
    assert!(!p.ret && !p.first_arg_filter && p.gate.is_none());
    assert_eq!(p.offset, place.offset);
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, p.key, pid, 0, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Hold);
    // Held until a Resume: the objects thread is not asked.
    assert!(rig.kernel.resumed().is_empty());
    assert!(armer.armed.is_empty() && rig.core.watches.is_empty());
    let v = rig.view(view.id);
    assert_eq!(v.hits, 1);
    assert_eq!(kept_counts(&rig, view.id), [1]);
    assert_eq!(rig.core.breakpoint_recent(view.id, 0).unwrap().2, 1);
}

#[test]
fn ignore_and_every_let_threads_go_on() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(CodeSpec {
        ignore: 2,
        every: 3,
        ..breakpoint("malloc")
    });
    let mut armer = Armer::reaching(&[pid]);
    let r = record(pid, probes.event().key, pid, 0, 0);
    let holds: Vec<bool> = (0..9)
        .map(|_| rig.stop(pid, &[r], &mut armer) == CodeHold::Hold)
        .collect();
    // The first 2 go on, then every 3rd is held: the 5th and the 8th.
    let held: Vec<usize> = (1..=9).filter(|n| holds[n - 1]).collect();
    assert_eq!(held, [5, 8]);
    assert_eq!(rig.view(view.id).hits, 9);
    assert_eq!(kept_counts(&rig, view.id), [5, 8]);
    assert_eq!(rig.core.breakpoint_recent(view.id, 0).unwrap().2, 2);
}

#[test]
fn a_stop_all_breakpoint_holds_every_thread() {
    let rig = Rig::start();
    let pid = rig.pid;
    let mut s = spec(pid);
    s.action = HitAction::StopAll;
    let (_, probes) = rig.set_as(s, breakpoint("malloc"));
    let mut armer = Armer::reaching(&[pid]);
    let r = record(pid, probes.event().key, pid, 0, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::HoldAll);
}

#[test]
fn a_breakpoint_keeps_its_last_stops() {
    let rig = Rig::start();
    let pid = rig.pid;
    let mut s = spec(pid);
    s.keep_recent = 2;
    let (view, probes) = rig.set_as(s, breakpoint("malloc"));
    let mut armer = Armer::reaching(&[pid]);
    let r = record(pid, probes.event().key, pid, 0, 0);
    for _ in 0..3 {
        assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Hold);
    }
    assert_eq!(kept_counts(&rig, view.id), [2, 3]);
    let (last, _, reported) = rig.core.breakpoint_recent(view.id, 1).unwrap();
    assert_eq!((last.len(), reported), (1, 3));
}
