//! The parts that need no process: the bound on live objects, the counts'
//! view, the probes' keys, why an event is pending, and the breakpoint
//! addresses of a range.

use std::sync::atomic::Ordering;

use super::super::pending::{Pending, pending_reason, pending_view};
use super::super::{DISARM_MAX_LIVE, ObjectCounts, disarm_key, event_key, live_bound, range_addrs};
use super::{breakpoint, malloced, spec};
use crate::backend::CODE_SET_MAX;
use crate::model::{Access, WatchId};
use crate::symbols::SymbolError;

#[test]
fn live_bound_is_max_live_and_the_disarming_set_bounds_it() {
    let bound = |max_live, disarm: Option<&str>| {
        live_bound(&super::super::CodeSpec {
            max_live,
            disarm_on: disarm.map(Into::into),
            ..malloced()
        })
    };
    // Without a disarming function: as asked, 0 meaning none.
    assert_eq!(bound(0, None), 0);
    assert_eq!(bound(7, None), 7);
    assert_eq!(bound(u32::MAX, None), u32::MAX);
    // With one: the kernel's set needs a size.
    assert_eq!(bound(0, Some("free")), DISARM_MAX_LIVE);
    assert_eq!(bound(7, Some("free")), 7);
    assert_eq!(bound(u32::MAX, Some("free")), CODE_SET_MAX);
    const { assert!(DISARM_MAX_LIVE <= CODE_SET_MAX) };
}

#[test]
fn counts_view_means_the_hold_over_the_objects_tried() {
    let c = ObjectCounts::default();
    assert_eq!(c.view(0).mean_hold_ns, 0, "nothing tried: no mean");
    c.armed.store(2, Ordering::Relaxed);
    c.no_slot.store(1, Ordering::Relaxed);
    c.failed.store(1, Ordering::Relaxed);
    // Over the bound: never held, not in the mean.
    c.over_limit.store(5, Ordering::Relaxed);
    c.held_ns.store(400, Ordering::Relaxed);
    c.disarmed.store(3, Ordering::Relaxed);
    c.armed_at_stop.store(1, Ordering::Relaxed);
    c.disarmed_at_stop.store(2, Ordering::Relaxed);
    c.freed_without_stop.store(4, Ordering::Relaxed);
    let v = c.view(9);
    assert_eq!(
        (v.armed, v.no_slot, v.failed, v.over_limit, v.live),
        (2, 1, 1, 5, 9)
    );
    assert_eq!(v.mean_hold_ns, 100);
    assert_eq!((v.disarmed, v.armed_at_stop, v.disarmed_at_stop), (3, 1, 2));
    assert_eq!(v.freed_without_stop, 4);
}

#[test]
fn keys_tell_the_event_from_its_disarming_call_and_name_the_watch() {
    let ids = [1, 2, 3, 1 << 40, (1 << 62) - 1].map(WatchId);
    for id in ids {
        let (e, d) = (event_key(id), disarm_key(id));
        // The record's key gives the watch back, and which probe it was.
        assert_eq!(WatchId(e >> 1), id);
        assert_eq!(WatchId(d >> 1), id);
        assert_eq!(e & 1, 0, "{id:?}'s event key");
        assert_eq!(d & 1, 1, "{id:?}'s disarming key");
        // No key of one watch is a key of another.
        for other in ids.iter().filter(|o| **o != id) {
            assert!(![event_key(*other), disarm_key(*other)].contains(&e));
            assert!(![event_key(*other), disarm_key(*other)].contains(&d));
        }
    }
}

#[test]
fn pending_reason_says_what_did_not_resolve_and_names_no_pid() {
    let pid = 424_242;
    let cases = [
        (
            SymbolError::NoSuchModule {
                pid,
                module: "libx.so".into(),
                loaded: vec!["sleep".into()],
            },
            "no module \"libx.so\" is loaded yet",
        ),
        (
            SymbolError::ModuleNotLoaded {
                pid,
                module: "libx.so".into(),
                loaded: vec![],
            },
            "no module \"libx.so\" is loaded yet",
        ),
        (
            SymbolError::Unknown {
                pid,
                name: "frob".into(),
                searched: 1,
                closest: vec![],
                stripped: vec![],
            },
            "no function named \"frob\" in the 1 module loaded",
        ),
        (
            SymbolError::Unknown {
                pid,
                name: "frob".into(),
                searched: 3,
                closest: vec!["frobs".into(), "frob2".into()],
                stripped: vec![],
            },
            "no function named \"frob\" in the 3 modules loaded (closest: frobs, frob2)",
        ),
        (
            SymbolError::SourceNotLoaded {
                pid,
                file: "a.c".into(),
                line: 3,
                searched: 1,
                closest: vec![],
            },
            "no line table names \"a.c\" (1 module with line tables loaded)",
        ),
        (
            SymbolError::SourceNotLoaded {
                pid,
                file: "a.c".into(),
                line: 3,
                searched: 2,
                closest: vec!["b.c".into()],
            },
            "no line table names \"a.c\" (2 modules with line tables loaded; closest: b.c)",
        ),
    ];
    for (e, want) in cases {
        // (A module not loaded is what a name not pending is refused with.)
        assert!(
            e.may_resolve_later() || matches!(e, SymbolError::ModuleNotLoaded { .. }),
            "{e:?} keeps an event pending"
        );
        let got = pending_reason(&e);
        assert_eq!(got, want);
        assert!(!got.contains(&pid.to_string()), "{got:?} names the pid");
    }
}

#[test]
fn pending_view_is_listed_pending_with_its_reason_and_nothing_live() {
    let p = Pending {
        id: WatchId(17),
        owner: 1000,
        spec: spec(4321),
        code: breakpoint("f"),
        why: "no module \"libx.so\" is loaded yet".into(),
    };
    let v = pending_view(&p);
    assert_eq!(v.id, WatchId(17));
    assert!(v.pending && v.ready, "listed, as pending");
    assert_eq!(v.pending_why.as_deref(), Some(p.why.as_str()));
    assert!(v.live.is_empty() && v.place.is_none());
    assert_eq!(v.hits, 0);
    assert_eq!(v.counts, Default::default());
    assert_eq!(v.code, p.code);
}

#[test]
fn range_addrs_are_one_breakpoint_address_per_piece() {
    let addrs = |addr, len| {
        let r = crate::arch::validate(addr, len, Access::Write).unwrap();
        range_addrs(&r).collect::<Vec<u64>>()
    };
    assert_eq!(addrs(0x1000, 8), [0x1000]);
    assert_eq!(addrs(0x1004, 8), [0x1004, 0x1008]);
    assert_eq!(addrs(0x1001, 3), [0x1001, 0x1002]);
    assert_eq!(addrs(0x1000, 32), [0x1000, 0x1008, 0x1010, 0x1018]);
}

#[test]
fn code_spec_at_is_the_function_or_the_line() {
    assert_eq!(malloced().at(), "malloc");
    let line = super::super::CodeSpec {
        line: Some(("src/a.c".into(), 12)),
        ..breakpoint("")
    };
    assert_eq!(line.at(), "src/a.c:12");
}
