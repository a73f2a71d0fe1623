//! In-process RPC tests: authentication and authorization refusals and their statuses.

use super::*;

#[tokio::test]
async fn authentication_and_authorization_refusals_map_to_their_statuses() {
    let rig = Rig::start(Limits::default(), Some("s3cret")).await;
    let target = Sleeper::start();
    let pid = target.pid();
    // No caller identity on the connection: the token decides.
    let mut anon = rig.client(None).await;
    check_refusal(
        "no token",
        anon.get_stats(pb::GetStatsRequest {}).await,
        Code::Unauthenticated,
        r::UNAUTHENTICATED,
        "missing",
    );
    let with = |v: &[&str]| {
        let mut req = Request::new(pb::GetStatsRequest {});
        for t in v {
            req.metadata_mut()
                .append("authorization", t.parse().unwrap());
        }
        req
    };
    check_refusal(
        "a wrong token",
        anon.get_stats(with(&["Bearer nope"])).await,
        Code::Unauthenticated,
        r::UNAUTHENTICATED,
        "invalid token",
    );
    check_refusal(
        "two headers",
        anon.get_stats(with(&["Bearer s3cret", "Bearer s3cret"]))
            .await,
        Code::Unauthenticated,
        r::UNAUTHENTICATED,
        "2 `authorization` headers",
    );
    assert!(anon.get_stats(with(&["bearer s3cret"])).await.is_ok());
    // A caller that does not own the process.
    let mut other = rig.client(stranger()).await;
    check_refusal(
        "a stranger's watch",
        other
            .set_watchpoint(pb::SetWatchpointRequest {
                spec: Some(spec(pid, 0x1000)),
            })
            .await,
        Code::PermissionDenied,
        r::PERMISSION_DENIED,
        "caller uid 54321 does not own the process",
    );
    let mut c = rig.client(root()).await;
    check_refusal(
        "the daemon itself",
        c.attach(pb::AttachRequest {
            pid: std::process::id() as i32,
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        r::OWN_PROCESS,
        "daemon itself",
    );
    check_refusal(
        "pid 1",
        c.attach(pb::AttachRequest {
            pid: 1,
            ..Default::default()
        })
        .await,
        Code::FailedPrecondition,
        r::INIT_PROCESS,
        "--allow-init",
    );
    // The kernel's refusals, through the fake.
    rig.kernel.take_foreign_slots(pid, 4);
    let full = c
        .set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await;
    check_refusal(
        "no free slot",
        full,
        Code::ResourceExhausted,
        r::OUT_OF_SLOTS,
        "out of debug-register slots",
    );
    rig.kernel.take_foreign_slots(pid, 0);
    rig.kernel.fail_next_arm(FakeFailure::Emfile);
    check_refusal(
        "out of fds",
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await,
        Code::ResourceExhausted,
        r::FD_LIMIT,
        "nothing was changed",
    );
    rig.kernel.fail_next_arm(FakeFailure::Eperm);
    check_refusal(
        "refused by the kernel",
        c.set_watchpoint(pb::SetWatchpointRequest {
            spec: Some(spec(pid, 0x1000)),
        })
        .await,
        Code::PermissionDenied,
        r::PERMISSION_DENIED,
        "operation not permitted",
    );
    // Every refusal above left nothing, the attach they needed included.
    assert_eq!(listing(&mut c).await, (vec![], vec![]));
    assert!(rig.kernel.attached().is_empty());
}
