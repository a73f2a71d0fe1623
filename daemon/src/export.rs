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

use std::collections::VecDeque;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_nats::jetstream;
use prost::Message;
use tokio_stream::{Stream, StreamExt};

use crate::journal::{Item, Journal, Start};

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

/// A subject token: what NATS allows between dots.
pub fn token(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if t.is_empty() { "_".into() } else { t }
}

/// A header value for text a target chose: escaped (no control
/// character), checked by the library's own validation rather than its
/// panicking conversion.
fn header_text(s: &str) -> async_nats::HeaderValue {
    let e = wpd_proto::text::escape(s);
    e.parse().unwrap_or_default()
}

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

use crate::wire::head;

/// Subject kinds, in the order of [`Subjects`].
const KINDS: [&str; 12] = [
    "hit",
    "thread_started",
    "thread_exited",
    "process_exited",
    "watchpoint_removed",
    "records_lost",
    "process_lost",
    "process_crashed",
    "breakpoint_hit",
    "watchpoint_resolved",
    "dropped",
    "leased",
];

/// The subject of each kind, `<prefix>.<host>.<kind>`, made once.
struct Subjects(Vec<async_nats::Subject>);

impl Subjects {
    fn new(prefix: &str, host: &str) -> Subjects {
        Subjects(
            KINDS
                .iter()
                .map(|k| async_nats::Subject::from(format!("{prefix}.{host}.{k}")))
                .collect(),
        )
    }

    fn of(&self, kind: &str) -> async_nats::Subject {
        let i = KINDS
            .iter()
            .position(|k| *k == kind)
            .expect("a kind of KINDS");
        self.0[i].clone()
    }
}

/// Header names, parsed once (`HeaderName::from_static`).
mod names {
    use async_nats::HeaderName;
    pub const HOST: HeaderName = HeaderName::from_static("Wpd-Host");
    pub const SEQ: HeaderName = HeaderName::from_static("Wpd-Seq");
    pub const TIME: HeaderName = HeaderName::from_static("Wpd-Time-Ns");
    pub const KIND: HeaderName = HeaderName::from_static("Wpd-Kind");
    pub const PID: HeaderName = HeaderName::from_static("Wpd-Pid");
    pub const TID: HeaderName = HeaderName::from_static("Wpd-Tid");
    pub const PROCESS: HeaderName = HeaderName::from_static("Wpd-Process");
    pub const THREAD: HeaderName = HeaderName::from_static("Wpd-Thread");
    pub const CONTENT_TYPE: HeaderName = HeaderName::from_static("Content-Type");
}

/// Content type of every message.
const CONTENT_TYPE: &str = "application/x-protobuf; messageType=wpd.v1.StreamEventsResponse";

/// The headers of each message: a clone of a map made once, which holds
/// the values every message of this exporter shares (host, content type)
/// and every other name with no value yet, so that an event's values are
/// appended to names already in its table: no table grows and no name is
/// parsed per message. A name left without a value is not sent.
struct Headers {
    template: async_nats::HeaderMap,
    /// `<journal id>-`, the message id's prefix.
    id_prefix: String,
}

impl Headers {
    fn new(host: &str, journal_id: &str) -> Headers {
        Headers {
            template: template(host).unwrap_or_else(|| {
                let mut h = async_nats::HeaderMap::new();
                h.insert(names::HOST, host);
                h.insert(names::CONTENT_TYPE, CONTENT_TYPE);
                h
            }),
            id_prefix: format!("{journal_id}-"),
        }
    }

    /// The headers of event `seq`.
    #[allow(clippy::too_many_arguments)]
    fn of(
        &self,
        seq: u64,
        time_ns: u64,
        kind: &'static str,
        pid: i32,
        tid: i32,
        process: Option<&str>,
        thread: Option<&str>,
    ) -> async_nats::HeaderMap {
        let mut h = self.template.clone();
        h.append(names::SEQ, number(seq));
        h.append(names::TIME, number(time_ns));
        h.append(names::KIND, kind);
        if pid > 0 {
            h.append(names::PID, number(pid));
        }
        if tid > 0 {
            h.append(names::TID, number(tid));
        }
        // Names are the target's choice (`prctl(PR_SET_NAME)`): a line
        // break in a header value would end the header block (and
        // async-nats panics on one), so they go out escaped.
        if let Some(p) = process {
            h.append(names::PROCESS, header_text(p));
        }
        if let Some(t) = thread {
            h.append(names::THREAD, header_text(t));
        }
        let mut id = String::with_capacity(self.id_prefix.len() + 20);
        id.push_str(&self.id_prefix);
        id.push_str(itoa::Buffer::new().format(seq));
        h.append(async_nats::header::NATS_MESSAGE_ID, id);
        h
    }
}

/// The map [`Headers`] clones: every name of a message, those shared
/// with their value. `HeaderMap` has no way to make a table of a given
/// size or a name without a value but its `Deserialize` (a map of names to
/// lists of values, the table sized for them all); `None` if that fails,
/// and the headers are then inserted one by one.
fn template(host: &str) -> Option<async_nats::HeaderMap> {
    use serde::Deserialize;
    use serde::de::value::{Error, MapDeserializer};
    let none = Vec::new;
    let entries: Vec<(&str, Vec<&str>)> = vec![
        ("Wpd-Host", vec![host]),
        ("Content-Type", vec![CONTENT_TYPE]),
        ("Wpd-Seq", none()),
        ("Wpd-Time-Ns", none()),
        ("Wpd-Kind", none()),
        ("Wpd-Pid", none()),
        ("Wpd-Tid", none()),
        ("Wpd-Process", none()),
        ("Wpd-Thread", none()),
        ("Nats-Msg-Id", none()),
    ];
    async_nats::HeaderMap::deserialize(MapDeserializer::<_, Error>::new(entries.into_iter())).ok()
}

/// `n` in decimal, as an owned header value.
fn number(n: impl itoa::Integer) -> String {
    itoa::Buffer::new().format(n).to_owned()
}

/// The reply subject of event `seq`'s acknowledgement: `<inbox>.<seq>`.
fn reply_subject(inbox: &str, seq: u64) -> async_nats::Subject {
    let mut s = String::with_capacity(inbox.len() + 21);
    s.push_str(inbox);
    s.push('.');
    s.push_str(itoa::Buffer::new().format(seq));
    async_nats::Subject::from(s)
}

/// The acknowledged position kept on disk.
fn cursor_path(dir: &Path) -> PathBuf {
    dir.join("nats.cursor")
}

/// Reads the position: (journal id, last acknowledged seq). A file that
/// does not parse is reported and counts as none.
fn read_cursor(dir: &Path) -> Option<(String, u64)> {
    let path = cursor_path(dir);
    let b = match crate::statedir::read(&path, 4096) {
        Ok(b) => b?,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "export: position unreadable");
            return None;
        }
    };
    let parsed = String::from_utf8(b).ok().and_then(|s| {
        let (id, seq) = s.trim().split_once(' ')?;
        let seq: u64 = seq.parse().ok()?;
        (!id.is_empty() && id.len() <= 64 && seq <= crate::journal::segment::MAX_SEQ)
            .then(|| (id.to_string(), seq))
    });
    if parsed.is_none() {
        tracing::warn!(
            file = %path.display(),
            "export: the position is damaged; the export starts over from the oldest event"
        );
    }
    parsed
}

/// Where the export starts: the position kept, if it is this journal's,
/// and never beyond what the journal holds (a forged or damaged position,
/// or a tail cut at start: the numbers after the end will be given to new
/// events, which must not be skipped); else the oldest event.
fn start_position(dir: &Path, journal_id: &str, written: u64) -> u64 {
    match read_cursor(dir) {
        Some((id, seq)) if id == journal_id && seq <= written => seq,
        Some((id, seq)) if id == journal_id => {
            tracing::warn!(
                acked = seq,
                written,
                "export: the position kept is beyond the journal's end; the export goes on from \
                 the end"
            );
            written
        }
        // Another journal's (the state directory was replaced): nothing
        // here.
        _ => 0,
    }
}

fn write_cursor(dir: &Path, journal_id: &str, seq: u64) -> std::io::Result<()> {
    crate::statedir::replace(
        &cursor_path(dir),
        format!("{journal_id} {seq}\n").as_bytes(),
    )
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

/// The connection the publishes went out on: the client reconnects by
/// itself, but an acknowledgement sent while it was away never comes.
struct Link {
    client: async_nats::Client,
    /// Connections made before the first publish.
    connects: u64,
}

impl Link {
    fn new(client: &async_nats::Client) -> Self {
        Link {
            client: client.clone(),
            connects: client.statistics().connects.load(Ordering::Relaxed),
        }
    }

    /// Whether the connection dropped since [`Link::new`].
    fn dropped(&self) -> bool {
        self.client.connection_state() != async_nats::connection::State::Connected
            || self.client.statistics().connects.load(Ordering::Relaxed) != self.connects
    }
}

/// The publishes awaiting their acknowledgement, oldest first, and the
/// position acknowledged in order: every event up to it is stored by the
/// server (or was a gap of the journal, counted lost).
#[derive(Debug)]
struct Window {
    /// Sequence numbers sent, increasing, each with whether it is
    /// acknowledged yet.
    sent: VecDeque<(u64, bool)>,
    /// The position acknowledged in order.
    acked: u64,
}

/// Why an acknowledgement ended the connection's export.
#[derive(Debug, thiserror::Error)]
enum AckError {
    /// The server refused a message (its JetStream error, or a status
    /// such as 503: no stream for the subject).
    #[error("JetStream refused event {seq}: {why}")]
    Refused { seq: u64, why: String },
    /// Nothing came for [`ACK_TIMEOUT`].
    #[error("no acknowledgement for {0:?}")]
    TimedOut(Duration),
    /// The connection dropped (and the client may have connected again):
    /// what was in flight may never be acknowledged.
    #[error("the connection dropped with {0} publishes unacknowledged")]
    Dropped(usize),
    /// The subscription ended (the connection closed).
    #[error("the acknowledgements' subscription ended")]
    Closed,
}

impl Window {
    fn new(acked: u64) -> Self {
        Window {
            sent: VecDeque::with_capacity(WINDOW),
            acked,
        }
    }

    fn len(&self) -> usize {
        self.sent.len()
    }

    fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// The position acknowledged in order.
    fn acked(&self) -> u64 {
        self.acked
    }

    /// Event `seq` was published (after every one sent before).
    fn sent(&mut self, seq: u64) {
        debug_assert!(self.sent.back().is_none_or(|&(s, _)| s < seq));
        self.sent.push_back((seq, false));
    }

    /// Event `seq` is acknowledged; the in-order position moves past every
    /// acknowledged event at the front. An acknowledgement of an event not
    /// awaited (a repeat) changes nothing.
    fn ack(&mut self, seq: u64) {
        if let Ok(i) = self.sent.binary_search_by_key(&seq, |&(s, _)| s) {
            self.sent[i].1 = true;
        }
        while let Some(&(s, true)) = self.sent.front() {
            self.acked = s;
            self.sent.pop_front();
        }
    }

    /// Applies one message of the acknowledgements' subscription.
    fn receive(&mut self, m: &async_nats::Message, inbox: &str) -> Result<(), AckError> {
        let Some(seq) = m
            .subject
            .as_str()
            .strip_prefix(inbox)
            .and_then(|s| s.strip_prefix('.'))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return Ok(());
        };
        if let Some(status) = m.status {
            return Err(AckError::Refused {
                seq,
                why: format!("status {status}"),
            });
        }
        // `{"stream":…,"seq":…}`, with `"duplicate":true` for a repeat;
        // `{"error":{…}}` for a refusal.
        if m.payload.windows(8).any(|w| w == b"\"error\":") {
            return Err(AckError::Refused {
                seq,
                why: String::from_utf8_lossy(&m.payload).into_owned(),
            });
        }
        self.ack(seq);
        Ok(())
    }

    /// Waits for the next acknowledgement (at most [`ACK_TIMEOUT`]) and
    /// applies it with every other one already there.
    async fn wait<S>(&mut self, acks: &mut S, inbox: &str, link: &Link) -> Result<(), AckError>
    where
        S: Stream<Item = async_nats::Message> + Unpin,
    {
        let mut waited = Duration::ZERO;
        let m = loop {
            match tokio::time::timeout(LINK_CHECK, acks.next()).await {
                Ok(m) => break m.ok_or(AckError::Closed)?,
                Err(_) if link.dropped() => return Err(AckError::Dropped(self.len())),
                Err(_) if waited >= ACK_TIMEOUT => return Err(AckError::TimedOut(ACK_TIMEOUT)),
                Err(_) => waited += LINK_CHECK,
            }
        };
        self.receive(&m, inbox)?;
        self.take_ready(acks, inbox)
    }

    /// Applies the acknowledgements already received, without waiting.
    fn take_ready<S>(&mut self, acks: &mut S, inbox: &str) -> Result<(), AckError>
    where
        S: Stream<Item = async_nats::Message> + Unpin,
    {
        // A poll that finds nothing registers no one to wake: the next
        // `wait` polls again with the task's own waker.
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            match std::pin::Pin::new(&mut *acks).poll_next(&mut cx) {
                Poll::Ready(Some(m)) => self.receive(&m, inbox)?,
                Poll::Ready(None) => return Err(AckError::Closed),
                Poll::Pending => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wpd_proto::v1 as pb;
    use wpd_proto::v1::stream_events_response::Event as E;

    /// One event of every kind, with its other fields set too (a field
    /// the head declares with another wire type would fail to decode).
    fn every_kind() -> Vec<E> {
        let place = pb::Location {
            function: "conn_new".into(),
            file: "conn.c".into(),
            line: 42,
            ..Default::default()
        };
        vec![
            E::Hit(pb::Hit {
                watchpoint_id: 3,
                pid: 41,
                tid: 42,
                ip: 0x401000,
                address: 0x7000,
                length: 8,
                value: vec![1, 2, 3, 4, 5, 6, 7, 8],
                old_value: vec![9; 8],
                location: Some(place.clone()),
                backtrace: vec![place.clone()],
                backtrace_note: "note".into(),
                process_name: "server".into(),
                thread_name: "worker 1".into(),
                ..Default::default()
            }),
            E::ThreadStarted(pb::ThreadStarted {
                pid: 43,
                tid: 44,
                ..Default::default()
            }),
            E::ThreadExited(pb::ThreadExited { pid: 45, tid: 46 }),
            E::ProcessExited(pb::ProcessExited {
                pid: 47,
                ..Default::default()
            }),
            E::WatchpointRemoved(pb::WatchpointRemoved {
                watchpoint_id: 5,
                pid: 48,
                reason: "exec".into(),
            }),
            E::RecordsLost(pb::RecordsLost {
                ..Default::default()
            }),
            E::ProcessLost(pb::ProcessLost {
                pid: 49,
                ..Default::default()
            }),
            E::ProcessCrashed(pb::ProcessCrashed {
                pid: 50,
                tid: 51,
                ..Default::default()
            }),
            E::BreakpointHit(pb::BreakpointHit {
                watchpoint_id: 6,
                pid: 52,
                tid: 53,
                count: 2,
                place: Some(pb::BreakpointPlace {
                    function: "conn_new".into(),
                    ..Default::default()
                }),
            }),
            E::WatchpointResolved(pb::WatchpointResolved {
                pid: 54,
                ..Default::default()
            }),
            E::Dropped(pb::EventsDropped {
                ..Default::default()
            }),
            E::Leased(pb::Leased {
                ..Default::default()
            }),
        ]
    }

    #[test]
    fn the_head_reads_what_the_full_decoding_reads() {
        let kinds = every_kind();
        // What each one's head must give, in the same order.
        let wanted = [
            ("hit", 41, 42),
            ("thread_started", 43, 44),
            ("thread_exited", 45, 46),
            ("process_exited", 47, 0),
            ("watchpoint_removed", 48, 0),
            ("records_lost", 0, 0),
            ("process_lost", 49, 0),
            ("process_crashed", 50, 51),
            ("breakpoint_hit", 52, 53),
            ("watchpoint_resolved", 54, 0),
            ("dropped", 0, 0),
            ("leased", 0, 0),
        ];
        assert_eq!(kinds.len(), KINDS.len());
        assert_eq!(kinds.len(), wanted.len());
        for (ev, want) in kinds.into_iter().zip(wanted) {
            let msg = pb::StreamEventsResponse {
                seq: 9,
                time_ns: 10,
                owner: Some(pb::ProcessOwner {
                    start_time: 11,
                    uids: vec![0, 1000, 1000, 1000],
                    ..Default::default()
                }),
                event: Some(ev.clone()),
            };
            let bytes = msg.encode_to_vec();
            let mut head = head::Head::decode(bytes.as_slice())
                .unwrap_or_else(|e| panic!("{ev:?}: {e}"))
                .event
                .expect("an event");
            assert_eq!(head.kind(), want, "{ev:?}");
            assert!(KINDS.contains(&head.kind().0));
            let names = match &ev {
                E::Hit(h) => (Some(h.process_name.clone()), Some(h.thread_name.clone())),
                _ => (None, None),
            };
            assert_eq!(head.take_names(), names, "{ev:?}");
        }
    }

    #[test]
    fn headers_name_the_event_and_its_message_id() {
        // The fast path: every name in one table, two with their values.
        let t = template("host.1").expect("HeaderMap deserializes");
        assert_eq!(t.len(), 10);
        assert_eq!(t.iter().map(|(_, v)| v.len()).sum::<usize>(), 2);
        let h = Headers::new("host.1", "abcd");
        let m = h.of(
            12,
            1_700_000_000_000_000_123,
            "hit",
            41,
            42,
            Some("srv\nx"),
            Some("w"),
        );
        let get = |k: &str| m.get(k).map(|v| v.as_str().to_string());
        assert_eq!(get("Wpd-Host").as_deref(), Some("host.1"));
        assert_eq!(get("Wpd-Seq").as_deref(), Some("12"));
        assert_eq!(get("Wpd-Time-Ns").as_deref(), Some("1700000000000000123"));
        assert_eq!(get("Wpd-Kind").as_deref(), Some("hit"));
        assert_eq!(get("Wpd-Pid").as_deref(), Some("41"));
        assert_eq!(get("Wpd-Tid").as_deref(), Some("42"));
        assert_eq!(get("Wpd-Process").as_deref(), Some("srv\\nx"));
        assert_eq!(get("Wpd-Thread").as_deref(), Some("w"));
        assert_eq!(get("Nats-Msg-Id").as_deref(), Some("abcd-12"));
        assert!(get("Content-Type").is_some());
        // A daemon-wide event: no pid, tid or names.
        let m = h.of(13, 1, "records_lost", 0, 0, None, None);
        for k in ["Wpd-Pid", "Wpd-Tid", "Wpd-Process", "Wpd-Thread"] {
            assert!(m.get(k).is_none(), "{k}");
        }
        assert_eq!(reply_subject("_INBOX.x", 77).as_str(), "_INBOX.x.77");
        let s = Subjects::new("wpd", "h_1");
        assert_eq!(s.of("breakpoint_hit").as_str(), "wpd.h_1.breakpoint_hit");
    }

    #[test]
    fn subject_tokens_hold_no_separator_or_wildcard() {
        assert_eq!(token("host-1.example.org"), "host-1_example_org");
        assert_eq!(token("a b*c>"), "a_b_c_");
        assert_eq!(token(""), "_");
    }

    #[test]
    fn names_a_target_chose_make_valid_header_values() {
        for name in ["evil\nname", "a\r\nNats-Msg-Id: x", "\x1b[2J", "ok", ""] {
            let v = header_text(name);
            assert!(!v.as_str().contains(['\r', '\n']), "{name:?} -> {v:?}");
            let mut h = async_nats::HeaderMap::new();
            h.insert("Wpd-Thread", v);
        }
        assert_eq!(header_text("evil\nname").as_str(), "evil\\nname");
    }

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

    fn ack_message(subject: &str, payload: &str) -> async_nats::Message {
        async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: payload.to_string().into(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn the_window_moves_only_past_events_acknowledged_in_order() {
        let mut w = Window::new(10);
        for seq in [11, 12, 15, 16] {
            w.sent(seq);
        }
        let ok = r#"{"stream":"WPD","seq":7}"#;
        // 15 first: 11 and 12 still wait.
        w.receive(&ack_message("_INBOX.x.15", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (10, 4));
        w.receive(&ack_message("_INBOX.x.11", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (11, 3));
        // A repeat the server dropped as a duplicate is acknowledged too.
        let dup = r#"{"stream":"WPD","seq":5,"duplicate":true}"#;
        w.receive(&ack_message("_INBOX.x.12", dup), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (15, 1));
        // Another inbox's subject, or an event not awaited: nothing moves.
        w.receive(&ack_message("_INBOX.y.16", ok), "_INBOX.x")
            .unwrap();
        w.receive(&ack_message("_INBOX.x.99", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (15, 1));
        let refused = r#"{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":503,"description":"insufficient resources"}}"#;
        let e = w
            .receive(&ack_message("_INBOX.x.16", refused), "_INBOX.x")
            .unwrap_err();
        assert!(matches!(e, AckError::Refused { seq: 16, .. }), "{e}");
        assert_eq!((w.acked(), w.len()), (15, 1));
        let mut no_stream = ack_message("_INBOX.x.16", "");
        no_stream.status = Some(async_nats::StatusCode::NO_RESPONDERS);
        assert!(w.receive(&no_stream, "_INBOX.x").is_err());
        w.receive(&ack_message("_INBOX.x.16", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (16, 0));
    }

    #[test]
    fn the_cursor_names_its_journal() {
        let d = std::env::temp_dir().join(format!("wpd-export-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(read_cursor(&d), None);
        write_cursor(&d, "abc", 42).unwrap();
        assert_eq!(read_cursor(&d), Some(("abc".into(), 42)));
        assert_eq!(start_position(&d, "abc", 50), 42);
        assert_eq!(start_position(&d, "other", 50), 0, "another journal's");
        assert_eq!(
            start_position(&d, "abc", 41),
            41,
            "beyond the journal's end"
        );
        // Garbage of every kind: none, never a panic or a huge position.
        for junk in [
            &b"abc 18446744073709551615\n"[..],
            b"abc -1",
            b"abc",
            b" 5",
            b"\xff\xfe 3",
            b"abc 1 2",
            &[b'a'; 4096],
        ] {
            crate::statedir::replace(&cursor_path(&d), junk).unwrap();
            assert_eq!(read_cursor(&d), None, "{junk:?}");
            assert_eq!(start_position(&d, "abc", u64::MAX), 0);
        }
        std::fs::remove_dir_all(d).unwrap();
    }
}
