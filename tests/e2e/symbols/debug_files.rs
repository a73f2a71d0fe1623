//! Where names come from: a debug file found by build id in a debug
//! directory, a global two libraries define (the first loaded is the one),
//! and a debug link naming a FIFO, which delays no one.

use super::*;

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
