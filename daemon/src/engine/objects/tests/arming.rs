//! Setting an object watch, and arming its objects: at the stop by the
//! tracer when it reaches every thread, else by the objects thread; the
//! bound on live objects; what is counted and not armed.

use super::super::CodeSpec;
use super::{Armer, BASE, OTHER, OWNER, Rig, malloced, record, spec};
use crate::backend::CodeHold;
use crate::model::{Scope, Tid};

fn tids(slots: &[(Tid, u8)]) -> Vec<Tid> {
    slots.iter().map(|s| s.0).collect()
}

#[test]
fn set_opens_the_event_probe_and_a_disarming_probe_sized_by_max_live() {
    let rig = Rig::start();
    let (view, probes) = rig.set(CodeSpec {
        max_live: 3,
        ..malloced()
    });
    assert!(view.ready && !view.pending);
    let (e, d) = (probes.event(), probes.disarm());
    // At malloc's return, stopping every caller.
    assert!(e.ret && !e.without_stop && e.gate.is_none() && e.set_max == 0);
    // At free's entry, in the kernel: only a live base, and it stops no one.
    assert!(!d.ret && d.without_stop && d.set_max == 3);
    assert_ne!(e.key, d.key);
    assert_eq!(e.path, d.path, "malloc and free are libc's");
    assert!(e.path.to_string_lossy().contains("libc.so"), "{e:?}");
    assert_ne!(e.offset, d.offset);
    assert_eq!(e.owner, OWNER);
    assert!(rig.kernel.attached().contains(&rig.pid));
    assert_eq!(rig.core.objects.ids_on(rig.pid), [view.id]);
    assert!(
        rig.core
            .object_watches()
            .iter()
            .any(|v| v.id == view.id && v.ready)
    );
    // Without a disarming function, the event's probe alone (here at the
    // entry, the object from an argument).
    let (_, probes) = rig.set(CodeSpec {
        at_return: false,
        expr: "$arg0+8".into(),
        disarm_on: None,
        ..malloced()
    });
    assert_eq!(probes.0.len(), 1, "{probes:?}");
    assert!(!probes.event().ret);
}

#[test]
fn a_refused_probe_undoes_the_set() {
    let rig = Rig::start();
    // The disarming probe, second, is refused: the first is closed.
    rig.kernel.fail_probe_after(1);
    let e = rig
        .core
        .set_object_watch(spec(rig.pid), malloced(), OWNER)
        .expect_err("a refused probe");
    assert!(e.to_string().contains("uprobe"), "{e}");
    assert!(rig.kernel.probes(rig.pid).is_empty());
    assert_eq!(rig.kernel.closed_probes(rig.pid).len(), 1);
    assert_eq!(rig.core.objects.count(), 0);
    assert!(rig.core.object_watches().is_empty());
    assert!(
        !rig.kernel.attached().contains(&rig.pid),
        "the attach it made is undone"
    );
}

#[test]
fn an_object_is_armed_at_the_stop_when_its_tracer_reaches_every_thread() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, probes.event().key, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let child = rig.only_child(view.id);
    assert!(child.object);
    assert_eq!((child.spec.range.addr, child.spec.range.len), (BASE, 8));
    assert_eq!(child.spec.scope, Scope::Process);
    // Programmed by the tracer on both threads, committed in the ledger.
    assert_eq!(tids(&armer.slots_of(child.id)), [pid, OTHER]);
    assert_eq!(rig.slots(child.id), armer.slots_of(child.id));
    assert_eq!(rig.core.ledger.armed_on(&[pid, OTHER], child.id), 2);
    let c = rig.counts(view.id);
    assert_eq!((c.armed, c.armed_at_stop, c.live), (1, 1, 1));
    assert_eq!((c.failed, c.no_slot, c.over_limit), (0, 0, 0));
    assert_eq!(rig.core.objects.totals().armed_at_stop, 1);
    // The disarming probe's set knows the base: its watchpoint and the
    // breakpoint's address.
    assert_eq!(
        rig.kernel.members(probes.disarm().key),
        [(BASE, vec![child.id.0, BASE])]
    );
    assert!(rig.kernel.resumed().is_empty(), "no round trip");
    assert!(
        rig.kernel.armed_threads(child.id).is_empty(),
        "no ordinary arm"
    );
}

#[test]
fn an_object_is_armed_by_the_objects_thread_when_a_thread_is_out_of_reach() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let mut armer = Armer::reaching(&[pid]);
    let r = record(pid, probes.event().key, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Hold);
    assert!(armer.armed.is_empty() && armer.cleared.is_empty());
    // Armed, then the thread resumed.
    rig.wait_resumed(pid, 1);
    let child = rig.only_child(view.id);
    assert_eq!(rig.kernel.armed_threads(child.id), [pid, OTHER]);
    assert_eq!(rig.core.ledger.armed_on(&[pid, OTHER], child.id), 2);
    let c = rig.counts(view.id);
    assert_eq!((c.armed, c.armed_at_stop, c.live), (1, 0, 1));
    assert_eq!(
        rig.kernel.members(probes.disarm().key),
        [(BASE, vec![child.id.0, BASE])]
    );
}

#[test]
fn creator_only_needs_the_creating_thread_alone() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(CodeSpec {
        creator_only: true,
        ..malloced()
    });
    let mut armer = Armer::reaching(&[pid]);
    let r = record(pid, probes.event().key, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let child = rig.only_child(view.id);
    assert_eq!(child.spec.scope, Scope::Threads(vec![pid]));
    assert_eq!(tids(&armer.slots_of(child.id)), [pid]);
    assert_eq!(tids(&rig.slots(child.id)), [pid]);
}

#[test]
fn a_process_busy_with_an_operation_sends_the_object_to_the_objects_thread() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let proc = rig.core.procs.get(&pid).unwrap().clone();
    let op = proc.lock_op();
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, probes.event().key, pid, BASE, 0);
    // A tracer never waits for an operation.
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Hold);
    assert!(armer.armed.is_empty());
    drop(op);
    rig.wait_resumed(pid, 1);
    let c = rig.counts(view.id);
    assert_eq!((c.armed, c.armed_at_stop, c.live), (1, 0, 1));
}

#[test]
fn max_live_bounds_the_live_objects_and_counts_the_others() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(CodeSpec {
        max_live: 2,
        ..malloced()
    });
    let event = probes.event().key;
    let mut armer = Armer::reaching(&[pid, OTHER]);
    for base in [BASE, BASE + 0x100, BASE + 0x200] {
        let r = record(pid, event, pid, base, 0);
        assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    }
    let c = rig.counts(view.id);
    assert_eq!((c.armed, c.over_limit, c.live), (2, 1, 2));
    assert_eq!(armer.armed.len(), 2, "the third is not armed");
    assert_eq!(rig.core.objects.totals().over_limit, 1);
    let bases: Vec<u64> = rig
        .kernel
        .members(probes.disarm().key)
        .iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(bases, [BASE, BASE + 0x100]);
    // One freed: room for the next.
    let free = record(pid, probes.disarm().key, pid, 0, BASE);
    assert_eq!(rig.stop(pid, &[free], &mut armer), CodeHold::Run);
    let r = record(pid, event, pid, BASE + 0x300, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let c = rig.counts(view.id);
    assert_eq!((c.armed, c.disarmed, c.over_limit, c.live), (3, 1, 1, 2));
}

#[test]
fn a_null_base_or_an_address_out_of_user_space_is_counted_not_armed() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let event = probes.event().key;
    let mut near = Armer::reaching(&[pid, OTHER]);
    let mut far = Armer::reaching(&[pid]);
    let cases = [
        (0, CodeHold::Run),
        (0, CodeHold::Hold),
        // Non-canonical: no breakpoint can take it.
        (0x8000_0000_0000, CodeHold::Run),
        (0x8000_0000_0000, CodeHold::Hold),
    ];
    for (n, (base, hold)) in cases.into_iter().enumerate() {
        let armer = if hold == CodeHold::Run {
            &mut near
        } else {
            &mut far
        };
        let r = record(pid, event, pid, base, 0);
        assert_eq!(rig.stop(pid, &[r], armer), hold, "{base:#x}");
        if hold == CodeHold::Hold {
            rig.wait_resumed(pid, n.div_ceil(2));
        }
        assert_eq!(rig.counts(view.id).failed, n as u64 + 1, "{base:#x}");
    }
    let c = rig.counts(view.id);
    assert_eq!((c.armed, c.live, c.no_slot), (0, 0, 0));
    assert!(near.armed.is_empty() && far.armed.is_empty());
    assert!(rig.core.watches.is_empty(), "no watchpoint set");
    assert!(rig.kernel.members(probes.disarm().key).is_empty());
    assert_eq!(rig.core.objects.totals().failed, 4);
}

#[test]
fn a_thread_without_a_slot_at_the_stop_undoes_every_thread() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let mut armer = Armer {
        full: vec![OTHER],
        ..Armer::reaching(&[pid, OTHER])
    };
    let r = record(pid, probes.event().key, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let c = rig.counts(view.id);
    assert_eq!((c.no_slot, c.armed, c.live), (1, 0, 0));
    // Programmed on both, refused on one: the other cleared, every slot
    // released.
    let (id, _) = armer.armed[0];
    assert_eq!(tids(&armer.slots_of(id)), [pid, OTHER]);
    assert_eq!(tids(&armer.cleared()), [pid]);
    assert!(rig.slots(id).is_empty());
    assert!(rig.core.watches.get(&id).is_none());
    assert!(rig.kernel.members(probes.disarm().key).is_empty());
}

#[test]
fn the_same_base_again_replaces_the_old_object() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, probes.event().key, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let old = rig.only_child(view.id);
    // Freed without the disarming function, handed out again.
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let new = rig.only_child(view.id);
    assert_ne!(old.id, new.id);
    assert_eq!(armer.cleared(), armer.slots_of(old.id));
    assert!(rig.core.watches.get(&old.id).is_none());
    assert!(rig.slots(old.id).is_empty());
    assert_eq!(rig.core.ledger.armed_on(&[pid, OTHER], new.id), 2);
    assert_eq!(
        rig.kernel.members(probes.disarm().key),
        [(BASE, vec![new.id.0, BASE])]
    );
    let c = rig.counts(view.id);
    assert_eq!((c.armed, c.live), (2, 1));
}

#[test]
fn a_base_the_disarming_set_refuses_is_dropped_and_counted() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    rig.kernel.refuse_members(true);
    let event = probes.event().key;
    // At the stop.
    let mut armer = Armer::reaching(&[pid, OTHER]);
    let r = record(pid, event, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    let (id, _) = armer.armed[0];
    assert_eq!(
        armer.cleared(),
        armer.slots_of(id),
        "its free would not be seen"
    );
    assert!(rig.slots(id).is_empty());
    assert_eq!(rig.counts(view.id).failed, 1);
    // By the objects thread.
    let mut far = Armer::reaching(&[pid]);
    let r = record(pid, event, pid, BASE + 0x100, 0);
    assert_eq!(rig.stop(pid, &[r], &mut far), CodeHold::Hold);
    rig.wait_resumed(pid, 1);
    let c = rig.counts(view.id);
    assert_eq!((c.failed, c.live), (2, 0));
    assert!(rig.core.watches.is_empty());
}

#[test]
fn records_of_another_process_or_of_no_watch_arm_nothing() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(malloced());
    let key = probes.event().key;
    let mut armer = Armer::reaching(&[pid, OTHER]);
    // The watch's key, at another process's stop.
    let other = pid + 1;
    let r = record(other, key, other, BASE, 0);
    let hold = crate::backend::Host::code_event(&*rig.core, other, other, &[r], &mut armer);
    assert_eq!(hold, CodeHold::Run);
    // A key no watch has.
    let r = record(pid, key + 2 * 1000, pid, BASE, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Run);
    assert!(armer.armed.is_empty());
    assert_eq!(rig.counts(view.id), Default::default());
}
