//! Watching by name: a struct is one watchpoint over several slots, a heap
//! object is watched through its pointers, hits name the function and
//! source line of the store, backtraces follow frame pointers, places go
//! once per stream, a library loaded later is watched by name until it is
//! unloaded, and exec resolves again or removes.

use super::*;

both_backends!(a_struct_is_one_watchpoint_over_several_slots);

/// `stats` (32 bytes with its padding) is one watchpoint holding 4 slots on
/// every thread, in pieces of 8 bytes; a store into `stats.flags[2]` is reported
/// by that one id with the piece and bytes written.
async fn a_struct_is_one_watchpoint_over_several_slots(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let resp = set_watchpoint(&mut client, by_name(backend, t.pid, "stats")).await?;
            let wp = resp.watchpoint.clone().unwrap_or_default();
            let base = t.addr("stats");
            let pieces: Vec<(u64, u32)> = wp.pieces.iter().map(|p| (p.address, p.length)).collect();
            ensure!(
                pieces == vec![(base, 8), (base + 8, 8), (base + 16, 8), (base + 24, 8)],
                "pieces {pieces:x?}"
            );
            let sym = resp.symbol.clone().unwrap_or_default();
            ensure!(sym.size == 32 && sym.type_name == "struct stats", "{sym:?}");
            let threads = list_threads(&mut client, t.pid, false).await?;
            for th in &threads.threads {
                let mut held: Vec<(u64, u32)> = th
                    .slots
                    .iter()
                    .filter(|s| s.state == SlotState::Ours as i32)
                    .map(|s| (s.watchpoint_id, s.piece))
                    .collect();
                held.sort_unstable();
                ensure!(
                    held == vec![(wp.id, 0), (wp.id, 1), (wp.id, 2), (wp.id, 3)],
                    "thread {}: {held:?}",
                    th.tid
                );
            }
            // A second watchpoint has no slot left: refused, naming the holder.
            let r = rpc(client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest {
                spec: Some(by_name(backend, t.pid, "counter")),
            }))
            .await?;
            expect_status(
                "a fifth slot",
                r,
                Code::ResourceExhausted,
                &[&format!("#{}", wp.id)],
            )?;

            t.cmd("set flag2 513").await?;
            let hit = one_hit(&mut events, "the store into stats.flags[2]").await?;
            // flags[2] (stats+16) is the first 2 bytes of the third piece.
            ensure!(hit.watchpoint_id == wp.id && hit.piece == 2, "{hit:?}");
            ensure!(
                (hit.address, hit.length) == (base + 16, 8),
                "the piece's 8 bytes: {hit:?}"
            );
            // 513 = 0x0201, little-endian.
            ensure!(
                hit.value.get(0..2) == Some(&[0x01, 0x02][..]),
                "value {:x?}",
                hit.value
            );
            check_location(
                hit.location.as_ref().context("no location")?,
                "set_flag2",
                "set_flag2",
                "ct-pie",
            )?;
            Ok(())
        }
        .await,
    )
}

both_backends!(a_heap_object_is_watched_through_its_pointers);

/// `conns->next->state`: the pointers are read from the process when the
/// watchpoint is set, and the watchpoint is on the heap object they lead to
/// (the address the program prints); `wpctl watch` says so; a store into
/// that field is a hit naming its function and line.
async fn a_heap_object_is_watched_through_its_pointers(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let want = t.addr("conn1state");
            let r = resolve(&mut client, t.pid, "conns->next->state").await?;
            let sym = r.symbol.clone().unwrap_or_default();
            ensure!(
                sym.address == want && sym.size == 4 && sym.type_name == "int",
                "resolved to {sym:?}, the program says {want:#x}"
            );
            let ep = daemon.endpoint();
            let pid = t.pid.to_string();
            let backend_arg = match backend {
                Backend::Ptrace => "ptrace",
                _ => "perf",
            };
            let out = run_wpctl(
                &[
                    "--endpoint",
                    &ep,
                    "watch",
                    "--pid",
                    &pid,
                    "--backend",
                    backend_arg,
                    "--symbol",
                    "conns->next->state",
                ],
                Duration::from_secs(20),
            )
            .await?;
            ensure!(
                out.code == Some(0)
                    && out.stdout.contains(&format!("{want:#x}"))
                    && out.stdout.contains("followed"),
                "wpctl watch: {out:?}"
            );
            t.cmd("set conn1state 3").await?;
            let hit = one_hit(&mut events, "set conn1state").await?;
            ensure!(
                hit.address == want && hit.value == 3i32.to_le_bytes(),
                "{hit:?}"
            );
            check_location(
                hit.location.as_ref().context("no location")?,
                "set",
                "set_conn1state",
                "ct-pie",
            )
        }
        .await,
    )
}

both_backends!(hits_name_function_and_line);

/// Hits carry the function and source line of the store, in the executable
/// and in a library, and `wpctl events` shows them; `raw` subscribers get
/// the bare instruction pointer; ResolveSymbol turns that pointer back into
/// the same place.
async fn hits_name_function_and_line(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let mut raw = EventStream::subscribe(
                &mut client,
                StreamEventsRequest {
                    pid: t.pid,
                    watchpoint_ids: vec![],
                    hits_only: true,
                    raw: true,
                    lease: false,
                    ..Default::default()
                },
            )
            .await?;
            set_watchpoint(&mut client, by_name(backend, t.pid, "stats.errors")).await?;
            set_watchpoint(&mut client, by_name(backend, t.pid, "lib_counter")).await?;
            set_watchpoint(&mut client, by_name(backend, t.pid, "initialized")).await?;

            let ep = daemon.endpoint();
            let pid = t.pid.to_string();
            let listening = rpc_ok("GetStats", client.get_stats(GetStatsRequest {}))
                .await?
                .subscribers;
            let cli = tokio::spawn(async move {
                run_wpctl(
                    &[
                        "--endpoint",
                        &ep,
                        "events",
                        "--pid",
                        &pid,
                        "--hits-only",
                        "--count",
                        "3",
                    ],
                    Duration::from_secs(20),
                )
                .await
            });
            wait_for_subscribers(&mut client, listening + 1).await?;

            t.cmd("set errors 5").await?;
            let hit = one_hit(&mut events, "set errors").await?;
            let loc = hit.location.clone().context("no location")?;
            check_location(&loc, "set_errors", "set_errors", "ct-pie")?;
            ensure!(loc.ip == hit.ip, "{loc:?} vs ip {:#x}", hit.ip);

            t.cmd("set lib 6").await?;
            let hit = one_hit(&mut events, "set lib").await?;
            check_location(
                hit.location.as_ref().context("no location")?,
                "lib_set",
                "lib_set",
                "libctlib.so",
            )?;

            // A store in main's own body (inlined `set`): its line.
            t.cmd("set initialized 8").await?;
            let hit = one_hit(&mut events, "set initialized").await?;
            let loc = hit.location.clone().context("no location")?;
            let (_, line) = line_of("set_initialized");
            ensure!(loc.function == "set" && loc.line == line, "{loc:?}");

            let raw_hits = raw.collect_hits(3, HIT_TIMEOUT).await?;
            ensure!(
                raw_hits.iter().all(|h| h.location.is_none() && h.ip != 0),
                "raw hits: {raw_hits:?}"
            );

            // The instruction's address, back through ResolveSymbol.
            let r = rpc_ok(
                "ResolveSymbol(address)",
                client.resolve_symbol(ResolveSymbolRequest {
                    pid: t.pid,
                    name: String::new(),
                    address: loc.lookup_address,
                    ..Default::default()
                }),
            )
            .await?;
            ensure!(
                r.kind == "function" && r.symbol.as_ref().is_some_and(|s| s.name == "set"),
                "{r:?}"
            );
            ensure!(r.location.as_ref().is_some_and(|l| l.line == line), "{r:?}");
            // A data address: the variable holding it, and the offset.
            let r = rpc_ok(
                "ResolveSymbol(data)",
                client.resolve_symbol(ResolveSymbolRequest {
                    pid: t.pid,
                    name: String::new(),
                    address: t.addr("errors"),
                    ..Default::default()
                }),
            )
            .await?;
            ensure!(
                r.kind == "variable"
                    && r.offset == 8
                    && r.symbol.as_ref().is_some_and(|s| s.name == "stats"),
                "{r:?}"
            );

            let out = cli.await??;
            ensure!(
                out.code == Some(0),
                "wpctl events: {:?} {}",
                out.code,
                out.stderr
            );
            let (_, l1) = line_of("set_errors");
            let (_, l2) = line_of("lib_set");
            ensure!(
                out.stdout
                    .contains(&format!("at set_errors (ctarget.c:{l1})"))
                    && out.stdout.contains(&format!("at lib_set (ctlib.c:{l2})")),
                "wpctl events:\n{}",
                out.stdout
            );
            Ok(())
        }
        .await,
    )
}

both_backends!(backtraces_follow_frame_pointers);

/// `--backtrace`: a store three calls deep reports deep_c, with deep_b,
/// deep_a and main as its callers at the lines of the calls; code without
/// frame pointers gives what can be known and says why the chain is short.
async fn backtraces_follow_frame_pointers(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let mut spec = by_name(backend, t.pid, "counter");
            spec.backtrace_depth = 8;
            set_watchpoint(&mut client, spec).await?;
            t.cmd("deep").await?;
            let hit = one_hit(&mut events, "deep").await?;
            check_location(
                hit.location.as_ref().context("no location")?,
                "deep_c",
                "deep_c",
                "ct-pie",
            )?;
            let chain: Vec<(String, u32)> = hit
                .backtrace
                .iter()
                .map(|f| (f.function.clone(), f.line))
                .collect();
            ensure!(
                chain.len() >= 4,
                "short chain {chain:?} ({})",
                hit.backtrace_note
            );
            ensure!(
                chain[..3]
                    == [
                        ("deep_b".to_string(), line_of("deep_b").1),
                        ("deep_a".to_string(), line_of("deep_a").1),
                        ("main".to_string(), chain[2].1),
                    ],
                "chain {chain:?}"
            );
            // Every hit of it carries its chain.
            t.cmd("set counter 3").await?;
            let hit = one_hit(&mut events, "set counter").await?;
            ensure!(
                !hit.backtrace.is_empty(),
                "the same watchpoint keeps its depth"
            );

            // Without frame pointers (-O2 -fomit-frame-pointer): the hit's
            // own location is exact, inlining included; on perf the chain is
            // what the frame pointer register happened to lead to (the kernel
            // walks frame pointers), on ptrace the unwound one; never longer
            // than asked.
            let mut t2 = CTarget::start("ct-nofp").await?;
            let mut ev2 = EventStream::subscribe(&mut client, wpd_tests::hits_only(t2.pid)).await?;
            let mut spec = by_name(backend, t2.pid, "counter");
            spec.backtrace_depth = 4;
            set_watchpoint(&mut client, spec).await?;
            t2.cmd("deep").await?;
            let hit = one_hit(&mut ev2, "deep without frame pointers").await?;
            let loc = hit.location.clone().context("no location")?;
            ensure!(loc.line == line_of("deep_c").1, "{loc:?}");
            ensure!(hit.backtrace.len() <= 4, "{:?}", hit.backtrace);
            ensure!(
                loc.inlined.iter().any(|i| i.function == "deep_b"),
                "the inlined callers: {loc:?}"
            );
            if backend == Backend::Ptrace {
                // The thread is stopped: its stack is unwound with the call frame
                // information, through main's callers in the C library to _start.
                let names: Vec<&str> = hit.backtrace.iter().map(|f| f.function.as_str()).collect();
                ensure!(
                    names.last() == Some(&"_start")
                        && names.iter().any(|n| n.starts_with("__libc_start"))
                        && hit.backtrace_note.is_empty(),
                    "ptrace without frame pointers: chain {names:?}, note {:?}",
                    hit.backtrace_note
                );
            } else if hit.backtrace.is_empty() {
                ensure!(
                    hit.backtrace_note.contains("frame-pointer"),
                    "{:?}",
                    hit.backtrace_note
                );
            }
            eprintln!(
                "without frame pointers: {} ({}:{}), inlined in {:?}; chain {:?}; note {:?}",
                loc.function,
                loc.file,
                loc.line,
                loc.inlined.iter().map(|i| &i.function).collect::<Vec<_>>(),
                hit.backtrace
                    .iter()
                    .map(|f| &f.function)
                    .collect::<Vec<_>>(),
                hit.backtrace_note
            );
            Ok(())
        }
        .await,
    )
}

/// Hits at the same places, to a stream that asked for each place once:
/// the first hit there carries the places' fields, later ones their
/// numbers alone, and filled in from the first they say what a stream
/// with every field says. A stream opened later gets the fields again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn places_go_once_per_stream() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut full = EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let once = |pid| StreamEventsRequest {
                places_once: true,
                ..wpd_tests::hits_only(pid)
            };
            let mut numbered = EventStream::subscribe(&mut client, once(t.pid)).await?;
            let mut spec = by_name(Backend::Perf, t.pid, "counter");
            spec.backtrace_depth = 8;
            set_watchpoint(&mut client, spec).await?;
            let mut places = wpd_proto::places::Places::new();
            // Each location's fields with its number left out.
            let bare = |h: &Hit| -> Vec<Location> {
                h.location
                    .iter()
                    .chain(&h.backtrace)
                    .map(|l| Location {
                        place_id: 0,
                        ..l.clone()
                    })
                    .collect()
            };
            let mut first_ids = Vec::new();
            for round in 0..3 {
                t.cmd("deep").await?;
                let want = one_hit(&mut full, "deep, every field").await?;
                let mut got = one_hit(&mut numbered, "deep, places once").await?;
                let locs: Vec<&Location> = got.location.iter().chain(&got.backtrace).collect();
                ensure!(locs.len() >= 4, "{got:?}");
                ensure!(locs.iter().all(|l| l.place_id != 0), "{got:?}");
                let ids: Vec<u64> = locs.iter().map(|l| l.place_id).collect();
                if round == 0 {
                    ensure!(
                        locs.iter()
                            .all(|l| !l.function.is_empty() && !l.module.is_empty()),
                        "the first hit there carries the fields: {got:?}"
                    );
                    first_ids = ids;
                } else {
                    ensure!(ids == first_ids, "the same places: {ids:?} {first_ids:?}");
                    ensure!(
                        locs.iter().all(|l| l.function.is_empty()
                            && l.module.is_empty()
                            && l.build_id.is_empty()
                            && l.ip != 0),
                        "a later hit carries the numbers alone: {got:?}"
                    );
                }
                let mut ev = wpd_proto::v1::StreamEventsResponse {
                    event: Some(Event::Hit(got)),
                    ..Default::default()
                };
                places.fill_event(&mut ev);
                let Some(Event::Hit(h)) = ev.event else {
                    unreachable!()
                };
                got = h;
                ensure!(
                    bare(&got) == bare(&want),
                    "round {round}: {got:?}\n{want:?}"
                );
                check_location(
                    got.location.as_ref().context("no location")?,
                    "deep_c",
                    "deep_c",
                    "ct-pie",
                )?;
            }
            // A stream opened now has had none of them.
            let mut late = EventStream::subscribe(&mut client, once(t.pid)).await?;
            t.cmd("deep").await?;
            let got = one_hit(&mut late, "deep, a new stream").await?;
            let want = one_hit(&mut full, "deep, every field").await?;
            ensure!(bare(&got) == bare(&want), "{got:?}\n{want:?}");
            Ok(())
        }
        .await,
    )
}

both_backends!(a_library_loaded_later_is_watched_until_unloaded);

/// A library `dlopen`ed after the attach is found by name; its watchpoint
/// fires in its code; `dlclose` removes the watchpoint with a reason.
async fn a_library_loaded_later_is_watched_until_unloaded(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            // Attached before the library exists.
            set_watchpoint(&mut client, by_name(backend, t.pid, "counter")).await?;
            let st = resolve_err(&mut client, t.pid, "plug_counter").await?;
            ensure!(st.code() == Code::NotFound, "{st:?}");

            let reply = t.cmd("dlopen").await?;
            let plug = CTarget::reply_addr(&reply, "plug")?;
            let mut events = EventStream::for_pid(&mut client, t.pid).await?;
            let resp = set_watchpoint(
                &mut client,
                by_name(backend, t.pid, "libctplug.so:plug_counter"),
            )
            .await?;
            let wp = resp.watchpoint.unwrap_or_default();
            ensure!(
                wp.pieces.first().map(|p| p.address) == Some(plug),
                "{wp:?} vs {plug:#x}"
            );
            t.cmd("set plug 4").await?;
            let hit = events
                .wait_for(HIT_TIMEOUT, "the plug hit", |ev| {
                    Ok(match ev {
                        Event::Hit(h) if h.watchpoint_id == wp.id => Some(h.clone()),
                        _ => None,
                    })
                })
                .await?;
            check_location(
                hit.location.as_ref().context("no location")?,
                "plug_set",
                "plug_set",
                "libctplug.so",
            )?;

            t.cmd("dlclose").await?;
            let why = events
                .wait_for(Duration::from_secs(10), "the plug watchpoint to go", |ev| {
                    Ok(match ev {
                        Event::WatchpointRemoved(r) if r.watchpoint_id == wp.id => {
                            Some(r.reason.clone())
                        }
                        _ => None,
                    })
                })
                .await?;
            ensure!(
                why.contains("libctplug.so") && why.contains("unmapped"),
                "reason {why:?}"
            );
            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: t.pid }),
            )
            .await?;
            ensure!(
                list.watchpoints.len() == 1,
                "the exe's watchpoint stays: {:?}",
                list.watchpoints
            );
            Ok(())
        }
        .await,
    )
}

both_backends!(exec_resolves_again_or_removes);

/// After exec, a watchpoint by name follows its name into the new image
/// (the default), or goes with reason "exec" (`on_exec: remove`).
async fn exec_resolves_again_or_removes(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events = EventStream::for_pid(&mut client, t.pid).await?;
            let follow = set_watchpoint(&mut client, by_name(backend, t.pid, "counter")).await?;
            let follow = follow.watchpoint.unwrap_or_default().id;
            let mut spec = by_name(backend, t.pid, "initialized");
            spec.on_exec = ExecPolicy::Remove as i32;
            let gone = set_watchpoint(&mut client, spec)
                .await?
                .watchpoint
                .unwrap_or_default()
                .id;
            // An expression that starts from an address names nothing in
            // the new program: it goes too.
            let by_addr = format!("((struct item *){:#x})->refs", t.addr("item"));
            let addressed = set_watchpoint(&mut client, by_name(backend, t.pid, &by_addr))
                .await?
                .watchpoint
                .unwrap_or_default()
                .id;
            t.exec().await?;
            let (mut resolved, mut removed, mut unaddressed) = (None, None, None);
            events
                .wait_for(Duration::from_secs(10), "resolved and removed", |ev| {
                    match ev {
                        Event::WatchpointResolved(r) if r.watchpoint_id == follow => {
                            resolved = Some(r.clone())
                        }
                        Event::WatchpointRemoved(r) if r.watchpoint_id == gone => {
                            removed = Some(r.reason.clone())
                        }
                        Event::WatchpointRemoved(r) if r.watchpoint_id == addressed => {
                            unaddressed = Some(r.reason.clone())
                        }
                        Event::WatchpointRemoved(r) if r.watchpoint_id == follow => {
                            anyhow::bail!("the followed watchpoint was removed: {r:?}")
                        }
                        _ => {}
                    }
                    Ok(
                        (resolved.is_some() && removed.is_some() && unaddressed.is_some())
                            .then_some(()),
                    )
                })
                .await?;
            let r = resolved.expect("seen");
            ensure!(r.reason == "exec", "{r:?}");
            ensure!(
                r.symbol.as_ref().map(|s| s.address) == Some(t.addr("counter")),
                "{r:?} vs {:#x}",
                t.addr("counter")
            );
            ensure!(removed.as_deref() == Some("exec"), "{removed:?}");
            ensure!(unaddressed.as_deref() == Some("exec"), "{unaddressed:?}");
            t.cmd("set counter 11").await?;
            let hit = events
                .wait_for(HIT_TIMEOUT, "a hit in the new image", |ev| {
                    Ok(match ev {
                        Event::Hit(h) => Some(h.clone()),
                        _ => None,
                    })
                })
                .await?;
            ensure!(
                hit.watchpoint_id == follow && hit.address == t.addr("counter"),
                "{hit:?}"
            );
            check_location(
                hit.location.as_ref().context("no location")?,
                "bump_counter",
                "bump_counter",
                "ct-pie",
            )?;
            Ok(())
        }
        .await,
    )
}
