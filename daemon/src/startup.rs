//! The one place that starts the daemon: from a [`Config`] built once by
//! `main.rs` (no setting reaches the library any other way), in this order:
//!
//! 1. Where to listen: the socket systemd passed, or `--listen`; a
//!    listener set-up that would expose the daemon is refused.
//! 2. The only daemon: the listener is bound, the ptrace state file locked
//!    and the state directory checked and locked — before anything is read,
//!    cleaned up or written, so a second daemon is refused with the first
//!    one's files untouched.
//! 3. Recovery: debug registers a killed daemon left armed are cleared.
//! 4. The event bus, the journal reading it from its first event, the
//!    export's counters; then the core (engine), with them passed in.
//! 5. The export task, and the service (`service/`) with the saved
//!    watchpoints, set again once serving and kept on disk.
//! 6. The gRPC API (`rpc::Api`) and its metrics endpoint, served
//!    (`rpc::serve`) until SIGTERM/SIGINT, with systemd told it is ready
//!    (its watchdog pinged) and when it stops; then every target
//!    detached.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};

use crate::backend::SystemOptions;
use crate::engine::{Backends, Core};
use crate::events::EventBus;
use crate::rpc::serve::{self, Listen};

/// Everything the daemon is started with (`wpd`'s flags, read and checked
/// by `main.rs`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where to listen (systemd's socket, when it passes one, wins).
    pub listen: Listen,
    /// How the API is served: token, TLS, socket mode, connection limits,
    /// metrics.
    pub server: serve::Options,
    /// The core's limits.
    pub limits: crate::engine::Limits,
    /// The ptrace state file (default: [`state_file_for`] the listen
    /// address).
    pub state_file: Option<PathBuf>,
    /// A user's daemon listening where it does by default: the directory
    /// of its socket, made private to the user (0700) or, when it is there
    /// already, checked to be the user's and writable by nobody else,
    /// before the socket is bound (`/tmp/wpd-UID` could have been made by
    /// someone else first).
    pub private_run_dir: Option<PathBuf>,
    /// How the perf backend opens breakpoints.
    pub perf_events: crate::backend::perf::EventsPolicy,
    /// Size of the perf backend's rings in KiB (`--perf-ring-kib`; None:
    /// each path's default).
    pub perf_ring_kib: Option<u32>,
    /// How the ptrace backend stops threads.
    pub ptrace_stops: crate::backend::ptrace::signal_bp::Policy,
    /// Tracer threads of the ptrace backend (`WPD_PTRACE_SHARDS`; default
    /// 4).
    pub ptrace_shards: Option<usize>,
    /// Directories of separate debug files (empty: the defaults).
    pub debug_dirs: Vec<PathBuf>,
    /// Where policies by command name look for programs of that name to
    /// hold at their exec (`PATH`'s absolute directories).
    pub exec_search_path: Vec<PathBuf>,
    /// The state directory (`--state-dir`). None: no journal, nothing
    /// saved.
    pub state: Option<StateOptions>,
    /// Fault injection for the tests (none in production).
    pub faults: Faults,
}

/// Faults the tests inject, each from an environment variable `wpd` reads
/// at start (`WPD_FAULT_*`).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// A pause after every permission check (`WPD_FAULT_AFTER_CHECK_MS`).
    pub after_check: Option<std::time::Duration>,
    /// A pause after every journal write (`WPD_FAULT_JOURNAL_DELAY_MS`).
    pub journal_write_delay: Option<std::time::Duration>,
    /// A tracer thread panics at this hit (`WPD_FAULT_PANIC_AT_HIT`).
    pub panic_at_hit: Option<u64>,
}

/// The state directory and what is kept there.
#[derive(Debug, Clone)]
pub struct StateOptions {
    /// The directory: the saved watchpoints and policies
    /// (`persist::FILE`) and the journal.
    pub dir: PathBuf,
    /// The journal's settings (its segments in `dir/journal/`).
    pub journal: crate::journal::Config,
    /// Export of the journal's events to NATS JetStream (its position in
    /// `dir/export/`, set here).
    pub export: Option<crate::export::Config>,
}

/// Where a daemon listening on `listen` keeps its ptrace state file: beside
/// its socket (`/run/wpd/wpd.sock` → `/run/wpd/wpd.sock.ptrace-armed`), or
/// under /run/wpd named after the TCP address, so that two daemons never
/// share one.
pub fn state_file_for(listen: &Listen) -> PathBuf {
    state_file_in(listen, std::path::Path::new("/run/wpd"))
}

/// As [`state_file_for`], a TCP daemon's file in `run_dir` (a user's
/// daemon: the directory of its default socket).
pub fn state_file_in(listen: &Listen, run_dir: &std::path::Path) -> PathBuf {
    match listen {
        Listen::Unix(path) => {
            let mut p = path.clone().into_os_string();
            p.push(".ptrace-armed");
            PathBuf::from(p)
        }
        Listen::Tcp(addr) => run_dir.join(format!("ptrace-armed-tcp-{}", addr_token(addr))),
    }
}

fn addr_token(addr: &SocketAddr) -> String {
    addr.to_string().replace([':', '[', ']'], "_")
}

/// The soft file limit raised to the hard one (or `nr_open`, for root):
/// one perf event is one fd.
fn raise_fd_limit() {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(1 << 20);
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        // Root may raise the hard limit; everyone may raise soft to hard.
        if setrlimit(Resource::RLIMIT_NOFILE, nr_open, nr_open).is_err() && soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// Takes the state directory's lock (`DIR/lock`, an exclusive `flock`),
/// or says which daemon holds it.
fn lock_state_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = dir.join("lock");
    let mut f = crate::statedir::open(
        &path,
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
    )
    .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        bail!(
            "another wpd (pid {}) uses the state directory {}: give this one its own \
             --state-dir, or --state-dir none",
            holder.trim(),
            dir.display()
        );
    }
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{}", std::process::id())?;
    Ok(f)
}

/// Runs the daemon until SIGTERM/SIGINT, then detaches from every process
/// (the module's steps).
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    // 1. Where.
    let activated = serve::activated_socket()?;
    let listen = match &activated {
        Some((_, path)) => {
            if cfg.listen != Listen::Unix(path.clone()) {
                tracing::info!(
                    "serving the socket systemd passed, {}, instead of {:?}",
                    path.display(),
                    cfg.listen
                );
            }
            Listen::Unix(path.clone())
        }
        None => cfg.listen.clone(),
    };
    if let Err(e) = serve::check_listen(&listen, &cfg.server) {
        bail!("{e}");
    }
    raise_fd_limit();
    let state_file = cfg
        .state_file
        .clone()
        .unwrap_or_else(|| state_file_for(&listen));

    // 2. The only daemon: the state directory checked from outside (nothing
    // in it looked at), then the locks, then what the directory holds.
    if let Some(dir) = &cfg.private_run_dir {
        crate::statedir::StateDir::prepare(dir)
            .with_context(|| format!("refusing the socket's directory {}", dir.display()))?;
    }
    let bound = serve::bind(&listen, activated, &cfg.server).await?;
    let refused = "refusing the state directory (--state-dir)";
    let state_dir = match &cfg.state {
        Some(state) => {
            Some(crate::statedir::StateDir::prepare(&state.dir).with_context(|| refused)?)
        }
        None => None,
    };
    let ptrace_lock =
        crate::backend::ptrace::recovery::lock_state_file(&state_file).map_err(|e| anyhow!(e))?;
    let _state_lock = match &state_dir {
        Some(dir) => {
            // A daemon refused here leaves no lock file of its own behind.
            let locked = lock_state_dir(dir.path())
                .and_then(|l| dir.check().with_context(|| refused).map(|()| l));
            match locked {
                Ok(l) => Some(l),
                Err(e) => {
                    ptrace_lock.discard();
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let _ptrace_lock = ptrace_lock;

    // 3. A previous daemon killed with ptrace registers armed left targets
    // that die on their next hit: clear them before anything else.
    let recover = state_file.clone();
    let cleaned = std::thread::spawn(move || crate::backend::ptrace::recovery::recover(&recover))
        .join()
        .unwrap_or(0);
    if cleaned > 0 {
        tracing::warn!(
            cleaned,
            "cleared debug registers left armed by a previous daemon"
        );
    }

    // 4. Bus, journal, export counters, core.
    let bus = EventBus::default();
    let journal = match &cfg.state {
        Some(state) => Some(
            crate::journal::Journal::start(
                crate::journal::Config {
                    write_delay: cfg.faults.journal_write_delay.unwrap_or_default(),
                    ..state.journal.clone()
                },
                &bus,
                crate::journal::encoder(),
            )
            .with_context(|| format!("opening the journal in {}", state.journal.dir.display()))?,
        ),
        None => None,
    };
    let export_stats = cfg
        .state
        .as_ref()
        .and_then(|s| s.export.as_ref())
        .map(|_| Arc::new(crate::export::Stats::default()));
    let core = Core::start_config(crate::engine::Config {
        limits: cfg.limits,
        backends: Backends::System(SystemOptions {
            state_file,
            perf_events: cfg.perf_events,
            perf_ring_kib: cfg.perf_ring_kib,
            ptrace_stops: cfg.ptrace_stops,
            ptrace_shards: cfg.ptrace_shards,
            fault_panic_at_hit: cfg.faults.panic_at_hit,
        }),
        debug_dirs: cfg.debug_dirs.clone(),
        exec_search_path: cfg.exec_search_path.clone(),
        bus,
        journal: journal.clone(),
        export: export_stats.clone(),
    });

    // 5. The export, and the service with the saved state: restored once
    // serving, then kept on disk as watchpoints come and go.
    let mut service =
        crate::service::Service::new(core.clone()).with_fault_after_check(cfg.faults.after_check);
    if let Some(state) = &cfg.state {
        let (p, last) = crate::service::persist::Persist::open(&state.dir)
            .with_context(|| format!("opening the saved watchpoints in {}", state.dir.display()))?;
        if let (Some(export), Some(journal), Some(stats)) = (&state.export, &journal, export_stats)
        {
            start_export(export, &state.dir, journal, stats, &core)?;
        }
        // Ids of the last run are never given to anything new.
        if let Some(s) = &last {
            core.reserve_ids(crate::service::persist::last_used_id(s));
        }
        service = service.with_persist(Arc::new(p));
        tokio::spawn(keep_saved(service.clone(), last));
    }

    // 6. The API and its metrics; serving until SIGTERM/SIGINT, systemd
    // told it is ready (and pinged by its watchdog) and when it stops.
    let registry = Arc::new(crate::rpc::conn::Registry::default());
    let auth = crate::rpc::auth::AuthConfig {
        token: cfg.server.token.as_deref().map(Into::into),
    };
    let api = crate::rpc::Api::new(service.clone(), auth, registry.clone());
    let metrics = match cfg.server.metrics_listen {
        Some(addr) => {
            let m = Arc::new(crate::rpc::metrics::Metrics::new());
            let bound = crate::rpc::metrics::listen(addr, m.clone(), api.clone()).await?;
            eprintln!("wpd: metrics on http://{bound}/metrics");
            Some(m)
        }
        None => None,
    };
    let stop = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
        serve::notify_systemd(&[sd_notify::NotifyState::Stopping]);
        // What is saved stays as it is: the detaches that follow remove
        // everything from the targets, not from the state directory.
        service.sync_saved().await;
        service.freeze_saved();
    };
    serve::systemd_ready();
    let result = serve::serve(bound, &listen, api, registry, metrics, &cfg.server, stop).await;
    let c = core.clone();
    tokio::task::spawn_blocking(move || c.shutdown()).await?;
    eprintln!("wpd: stopped; every target was detached");
    result
}

/// Starts the export of the journal to NATS JetStream (`export/`), its
/// position kept in `dir/export`, with the core's thread names.
fn start_export(
    export: &crate::export::Config,
    dir: &Path,
    journal: &Arc<crate::journal::Journal>,
    stats: Arc<crate::export::Stats>,
    core: &Arc<Core>,
) -> anyhow::Result<()> {
    let mut ecfg = export.clone();
    ecfg.dir = dir.join("export");
    let names = Arc::downgrade(core);
    let namer: crate::export::Namer = Arc::new(move |pid, tid| {
        let Some(names) = names.upgrade() else {
            return (None, None);
        };
        (
            names.known_name(pid, pid),
            (tid > 0).then(|| names.known_name(pid, tid)).flatten(),
        )
    });
    crate::export::start(ecfg, journal.clone(), namer, stats)
        .with_context(|| format!("starting the export in {}", dir.display()))
}

/// Sets again what the last run saved (the API is served already), then
/// keeps the saved state on disk as watchpoints come and go.
async fn keep_saved(service: crate::service::Service, last: Option<wpd_proto::v1::SavedState>) {
    if let Some(saved) = last {
        service.restore(saved).await;
    }
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tick.tick().await;
        service.sync_saved().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listen_address_has_its_own_state_file() {
        let a = state_file_for(&"unix:/run/wpd/wpd.sock".parse().unwrap());
        let b = state_file_for(&"unix:/tmp/other/wpd.sock".parse().unwrap());
        let c = state_file_for(&"tcp://127.0.0.1:5000".parse().unwrap());
        let d = state_file_for(&"tcp://127.0.0.1:5001".parse().unwrap());
        assert_eq!(a, PathBuf::from("/run/wpd/wpd.sock.ptrace-armed"));
        assert_eq!(b, PathBuf::from("/tmp/other/wpd.sock.ptrace-armed"));
        assert_eq!(c, PathBuf::from("/run/wpd/ptrace-armed-tcp-127.0.0.1_5000"));
        assert_ne!(c, d);
    }
}
