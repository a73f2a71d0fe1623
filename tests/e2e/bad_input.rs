//! End-to-end tests of refused requests: every invalid WatchpointSpec from a table, and unknown
//! ids and pids on the other RPCs. A refusal must carry the right code and change nothing.

use anyhow::{Result, bail, ensure};
use tonic::Code;
use wpd_proto::v1::{
    Access, DetachRequest, HitAction, ListThreadsRequest, ListWatchpointsRequest,
    RemoveWatchpointRequest, ResumeRequest, SetWatchpointRequest, WatchpointSpec,
};
use wpd_tests::{
    Backend, Client, Daemon, Snapshot, TargetProc, both_backends, dead_pid, ensure_unchanged,
    expect_status, require_root_perf, rpc, rpc_ok, set_watchpoint, snapshot, write_spec,
};

/// One invalid request: how to spoil a valid spec, the expected code, and words (matched
/// case-insensitively) the message must contain.
struct Case {
    name: String,
    mutate: Box<dyn Fn(&mut WatchpointSpec)>,
    code: Code,
    needles: Vec<String>,
}

fn case(
    name: impl Into<String>,
    code: Code,
    needles: &[&str],
    mutate: impl Fn(&mut WatchpointSpec) + 'static,
) -> Case {
    Case {
        name: name.into(),
        mutate: Box::new(mutate),
        code,
        needles: needles.iter().map(|s| s.to_string()).collect(),
    }
}

/// Applies the case to `base`, sends it, checks the refusal and that nothing changed.
async fn check(
    client: &mut Client,
    base: &WatchpointSpec,
    before: &Snapshot,
    c: &Case,
) -> Result<()> {
    let mut spec = base.clone();
    (c.mutate)(&mut spec);
    let what = format!("{} ({spec:?})", c.name);
    let result = rpc(client.set_watchpoint(SetWatchpointRequest { spec: Some(spec) })).await?;
    let needles: Vec<&str> = c.needles.iter().map(String::as_str).collect();
    expect_status(&what, result, c.code, &needles)?;
    let after = snapshot(client, base.pid).await?;
    ensure_unchanged(&what, before, &after)?;
    Ok(())
}

both_backends!(invalid_watchpoint_specs_are_refused);

/// k. Every invalid spec of the contract is refused with its code and changes nothing. With
/// the perf backend, also what only ptrace can do: stopping on a hit, only-on-change.
async fn invalid_watchpoint_specs_are_refused(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let addr = target.vars[2];
            let worker = target.worker_tids()?[0];
            let dead = dead_pid()?;
            let stranger = std::process::id() as i32; // a live thread of another process

            // Something to keep unchanged: the process attached with one watchpoint.
            set_watchpoint(&mut client, write_spec(backend, pid, target.vars[1])).await?;
            let base = write_spec(backend, pid, addr);
            let before = snapshot(&mut client, pid).await?;

            use Code::{InvalidArgument as Invalid, NotFound};
            let mut cases = vec![
                // Ranges are split into aligned pieces, one slot each: refused
                // only when they need more slots than a thread has.
                case(
                    "32 bytes at +4: 5 slots",
                    Invalid,
                    &["need 5", "slots"],
                    move |s| {
                        s.address = addr + 4;
                        s.length = 32;
                    },
                ),
                case(
                    "33 bytes: 5 slots",
                    Invalid,
                    &["need 5", "--len"],
                    move |s| s.length = 33,
                ),
                case("40 bytes at +1: 8 slots", Invalid, &["need 8"], move |s| {
                    s.address = addr + 1;
                    s.length = 40;
                }),
                case("length 0", Invalid, &["length 0"], |s| s.length = 0),
                case("length u32::MAX", Invalid, &["slots"], |s| {
                    s.length = u32::MAX
                }),
                case("exec with length 8", Invalid, &[], |s| {
                    s.access = Access::Exec as i32
                }),
                case("exec with length 4", Invalid, &[], |s| {
                    s.access = Access::Exec as i32;
                    s.length = 4;
                }),
                case("kernel address", Invalid, &[], |s| {
                    s.address = 0xffff_ffff_8100_0000
                }),
                case("top of the kernel half", Invalid, &[], |s| {
                    s.address = 0xffff_ffff_ffff_fff8
                }),
                case("lowest non-canonical", Invalid, &[], |s| {
                    s.address = 0x0000_8000_0000_0000
                }),
                case("non-canonical", Invalid, &[], |s| {
                    s.address = 0x00ff_0000_0000_0000
                }),
                case("start of the kernel half", Invalid, &[], |s| {
                    s.address = 0xffff_8000_0000_0000
                }),
                case("0x7ffffffff000", Invalid, &[], |s| {
                    s.address = 0x7fff_ffff_f000
                }),
                case("last user page", Invalid, &[], |s| {
                    s.address = 0x7fff_ffff_fff8
                }),
                case("ACCESS_UNSPECIFIED", Invalid, &[], |s| {
                    s.access = Access::Unspecified as i32
                }),
                case("ACCESS_READ", Invalid, &["x86", "read"], |s| {
                    s.access = Access::Read as i32
                }),
                case("pid 0", Invalid, &[], |s| s.pid = 0),
                case("pid -1", Invalid, &[], |s| s.pid = -1),
                case("pid i32::MIN", Invalid, &[], |s| s.pid = i32::MIN),
                case("pid that does not exist", NotFound, &[], move |s| {
                    s.pid = dead
                }),
            ];
            cases.push(case("undefined hit action 99", Invalid, &[], |s| {
                s.action = 99
            }));
            cases.push(case("undefined backend 7", Invalid, &[], |s| s.backend = 7));
            if backend == Backend::Perf {
                // perf breakpoints never stop the target and their values are read too late to
                // tell a change: the daemon must refuse, and say which backend can.
                for action in [HitAction::Stop, HitAction::StopAll] {
                    cases.push(case(
                        format!("{action:?} on perf"),
                        Invalid,
                        &["ptrace"],
                        move |s| s.action = action as i32,
                    ));
                }
                cases.push(case("only_on_change on perf", Invalid, &["ptrace"], |s| {
                    s.only_on_change = true
                }));
            }
            // Past what 4 slots cover, from the variable's 64-byte-aligned
            // address: 40 bytes need 5 pieces, 64 need 8.
            for len in [40, 64, 4096] {
                cases.push(case(
                    format!("length {len}"),
                    Invalid,
                    &["slots"],
                    move |s| s.length = len,
                ));
            }
            let (p, st, d, w) = (
                pid.to_string(),
                stranger.to_string(),
                dead.to_string(),
                worker,
            );
            cases.push(case(
                "tid of another process",
                NotFound,
                &[&st, &p],
                move |s| s.tids = vec![stranger],
            ));
            cases.push(case(
                "tid that does not exist",
                NotFound,
                &[&d, &p],
                move |s| s.tids = vec![dead],
            ));
            cases.push(case(
                "a good tid and a foreign one",
                NotFound,
                &[&st, &p],
                move |s| s.tids = vec![w, stranger],
            ));

            let mut failures = Vec::new();
            for c in &cases {
                if let Err(e) = check(&mut client, &base, &before, c).await {
                    failures.push(format!("- {}: {e:#}", c.name));
                }
            }
            if !failures.is_empty() {
                bail!(
                    "{} of {} invalid requests were not handled as specified:\n{}",
                    failures.len(),
                    cases.len(),
                    failures.join("\n")
                );
            }

            // Control: the unspoiled spec is accepted, so the refusals were about the spoils.
            set_watchpoint(&mut client, base).await?;
            Ok(())
        }
        .await,
    )
}

both_backends!(removing_an_unknown_id_is_not_found);

/// RemoveWatchpoint of an id the daemon never issued is NotFound and changes nothing.
async fn removing_an_unknown_id_is_not_found(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let id = set_watchpoint(&mut client, write_spec(backend, target.pid, target.vars[1]))
                .await?
                .watchpoint
                .unwrap_or_default()
                .id;
            let before = snapshot(&mut client, target.pid).await?;
            for unknown in [id + 1000, 999_999, u64::MAX] {
                let r =
                    rpc(client.remove_watchpoint(RemoveWatchpointRequest { id: unknown })).await?;
                expect_status(
                    &format!("RemoveWatchpoint({unknown})"),
                    r,
                    Code::NotFound,
                    &[],
                )?;
                let after = snapshot(&mut client, target.pid).await?;
                ensure_unchanged(&format!("RemoveWatchpoint({unknown})"), &before, &after)?;
            }
            Ok(())
        }
        .await,
    )
}

/// ListThreads, Detach and Resume of a process that is not attached are NotFound and attach
/// nothing. (Not per backend: an unattached process has none.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unattached_pid_is_not_found() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let pid = target.pid;
            let dead = dead_pid()?;
            for p in [pid, dead] {
                let r = rpc(client.list_threads(ListThreadsRequest {
                    pid: p,
                    tids: vec![],
                    probe: false,
                }))
                .await?;
                expect_status(&format!("ListThreads({p})"), r, Code::NotFound, &[])?;
                let r = rpc(client.list_threads(ListThreadsRequest {
                    pid: p,
                    tids: vec![],
                    probe: true,
                }))
                .await?;
                expect_status(&format!("ListThreads({p}, probe)"), r, Code::NotFound, &[])?;
                let r = rpc(client.detach(DetachRequest { pid: p })).await?;
                expect_status(&format!("Detach({p})"), r, Code::NotFound, &[])?;
                let r = rpc(client.resume(ResumeRequest {
                    pid: p,
                    tids: vec![],
                }))
                .await?;
                expect_status(&format!("Resume({p})"), r, Code::NotFound, &[])?;
            }
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty() && list.processes.is_empty(),
                "nothing should be attached: {list:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// The reason of a status's ErrorInfo detail.
fn reason(s: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    s.get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

/// The daemon never attaches to itself (its own hits would feed back into it), and pid 1 only
/// when asked for explicitly (`allow_init`); both refused before anything is touched. (The
/// explicit case is not tried: the tests attach only to processes they started.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_itself_and_init_are_refused() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let own = daemon.pid();
            let r = rpc(client.attach(wpd_proto::v1::AttachRequest {
                pid: own,
                ..Default::default()
            }))
            .await?;
            let s = expect_status(
                "Attach(the daemon)",
                r,
                Code::InvalidArgument,
                &["daemon itself"],
            )?;
            ensure!(reason(&s) == wpd_proto::reason::OWN_PROCESS, "{s:?}");
            let r = rpc(client.set_watchpoint(SetWatchpointRequest {
                spec: Some(write_spec(Backend::Perf, own, 0x1000)),
            }))
            .await?;
            expect_status(
                "SetWatchpoint(the daemon)",
                r,
                Code::InvalidArgument,
                &["daemon itself"],
            )?;
            let r = rpc(client.attach(wpd_proto::v1::AttachRequest {
                pid: 1,
                ..Default::default()
            }))
            .await?;
            let s = expect_status("Attach(1)", r, Code::FailedPrecondition, &["allow-init"])?;
            ensure!(reason(&s) == wpd_proto::reason::INIT_PROCESS, "{s:?}");
            let r = rpc(client.set_watchpoint(SetWatchpointRequest {
                spec: Some(write_spec(Backend::Perf, 1, 0x1000)),
            }))
            .await?;
            expect_status("SetWatchpoint(1)", r, Code::FailedPrecondition, &["init"])?;
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(list.processes.is_empty(), "attached: {list:?}");
            Ok(())
        }
        .await,
    )
}

/// A thread named 100,000 times in ListThreads is listed once (as SetWatchpoint counts it once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_threads_lists_a_repeated_tid_once() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let target = TargetProc::start(&["--threads", "2"]).await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            set_watchpoint(
                &mut client,
                write_spec(Backend::Perf, target.pid, target.vars[1]),
            )
            .await?;
            let r = rpc_ok(
                "ListThreads",
                client.list_threads(ListThreadsRequest {
                    pid: target.pid,
                    tids: vec![target.pid; 100_000],
                    probe: false,
                }),
            )
            .await?;
            ensure!(
                r.threads.len() == 1 && r.threads[0].tid == target.pid,
                "{} entries for one thread",
                r.threads.len()
            );
            Ok(())
        }
        .await,
    )
}
