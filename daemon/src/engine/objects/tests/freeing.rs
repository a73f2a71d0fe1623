//! Objects going: a disarming call at a stop, a freeing call that stopped
//! no one (read at a stop, or swept by the objects thread), and the object
//! watch removed.

use std::sync::atomic::Ordering;

use super::{Armer, BASE, OTHER, Rig, malloced, record, wait_until};
use crate::backend::{CodeHold, CodeRecord, Host};
use crate::model::WatchId;

/// A rig with one object armed at the stop at [`BASE`]: its object watch,
/// the disarming probe's key, the object's watchpoint and the armer that
/// armed it.
fn armed() -> (Rig, WatchId, u64, WatchId, Armer) {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, probes.event().key, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let child = rig.only_child(view.id).id;
    assert_eq!(rig.slots(child).len(), 2);
    (rig, view.id, probes.disarm().key, child, armer)
}

/// The object's watchpoint and its slots are gone, and its base is out of
/// the disarming probe's set.
fn gone(rig: &Rig, id: WatchId, disarm: u64, child: WatchId) {
    assert!(
        rig.core.watches.get(&child).is_none(),
        "{child:?} is removed"
    );
    assert!(
        rig.slots(child).is_empty(),
        "{child:?}'s slots are released"
    );
    assert!(rig.view(id).live.is_empty());
    assert!(rig.kernel.members(disarm).is_empty());
}

#[test]
fn a_disarming_call_at_a_stop_removes_the_object_and_its_slots_there() {
    let (rig, id, disarm, child, mut armer) = armed();
    let pid = rig.pid;
    let slots = rig.slots(child);
    // A call with another base is not ours.
    let r = record(pid, disarm, pid, 0, BASE + 8);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    assert!(armer.cleared.is_empty());
    assert_eq!(rig.view(id).live, [child]);
    let r = record(pid, disarm, pid, 0, BASE);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    assert_eq!(armer.cleared(), slots);
    gone(&rig, id, disarm, child);
    let c = rig.counts(id);
    assert_eq!((c.disarmed, c.disarmed_at_stop, c.live), (1, 1, 0));
}

#[test]
fn a_disarming_call_out_of_reach_is_done_by_the_objects_thread() {
    let (rig, id, disarm, child, _) = armed();
    let pid = rig.pid;
    let mut far = Armer::reaching(&[pid]);
    let r = record(pid, disarm, pid, 0, BASE);
    assert_eq!(rig.stop(pid, &[r], &mut far), CodeHold::Hold);
    assert!(far.cleared.is_empty());
    rig.wait_resumed(pid, 1);
    gone(&rig, id, disarm, child);
    let c = rig.counts(id);
    assert_eq!((c.disarmed, c.disarmed_at_stop), (1, 0));
}

/// The `FREED` record of `free(BASE)`, as the disarming probe's program
/// writes it: the base out of its set, the breakpoint muted.
fn free_base(rig: &Rig, disarm: u64, child: WatchId) -> CodeRecord {
    let r = rig
        .kernel
        .free_call(rig.pid, rig.pid, disarm, BASE)
        .expect("BASE is live");
    assert_eq!((r.ret, r.args[0]), (child.0, BASE));
    assert_eq!(rig.kernel.muted(rig.pid), [BASE]);
    assert!(
        rig.kernel
            .free_call(rig.pid, rig.pid, disarm, BASE)
            .is_none()
    );
    r
}

#[test]
fn a_freed_object_read_at_a_stop_is_removed_there_and_unmuted() {
    let (rig, id, disarm, child, mut armer) = armed();
    let slots = rig.slots(child);
    let r = free_base(&rig, disarm, child);
    Host::objects_freed(&*rig.core, &[r], Some(&mut armer));
    assert_eq!(armer.cleared(), slots);
    gone(&rig, id, disarm, child);
    assert!(rig.kernel.muted(rig.pid).is_empty(), "closed, then unmuted");
    let c = rig.counts(id);
    assert_eq!(
        (c.freed_without_stop, c.disarmed, c.disarmed_at_stop),
        (1, 1, 1)
    );
    assert_eq!(rig.core.objects.totals().freed_without_stop, 1);
}

#[test]
fn a_freed_object_out_of_reach_stops_reporting_and_is_removed_by_the_objects_thread() {
    let (rig, id, disarm, child, _) = armed();
    let w = rig.core.watches.get(&child).unwrap().clone();
    let r = free_base(&rig, disarm, child);
    let mut far = Armer::reaching(&[rig.pid]);
    Host::objects_freed(&*rig.core, &[r], Some(&mut far));
    assert!(w.freed.load(Ordering::Relaxed), "its hits are not reported");
    assert!(far.cleared.is_empty());
    wait_until("the objects thread removed it", || {
        rig.counts(id).disarmed == 1
    });
    gone(&rig, id, disarm, child);
    assert!(rig.kernel.muted(rig.pid).is_empty());
    let c = rig.counts(id);
    assert_eq!((c.freed_without_stop, c.disarmed_at_stop), (1, 0));
}

#[test]
fn freed_records_no_stop_reads_are_swept_by_the_objects_thread() {
    let (rig, id, disarm, child, _) = armed();
    let r = free_base(&rig, disarm, child);
    rig.kernel.queue_freed(r);
    wait_until("the sweep removed it", || {
        rig.counts(id).disarmed == 1 && rig.kernel.freed_waiting() == 0
    });
    gone(&rig, id, disarm, child);
    assert!(rig.kernel.muted(rig.pid).is_empty());
    assert_eq!(rig.counts(id).freed_without_stop, 1);
}

#[test]
fn a_freed_record_of_an_object_gone_meanwhile_changes_nothing() {
    let (rig, id, disarm, old, mut armer) = armed();
    let pid = rig.pid;
    let stale = free_base(&rig, disarm, old);
    // The base handed out again before the record is read: a new object.
    let event = rig.kernel.probes(pid)[0].key;
    let r = record(pid, event, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let new = rig.only_child(id).id;
    assert_ne!(new, old);
    let cleared = armer.cleared.len();
    Host::objects_freed(&*rig.core, &[stale], Some(&mut armer));
    assert_eq!(armer.cleared.len(), cleared);
    assert_eq!(rig.view(id).live, [new]);
    assert_eq!(rig.core.ledger.armed_on(&[pid, OTHER], new), 2);
    assert_eq!(rig.counts(id).freed_without_stop, 0);
    // A record that is no freeing call is no free either.
    let mut late = rig.kernel.free_call(pid, pid, disarm, BASE).unwrap();
    late.freed = false;
    Host::objects_freed(&*rig.core, &[late], Some(&mut armer));
    assert_eq!(rig.view(id).live, [new]);
}

#[test]
fn removing_the_object_watch_closes_its_probes_and_every_live_object() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let (event, disarm) = (probes.event().key, probes.disarm().key);
    // One object armed at the stop, one by the objects thread.
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, event, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let mut far = Armer::reaching(&[pid]);
    let r = record(pid, event, pid, BASE + 0x100, 0);
    assert_eq!(rig.stop(pid, &[r], &mut far), CodeHold::Hold);
    rig.wait_resumed(pid, 1);
    let live = rig.view(view.id).live;
    assert_eq!(live.len(), 2);
    let removed = rig.core.remove_object_watch(view.id).unwrap();
    assert_eq!(removed.id, view.id);
    let mut closed = rig.kernel.closed_probes(pid);
    closed.sort_unstable();
    assert_eq!(closed, [event, disarm]);
    assert!(rig.kernel.probes(pid).is_empty());
    for child in live {
        assert!(rig.core.watches.get(&child).is_none());
        assert!(rig.slots(child).is_empty());
        assert!(rig.kernel.armed_threads(child).is_empty());
    }
    assert!(rig.core.object_watch(view.id).is_none());
    assert_eq!(rig.core.objects.count(), 0);
    // A late record of its probe arms nothing.
    let r = record(pid, event, pid, BASE + 0x200, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    assert!(rig.core.watches.is_empty());
}
