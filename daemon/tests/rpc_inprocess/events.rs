//! In-process RPC tests: hits reach subscribers; losses count when they happen.

use super::*;

#[tokio::test]
async fn hits_reach_subscribers_and_losses_count_when_they_happen() {
    let rig = Rig::start(Limits::default(), None).await;
    let target = Sleeper::start();
    let pid = target.pid();
    let mut c = rig.client(root()).await;
    let wp = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await
        .unwrap()
        .into_inner()
        .watchpoint
        .unwrap();
    let id = WatchId(wp.id);
    let mut reader = c
        .stream_events(pb::StreamEventsRequest {
            pid,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let stalled_client = rig.client(root()).await;
    let mut stalled = stalled_client
        .clone()
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(fake_hit(&*rig.core, &rig.kernel, id, pid, 0x401000));
    let first = tokio::time::timeout(Duration::from_secs(5), reader.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match first.event {
        Some(pb::stream_events_response::Event::Hit(h)) => {
            assert_eq!((h.watchpoint_id, h.tid, h.ip), (wp.id, pid, 0x401000));
        }
        other => panic!("expected the hit, got {other:?}"),
    }
    drop(reader);
    // Until the server has seen the reader go, it loses events too.
    for _ in 0..200 {
        let s = c
            .get_stats(pb::GetStatsRequest {})
            .await
            .unwrap()
            .into_inner();
        if s.subscribers == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Far more than the ring holds, while `stalled` does not read.
    let n = 3 * wpd::events::BUS_CAPACITY;
    for _ in 0..n {
        fake_hit(&*rig.core, &rig.kernel, id, pid, 0x401000);
    }
    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(stats.subscriber_dropped > 0, "{stats:?}");
    assert_eq!(stats.hits, n as u64 + 1);
    // Reading now: what was kept, and one report of what was lost.
    let mut told = 0;
    let mut last = 0u64;
    while let Ok(Ok(Some(m))) =
        tokio::time::timeout(Duration::from_millis(500), stalled.message()).await
    {
        if let Some(pb::stream_events_response::Event::Dropped(d)) = &m.event {
            assert_eq!(d.last_seq, m.seq);
            assert_eq!(d.last_seq - d.first_seq + 1, d.count);
            told += d.count;
        } else if last != 0 {
            assert_eq!(m.seq, last + 1, "a gap without a loss report");
        }
        last = m.seq;
    }
    assert!(told > 0);
    let after = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stats.subscriber_dropped, told,
        "counted before the read = told after"
    );
    assert_eq!(after.subscriber_dropped, told, "and not counted twice");
}
