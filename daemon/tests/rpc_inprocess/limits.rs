//! In-process RPC tests: limits refused with their names.

use super::*;

#[tokio::test]
async fn limits_are_refused_with_their_names() {
    let limits = Limits {
        watchpoints_per_caller: 2,
        processes: 1,
        subscribers: 20,
        subscribers_per_caller: 2,
        ..Limits::default()
    };
    let rig = Rig::start(limits, None).await;
    let (a, b) = (Sleeper::start(), Sleeper::start());
    let mut c = rig.client(root()).await;
    for addr in [0x1000, 0x2000] {
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(a.pid(), addr)),
        })
        .await
        .unwrap();
    }
    check_refusal(
        "a third watchpoint",
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(a.pid(), 0x3000)),
        })
        .await,
        Code::ResourceExhausted,
        r::LIMIT_REACHED,
        "watchpoints, code events and policies per caller (limit 2)",
    );
    check_refusal(
        "a second process",
        c.attach(pb::AttachRequest {
            pid: b.pid(),
            ..Default::default()
        })
        .await,
        Code::ResourceExhausted,
        r::LIMIT_REACHED,
        "attached processes (limit 1)",
    );
    // Subscriptions: two per unprivileged caller; root has its reserve.
    let mut user = rig.client(stranger()).await;
    let _s1 = user
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap();
    let _s2 = user
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap();
    check_refusal(
        "a third subscription",
        user.stream_events(pb::StreamEventsRequest::default()).await,
        Code::ResourceExhausted,
        r::LIMIT_REACHED,
        "event subscribers per caller (limit 2)",
    );
    let _s3 = c
        .stream_events(pb::StreamEventsRequest::default())
        .await
        .unwrap();
}
