//! In-process RPC tests: a range over several slots, all or nothing.

use super::*;

/// A range longer than one slot is one watchpoint holding a slot per piece
/// on every thread, reserved all or nothing; a refusal says how many slots
/// it needs and names who holds the others; a hit names its piece.
#[tokio::test]
async fn a_range_is_one_watchpoint_over_several_slots_all_or_nothing() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;
    let ranged = |addr, length| pb::SetWatchpointRequest {
        spec: Some(pb::WatchpointSpec {
            length,
            ..spec(pid, addr)
        }),
    };
    let set = c
        .set_watchpoint(ranged(0x1000, 24))
        .await
        .unwrap()
        .into_inner();
    let wp = set.watchpoint.unwrap();
    let pieces: Vec<(u64, u32)> = wp.pieces.iter().map(|p| (p.address, p.length)).collect();
    assert_eq!(pieces, vec![(0x1000, 8), (0x1008, 8), (0x1010, 8)]);
    assert!(
        set.warnings
            .iter()
            .any(|w| w.contains("take 3 slots on every thread")),
        "{:?}",
        set.warnings
    );
    let slots = |c: &mut WatchpointsClient<Channel>| {
        let mut c = c.clone();
        async move {
            let t = c
                .list_threads(pb::ListThreadsRequest {
                    pid,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(t.threads.len(), 1);
            t.threads[0]
                .slots
                .iter()
                .map(|s| (s.state, s.watchpoint_id, s.piece))
                .collect::<Vec<_>>()
        }
    };
    let ours = pb::SlotState::Ours as i32;
    let free = pb::SlotState::Free as i32;
    let three = vec![
        (ours, wp.id, 0),
        (ours, wp.id, 1),
        (ours, wp.id, 2),
        (free, 0, 0),
    ];
    assert_eq!(slots(&mut c).await, three, "one id, three pieces");
    assert_eq!(rig.kernel.slots_armed(pid), 3);
    // Two more slots do not fit: refused whole, naming the need and the holder.
    let refused = c.set_watchpoint(ranged(0x2000, 16)).await;
    let status = refused.as_ref().unwrap_err().clone();
    check_refusal(
        "a second range",
        refused,
        Code::ResourceExhausted,
        r::OUT_OF_SLOTS,
        "takes 2 slots on every thread and 1 thread has fewer free",
    );
    assert!(
        status
            .message()
            .contains(&format!("watchpoints #{} (3 slots)", wp.id)),
        "{}",
        status.message()
    );
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata["slots_needed"], "2");
    assert_eq!(slots(&mut c).await, three, "the refusal changed nothing");
    assert_eq!(rig.kernel.slots_armed(pid), 3);
    // One slot does fit.
    let one = c
        .set_watchpoint(ranged(0x2000, 8))
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    assert_eq!(one.pieces.len(), 1);
    // A hit of the third piece names it and its bytes.
    let mut events = c
        .stream_events(pb::StreamEventsRequest {
            pid,
            hits_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(fake_hit(
        &*rig.core,
        &rig.kernel,
        wpd::model::SlotKey::new(WatchId(wp.id), 2),
        pid,
        0x401000
    ));
    let m = tokio::time::timeout(Duration::from_secs(5), events.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match m.event {
        Some(pb::stream_events_response::Event::Hit(h)) => {
            assert_eq!(
                (h.watchpoint_id, h.piece, h.address, h.length),
                (wp.id, 2, 0x1010, 8)
            );
        }
        other => panic!("expected the hit, got {other:?}"),
    }
    // Removed, it gives back every slot.
    c.remove_watchpoint(pb::RemoveWatchpointRequest { id: wp.id })
        .await
        .unwrap();
    assert_eq!(
        slots(&mut c).await,
        vec![(free, 0, 0), (free, 0, 0), (free, 0, 0), (ours, one.id, 0)]
    );
    assert_eq!(rig.kernel.slots_armed(pid), 1);
}
