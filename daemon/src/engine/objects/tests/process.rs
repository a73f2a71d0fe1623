//! A process's code events end with its program (exec) and with its
//! attachment (detach), each reported; its objects' watchpoints are not.

use std::collections::BTreeMap;

use super::super::CodeSpec;
use super::{Armer, BASE, OTHER, Rig, breakpoint, malloced, record};
use crate::backend::CodeHold;
use crate::events::{EventKind, Subscription};
use crate::model::WatchId;

/// A rig with an object watch whose one object is live, and a pending
/// event: their ids, the object's watchpoint, and every probe's key.
fn busy() -> (Rig, WatchId, WatchId, WatchId, Vec<u64>) {
    let rig = Rig::start();
    let pid = rig.pid;
    let (watch, probes) = rig.set(malloced());
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, probes.event().key, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let child = rig.only_child(watch.id).id;
    let (waiting, _) = rig.set(CodeSpec {
        pending: true,
        ..breakpoint("libwpd-none.so.7:frob")
    });
    let mut keys: Vec<u64> = rig.kernel.probes(pid).iter().map(|p| p.key).collect();
    keys.sort_unstable();
    assert_eq!(keys.len(), 3, "the event, free, the loader's hook");
    (rig, watch.id, waiting.id, child, keys)
}

/// The `WatchpointRemoved` events received: id → reason.
fn removals(sub: &mut Subscription) -> BTreeMap<WatchId, String> {
    let mut out = BTreeMap::new();
    while let Ok(ev) = sub.rx.try_recv() {
        if let EventKind::WatchpointRemoved { id, reason, .. } = &ev.kind {
            out.insert(*id, reason.to_string());
        }
    }
    out
}

#[test]
fn an_exec_removes_the_process_code_events_and_closes_their_probes() {
    let (rig, watch, waiting, _, keys) = busy();
    let pid = rig.pid;
    let mut sub = rig.core.bus.subscribe(0, true);
    let proc = rig.core.procs.get(&pid).unwrap().clone();
    rig.core.remove_object_watches_at_exec(&proc.lock_op());
    let mut closed = rig.kernel.closed_probes(pid);
    closed.sort_unstable();
    assert_eq!(closed, keys);
    assert!(rig.kernel.probes(pid).is_empty());
    assert_eq!(rig.core.objects.count(), 0);
    assert!(!rig.core.objects.has_loader_hook(pid));
    let got = removals(&mut sub);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), [watch, waiting]);
    assert!(got[&watch].contains("exec"), "{got:?}");
    assert!(got[&waiting].contains("exec"), "{got:?}");
}

#[test]
fn a_detach_ends_the_process_code_events_and_its_objects() {
    let (rig, watch, waiting, child, _) = busy();
    let pid = rig.pid;
    let mut sub = rig.core.bus.subscribe(0, true);
    rig.core.detach(pid).unwrap();
    assert_eq!(rig.core.objects.count(), 0);
    assert!(rig.core.object_watch(watch).is_none());
    assert!(!rig.core.objects.has_loader_hook(pid));
    assert!(rig.core.watches.get(&child).is_none());
    assert!(rig.kernel.probes(pid).is_empty());
    assert!(!rig.kernel.attached().contains(&pid));
    // Each code event reported; the object's watchpoint is not an event.
    let got = removals(&mut sub);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), [watch, waiting]);
    assert!(got.values().all(|r| r == "detached"), "{got:?}");
}
