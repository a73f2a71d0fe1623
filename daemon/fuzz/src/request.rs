//! `decode_spec`: arbitrary bytes → a prost request → the daemon's wire →
//! domain conversions (`wpd::convert`).
//!
//! Input layout: the first byte picks the request type ([`Kind::from_byte`],
//! modulo the number of kinds), the rest is the protobuf encoding of that request.
//!
//! Oracle for `WatchpointSpec` → `WatchSpec`: an independent reference
//! verdict written from the proto comments and the x86-64 rules (not from
//! `arch::x86_64`), so over-rejection is caught as well as over-acceptance;
//! when the conversion succeeds, every documented invariant of the domain
//! value; and `spec_to_pb` round-trips through the wire back to an equal
//! value. Every error goes through [`crate::status::check`].

use std::fmt::Debug;

use prost::Message;
use wpd::model::{Access, BackendKind, HitAction, Scope, WatchSpec};
use wpd::convert;
use wpd_proto::v1 as pb;

use crate::status;

/// First byte after the end of user space on x86-64 with 4-level paging
/// (`TASK_SIZE_MAX`). Written out here on purpose: the oracle must not take
/// its limit from the code under test.
pub const USER_END: u64 = 0x7fff_ffff_f000;

/// Which request an input holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `SetWatchpointRequest` (the only one carrying a `WatchpointSpec`).
    SetWatchpoint = 0,
    /// `AttachRequest`.
    Attach = 1,
    /// `ListThreadsRequest`.
    ListThreads = 2,
    /// `ResumeRequest`.
    Resume = 3,
    /// `StreamEventsRequest`.
    StreamEvents = 4,
    /// `PauseRequest`.
    Pause = 5,
    /// `GetThreadStackRequest`.
    GetThreadStack = 6,
    /// `ReadMemoryRequest`.
    ReadMemory = 7,
}

impl Kind {
    /// Every kind, in selector order.
    pub const ALL: [Kind; 8] = [
        Kind::SetWatchpoint,
        Kind::Attach,
        Kind::ListThreads,
        Kind::Resume,
        Kind::StreamEvents,
        Kind::Pause,
        Kind::GetThreadStack,
        Kind::ReadMemory,
    ];

    /// The kind a selector byte picks (any byte is valid).
    pub fn from_byte(b: u8) -> Kind {
        Kind::ALL[usize::from(b) % Kind::ALL.len()]
    }
}

/// Frames a request as a `decode_spec` input (selector byte + encoding).
pub fn frame(kind: Kind, msg: &impl Message) -> Vec<u8> {
    let mut v = vec![kind as u8];
    msg.encode(&mut v).expect("a Vec grows as needed");
    v
}

/// The `decode_spec` target: never panics unless a property is violated.
pub fn check(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match Kind::from_byte(selector) {
        Kind::SetWatchpoint => set_watchpoint(body),
        Kind::Attach => {
            if let Some(r) = decode::<pb::AttachRequest>(body) {
                check_pid(r.pid);
                check_backend(r.backend);
            }
        }
        Kind::ListThreads => {
            if let Some(r) = decode::<pb::ListThreadsRequest>(body) {
                check_pid(r.pid);
            }
        }
        Kind::Resume => {
            if let Some(r) = decode::<pb::ResumeRequest>(body) {
                check_pid(r.pid);
            }
        }
        Kind::StreamEvents => {
            // Validated inline by the handler (pid ≥ 0); only the wire part here.
            let _ = decode::<pb::StreamEventsRequest>(body);
        }
        Kind::Pause => {
            if let Some(r) = decode::<pb::PauseRequest>(body) {
                check_pid(r.pid);
            }
        }
        Kind::GetThreadStack => {
            if let Some(r) = decode::<pb::GetThreadStackRequest>(body) {
                check_pid(r.pid);
                // 0 means 32 frames; at most 128.
                let want = match r.depth {
                    0 => Some(32),
                    d if d <= 128 => Some(d as usize),
                    _ => None,
                };
                match (convert::stack_depth(r.depth), want) {
                    (Ok(got), Some(w)) => assert_eq!(got, w),
                    (Err(e), None) => {
                        status::check(&e);
                    }
                    (got, want) => panic!("depth {}: got {got:?}, want {want:?}", r.depth),
                }
            }
        }
        Kind::ReadMemory => {
            if let Some(r) = decode::<pb::ReadMemoryRequest>(body) {
                check_pid(r.pid);
                // 1 byte to 1 MiB, all below the end of user space.
                let ok = (1..=1 << 20).contains(&r.length)
                    && r.address
                        .checked_add(u64::from(r.length))
                        .is_some_and(|end| end <= USER_END);
                match convert::read_length(r.address, r.length) {
                    Ok(got) => {
                        assert!(ok, "{} bytes at {:#x} accepted", r.length, r.address);
                        assert_eq!(got, r.length as usize);
                    }
                    Err(e) => {
                        assert!(!ok, "{} bytes at {:#x} refused: {e}", r.length, r.address);
                        status::check(&e);
                    }
                }
            }
        }
    }
}

/// Decodes `body`; on success also checks that prost's re-encoding has the
/// announced length and decodes back to the same message.
fn decode<M: Message + Default + PartialEq + Debug>(body: &[u8]) -> Option<M> {
    let m = M::decode(body).ok()?;
    let again = m.encode_to_vec();
    assert_eq!(again.len(), m.encoded_len(), "encoded_len lies for {m:?}");
    let m2 = M::decode(again.as_slice()).expect("prost's own encoding must decode");
    assert_eq!(m, m2, "decode(encode(m)) != m");
    Some(m)
}

fn check_pid(p: i32) {
    match convert::pid(p) {
        Ok(got) => {
            assert!(p > 0, "pid {p} accepted");
            assert_eq!(got, p);
        }
        Err(e) => {
            assert!(p <= 0, "positive pid {p} refused: {e}");
            status::check(&e);
        }
    }
}

fn check_backend(b: i32) {
    match convert::backend(b) {
        Ok(None) => assert_eq!(b, 0, "backend {b} read as unspecified"),
        Ok(Some(k)) => assert_eq!(convert::backend_to_pb(k) as i32, b, "backend {b} → {k:?}"),
        Err(e) => {
            assert!(!(0..=2).contains(&b), "known backend {b} refused: {e}");
            status::check(&e);
        }
    }
}

fn set_watchpoint(body: &[u8]) {
    let Some(req) = decode::<pb::SetWatchpointRequest>(body) else {
        return;
    };
    let Some(spec) = req.spec else {
        // What the handler answers for a missing spec.
        status::check(&wpd::error::WpdError::InvalidArgument(
            "spec is required".into(),
        ));
        return;
    };
    // A code event's own rules (`convert::code_from_pb`, checked before
    // the spec's): what it refuses is refused with a mapped status.
    let code_verdict = code_reference(&spec);
    match convert::code_from_pb(&spec) {
        Ok(c) => {
            if let Err(rule) = code_verdict {
                panic!("accepted a code event that breaks {rule}: {spec:?} → {c:?}");
            }
            if let Some(c) = c {
                assert_eq!(c.expr, spec.symbol, "the expression is the spec's symbol");
            }
        }
        Err(e) => {
            if code_verdict.is_ok() {
                panic!("refused a valid code event {spec:?}: {e}");
            }
            status::check(&e);
            return;
        }
    }
    let verdict = reference(&spec);
    match WatchSpec::try_from(spec.clone()) {
        Ok(ws) => {
            if let Err(rule) = verdict {
                panic!("accepted a spec that breaks {rule}: {spec:?} → {ws:?}");
            }
            check_valid(&spec, &ws);
            round_trip(&ws);
        }
        Err(e) => {
            if verdict.is_ok() {
                panic!("refused a valid spec {spec:?}: {e}");
            }
            status::check(&e);
        }
    }
}

/// Reference verdict of a code event (CodeEvent's comments): which rule,
/// if any, `s` breaks.
pub fn code_reference(s: &pb::WatchpointSpec) -> Result<(), &'static str> {
    let Some(c) = &s.code_event else {
        return Ok(());
    };
    if c.stop {
        // A code breakpoint: a function, or a file and a line.
        match (c.function.is_empty(), c.file.is_empty(), c.line) {
            (false, true, 0) => {}
            (true, false, l) if l > 0 => {}
            _ => return Err("a code breakpoint is at a function, or at a file's line ≥ 1"),
        }
        if !s.symbol.is_empty()
            || s.length != 0
            || s.address != 0
            || !s.tids.is_empty()
            || !s.thread_name.is_empty()
            || s.follow_forks
            || s.aggregate
            || s.condition.is_some()
            || c.at_return
            || !c.disarm_on.is_empty()
            || c.max_live != 0
            || c.creator_only
        {
            return Err("a code breakpoint arms nothing: no watchpoint field");
        }
        return Ok(());
    }
    if !c.file.is_empty() || c.line != 0 {
        return Err("code_event.file and line need stop");
    }
    if c.function.is_empty() {
        return Err("code_event.function is required");
    }
    if s.symbol.is_empty() {
        return Err("a code event's expression is symbol");
    }
    if s.address != 0 || !s.tids.is_empty() || !s.thread_name.is_empty() || s.follow_forks {
        return Err("a code event has no address, tids, thread_name or follow_forks");
    }
    if s.lease != 0 || s.aggregate {
        return Err("a code event has no lease and no aggregate mode");
    }
    Ok(())
}

/// Reference verdict: which documented rule, if any, `s` breaks.
pub fn reference(s: &pb::WatchpointSpec) -> Result<(), &'static str> {
    if s.pid <= 0 {
        return Err("pid > 0");
    }
    let exec = match s.access {
        1 | 2 => false, // write, read-write
        3 => true,      // exec
        _ => return Err("access ∈ {write, rw, exec}"),
    };
    if s.backtrace_depth > 127 {
        return Err("backtrace_depth ≤ 127");
    }
    if s.keep_recent > 4096 {
        return Err("keep_recent ≤ 4096");
    }
    if s.condition
        .as_ref()
        .is_some_and(|c| !(0..=7).contains(&c.op))
    {
        return Err("condition operator known");
    }
    if s.condition.as_ref().is_some_and(|c| {
        (1..=6).contains(&c.op)
            && !c.value.trim().is_empty()
            && wpd_proto::condition::literal(&c.value).is_err()
    }) {
        return Err("condition value a number or a name");
    }
    if !s.symbol.trim().is_empty() {
        // By name: the range is the daemon's to find in the process.
        if s.address != 0 {
            return Err("an address or a symbol, not both");
        }
        if !(0..=2).contains(&s.on_exec) {
            return Err("exec policy known");
        }
    } else {
        if s.on_exec != 0 {
            return Err("on_exec only with a symbol");
        }
        if s.length == 0 {
            return Err("length > 0");
        }
        if exec && s.length != 1 {
            return Err("exec ⇒ length 1");
        }
        if u128::from(s.address) + u128::from(s.length) > u128::from(USER_END) {
            return Err("address + length ≤ 0x7ffffffff000");
        }
        if min_pieces(s.address, s.length).is_none_or(|n| n > 4) {
            return Err("the range fits in 4 aligned pieces of 1, 2, 4 or 8 bytes");
        }
    }
    if s.tids.iter().any(|&t| t <= 0) {
        return Err("tids > 0");
    }
    if !s.thread_name.is_empty() {
        if !s.tids.is_empty() {
            return Err("tids or thread_name, not both");
        }
        if wpd::model::ThreadGlob::new(&s.thread_name).is_err() {
            return Err("thread_name a shell pattern of 1 to 64 bytes");
        }
    }
    if !s.aggregate && s.exemplars_per_second != 0 {
        return Err("exemplars_per_second only in aggregate mode");
    }
    if s.aggregate && s.exemplars_per_second > 10_000 {
        return Err("exemplars_per_second ≤ 10,000");
    }
    if s.aggregate && !(0..=1).contains(&s.action) {
        return Err("aggregate ⇒ action log");
    }
    if s.signal != 0 && s.action != 4 {
        return Err("signal ⇒ action signal");
    }
    if s.action == 4 {
        let sig = if s.signal == 0 { 6 } else { s.signal };
        // SIGTRAP, SIGKILL, job control (SIGCONT, SIGSTOP, SIGTSTP, SIGTTIN,
        // SIGTTOU) and those ignored by default (SIGCHLD, SIGURG, SIGWINCH).
        if !(1..=64).contains(&sig) || [5, 9, 17, 18, 19, 20, 21, 22, 23, 28].contains(&sig) {
            return Err("signal action ⇒ a signal that can end the process");
        }
    }
    if s.follow_forks && (!s.tids.is_empty() || !s.thread_name.is_empty()) {
        return Err("follow_forks ⇒ process-wide (no tids, no thread_name)");
    }
    if !(0..=2).contains(&s.backend) {
        return Err("backend known");
    }
    if !(0..=4).contains(&s.action) {
        return Err("hit action known");
    }
    Ok(())
}

/// The fewest aligned pieces of 1, 2, 4 or 8 bytes that cover
/// `[addr, addr + len)` exactly, by dynamic programming over the bytes
/// (independent of the daemon's greedy split); `None` above 32 bytes, which
/// no 4 pieces can cover.
fn min_pieces(addr: u64, len: u32) -> Option<usize> {
    if len > 32 {
        return None;
    }
    let n = len as usize;
    let mut best = vec![usize::MAX; n + 1];
    best[n] = 0;
    for i in (0..n).rev() {
        for l in [1usize, 2, 4, 8] {
            if (addr + i as u64).is_multiple_of(l as u64) && i + l <= n && best[i + l] != usize::MAX
            {
                best[i] = best[i].min(best[i + l] + 1);
            }
        }
    }
    Some(best[0])
}

/// Invariants of an accepted spec, and agreement with the wire value.
fn check_valid(s: &pb::WatchpointSpec, w: &WatchSpec) {
    assert!(w.pid > 0 && w.pid == s.pid, "pid {} from {}", w.pid, s.pid);
    assert_eq!(
        u32::from(w.backtrace),
        s.backtrace_depth,
        "backtrace depth changed"
    );
    // 0 keeps the default 16.
    let keep = if s.keep_recent == 0 {
        16
    } else {
        s.keep_recent
    };
    assert_eq!(w.keep_recent, keep, "keep_recent changed");
    assert_eq!(w.follow_forks, s.follow_forks, "follow_forks changed");
    let want_agg = s.aggregate.then_some(if s.exemplars_per_second == 0 {
        10
    } else {
        s.exemplars_per_second
    });
    assert_eq!(w.aggregate, want_agg, "aggregate mode changed");
    match &w.scope {
        Scope::Named(g) => assert_eq!(g.text, s.thread_name, "pattern changed"),
        _ => assert!(
            s.thread_name.is_empty(),
            "thread_name {:?} dropped",
            s.thread_name
        ),
    }
    assert!(w.policy.is_none(), "a policy invented by the conversion");
    let f = &w.filter;
    assert_eq!(
        (f.ignore, f.every, f.max_per_second),
        (s.ignore_count, s.hit_count, s.max_hits_per_second),
        "hit counts changed"
    );
    // Bound to the watched type when the watchpoint is set, not here.
    assert!(f.condition.is_none(), "a condition bound before its type is known");
    assert_eq!(
        w.condition.is_some(),
        s.condition.as_ref().is_some_and(|c| c.op != 0),
        "condition dropped or invented"
    );
    match &w.symbol {
        Some(by_name) => {
            assert_eq!(by_name.expr, s.symbol.trim(), "name changed");
            assert_eq!(by_name.len, s.length, "length override changed");
            assert!(
                w.range.pieces.is_empty(),
                "a name is resolved later, not here"
            );
        }
        None => {
            assert!(s.symbol.trim().is_empty(), "name {:?} dropped", s.symbol);
            check_range(s, w);
        }
    }
    let want_access = match s.access {
        1 => Access::Write,
        2 => Access::ReadWrite,
        _ => Access::Exec,
    };
    assert_eq!(w.access, want_access);
    if w.access == Access::Exec && w.symbol.is_none() {
        assert_eq!(w.range.len, 1, "exec watchpoint of length {}", w.range.len);
    }
    match &w.scope {
        Scope::Process => assert!(s.tids.is_empty(), "tids {:?} became process-wide", s.tids),
        Scope::Threads(t) => {
            assert!(!t.is_empty(), "empty thread list");
            assert!(t.iter().all(|&t| t > 0), "non-positive tid in {t:?}");
            assert!(
                t.windows(2).all(|p| p[0] < p[1]),
                "not sorted/deduplicated: {t:?}"
            );
            let mut want = s.tids.clone();
            want.sort_unstable();
            want.dedup();
            assert_eq!(*t, want, "thread set changed");
        }
        Scope::Named(_) => assert!(s.tids.is_empty(), "tids {:?} dropped", s.tids),
    }
    let want_backend = match s.backend {
        0 => None,
        1 => Some(BackendKind::Perf),
        _ => Some(BackendKind::Ptrace),
    };
    assert_eq!(w.backend, want_backend);
    let want_action = match s.action {
        0 | 1 => HitAction::Log,
        2 => HitAction::Stop,
        3 => HitAction::StopAll,
        _ => HitAction::Signal(if s.signal == 0 { 6 } else { s.signal }),
    };
    assert_eq!(w.action, want_action);
    assert_eq!(w.only_on_change, s.only_on_change);
}

/// The range of a spec set by address: as asked, split into the fewest
/// aligned pieces.
fn check_range(s: &pb::WatchpointSpec, w: &WatchSpec) {
    let r = &w.range;
    assert_eq!(r.addr, s.address, "address changed");
    assert_eq!(r.len, s.length, "length changed");
    let len = r.len;
    assert!(
        u128::from(r.addr) + u128::from(len) <= u128::from(USER_END),
        "{:#x}+{len} past user space",
        r.addr
    );
    // The pieces: aligned, contiguous, covering the range exactly, as few
    // as possible.
    let mut at = r.addr;
    for p in &r.pieces {
        let l = p.len.bytes();
        assert!(matches!(l, 1 | 2 | 4 | 8), "piece length {l}");
        assert_eq!(p.addr, at, "pieces not contiguous: {:?}", r.pieces);
        assert!(
            p.addr.is_multiple_of(u64::from(l)),
            "piece {p:?} misaligned"
        );
        at += u64::from(l);
    }
    assert_eq!(
        at,
        r.addr + u64::from(len),
        "pieces do not cover the range: {r:?}"
    );
    assert_eq!(
        Some(r.pieces.len()),
        min_pieces(r.addr, len),
        "not the fewest pieces: {r:?}"
    );
}

/// domain → wire → bytes → wire → domain gives the same value.
fn round_trip(w: &WatchSpec) {
    let req = pb::SetWatchpointRequest {
        spec: Some(convert::spec_to_pb(w)),
    };
    let bytes = req.encode_to_vec();
    let back = pb::SetWatchpointRequest::decode(bytes.as_slice())
        .expect("encoded request must decode")
        .spec
        .expect("spec survives encoding");
    let w2 = WatchSpec::try_from(back.clone())
        .unwrap_or_else(|e| panic!("spec_to_pb({w:?}) = {back:?} is refused: {e}"));
    assert_eq!(&w2, w, "round trip changed the spec");
}
