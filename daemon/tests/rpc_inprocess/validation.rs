//! In-process RPC tests: every handler validates its request and changes nothing when it refuses.

use super::*;

#[tokio::test]
async fn every_handler_validates_its_request_and_changes_nothing_when_it_refuses() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;
    let set = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await
        .unwrap()
        .into_inner();
    // Nothing is mapped at 0x1000: armed, with a warning that says so (and, the process's
    // first watchpoint, the one about its memset where the CPU has fast strings).
    let unmapped: Vec<&String> = set
        .warnings
        .iter()
        .filter(|w| !w.contains("rep stosb"))
        .collect();
    assert!(
        unmapped.len() == 1 && unmapped[0].contains("0x1000 is not mapped"),
        "{:?}",
        set.warnings
    );
    let wp = set.watchpoint.unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mapped = u64::from_str_radix(maps.split('-').next().unwrap(), 16).unwrap();
    let on_mapped = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, mapped)),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(on_mapped.warnings.is_empty(), "{:?}", on_mapped.warnings);
    c.remove_watchpoint(pb::RemoveWatchpointRequest {
        id: on_mapped.watchpoint.unwrap().id,
    })
    .await
    .unwrap();
    let before = listing(&mut c).await;
    let dead = {
        let mut ch = std::process::Command::new("true").spawn().unwrap();
        let p = ch.id() as i32;
        ch.wait().unwrap();
        p
    };
    let with = |f: &dyn Fn(&mut pb::WatchpointSpec)| {
        let mut s = spec(pid, 0x2000);
        f(&mut s);
        pb::SetWatchpointRequest { spec: Some(s) }
    };
    let specs: Vec<(&str, pb::SetWatchpointRequest, Code, &str, &str)> = vec![
        (
            "no spec",
            pb::SetWatchpointRequest { spec: None },
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "spec is required",
        ),
        (
            "length 0",
            with(&|s| s.length = 0),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "length 0",
        ),
        (
            "a range of more slots than a thread has",
            with(&|s| s.length = 40),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "40 bytes at 0x2000 need 5 debug-register slots per thread",
        ),
        (
            "unaligned, one slot too many",
            with(&|s| {
                s.address = 0x2004;
                s.length = 32;
            }),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "need 5 debug-register slots",
        ),
        (
            "exec of 8 bytes",
            with(&|s| s.access = pb::Access::Exec as i32),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "exec watchpoint must have length 1",
        ),
        (
            "kernel address",
            with(&|s| s.address = 0xffff_ffff_8100_0000),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "kernel half",
        ),
        (
            "read only",
            with(&|s| s.access = pb::Access::Read as i32),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "cannot watch reads only",
        ),
        (
            "no access",
            with(&|s| s.access = 0),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "access kind is required",
        ),
        (
            "tid 0",
            with(&|s| s.tids = vec![0]),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "tid must be positive",
        ),
        (
            "a tid of another process",
            with(&|s| s.tids = vec![1]),
            Code::NotFound,
            r::NO_SUCH_THREAD,
            "is not a thread of process",
        ),
        (
            "backend 99",
            with(&|s| s.backend = 99),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "unknown backend",
        ),
        (
            "action 99",
            with(&|s| s.action = 99),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "unknown hit action",
        ),
        (
            "stop on a backend that never stops",
            with(&|s| s.action = pb::HitAction::Stop as i32),
            Code::InvalidArgument,
            r::NEEDS_BACKEND,
            "needs the ptrace backend",
        ),
        (
            "only-on-change on it",
            with(&|s| s.only_on_change = true),
            Code::InvalidArgument,
            r::NEEDS_BACKEND,
            "only-on-change",
        ),
        (
            "pid 0",
            with(&|s| s.pid = 0),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "positive",
        ),
        (
            "a dead pid",
            with(&|s| s.pid = dead),
            Code::NotFound,
            r::NO_SUCH_PROCESS,
            "no process",
        ),
        (
            "the ptrace backend, not running here",
            with(&|s| s.backend = pb::Backend::Ptrace as i32),
            Code::FailedPrecondition,
            r::BACKEND_MISMATCH,
            "detach first",
        ),
    ];
    let code_bp = |f: &dyn Fn(&mut pb::WatchpointSpec, &mut pb::CodeEvent)| {
        let mut s = pb::WatchpointSpec {
            pid,
            ..Default::default()
        };
        let mut c = pb::CodeEvent {
            function: "main".into(),
            stop: true,
            ..Default::default()
        };
        f(&mut s, &mut c);
        s.code_event = Some(c);
        pb::SetWatchpointRequest { spec: Some(s) }
    };
    let mut specs = specs;
    specs.extend([
        (
            "a code breakpoint on a backend that cannot hold a thread",
            code_bp(&|_, _| {}),
            Code::InvalidArgument,
            r::NEEDS_BACKEND,
            "code breakpoints",
        ),
        (
            "a code breakpoint with a watchpoint's expression",
            code_bp(&|s, _| s.symbol = "x".into()),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "arms nothing",
        ),
        (
            "a code breakpoint with a condition",
            code_bp(&|s, _| s.condition = Some(pb::HitCondition::default())),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "no symbol, length",
        ),
        (
            "a code breakpoint at a file without a line",
            code_bp(&|_, c| {
                c.function.clear();
                c.file = "a.c".into();
            }),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "needs code_event.line",
        ),
        (
            "a code breakpoint at a function and a line",
            code_bp(&|_, c| {
                c.file = "a.c".into();
                c.line = 3;
            }),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "not both",
        ),
        (
            "a code breakpoint nowhere",
            code_bp(&|_, c| c.function.clear()),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "needs code_event.function",
        ),
        (
            "a file and line without stop",
            code_bp(&|_, c| {
                c.stop = false;
                c.file = "a.c".into();
                c.line = 3;
            }),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "need code_event.stop",
        ),
    ]);
    for (what, req, code, reason, needle) in specs {
        check_refusal(what, c.set_watchpoint(req).await, code, reason, needle);
        assert_eq!(listing(&mut c).await, before, "{what} changed something");
    }
    // The other handlers.
    check_refusal(
        "Attach(0)",
        c.attach(pb::AttachRequest {
            pid: 0,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        r::INVALID_ARGUMENT,
        "positive",
    );
    check_refusal(
        "Attach(dead)",
        c.attach(pb::AttachRequest {
            pid: dead,
            ..Default::default()
        })
        .await,
        Code::NotFound,
        r::NO_SUCH_PROCESS,
        "no process",
    );
    check_refusal(
        "Attach(another pid, ptrace)",
        {
            let other = Sleeper::start();
            c.attach(pb::AttachRequest {
                pid: other.pid(),
                backend: pb::Backend::Ptrace as i32,
                ..Default::default()
            })
            .await
        },
        Code::FailedPrecondition,
        r::BACKEND_UNAVAILABLE,
        "not started",
    );
    check_refusal(
        "Detach(unattached)",
        c.detach(pb::DetachRequest { pid: dead }).await,
        Code::NotFound,
        r::NOT_ATTACHED,
        "not attached",
    );
    check_refusal(
        "RemoveWatchpoint(99)",
        c.remove_watchpoint(pb::RemoveWatchpointRequest { id: 99 })
            .await,
        Code::NotFound,
        r::NO_SUCH_WATCHPOINT,
        "no watchpoint #99",
    );
    check_refusal(
        "ListWatchpoints(-1)",
        c.list_watchpoints(pb::ListWatchpointsRequest { pid: -1 })
            .await,
        Code::InvalidArgument,
        r::INVALID_ARGUMENT,
        "pid must be 0",
    );
    check_refusal(
        "ListThreads(a tid not listed)",
        c.list_threads(pb::ListThreadsRequest {
            pid,
            tids: vec![1],
            probe: false,
        })
        .await,
        Code::NotFound,
        r::NO_SUCH_THREAD,
        "thread 1",
    );
    check_refusal(
        "StreamEvents(-1)",
        c.stream_events(pb::StreamEventsRequest {
            pid: -1,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        r::INVALID_ARGUMENT,
        "pid must be 0",
    );
    check_refusal(
        "Resume on a backend that never stops",
        c.resume(pb::ResumeRequest { pid, tids: vec![] }).await,
        Code::InvalidArgument,
        r::NEEDS_BACKEND,
        "resuming threads",
    );
    assert_eq!(listing(&mut c).await, before);
    // What works: the watchpoint holds a slot of the thread, and is removed.
    let threads = c
        .list_threads(pb::ListThreadsRequest {
            pid,
            tids: vec![pid; 1000],
            probe: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(threads.threads.len(), 1, "one thread, named 1000 times");
    assert_eq!(threads.threads[0].slots[0].watchpoint_id, wp.id);
    assert_eq!(rig.kernel.armed_threads(WatchId(wp.id)), vec![pid]);
    c.remove_watchpoint(pb::RemoveWatchpointRequest { id: wp.id })
        .await
        .unwrap();
    assert!(rig.kernel.armed_threads(WatchId(wp.id)).is_empty());
    let caps = c
        .get_capabilities(pb::GetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.slots_per_thread, 4);
    assert!(
        caps.backends
            .iter()
            .any(|b| !b.usable && !b.reason.is_empty())
    );
}
