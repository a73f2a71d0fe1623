//! Export to NATS JetStream (`wpd --export-nats URL`): every event of the
//! journal published to a JetStream stream, at the journal's pace, never
//! the targets'.
//!
//! 1. The exporter is a reader of the journal, not of the event bus: a slow
//!    or absent server delays the export and nothing else, and what piles
//!    up waits on disk (retention permitting: events deleted before they
//!    were exported are counted as lost).
//! 2. Each event is one message on `<prefix>.<host>.<kind>` (kind: `hit`,
//!    `thread_started`, …), its payload the event as `StreamEvents` sends
//!    it (`wpd.v1.StreamEventsResponse`, protobuf), its headers the host,
//!    sequence number, pid, tid, process and thread names.
//! 3. Up to [`WINDOW`] publishes wait for their acknowledgements at once,
//!    pipelined on the connection: each message's reply subject is
//!    `<inbox>.<seq>` under one subscription of the connection's own, so an
//!    acknowledgement names its event with no request state per message
//!    ([`Window`]); none for [`ACK_TIMEOUT`] while some are awaited, or
//!    a dropped connection while waiting, is an error. The position acknowledged in order is kept in `<state dir>/export/`
//!    (`nats.cursor`). After an error (server gone, timeout) the exporter
//!    waits, reconnects and publishes again from that position: JetStream
//!    drops the repeats by their message id (`Nats-Msg-Id`: the journal's
//!    identity and the sequence number) within its duplicate window. A
//!    position read back that does not parse or names another journal
//!    starts the export over from the oldest event (repeats rather than
//!    events never exported); one beyond the journal's end (a torn tail cut
//!    at start, a forged file) goes on from the end, so that the new events
//!    given those numbers are exported.
//!
//! Rooms: `message.rs` (each event's subject and headers), `window.rs`
//! (the publishes awaiting acknowledgement), `cursor.rs` (the position
//! kept on disk). This file holds the settings, the counters and the
//! exporter's loop.

mod cursor;
mod message;
mod window;

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use prost::Message;

use crate::journal::{Item, Journal, Start};
use crate::wire::head;
use cursor::{start_position, write_cursor};
pub use message::token;
use message::{Headers, Subjects, reply_subject};
use window::{Link, Window};

/// Publishes waiting for their acknowledgement at most.
pub const WINDOW: usize = 1024;
/// Events read from the journal at once.
const BATCH: usize = 1024;
/// Longest wait for an acknowledgement while some are awaited.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// While waiting for one, how often the connection is checked.
const LINK_CHECK: Duration = Duration::from_millis(100);

/// How the exporter proves who it is to the server.
#[derive(Debug, Clone, Default)]
pub enum Auth {
    /// Nothing (a server without authorization).
    #[default]
    None,
    /// A token (`authorization { token: ... }`).
    Token(crate::secret::Secret),
    /// A user and password.
    UserPassword(String, crate::secret::Secret),
    /// A NATS credentials file (JWT and NKey seed, as `nsc` makes them).
    CredsFile(PathBuf),
}

/// TLS to the server.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    /// PEM file of the CA(s) the server's certificate must chain to; TLS is
    /// required when set.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM), for servers that verify clients.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Export settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server URL(s), comma-separated (`nats://127.0.0.1:4222`,
    /// `tls://host:4222`), without credentials ([`check_url`]).
    pub url: String,
    /// Authentication.
    pub auth: Auth,
    /// TLS settings.
    pub tls: Tls,
    /// Subject prefix (`wpd`): events go to `<prefix>.<host>.<kind>`.
    pub prefix: String,
    /// JetStream stream, created (file storage, subjects `<prefix>.>`)
    /// if missing.
    pub stream: String,
    /// This host's name in subjects and headers.
    pub host: String,
    /// Where the acknowledged position is kept.
    pub dir: PathBuf,
}

/// The exporter's counters.
#[derive(Debug, Default)]
pub struct Stats {
    /// Sequence number of the last event acknowledged in order (every
    /// event up to it is in the stream, or was lost before export).
    pub acked_seq: AtomicU64,
    /// Messages published (repeats after an error included).
    pub published: AtomicU64,
    /// Errors (connection, publish, acknowledgement).
    pub errors: AtomicU64,
    /// Events the journal no longer held when the export reached them.
    pub lost: AtomicU64,
    /// Connected to the server now.
    pub connected: AtomicBool,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// See [`Stats::acked_seq`].
    pub acked_seq: u64,
    /// See [`Stats::published`].
    pub published: u64,
    /// See [`Stats::errors`].
    pub errors: u64,
    /// See [`Stats::lost`].
    pub lost: u64,
    /// See [`Stats::connected`].
    pub connected: bool,
}

impl Stats {
    /// The counters now.
    pub fn figures(&self) -> Figures {
        Figures {
            acked_seq: self.acked_seq.load(Ordering::Relaxed),
            published: self.published.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            connected: self.connected.load(Ordering::Relaxed),
        }
    }
}

/// Names of a process and a thread, for events that do not carry them.
pub type Namer = Arc<dyn Fn(i32, i32) -> (Option<String>, Option<String>) + Send + Sync>;

/// Refuses server URLs that carry credentials (`nats://user:pass@host`): a
/// command line is readable by every user (`/proc/PID/cmdline`) and URLs end
/// up in logs. Credentials go in files (`--export-nats-token-file`,
/// `--export-nats-password-file`, `--export-nats-creds`).
pub fn check_url(url: &str) -> Result<(), String> {
    for server in url.split(',') {
        let rest = server.split_once("://").map_or(server, |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        if authority.contains('@') {
            return Err(
                "--export-nats: a server URL must not carry credentials (every user can read a \
                 command line): give them with --export-nats-token-file, --export-nats-user and \
                 --export-nats-password-file, or --export-nats-creds"
                    .into(),
            );
        }
    }
    Ok(())
}

/// The connection options `cfg` asks for.
async fn connect_options(cfg: &Config) -> std::io::Result<async_nats::ConnectOptions> {
    let mut o = async_nats::ConnectOptions::new()
        .name(format!("wpd {}", cfg.host))
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(2)));
    o = match &cfg.auth {
        Auth::None => o,
        Auth::Token(t) => o.token(t.expose().to_string()),
        Auth::UserPassword(u, p) => o.user_and_password(u.clone(), p.expose().to_string()),
        Auth::CredsFile(f) => o.credentials_file(f).await?,
    };
    if let Some(ca) = &cfg.tls.ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let Some((cert, key)) = &cfg.tls.client {
        o = o.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(o)
}

/// Starts the exporter, counting into `stats` (made before the core, which
/// reads them); it runs until the daemon exits, on a thread of its own
/// (`wpd-export`) with a single-threaded runtime that also runs its NATS
/// connection: reading the journal, publishing and taking the
/// acknowledgements make no wake-up of another thread and leave the gRPC
/// runtime's workers alone (on the shared runtime, a third of the
/// exporter's time went to switching between the workers that ran it and
/// its connection).
pub fn start(
    cfg: Config,
    journal: Arc<Journal>,
    namer: Namer,
    stats: Arc<Stats>,
) -> std::io::Result<()> {
    if !cfg.dir.exists() {
        std::fs::DirBuilder::new()
            .mode(crate::statedir::DIR_MODE)
            .create(&cfg.dir)?;
    }
    let from = start_position(&cfg.dir, journal.id(), journal.written_seq());
    stats.acked_seq.store(from, Ordering::Relaxed);
    let s = stats.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let export = async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            match run(&cfg, &journal, &namer, &s).await {
                Ok(()) => return,
                Err(e) => {
                    s.errors.fetch_add(1, Ordering::Relaxed);
                    s.connected.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        url = %cfg.url,
                        error = %e,
                        retry_in = ?backoff,
                        "export: NATS JetStream unavailable; events wait in the journal"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    };
    std::thread::Builder::new()
        .name("wpd-export".into())
        .spawn(move || runtime.block_on(export))?;
    Ok(())
}

/// One connection's worth of exporting: from the acknowledged position
/// until an error.
async fn run(
    cfg: &Config,
    journal: &Arc<Journal>,
    namer: &Namer,
    stats: &Arc<Stats>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let client = connect_options(cfg)
        .await?
        .connect(cfg.url.as_str())
        .await?;
    let js = jetstream::new(client.clone());
    js.get_or_create_stream(jetstream::stream::Config {
        name: cfg.stream.clone(),
        subjects: vec![format!("{}.>", cfg.prefix)],
        storage: jetstream::stream::StorageType::File,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await?;
    stats.connected.store(true, Ordering::Relaxed);
    tracing::info!(url = %cfg.url, stream = %cfg.stream, "export: connected");
    let subjects = Subjects::new(&cfg.prefix, &token(&cfg.host));
    let heads = Headers::new(&cfg.host, journal.id());
    let mut acked = stats.acked_seq.load(Ordering::Relaxed);
    let mut reader = journal.reader(Start::AfterSeq(acked));
    let mut progress = journal.progress();
    // Acknowledgements come to `<inbox>.<seq>`.
    let inbox = client.new_inbox();
    let mut acks = client.subscribe(format!("{inbox}.*")).await?;
    let mut window = Window::new(acked);
    let link = Link::new(&client);
    let mut last_saved = acked;
    let mut saved_at = tokio::time::Instant::now();
    loop {
        // The exporter's own thread: reading the journal may block it.
        let batch = reader.next_batch(BATCH, u64::MAX)?;
        if batch.is_empty() {
            // Caught up: settle what is in flight, keep the position, wait
            // for the writer.
            while !window.is_empty() {
                window.wait(&mut acks, &inbox, &link).await?;
            }
            acked = window.acked();
            stats.acked_seq.store(acked, Ordering::Relaxed);
            if acked != last_saved {
                write_cursor(&cfg.dir, journal.id(), acked)?;
                last_saved = acked;
                saved_at = tokio::time::Instant::now();
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), progress.changed()).await;
            continue;
        }
        for item in batch {
            let rec = match item {
                Item::Gap { first, last } => {
                    stats.lost.fetch_add(last - first + 1, Ordering::Relaxed);
                    tracing::warn!(first, last, "export: events no longer in the journal");
                    continue;
                }
                Item::Event(rec) => rec,
            };
            let mut ev = match head::Head::decode(rec.payload.as_slice()) {
                Ok(head::Head { event: Some(ev) }) => ev,
                Ok(_) => continue,
                Err(_) => {
                    stats.lost.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let (kind, pid, tid) = ev.kind();
            let (mut process, mut thread) = ev.take_names();
            if pid > 0 && (process.is_none() || (tid > 0 && thread.is_none())) {
                let (p, t) = namer(pid, tid);
                process = process.or(p);
                thread = thread.or(t);
            }
            let headers = heads.of(
                rec.seq,
                rec.time_ns,
                kind,
                pid,
                tid,
                process.as_deref(),
                thread.as_deref(),
            );
            while window.len() >= WINDOW {
                window.wait(&mut acks, &inbox, &link).await?;
            }
            client
                .publish_with_reply_and_headers(
                    subjects.of(kind),
                    reply_subject(&inbox, rec.seq),
                    headers,
                    rec.payload.into(),
                )
                .await?;
            stats.published.fetch_add(1, Ordering::Relaxed);
            window.sent(rec.seq);
            window.take_ready(&mut acks, &inbox)?;
        }
        acked = window.acked();
        stats.acked_seq.store(acked, Ordering::Relaxed);
        if acked != last_saved && saved_at.elapsed() >= Duration::from_millis(200) {
            write_cursor(&cfg.dir, journal.id(), acked)?;
            last_saved = acked;
            saved_at = tokio::time::Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_credentials_are_refused() {
        for bad in [
            "nats://user:pass@127.0.0.1:4222",
            "nats://127.0.0.1:4222,tls://tok@h:1",
            "token@host:4222",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        for good in ["nats://127.0.0.1:4222", "tls://h:1,nats://g:2/", "h:4222"] {
            assert!(check_url(good).is_ok(), "{good}");
        }
    }
}
