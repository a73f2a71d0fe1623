//! What each event is published as: its subject (`<prefix>.<host>.<kind>`),
//! its headers, and the reply subject its acknowledgement comes to.

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
pub(super) struct Subjects(Vec<async_nats::Subject>);

impl Subjects {
    pub(super) fn new(prefix: &str, host: &str) -> Subjects {
        Subjects(
            KINDS
                .iter()
                .map(|k| async_nats::Subject::from(format!("{prefix}.{host}.{k}")))
                .collect(),
        )
    }

    pub(super) fn of(&self, kind: &str) -> async_nats::Subject {
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
pub(super) struct Headers {
    template: async_nats::HeaderMap,
    /// `<journal id>-`, the message id's prefix.
    id_prefix: String,
}

impl Headers {
    pub(super) fn new(host: &str, journal_id: &str) -> Headers {
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
    pub(super) fn of(
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
pub(super) fn reply_subject(inbox: &str, seq: u64) -> async_nats::Subject {
    let mut s = String::with_capacity(inbox.len() + 21);
    s.push_str(inbox);
    s.push('.');
    s.push_str(itoa::Buffer::new().format(seq));
    async_nats::Subject::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::head;
    use prost::Message;
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
}
