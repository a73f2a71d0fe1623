//! In-process RPC tests: debugger calls validate; leases end with their stream.

use super::*;

#[tokio::test]
async fn debugger_calls_validate_and_leases_end_with_their_stream() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;

    // Not attached: nothing to pause, read or walk.
    let s = c
        .read_memory(pb::ReadMemoryRequest {
            pid,
            address: 0x1000,
            length: 8,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), reason(&s).as_str()),
        (Code::NotFound, r::NOT_ATTACHED)
    );
    for (len, addr) in [(0, 0x1000), ((1 << 20) + 1, 0x1000), (16, 0x7fff_ffff_eff8)] {
        let s = c
            .read_memory(pb::ReadMemoryRequest {
                pid,
                address: addr,
                length: len,
            })
            .await
            .unwrap_err();
        assert_eq!(
            (s.code(), reason(&s).as_str()),
            (Code::InvalidArgument, r::INVALID_ARGUMENT),
            "{len} bytes at {addr:#x}: {s:?}"
        );
    }
    let s = c
        .get_thread_stack(pb::GetThreadStackRequest {
            pid,
            tid: pid,
            depth: 129,
            raw: false,
            locals: false,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    // The fake backend, like perf, never stops threads.
    c.attach(pb::AttachRequest {
        pid,
        ..Default::default()
    })
    .await
    .unwrap();
    for s in [
        c.pause(pb::PauseRequest {
            pid,
            ..Default::default()
        })
        .await
        .unwrap_err(),
        c.get_thread_stack(pb::GetThreadStackRequest {
            pid,
            tid: pid,
            ..Default::default()
        })
        .await
        .unwrap_err(),
    ] {
        assert_eq!(
            (s.code(), reason(&s).as_str()),
            (Code::InvalidArgument, r::NEEDS_BACKEND),
            "{s:?}"
        );
    }
    // Memory of the attached process (the fake backend reads the real one).
    let mapped = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let start = u64::from_str_radix(mapped.split('-').next().unwrap(), 16).unwrap();
    let m = c
        .read_memory(pb::ReadMemoryRequest {
            pid,
            address: start,
            length: 4,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.data, b"\x7fELF", "the first mapping is the ELF header");

    // Leases: a number nobody opened is refused and arms nothing; one that
    // is open ties the watchpoint to its stream.
    let mut leased = spec(pid, 0x1000);
    leased.lease = 12_345;
    let s = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(leased.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(listing(&mut c).await.0.is_empty());
    let mut stream = c
        .stream_events(pb::StreamEventsRequest {
            pid,
            lease: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let lease = match stream.message().await.unwrap().unwrap().event {
        Some(pb::stream_events_response::Event::Leased(l)) => l.lease,
        other => panic!("the first item is the lease, got {other:?}"),
    };
    // Another user cannot use it, even on a process of their own (as root,
    // the test can start one as that user).
    if wpd_test_skip::require_root("starting a process as another uid") {
        use std::os::unix::process::CommandExt as _;
        let theirs = Sleeper(
            std::process::Command::new("sleep")
                .arg("120")
                .uid(4242)
                .gid(4242)
                .spawn()
                .expect("start sleep as uid 4242"),
        );
        let me = std::process::id() as i32;
        let user = Caller {
            userns: wpd::procfs::userns_of(me),
            ..Caller::unprivileged(4242, 4242, Some(me))
        };
        let mut other = rig.client(Some(user)).await;
        let mut foreign = spec(theirs.pid(), 0x1000);
        foreign.lease = lease;
        let s = other
            .set_watchpoint(pb::SetWatchpointRequest {
                spec: Some(foreign),
            })
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert!(
            s.message()
                .contains("not an open event stream of this caller"),
            "{s:?}"
        );
        assert!(listing(&mut c).await.0.is_empty(), "nothing armed");
    }
    leased.lease = lease;
    let wp = c
        .set_watchpoint(pb::SetWatchpointRequest { spec: Some(leased) })
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    assert_eq!(wp.spec.unwrap().lease, lease);
    // A watchpoint without a lease outlives the stream.
    let kept = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x2000)),
        })
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    assert_eq!(listing(&mut c).await.0, vec![wp.id, kept.id]);
    drop(stream);
    let mut left = Vec::new();
    for _ in 0..500 {
        left = listing(&mut c).await.0;
        if left == vec![kept.id] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        left,
        vec![kept.id],
        "the leased watchpoint ends with its stream"
    );
}
