//! Watching by name, end to end, against the C targets `build.rs` compiles
//! (`tests/c/`): names resolve to the addresses the program itself prints,
//! in every build (PIE, non-PIE, no `-g`, a separate debug file, stripped);
//! a struct is one watchpoint over several slots; hits name the function and
//! source line of the store; backtraces follow frame pointers; a library
//! loaded later is watched by name and its watchpoints go when it is
//! unloaded; exec re-resolves or removes; every wrong name is refused with a
//! specific status and changes nothing; a debug link naming a FIFO delays
//! no one.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tonic::Code;
use tonic_types::StatusExt;
use wpd_proto::v1::{
    ExecPolicy, GetStatsRequest, Hit, ListWatchpointsRequest, Location, ResolveSymbolRequest,
    ResolveSymbolResponse, SlotState, StreamEventsRequest, SymbolSource, WatchpointSpec,
};
use wpd_tests::{
    Backend, CTarget, Client, Daemon, Event, EventStream, both_backends, expect_status, line_of,
    list_threads, require_backend, require_root_perf, resume, rpc, rpc_ok, run_wpctl,
    set_watchpoint, set_watchpoint_within, wait_for_subscribers,
};

const HIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A write watchpoint on `name`, its length the object's.
fn by_name(backend: Backend, pid: i32, name: &str) -> WatchpointSpec {
    WatchpointSpec {
        pid,
        symbol: name.into(),
        access: wpd_proto::v1::Access::Write as i32,
        backend: backend as i32,
        ..Default::default()
    }
}

async fn resolve(client: &mut Client, pid: i32, name: &str) -> Result<ResolveSymbolResponse> {
    rpc_ok(
        &format!("ResolveSymbol({name})"),
        client.resolve_symbol(ResolveSymbolRequest {
            pid,
            name: name.into(),
            address: 0,
            ..Default::default()
        }),
    )
    .await
}

async fn resolve_err(client: &mut Client, pid: i32, name: &str) -> Result<tonic::Status> {
    match rpc(client.resolve_symbol(ResolveSymbolRequest {
        pid,
        name: name.into(),
        address: 0,
        ..Default::default()
    }))
    .await?
    {
        Ok(r) => anyhow::bail!("ResolveSymbol({name}) resolved: {r:?}"),
        Err(s) => Ok(s),
    }
}

/// The reason and metadata of a status.
fn reason(s: &tonic::Status) -> (String, std::collections::HashMap<String, String>) {
    s.get_details_error_info()
        .map(|i| (i.reason, i.metadata))
        .unwrap_or_default()
}

/// The location names `tag`'s line in `function`, in the C sources, with a
/// module, a build id and a file offset.
fn check_location(l: &Location, function: &str, tag: &str, module: &str) -> Result<()> {
    let (file, line) = line_of(tag);
    ensure!(
        l.function == function && l.line == line && l.file.ends_with(file),
        "expected {function} ({file}:{line}), got {} ({}:{}) in {l:?}",
        l.function,
        l.file,
        l.line
    );
    ensure!(l.module.ends_with(module), "module {:?}", l.module);
    ensure!(!l.build_id.is_empty(), "no build id: {l:?}");
    ensure!(l.has_file_offset, "no file offset: {l:?}");
    ensure!(
        l.lookup_address == l.ip - 1,
        "the address symbolized is ip - 1: {l:?}"
    );
    Ok(())
}

async fn one_hit(events: &mut EventStream, what: &str) -> Result<Hit> {
    let hits = events
        .collect_hits(1, HIT_TIMEOUT)
        .await
        .context(what.to_string())?;
    Ok(hits.into_iter().next().expect("one hit"))
}

/// Names resolve, in every build, to the addresses the program prints; the
/// answer says the module and where address and size came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_resolve_in_every_build() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            for variant in ["ct-pie", "ct-nopie", "ct-debuglink"] {
                let t = CTarget::start(variant).await?;
                for (name, key, size, type_name) in [
                    ("counter", "counter", 8, "long int"),
                    ("initialized", "initialized", 4, "int"),
                    ("stats", "stats", 32, "struct stats"),
                    ("stats.errors", "errors", 4, "int"),
                    ("stats.flags[2]", "flag2", 2, "short int"),
                    ("hidden", "hidden", 4, "int"),
                    ("libctlib.so:lib_counter", "lib", 8, "long int"),
                    ("lib_counter", "lib", 8, "long int"),
                    ("big_table", "big", 512, "double[64]"),
                ] {
                    let r = resolve(&mut client, t.pid, name).await?;
                    let s = r.symbol.unwrap_or_default();
                    let what = format!("{variant}: {name} → {s:?}");
                    ensure!(s.address == t.addr(key), "{what}: want {:#x}", t.addr(key));
                    ensure!(s.size == size, "{what}: size");
                    ensure!(s.type_name == type_name, "{what}: type");
                    ensure!(s.source == SymbolSource::Dwarf as i32, "{what}: source");
                    ensure!(r.kind == "variable", "{what}: kind {}", r.kind);
                    let module = if key == "lib" { "libctlib.so" } else { variant };
                    ensure!(s.module.ends_with(module), "{what}: module");
                    ensure!(!s.build_id.is_empty(), "{what}: build id");
                }
                // An offset into an object: the member there, said so.
                let r = resolve(&mut client, t.pid, "stats+12").await?;
                let s = r.symbol.unwrap_or_default();
                ensure!(
                    (s.address, s.size, s.type_name.as_str())
                        == (t.addr("stats") + 12, 2, "short int")
                        && s.note.contains("stats.flags[0]"),
                    "stats+12: {s:?}"
                );
            }

            // No -g: the symbol table gives address and size; members need
            // DWARF and say so.
            let t = CTarget::start("ct-nodebug").await?;
            let s = resolve(&mut client, t.pid, "counter")
                .await?
                .symbol
                .unwrap_or_default();
            ensure!(
                (s.address, s.size, s.source)
                    == (t.addr("counter"), 8, SymbolSource::Symtab as i32),
                "ct-nodebug counter: {s:?}"
            );
            let st = resolve_err(&mut client, t.pid, "stats.errors").await?;
            expect_status(
                "members without DWARF",
                Err::<(), _>(st.clone()),
                Code::FailedPrecondition,
                &["debug information", "-g"],
            )?;
            ensure!(reason(&st).0 == wpd_proto::reason::NO_DEBUG_INFO);

            // Stripped bare: the name is in no symbol table, and the error says so.
            let t = CTarget::start("ct-stripped").await?;
            let st = resolve_err(&mut client, t.pid, "counter").await?;
            expect_status(
                "stripped",
                Err::<(), _>(st.clone()),
                Code::NotFound,
                &["ct-stripped", "stripped"],
            )?;
            ensure!(reason(&st).0 == wpd_proto::reason::UNKNOWN_SYMBOL);
            // Its library keeps its symbols.
            let s = resolve(&mut client, t.pid, "lib_counter")
                .await?
                .symbol
                .unwrap_or_default();
            ensure!(
                s.address == t.addr("lib"),
                "stripped exe, lib_counter: {s:?}"
            );
            Ok(())
        }
        .await,
    )
}

/// Every wrong name gets its own status and reason, one clear message, and
/// changes nothing: no watchpoint, no slot held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_names_are_refused_and_change_nothing() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let cases: &[(&str, Code, &str, &[&str])] = &[
                (
                    "countr",
                    Code::NotFound,
                    wpd_proto::reason::UNKNOWN_SYMBOL,
                    &["countr", "closest: counter"],
                ),
                (
                    "twin",
                    Code::InvalidArgument,
                    wpd_proto::reason::AMBIGUOUS_SYMBOL,
                    &["ct-pie", "libctlib.so", "MODULE:twin"],
                ),
                (
                    "bump_counter",
                    Code::InvalidArgument,
                    wpd_proto::reason::NOT_A_VARIABLE,
                    &["function", "--access exec"],
                ),
                (
                    "tls_counter",
                    Code::InvalidArgument,
                    wpd_proto::reason::THREAD_LOCAL,
                    &["thread-local", "--tid"],
                ),
                (
                    "big_table",
                    Code::InvalidArgument,
                    wpd_proto::reason::OBJECT_TOO_LARGE,
                    &["512 bytes", "64 debug-register slots", "--len"],
                ),
                (
                    "nosuch.so:counter",
                    Code::NotFound,
                    wpd_proto::reason::NO_SUCH_MODULE,
                    &["nosuch.so", "libctlib.so"],
                ),
                (
                    "stats.nosuch",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["nosuch", "errors"],
                ),
                (
                    "stats.flags[9]",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["9", "4"],
                ),
                (
                    "stats..x",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL,
                    &[],
                ),
                // Pointers: followed where they can be, refused where not.
                (
                    "no_conn->state",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["no_conn", "null pointer"],
                ),
                (
                    "counter->x",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["counter", "long", "not a pointer"],
                ),
                (
                    "opaque->fd",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["void", "no members"],
                ),
                (
                    "opaque[1]",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["opaque", "no size"],
                ),
                (
                    "conns->nosuch",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["nosuch", "state", "next"],
                ),
                (
                    "conns->",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL,
                    &["'->' must be followed by a member name"],
                ),
                // An index whose offset does not fit in 64 bits (an array
                // without a bound: DWARF sets no limit).
                (
                    "flexobj.items[2305843009213693952]",
                    Code::InvalidArgument,
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    &["flexobj.items", "64 bits"],
                ),
            ];
            for &(name, code, want_reason, needles) in cases {
                for backend in [Backend::Perf, Backend::Ptrace] {
                    let r = rpc(client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest {
                        spec: Some(by_name(backend, t.pid, name)),
                    }))
                    .await?;
                    let st = expect_status(&format!("watch {name}"), r, code, needles)?;
                    let (got, meta) = reason(&st);
                    ensure!(
                        got == want_reason,
                        "{name}: reason {got}, want {want_reason}"
                    );
                    ensure!(
                        !st.message().contains('\n'),
                        "{name}: one line: {:?}",
                        st.message()
                    );
                    match name {
                        "countr" => ensure!(
                            meta.get("closest").is_some_and(|c| c.contains("counter")),
                            "{meta:?}"
                        ),
                        "twin" => ensure!(
                            meta.get("modules")
                                .is_some_and(|m| m.contains("libctlib.so")),
                            "{meta:?}"
                        ),
                        "big_table" => ensure!(
                            meta.get("slots_needed").map(String::as_str) == Some("64"),
                            "{meta:?}"
                        ),
                        _ => {}
                    }
                }
            }
            // MODULE: picks one of the twins.
            let s = resolve(&mut client, t.pid, "libctlib.so:twin")
                .await?
                .symbol
                .unwrap_or_default();
            ensure!(s.module.ends_with("libctlib.so"), "{s:?}");
            // A function resolves as one, for --access exec.
            let r = resolve(&mut client, t.pid, "bump_counter").await?;
            ensure!(r.kind == "function", "{r:?}");

            let list = rpc_ok(
                "ListWatchpoints",
                client.list_watchpoints(ListWatchpointsRequest { pid: 0 }),
            )
            .await?;
            ensure!(
                list.watchpoints.is_empty(),
                "a refusal left {:?}",
                list.watchpoints
            );
            for th in list_threads(&mut client, t.pid, false)
                .await
                .map(|l| l.threads)
                .unwrap_or_default()
            {
                ensure!(
                    th.slots.iter().all(|s| s.state != SlotState::Ours as i32),
                    "a refusal left a slot held: {th:?}"
                );
            }

            // wpctl: one line, the status's exit code.
            let out = run_wpctl(
                &[
                    "--endpoint",
                    &daemon.endpoint(),
                    "watch",
                    "--pid",
                    &t.pid.to_string(),
                    "--symbol",
                    "countr",
                ],
                Duration::from_secs(10),
            )
            .await?;
            ensure!(
                out.code == Some(5),
                "wpctl exit {:?}: {}",
                out.code,
                out.stderr
            );
            ensure!(
                out.stderr.lines().count() == 1 && out.stderr.contains("closest: counter"),
                "{:?}",
                out.stderr
            );
            Ok(())
        }
        .await,
    )
}

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

/// A stripped program whose debug file is found by build id in the
/// directory given with `wpd --debug-dir`: names resolve from its DWARF,
/// and hits name their function and line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_file_is_found_by_build_id_in_a_debug_dir() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("wpd-debug-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let result = async {
        let mut t = CTarget::start("ct-stripped").await?;
        // The build id of ct-pie's debug file, which ct-stripped shares.
        let elf = std::fs::read(wpd_tests::ctarget_path("ct-pie.debug"))?;
        let id = build_id(&elf).context("ct-pie.debug has no build id")?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let sub = dir.join(".build-id").join(&hex[..2]);
        std::fs::create_dir_all(&sub)?;
        std::fs::copy(
            wpd_tests::ctarget_path("ct-pie.debug"),
            sub.join(format!("{}.debug", &hex[2..])),
        )?;
        let dir_arg = dir.display().to_string();
        let daemon = Daemon::start_with_args(&["--debug-dir", &dir_arg]).await?;
        daemon.finish(
            async {
                let mut client = daemon.client().await?;
                let r = resolve(&mut client, t.pid, "stats.errors").await?;
                let s = r.symbol.unwrap_or_default();
                ensure!(
                    s.address == t.addr("errors") && s.source == SymbolSource::Dwarf as i32,
                    "{s:?}"
                );
                let mut events =
                    EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
                set_watchpoint(&mut client, by_name(Backend::Perf, t.pid, "stats.errors")).await?;
                t.cmd("set errors 3").await?;
                let hit = one_hit(&mut events, "set errors").await?;
                let loc = hit.location.context("no location")?;
                ensure!(
                    loc.function == "set_errors" && loc.line == line_of("set_errors").1,
                    "{loc:?}"
                );
                Ok(())
            }
            .await,
        )
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The GNU build id of an ELF file (its `.note.gnu.build-id`), read with
/// the `object` crate.
fn build_id(elf: &[u8]) -> Option<Vec<u8>> {
    use object::Object;
    object::File::parse(elf)
        .ok()?
        .build_id()
        .ok()?
        .map(<[u8]>::to_vec)
}

/// `wpctl symbol --pid PID EXPR` on `daemon`: its exit code and output.
async fn wpctl_symbol(daemon: &Daemon, pid: i32, expr: &str) -> Result<wpd_tests::CmdOutput> {
    run_wpctl(
        &[
            "--endpoint",
            &daemon.endpoint(),
            "symbol",
            "--pid",
            &pid.to_string(),
            expr,
        ],
        Duration::from_secs(10),
    )
    .await
}

/// The expression language over the program's DWARF types: `&` gives an
/// address (a value, never watched), casts to the program's named types
/// (struct, typedef, base types, `*` levels) view memory and convert
/// values, parentheses and C's precedence hold, and each way an expression
/// can be wrong has its message, status and `wpctl` exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expressions_take_addresses_casts_and_parentheses() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let sess = t.addr("sess");
            let item = t.addr("item");
            // Objects: (address, size, type), from the program's own addresses.
            for (expr, addr, size, ty) in [
                ("g_sess.mode", sess + 4, 4, "enum mode"),
                ("*&g_sess.mode", sess + 4, 4, "enum mode"),
                ("(&g_sess)->flags", sess + 8, 4, "unsigned int"),
                (
                    "g_sess.grid[2][3]",
                    sess + 12 + 2 * 8 + 3 * 2,
                    2,
                    "short int",
                ),
                ("g_sess.grid[1]", sess + 12 + 8, 8, "short int[4]"),
                ("(&g_sess.grid[1][0])[2]", sess + 12 + 8 + 4, 2, "short int"),
                ("g_item->refs", item + 8, 4, "int"),
                ("(*g_item).tag", item + 12, 2, "short unsigned int"),
                ("*g_item", item, 16, "item_t"),
                (
                    &format!("((struct item *){item:#x})->refs"),
                    item + 8,
                    4,
                    "int",
                ),
                (
                    &format!("((item_t *){item:#x})->tag"),
                    item + 12,
                    2,
                    "short unsigned int",
                ),
                (&format!("*(int *){:#x}", item + 8), item + 8, 4, "int"),
                (
                    "*(unsigned char *)&g_sess.flags",
                    sess + 8,
                    1,
                    "unsigned char",
                ),
                (
                    "((struct conn *)opaque)->next->state",
                    t.addr("conn1state"),
                    4,
                    "int",
                ),
                ("*(long *)&stats", t.addr("stats"), 8, "long int"),
            ] {
                let r = resolve(&mut client, t.pid, expr).await?;
                let s = r.symbol.clone().unwrap_or_default();
                ensure!(
                    r.kind == "variable"
                        && (s.address, s.size, s.type_name.as_str()) == (addr, size, ty),
                    "{expr}: {r:?}, want {addr:#x} {size} {ty}"
                );
            }
            // Values: `&` and casts of scalars compute, in no object.
            for (expr, ty, value) in [
                (
                    "&g_sess.mode",
                    "enum mode *",
                    (sess + 4).to_le_bytes().to_vec(),
                ),
                ("&g_item->refs", "int *", (item + 8).to_le_bytes().to_vec()),
                (
                    "(unsigned long)g_sess.id",
                    "long unsigned int",
                    7u64.to_le_bytes().to_vec(),
                ),
                ("(unsigned char)g_sess.flags", "unsigned char", vec![0xfe]),
                (
                    "(uint32_t)g_sess.id",
                    "uint32_t",
                    7u32.to_le_bytes().to_vec(),
                ),
                ("(_Bool)g_version", "_Bool", vec![1]),
                ("(int)g_sess.flags", "int", (-2i32).to_le_bytes().to_vec()),
                (
                    "(long)(int)g_sess.flags",
                    "long int",
                    (-2i64).to_le_bytes().to_vec(),
                ),
            ] {
                let r = resolve(&mut client, t.pid, expr).await?;
                let s = r.symbol.clone().unwrap_or_default();
                ensure!(r.kind == "value" && s.type_name == ty, "{expr}: {r:?}");
                ensure!(
                    r.value == value,
                    "{expr}: value {:x?}, want {value:x?}",
                    r.value
                );
            }
            // A pointer converted: the address it holds, as `symbol.address`.
            let r = resolve(&mut client, t.pid, "(struct conn *)opaque").await?;
            let s = r.symbol.clone().unwrap_or_default();
            ensure!(
                r.kind == "value"
                    && s.type_name == "struct conn *"
                    && r.value.len() == 8
                    && s.address != 0
                    && r.value == s.address.to_le_bytes(),
                "{r:?}"
            );
            // A value is not watched: it says what to watch instead.
            for (expr, needles) in [
                (
                    "&g_sess.mode",
                    &["a value", "enum mode *", "watch g_sess.mode"][..],
                ),
                (
                    "(unsigned int)g_sess.id",
                    &["a value", "*(unsigned int *)&g_sess.id"][..],
                ),
            ] {
                let r = rpc(client.set_watchpoint(wpd_proto::v1::SetWatchpointRequest {
                    spec: Some(by_name(Backend::Perf, t.pid, expr)),
                }))
                .await?;
                let st = expect_status(expr, r, Code::InvalidArgument, needles)?;
                ensure!(reason(&st).0 == wpd_proto::reason::NOT_AN_OBJECT, "{st:?}");
            }

            // `wpctl symbol`: objects and values, as a person reads them.
            let out = wpctl_symbol(&daemon, t.pid, "&g_sess.mode").await?;
            ensure!(
                out.code == Some(0)
                    && out.stdout.contains(&format!(
                        "&g_sess.mode = {:#x} <g_sess+4> (enum mode *",
                        sess + 4
                    )),
                "{out:?}"
            );
            let out = wpctl_symbol(&daemon, t.pid, "(int)g_sess.flags").await?;
            ensure!(
                out.code == Some(0) && out.stdout.contains("= -2 (int"),
                "{out:?}"
            );
            let e = format!("((item_t *){item:#x})->refs");
            let out = wpctl_symbol(&daemon, t.pid, &e).await?;
            ensure!(
                out.code == Some(0)
                    && out
                        .stdout
                        .contains(&format!("int, 4 bytes at {:#x}", item + 8)),
                "{out:?}"
            );

            // Every class of error: message, reason, wpctl's exit code (4:
            // invalid argument, 5: not found).
            let cases: &[(&str, &str, i32, &[&str])] = &[
                (
                    "g_ses.mode",
                    wpd_proto::reason::UNKNOWN_SYMBOL,
                    5,
                    &["closest: g_sess"],
                ),
                (
                    "(struct conection *)opaque",
                    wpd_proto::reason::UNKNOWN_TYPE,
                    5,
                    &["struct conection", "closest: struct conn"],
                ),
                (
                    "(itm_t *)opaque",
                    wpd_proto::reason::UNKNOWN_TYPE,
                    5,
                    &["itm_t", "item_t"],
                ),
                (
                    "*g_sess.id",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["g_sess.id", "int", "not a pointer"],
                ),
                (
                    "g_sess->id",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["g_sess", "struct session", "not a pointer"],
                ),
                (
                    "g_sess.id.x",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["g_sess.id", "not a struct or union"],
                ),
                (
                    "g_item.refs",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["item_t *", "not a struct or union", "use '->'"],
                ),
                (
                    "g_item->ref",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &[
                        "no member \"ref\"",
                        "closest: refs",
                        "members: key, refs, tag",
                    ],
                ),
                (
                    "g_sess.grid[3][0]",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["index 3", "g_sess.grid", "3 elements"],
                ),
                (
                    "g_sess.grid[0][4]",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["index 4", "g_sess.grid[0]", "4 elements"],
                ),
                (
                    "*0x1000",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["0x1000 is a number, not a pointer", "*(int *)0x1000"],
                ),
                (
                    "&(int)g_sess.id",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["cannot take the address", "a value"],
                ),
                (
                    "(struct session)g_sess",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["cannot cast g_sess to struct session", "scalar and pointer"],
                ),
                (
                    "((struct conn *)0)->state",
                    wpd_proto::reason::BAD_SYMBOL_PATH,
                    4,
                    &["null pointer"],
                ),
                (
                    "((struct conn *)opaque->state",
                    wpd_proto::reason::BAD_SYMBOL,
                    4,
                    &["expected ')'", "column 30 (the end)"],
                ),
                (
                    "(struct conn *opaque)->state",
                    wpd_proto::reason::BAD_SYMBOL,
                    4,
                    &["type name", "column 15"],
                ),
                (
                    "g_sess.mode)",
                    wpd_proto::reason::BAD_SYMBOL,
                    4,
                    &["no '(' matches it", "column 12"],
                ),
            ];
            for &(expr, want, exit, needles) in cases {
                let st = resolve_err(&mut client, t.pid, expr).await?;
                eprintln!("{expr}: {}", st.message());
                let (got, meta) = reason(&st);
                ensure!(got == want, "{expr}: reason {got}, want {want}: {st:?}");
                for n in needles {
                    ensure!(
                        st.message().contains(n),
                        "{expr}: {n:?} not in {:?}",
                        st.message()
                    );
                }
                ensure!(!st.message().contains('\n'), "{expr}: one line");
                if want == wpd_proto::reason::UNKNOWN_TYPE {
                    ensure!(
                        meta.get("closest").is_some_and(|c| !c.is_empty()),
                        "{expr}: {meta:?}"
                    );
                }
                let out = run_wpctl(
                    &[
                        "--endpoint",
                        &daemon.endpoint(),
                        "watch",
                        "--pid",
                        &t.pid.to_string(),
                        "--symbol",
                        expr,
                    ],
                    Duration::from_secs(10),
                )
                .await?;
                ensure!(
                    out.code == Some(exit) && out.stderr.contains(needles[0]),
                    "wpctl watch --symbol {expr}: {out:?}"
                );
            }

            // Optimized out: the -O2 build's DWARF names the variable
            // without a place.
            let t2 = CTarget::start("ct-nofp").await?;
            let st = resolve_err(&mut client, t2.pid, "left_out").await?;
            ensure!(
                st.code() == Code::NotFound
                    && reason(&st).0 == wpd_proto::reason::OPTIMIZED_OUT
                    && st.message().contains("optimized out"),
                "{st:?}"
            );
            let s = resolve(&mut client, t.pid, "left_out")
                .await?
                .symbol
                .unwrap_or_default();
            ensure!(s.size == 4, "at -O0 it is there: {s:?}");
            Ok(())
        }
        .await,
    )
}

both_backends!(a_heap_object_is_watched_through_a_cast_address);

/// `((struct X *)ADDR)->field`: the common way to watch a heap object whose
/// address is known; a store into that field is a hit there.
async fn a_heap_object_is_watched_through_a_cast_address(backend: Backend) -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    daemon.finish(
        async {
            let mut client = daemon.client().await?;
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(t.pid)).await?;
            let want = t.addr("itemrefs");
            let expr = format!("((struct item *){:#x})->refs", t.addr("item"));
            let out = run_wpctl(
                &[
                    "--endpoint",
                    &daemon.endpoint(),
                    "watch",
                    "--pid",
                    &t.pid.to_string(),
                    "--backend",
                    match backend {
                        Backend::Ptrace => "ptrace",
                        _ => "perf",
                    },
                    "--symbol",
                    &expr,
                ],
                Duration::from_secs(20),
            )
            .await?;
            ensure!(
                out.code == Some(0) && out.stdout.contains(&format!("{want:#x}")),
                "wpctl watch: {out:?}"
            );
            t.cmd("set refs 5").await?;
            let hit = one_hit(&mut events, "set refs").await?;
            ensure!(
                hit.address == want && hit.value == 5i32.to_le_bytes(),
                "{hit:?}"
            );
            check_location(
                hit.location.as_ref().context("no location")?,
                "touch_item",
                "touch_item",
                "ct-pie",
            )
        }
        .await,
    )
}

/// In a thread held after a hit, an expression may start from a parameter
/// or local variable of any of its frames: in `touch_item(item_t *c, int
/// v)`, `c->refs` is the heap object's field, `v` the value stored, `&v` its
/// place on the stack; in the caller `set(name, v)`, `*name` reads its
/// string; names that are no local are globals still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expressions_start_from_a_held_frames_locals() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let result = async {
        let mut c = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut c, wpd_tests::hits_only(t.pid)).await?;
        let mut spec = by_name(Backend::Ptrace, t.pid, "g_item->refs");
        spec.action = wpd_proto::v1::HitAction::Stop as i32;
        set_watchpoint(&mut c, spec).await?;
        t.send("set refs 6")?;
        let hit = one_hit(&mut events, "set refs").await?;
        ensure!(hit.stopped, "{hit:?}");
        let tid = hit.tid;
        let pid = t.pid;
        let ask = |name: &str, frame: u32| ResolveSymbolRequest {
            pid,
            name: name.into(),
            address: 0,
            tid,
            frame,
        };
        let item = t.addr("item");
        let r = rpc_ok("c->refs", c.resolve_symbol(ask("c->refs", 0))).await?;
        let s = r.symbol.clone().unwrap_or_default();
        ensure!(
            r.kind == "variable"
                && (s.address, s.size, s.type_name.as_str()) == (item + 8, 4, "int")
                && s.note.contains("parameter \"c\" of frame 0"),
            "c->refs: {r:?}"
        );
        let r = rpc_ok("c", c.resolve_symbol(ask("(long)c", 0))).await?;
        ensure!(
            r.kind == "value" && r.value == item.to_le_bytes(),
            "(long)c: {r:?}"
        );
        let r = rpc_ok("v", c.resolve_symbol(ask("v", 0))).await?;
        let s = r.symbol.clone().unwrap_or_default();
        ensure!(s.type_name == "int" && s.size == 4, "v: {r:?}");
        let mem = rpc_ok(
            "ReadMemory(v)",
            c.read_memory(wpd_proto::v1::ReadMemoryRequest {
                pid: t.pid,
                address: s.address,
                length: 4,
            }),
        )
        .await?;
        ensure!(mem.data == 6i32.to_le_bytes(), "v in memory: {mem:?}");
        let r = rpc_ok("&v", c.resolve_symbol(ask("&v", 0))).await?;
        ensure!(
            r.kind == "value" && r.value == s.address.to_le_bytes(),
            "&v: {r:?}"
        );
        // The caller: set(const char *name, long v).
        let r = rpc_ok("*name", c.resolve_symbol(ask("*name", 1))).await?;
        let s = r.symbol.clone().unwrap_or_default();
        ensure!(s.type_name.contains("char") && s.size == 1, "*name: {r:?}");
        let r = rpc_ok("(int)*name", c.resolve_symbol(ask("(int)*name", 1))).await?;
        ensure!(
            r.value == i32::from(b'r').to_le_bytes(),
            "(int)*name: {r:?}"
        );
        // A name no frame has is a global.
        let r = rpc_ok("g_sess.id", c.resolve_symbol(ask("g_sess.id", 0))).await?;
        ensure!(
            r.symbol.as_ref().map(|s| s.address) == Some(t.addr("sess")),
            "{r:?}"
        );
        // Errors: a local is typed like any variable; a frame past the stack.
        let st = expect_status(
            "c.refs",
            rpc(c.resolve_symbol(ask("c.refs", 0))).await?,
            Code::InvalidArgument,
            &["item_t *", "use '->'"],
        )?;
        ensure!(
            reason(&st).0 == wpd_proto::reason::BAD_SYMBOL_PATH,
            "{st:?}"
        );
        expect_status(
            "frame 100",
            rpc(c.resolve_symbol(ask("c", 100))).await?,
            Code::InvalidArgument,
            &["no frame 100"],
        )?;
        // wpctl symbol --tid --frame.
        let out = run_wpctl(
            &[
                "--endpoint",
                &daemon.endpoint(),
                "symbol",
                "--pid",
                &t.pid.to_string(),
                "--tid",
                &tid.to_string(),
                "--frame",
                "0",
                "c->refs",
            ],
            Duration::from_secs(10),
        )
        .await?;
        ensure!(
            out.code == Some(0)
                && out
                    .stdout
                    .contains(&format!("int, 4 bytes at {:#x}", item + 8)),
            "{out:?}"
        );
        resume(&mut c, t.pid, &[]).await?;
        let reply = t.reply(Duration::from_secs(10)).await?;
        ensure!(reply.as_deref() == Some("SET"), "{reply:?}");
        // Held no more: the frame is gone, and says so.
        let st = rpc(c.resolve_symbol(ask("c->refs", 0))).await?;
        ensure!(st.is_err(), "{st:?}");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A global two libraries both define, loaded by one dlopen (`ct-plugins`'
/// `load3`: `libplugin3.so`, which needs `libplugin2.so`): the name is the
/// one the process uses, the first in the dynamic linker's load order
/// (the library opened, then those it needs), not the lower address (the
/// library needed is mapped after the one opened, usually below it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_two_libraries_define_is_the_first_loaded() -> Result<()> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-plugins").await?;
    let result = async {
        let r = t.cmd("load3").await?;
        ensure!(r == "LOADED3 calls=1 calls2=1", "{r}");
        let mut c = daemon.client().await?;
        let sym = resolve(&mut c, t.pid, "plugin_shared")
            .await?
            .symbol
            .context("no symbol")?;
        ensure!(
            sym.module.ends_with("/libplugin3.so"),
            "the library loaded first defines it for the process: {sym:?}"
        );
        // Named with its module, the other library's is there too.
        let other = resolve(&mut c, t.pid, "libplugin2.so:plugin_shared")
            .await?
            .symbol
            .context("no symbol")?;
        ensure!(
            other.module.ends_with("/libplugin2.so") && other.address != sym.address,
            "{other:?}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Every daemon thread's wait channel (`/proc/PID/task/*/wchan`), with its
/// name.
fn daemon_waits(pid: i32) -> Vec<(String, String)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|t| {
            let read = |f: &str| {
                std::fs::read_to_string(t.path().join(f))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            };
            (read("comm"), read("wchan"))
        })
        .collect()
}

/// Lets go of any reader waiting in the FIFO's `open` (a writer opening
/// it pairs with them), so that a daemon blocked there can stop.
fn release_fifo(path: &std::path::Path) {
    use std::os::unix::fs::OpenOptionsExt;
    for _ in 0..1000 {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => drop(f),
            Err(_) => return,
        }
    }
}

/// A program built without `-g` and without a build id, whose debug link
/// names a FIFO beside it, run by another user: its hits and the requests
/// about it answer (the FIFO refused,
/// never opened: the names come from its symbol table), more of them at
/// once than the runtime has blocking threads; meanwhile root's process
/// is watched by name and its hits are symbolized, and no daemon thread
/// waits in a FIFO's `open`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_named_by_a_debug_link_delays_no_one() -> Result<()> {
    if !require_root_perf() {
        return Ok(());
    }
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    /// Far above any answer's time: what is checked is that it comes.
    const PATIENCE: Duration = Duration::from_secs(60);
    let dir = wpd_tests::unique_temp_dir("wpd-fifolink")?;
    let exe = dir.join("ct-fifolink");
    let fifo = dir.join("ct-fifolink.debug");
    std::fs::copy(wpd_tests::ctarget_path("ct-fifolink"), &exe)?;
    std::fs::copy(
        wpd_tests::ctarget_path("libctlib.so"),
        dir.join("libctlib.so"),
    )?;
    {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes())?;
        // SAFETY: a valid NUL-terminated path.
        ensure!(
            unsafe { libc::mkfifo(c.as_ptr(), 0o644) } == 0,
            "mkfifo: {}",
            std::io::Error::last_os_error()
        );
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    let result = async {
        let daemon = Daemon::start().await?;
        let mut hostile = CTarget::start_path_as(&exe, "ct-fifolink", NOBODY).await?;
        let mut other = CTarget::start("ct-pie").await?;
        let r = async {
            let mut client = daemon.client().await?;
            // The hostile process: watched by address, hit.
            let mut hostile_events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(hostile.pid)).await?;
            set_watchpoint(
                &mut client,
                wpd_tests::write_spec(Backend::Perf, hostile.pid, hostile.addr("errors")),
            )
            .await?;
            hostile.cmd("set errors 1").await?;
            // Root's process: watched by name, and its hits symbolized.
            let mut events =
                EventStream::subscribe(&mut client, wpd_tests::hits_only(other.pid)).await?;
            set_watchpoint_within(
                &mut client,
                by_name(Backend::Perf, other.pid, "stats.errors"),
                PATIENCE,
            )
            .await?;
            other.cmd("set errors 3").await?;
            let hit = events
                .collect_hits(1, PATIENCE)
                .await
                .context("root's hits while the hostile program is hit")?;
            let loc = hit[0].location.clone().context("no location")?;
            check_location(&loc, "set_errors", "set_errors", "ct-pie")?;
            // More requests about the hostile process at once than the
            // runtime has blocking threads (32): each answers, from the
            // symbol table.
            let asks: Vec<_> = (0..40)
                .map(|_| {
                    let mut c = client.clone();
                    let pid = hostile.pid;
                    tokio::spawn(async move {
                        tokio::time::timeout(
                            PATIENCE,
                            c.resolve_symbol(ResolveSymbolRequest {
                                pid,
                                name: "counter".into(),
                                ..Default::default()
                            }),
                        )
                        .await
                    })
                })
                .collect();
            for (i, ask) in asks.into_iter().enumerate() {
                let r = ask
                    .await?
                    .map_err(|_| anyhow::anyhow!("ResolveSymbol {i} on the hostile process hung"))?
                    .map_err(|s| anyhow::anyhow!("ResolveSymbol {i}: {s:?}"))?
                    .into_inner();
                let s = r.symbol.context("no symbol")?;
                ensure!(
                    s.address == hostile.addr("counter") && s.source == SymbolSource::Symtab as i32,
                    "{s:?}"
                );
            }
            // Root's requests answer after them.
            let r = tokio::time::timeout(PATIENCE, resolve(&mut client, other.pid, "counter"))
                .await
                .context("ResolveSymbol on root's process hung")??;
            ensure!(r.symbol.is_some_and(|s| s.address == other.addr("counter")));
            set_watchpoint_within(
                &mut client,
                by_name(Backend::Perf, other.pid, "counter"),
                PATIENCE,
            )
            .await?;
            other.cmd("set counter 4").await?;
            events
                .collect_hits(1, PATIENCE)
                .await
                .context("root's second hit")?;
            // The hostile hits are symbolized from its symbol table (the
            // first may go out before its module is loaded).
            let mut named = None;
            let mut seen = Vec::new();
            for i in 2..20 {
                let hits = hostile_events
                    .collect_hits(1, PATIENCE)
                    .await
                    .context("the hostile process's hits")?;
                let loc = hits[0].location.clone().unwrap_or_default();
                if loc.function == "set_errors" {
                    named = Some(loc);
                    break;
                }
                seen.push(loc);
                hostile.cmd(&format!("set errors {i}")).await?;
            }
            let loc = named.with_context(|| format!("no hostile hit symbolized: {seen:?}"))?;
            ensure!(loc.module.ends_with("ct-fifolink"), "{loc:?}");
            let waits = daemon_waits(daemon.pid());
            ensure!(
                !waits.iter().any(|(_, w)| w == "wait_for_partner"),
                "a daemon thread waits in a FIFO's open: {waits:?}"
            );
            // Each owner's hits were symbolized on a thread of its own.
            for owner in ["wpd-sym-0", "wpd-sym-65534"] {
                ensure!(
                    waits.iter().any(|(name, _)| name == owner),
                    "no symbolizer thread {owner}: {waits:?}"
                );
            }
            Ok(())
        }
        .await;
        release_fifo(&fifo);
        drop((hostile, other));
        daemon.finish(r)
    }
    .await;
    release_fifo(&fifo);
    let _ = std::fs::remove_dir_all(&dir);
    result
}
