//! The calls a debugger front end needs besides watchpoints: Pause (hold
//! every thread), GetThreadStack (a held thread's symbolized stack),
//! ReadMemory (as much as is readable), and leases (watchpoints that end
//! with their client's event stream). On real C targets the tests start.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use tonic::Code;
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::*;
use wpd_tests::{
    CTarget, Daemon, EventStream, attach, expect_status, require_backend, require_root_perf,
    resume, rpc_ok, thread_states, write_spec,
};

fn reason_of(s: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    s.get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_every_thread_and_their_stacks_can_be_read() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("threads 3").await?;
    t.cmd("spin 2").await?;
    let result = async {
        let mut c = daemon.client().await?;
        attach(&mut c, t.pid, Backend::Ptrace).await?;
        // A running thread has no stack to read.
        let s = expect_status(
            "stack of a running thread",
            c.get_thread_stack(GetThreadStackRequest {
                pid: t.pid,
                tid: t.pid,
                ..Default::default()
            })
            .await,
            Code::FailedPrecondition,
            &["running", "pause"],
        )?;
        ensure!(reason_of(&s) == wpd_proto::reason::THREAD_NOT_HELD, "{s:?}");

        let held = rpc_ok(
            "Pause",
            c.pause(PauseRequest {
                pid: t.pid,
                ..Default::default()
            }),
        )
        .await?
        .held;
        let states = thread_states(&mut c, t.pid).await?;
        ensure!(held.len() == states.len(), "held {held:?} of {states:?}");
        ensure!(
            states.iter().all(|(_, s)| *s == ThreadState::StoppedByPeer),
            "{states:?}"
        );
        let v = t.read_i64("counter")?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        ensure!(
            t.read_i64("counter")? == v,
            "counter changed while every thread was held"
        );

        // Each spinner is somewhere in spin_worker's loop: its stack shows it.
        let mut spinners = 0;
        let mut seen = Vec::new();
        for &tid in &held {
            let st = rpc_ok(
                "GetThreadStack",
                c.get_thread_stack(GetThreadStackRequest {
                    pid: t.pid,
                    tid,
                    depth: 8,
                    raw: false,
                    locals: false,
                }),
            )
            .await?;
            ensure!(!st.frames.is_empty() && st.frames.len() <= 8, "{st:?}");
            ensure!(st.sp != 0, "{st:?}");
            // Every general register, where the thread is held.
            let reg = |n: &str| st.registers.iter().find(|r| r.name == n).map(|r| r.value);
            ensure!(
                st.registers.len() == 18
                    && reg("rsp") == Some(st.sp)
                    && reg("rbp") == Some(st.fp)
                    && reg("rip") == Some(st.frames[0].ip),
                "registers {:?} against sp {:#x}, fp {:#x}, ip {:#x}",
                st.registers,
                st.sp,
                st.fp,
                st.frames[0].ip
            );
            seen.push(
                st.frames
                    .iter()
                    .map(|f| format!("{}@{:#x}", f.function, f.ip))
                    .collect::<Vec<_>>()
                    .join(" < "),
            );
            // In spin_worker's loop or in the bump_counter it calls (held in
            // bump_counter's prologue, before it pushed its frame pointer,
            // the walk skips spin_worker: frame pointers say nothing there).
            if let Some(f) = st
                .frames
                .iter()
                .find(|f| f.function == "spin_worker" || f.function == "bump_counter")
            {
                spinners += 1;
                ensure!(f.file.ends_with("ctarget.c") && f.line > 0, "{f:?}");
            }
        }
        ensure!(
            spinners == 2,
            "{spinners} stacks in spin_worker, want 2; stacks: {seen:#?}"
        );
        // Depth is bounded.
        expect_status(
            "depth 129",
            c.get_thread_stack(GetThreadStackRequest {
                pid: t.pid,
                tid: held[0],
                depth: 129,
                raw: false,
                locals: false,
            })
            .await,
            Code::InvalidArgument,
            &["128"],
        )?;

        let resumed = resume(&mut c, t.pid, &[]).await?;
        ensure!(resumed.len() == held.len(), "{resumed:?} vs {held:?}");
        t.changes("counter").await.context("after Resume")?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A thread held at its hit: each frame's parameters and locals are read from DWARF where
/// the frame is. In `bump_counter(long v)` the parameter `v` is the value just stored; in its
/// caller `spin_worker` the local `v` is the same (it passed `++v`), in memory on the stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locals_of_every_frame_are_read_where_the_thread_is_held() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut c, wpd_tests::hits_only(t.pid)).await?;
        let spec = WatchpointSpec {
            pid: t.pid,
            symbol: "counter".into(),
            access: Access::Write as i32,
            backend: Backend::Ptrace as i32,
            action: HitAction::Stop as i32,
            ..Default::default()
        };
        wpd_tests::set_watchpoint(&mut c, spec).await?;
        t.cmd("spin 1").await?;
        let hit = events
            .collect_hits(1, Duration::from_secs(10))
            .await?
            .remove(0);
        ensure!(hit.stopped, "{hit:?}");
        let stored = u64::from_le_bytes(hit.value.clone().try_into().unwrap_or_default());
        let st = rpc_ok(
            "GetThreadStack",
            c.get_thread_stack(GetThreadStackRequest {
                pid: t.pid,
                tid: hit.tid,
                depth: 8,
                raw: false,
                locals: true,
            }),
        )
        .await?;
        ensure!(st.locals.len() == st.frames.len(), "{st:?}");
        let var = |frame: usize, name: &str| {
            st.locals[frame]
                .variables
                .iter()
                .find(|v| v.name == name)
                .cloned()
        };
        let value = |v: &LocalVariable| {
            let mut b = [0u8; 8];
            b[..v.value.len().min(8)].copy_from_slice(&v.value[..v.value.len().min(8)]);
            u64::from_le_bytes(b)
        };
        ensure!(
            st.frames[0].function == "bump_counter",
            "{:?}",
            st.frames[0]
        );
        let p = var(0, "v").with_context(|| format!("bump_counter's v: {:?}", st.locals[0]))?;
        ensure!(
            p.parameter
                && p.r#type.starts_with("long")
                && p.error.is_empty()
                && value(&p) == stored,
            "bump_counter's v is {p:?}, the store was {stored}"
        );
        let at = st
            .frames
            .iter()
            .position(|f| f.function == "spin_worker")
            .context("no spin_worker frame")?;
        let v = var(at, "v").with_context(|| format!("spin_worker's v: {:?}", st.locals[at]))?;
        let arg = var(at, "arg").context("spin_worker's arg")?;
        ensure!(
            !v.parameter && arg.parameter && value(&v) == stored && v.address > st.sp,
            "spin_worker's v is {v:?} (sp {:#x}), the store was {stored}",
            st.sp
        );
        resume(&mut c, t.pid, &[]).await?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A program built without frame pointers (`-O2 -fomit-frame-pointer`): a held thread's
/// stack is unwound with the call frame information of its modules, through the program's
/// own functions (a call GCC inlined named with the function it was inlined into) into the
/// C library's thread start, to the end of the chain (no note).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacks_unwind_code_without_frame_pointers() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-nofp").await?;
    t.cmd("spin 2").await?;
    let result = async {
        let mut c = daemon.client().await?;
        attach(&mut c, t.pid, Backend::Ptrace).await?;
        let held = rpc_ok(
            "Pause",
            c.pause(PauseRequest {
                pid: t.pid,
                ..Default::default()
            }),
        )
        .await?
        .held;
        let mut spinners = 0;
        let mut seen = Vec::new();
        for &tid in &held {
            let st = rpc_ok(
                "GetThreadStack",
                c.get_thread_stack(GetThreadStackRequest {
                    pid: t.pid,
                    tid,
                    depth: 32,
                    raw: false,
                    locals: false,
                }),
            )
            .await?;
            let names: Vec<String> = st
                .frames
                .iter()
                .map(|f| {
                    let outer: Vec<&str> = f.inlined.iter().map(|i| i.function.as_str()).collect();
                    format!("{}@{:#x} (inlined in {outer:?})", f.function, f.ip)
                })
                .collect();
            seen.push(format!("{} (note {:?})", names.join(" < "), st.note));
            // spin_worker's own frame, or the frame of bump_counter inlined into it (-O2
            // inlines the call: a thread paused there is in bump_counter's code, with
            // spin_worker in the frame's inlined chain).
            let Some(at) = st.frames.iter().position(|f| {
                f.function == "spin_worker" || f.inlined.iter().any(|i| i.function == "spin_worker")
            }) else {
                continue;
            };
            spinners += 1;
            // spin_worker's callers: the C library's thread start (start_thread, then clone3
            // or clone), and nothing said against the chain.
            let callers = &st.frames[at + 1..];
            ensure!(
                callers.len() >= 2
                    && callers.iter().all(|f| f.module.contains("libc.so"))
                    && st.note.is_empty(),
                "spin_worker's callers are not the C library's thread start: {}",
                seen.last().map(String::as_str).unwrap_or_default()
            );
        }
        ensure!(
            spinners == 2,
            "{spinners} stacks through spin_worker, want 2; stacks: {seen:#?}"
        );
        resume(&mut c, t.pid, &[]).await?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_stacks_need_a_stopping_backend() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        attach(&mut c, t.pid, Backend::Perf).await?;
        for (what, r) in [
            (
                "Pause on perf",
                c.pause(PauseRequest {
                    pid: t.pid,
                    ..Default::default()
                })
                .await
                .map(|_| ()),
            ),
            (
                "GetThreadStack on perf",
                c.get_thread_stack(GetThreadStackRequest {
                    pid: t.pid,
                    tid: t.pid,
                    ..Default::default()
                })
                .await
                .map(|_| ()),
            ),
        ] {
            let s = expect_status(what, r, Code::InvalidArgument, &["ptrace"])?;
            ensure!(
                reason_of(&s) == wpd_proto::reason::NEEDS_BACKEND,
                "{what}: {s:?}"
            );
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// The end of a mapping of `pid` that no other mapping follows.
fn mapping_end_before_a_hole(pid: i32) -> Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let ranges: Vec<(u64, u64, bool)> = maps
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (a, b) = w.next()?.split_once('-')?;
            let readable = w.next()?.starts_with('r');
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
                readable,
            ))
        })
        .collect();
    ranges
        .windows(2)
        .find(|w| w[0].2 && w[0].1 < w[1].0)
        .map(|w| w[0].1)
        .context("no readable mapping followed by a hole")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_memory_returns_what_is_readable() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        // Not attached: nothing is read.
        expect_status(
            "ReadMemory before Attach",
            c.read_memory(ReadMemoryRequest {
                pid: t.pid,
                address: t.addr("counter"),
                length: 8,
            })
            .await,
            Code::NotFound,
            &["not attached"],
        )?;
        attach(&mut c, t.pid, Backend::Perf).await?;
        t.cmd("set counter 4242").await?;
        let r = rpc_ok(
            "ReadMemory",
            c.read_memory(ReadMemoryRequest {
                pid: t.pid,
                address: t.addr("counter"),
                length: 8,
            }),
        )
        .await?;
        ensure!(
            r.data == 4242i64.to_le_bytes() && r.unreadable == 0,
            "{r:?}"
        );
        ensure!(r.error.is_empty(), "{r:?}");
        // Across the end of a mapping: the readable part, and why not more.
        let end = mapping_end_before_a_hole(t.pid)?;
        let r = rpc_ok(
            "ReadMemory across a hole",
            c.read_memory(ReadMemoryRequest {
                pid: t.pid,
                address: end - 24,
                length: 64,
            }),
        )
        .await?;
        ensure!(r.data.len() == 24 && r.unreadable == 40, "{r:?}");
        ensure!(r.error.contains("not mapped"), "{r:?}");
        for (len, addr, needle) in [
            (0, 0x1000, "1 to"),
            ((1 << 20) + 1, 0x1000, "1 to"),
            (16, 0x7fff_ffff_eff8, "end of user space"),
            (16, u64::MAX - 4, "end of user space"),
        ] {
            expect_status(
                &format!("ReadMemory of {len} bytes at {addr:#x}"),
                c.read_memory(ReadMemoryRequest {
                    pid: t.pid,
                    address: addr,
                    length: len,
                })
                .await,
                Code::InvalidArgument,
                &[needle],
            )?;
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_watchpoint_ends_with_its_stream() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    t.cmd("spin 1").await?;
    let result = async {
        let mut c = daemon.client().await?;
        let mut events = EventStream::subscribe(
            &mut c,
            StreamEventsRequest {
                pid: t.pid,
                lease: true,
                ..Default::default()
            },
        )
        .await?;
        let lease = events
            .wait_for(Duration::from_secs(5), "the lease", |e| {
                Ok(match e {
                    Event::Leased(l) => Some(l.lease),
                    _ => None,
                })
            })
            .await?;
        // Someone else's lease number, or none that is open: refused, and
        // nothing is armed.
        let mut spec = write_spec(Backend::Ptrace, t.pid, t.addr("counter"));
        spec.action = HitAction::StopAll as i32;
        spec.lease = lease ^ 0x5555;
        expect_status(
            "a lease that is not open",
            c.set_watchpoint(SetWatchpointRequest {
                spec: Some(spec.clone()),
            })
            .await,
            Code::InvalidArgument,
            &["lease", "not an open event stream"],
        )?;
        spec.lease = lease;
        let wp = rpc_ok(
            "SetWatchpoint with the lease",
            c.set_watchpoint(SetWatchpointRequest { spec: Some(spec) }),
        )
        .await?
        .watchpoint
        .context("no watchpoint")?;
        ensure!(wp.spec.as_ref().is_some_and(|s| s.lease == lease), "{wp:?}");
        // The spinner hits and is held with every other thread.
        events
            .wait_for(Duration::from_secs(10), "a stopping hit", |e| {
                Ok(match e {
                    Event::Hit(h) if h.stopped => Some(()),
                    _ => None,
                })
            })
            .await?;
        // The stream goes away: the watchpoint with it, and the threads run.
        drop(events);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = c
                .list_watchpoints(ListWatchpointsRequest { pid: t.pid })
                .await?
                .into_inner()
                .watchpoints;
            let states = thread_states(&mut c, t.pid).await?;
            if left.is_empty() && states.iter().all(|(_, s)| *s == ThreadState::Running) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "10 s after the stream ended: {} watchpoints, threads {states:?}",
                left.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t.changes("counter")
            .await
            .context("the spinner, once the stream ended")?;
        Ok(())
    }
    .await;
    daemon.finish(result)
}
