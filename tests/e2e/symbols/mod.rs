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

mod debug_files;
mod exprs;
mod watching;
