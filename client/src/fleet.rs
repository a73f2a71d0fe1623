//! Several daemons from one command: the subcommand runs on every host at
//! once, each line of output (or JSON record) is tagged with its host, a host
//! that fails is reported without stopping the others, and the exit code
//! sums up (see [`exit_of`]).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use wpd_proto::v1::StreamEventsResponse;

use crate::cmd::{self, Ctx, Report};
use crate::error::{Error, Exit};
use crate::output;
use crate::{Command, EventsArgs};

/// One daemon of the fleet.
#[derive(Debug)]
pub struct Host {
    /// What its output is tagged with: the name from the endpoints file, or
    /// the endpoint's `HOST:PORT` (a socket endpoint: as given).
    pub label: String,
    /// How to reach it.
    pub ctx: Ctx,
}

/// The tag of a host with no name: `HOST:PORT` for TCP endpoints (with or
/// without TLS), the endpoint as given for a socket.
pub fn default_label(endpoint: &crate::Endpoint) -> String {
    use wpd_proto::connect::Target;
    match &endpoint.target {
        Target::Tcp(uri) => uri.strip_prefix("http://").unwrap_or(uri).to_string(),
        Target::Tls(uri) => uri.strip_prefix("https://").unwrap_or(uri).to_string(),
        Target::Unix(_) => endpoint.text.clone(),
    }
}

/// The name of a subcommand that acts on one daemon only, or `None` for
/// those that run on every host (and those that talk to no daemon).
pub fn single_daemon_only(command: &Command) -> Option<&'static str> {
    match command {
        Command::Caps
        | Command::Watch(_)
        | Command::Unwatch(_)
        | Command::List(_)
        | Command::Threads(_)
        | Command::Events(_)
        | Command::Stats
        | Command::Health
        | Command::Completions(_)
        | Command::Man(_) => None,
        Command::Attach(_) => Some("attach"),
        Command::Detach(_) => Some("detach"),
        Command::Resume(_) => Some("resume"),
        Command::Last(_) => Some("last"),
        Command::Aggregates(_) => Some("aggregates"),
        Command::Pause(_) => Some("pause"),
        Command::Stack(_) => Some("stack"),
        Command::Dap(_) => Some("dap"),
        Command::Symbol(_) => Some("symbol"),
    }
}

/// Output tags, padded to the longest so that columns line up across hosts.
#[derive(Debug)]
pub struct Tags {
    width: usize,
}

impl Tags {
    /// Tags for these host labels.
    pub fn new<'a>(labels: impl IntoIterator<Item = &'a str>) -> Self {
        let width = labels
            .into_iter()
            .map(|l| l.chars().count() + 2)
            .max()
            .unwrap_or(0);
        Tags { width }
    }

    /// `text` with every line prefixed by `[label]` and a space (a blank line
    /// keeps the tag alone), without trailing spaces.
    pub fn text(&self, label: &str, text: &str) -> String {
        let tag = format!("[{label}]");
        let mut out = String::new();
        for line in text.trim_end_matches('\n').split('\n') {
            let tagged = format!("{tag:<w$} {line}", w = self.width);
            out.push_str(tagged.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A JSON record of `label`: the object with a `"host"` field added (any
/// other value becomes `{"host", "value"}`).
pub fn tag_json(label: &str, value: Value) -> Value {
    match value {
        Value::Object(mut map) => {
            map.insert("host".into(), json!(label));
            Value::Object(map)
        }
        other => json!({ "host": label, "value": other }),
    }
}

/// The exit code of a fleet command from each host's outcome (`None`:
/// success): 0 when every host succeeded; when every host failed the same
/// way, that failure's code; otherwise [`Exit::Partial`].
pub fn exit_of(outcomes: &[Option<Exit>]) -> Exit {
    let failed: Vec<Exit> = outcomes.iter().flatten().copied().collect();
    match failed.first() {
        None => Exit::Ok,
        Some(&first) if failed.len() == outcomes.len() && failed.iter().all(|&e| e == first) => {
            first
        }
        Some(_) => Exit::Partial,
    }
}

/// Runs `command` on every host and returns the exit code (see [`exit_of`]).
pub async fn run(hosts: Vec<Host>, command: Command, json: bool) -> Exit {
    let hosts = Arc::new(hosts);
    let tags = Tags::new(hosts.iter().map(|h| h.label.as_str()));
    let out = Out { tags, json };
    let outcomes = match command {
        Command::Events(args) => events(&hosts, Arc::new(args), &out).await,
        other => unary(&hosts, Arc::new(other), &out).await,
    };
    match outcomes {
        Ok(outcomes) => exit_of(&outcomes),
        Err(err) => {
            crate::report(&err, json);
            err.exit()
        }
    }
}

/// How results are printed.
#[derive(Debug)]
struct Out {
    tags: Tags,
    json: bool,
}

impl Out {
    /// A host's answer: its warnings (text mode) on stderr, then its text
    /// with every line tagged, or its JSON as one record with `"host"`.
    fn report(&self, label: &str, report: Report) -> Result<(), Error> {
        if self.json {
            return output::emit_json_line(&tag_json(label, report.json));
        }
        for w in &report.warnings {
            eprintln!("wpctl: [{label}] warning: {w}");
        }
        output::emit(&self.tags.text(label, &report.text))
    }

    /// A host's failure: one line on stderr naming the host (JSON in `--json`
    /// mode), and in `--json` mode also an `{"host", "error"}` record on
    /// stdout, so that the stream accounts for every host.
    fn failure(&self, label: &str, err: &Error) -> Result<(), Error> {
        if self.json {
            let mut record = err.to_json();
            record["host"] = json!(label);
            record["error"]["message"] = json!(err.host_message());
            eprintln!("{record}");
            output::emit_json_line(&record)
        } else {
            eprintln!("wpctl: [{label}] {}", err.host_message());
            Ok(())
        }
    }

    /// One event of a host.
    fn event(&self, label: &str, ev: &StreamEventsResponse) -> Result<(), Error> {
        if self.json {
            output::emit_json_line(&tag_json(label, cmd::events::to_json(ev)))
        } else {
            output::emit(&self.tags.text(label, &cmd::events::to_text(ev)))
        }
    }
}

/// One call's answer, rendered, from one host.
async fn report(ctx: &Ctx, command: &Command) -> Result<Report, Error> {
    match command {
        Command::Caps => cmd::caps::report(ctx).await,
        Command::Watch(a) => cmd::watch::report(ctx, a).await,
        Command::Unwatch(a) => cmd::unwatch::report(ctx, a).await,
        Command::List(a) => cmd::list::report(ctx, a).await,
        Command::Threads(a) => cmd::threads::report(ctx, a).await,
        Command::Stats => cmd::stats::report(ctx).await,
        Command::Health => cmd::health::report(ctx).await,
        // `main` sends the others to one daemon, or refuses them.
        _ => Err(Error::Local(
            "this subcommand does not run on several daemons".into(),
        )),
    }
}

/// Makes the call on every host at once; prints the answers in the order
/// the hosts were given, each as soon as those before it are printed.
async fn unary(
    hosts: &Arc<Vec<Host>>,
    command: Arc<Command>,
    out: &Out,
) -> Result<Vec<Option<Exit>>, Error> {
    let mut calls = JoinSet::new();
    for i in 0..hosts.len() {
        let (hosts, command) = (hosts.clone(), command.clone());
        calls.spawn(async move { (i, report(&hosts[i].ctx, &command).await) });
    }
    let mut answers: Vec<Option<Result<Report, Error>>> = hosts.iter().map(|_| None).collect();
    let mut outcomes = Vec::with_capacity(hosts.len());
    while let Some(joined) = calls.join_next().await {
        let (i, answer) = joined.map_err(|e| Error::Local(format!("a call task failed: {e}")))?;
        answers[i] = Some(answer);
        while let Some(answer) = answers.get_mut(outcomes.len()).and_then(Option::take) {
            let label = &hosts[outcomes.len()].label;
            match answer {
                Ok(report) => {
                    out.report(label, report)?;
                    outcomes.push(None);
                }
                Err(err) => {
                    out.failure(label, &err)?;
                    outcomes.push(Some(err.exit()));
                }
            }
        }
    }
    Ok(outcomes)
}

/// What a host's event task reports.
enum Item {
    /// Its stream is open.
    Opened,
    /// An event.
    Event(Box<StreamEventsResponse>),
    /// The daemon ended the stream.
    Ended,
    /// The stream could not be opened, or broke.
    Failed(Error),
}

/// Where a host's stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// Not open yet.
    Opening,
    /// Delivering events.
    Open,
    /// Ended or failed.
    Done,
}

/// Follows every host's events, printed as they come, each tagged. Ends
/// when every stream has ended or failed, or after `--count` events in all;
/// then, so that the exit code covers every host, it waits (discarding
/// events) until no stream is still being opened (bounded by --timeout).
async fn events(
    hosts: &Arc<Vec<Host>>,
    args: Arc<EventsArgs>,
    out: &Out,
) -> Result<Vec<Option<Exit>>, Error> {
    // One instant for every host: `--since 10m` means the same on each.
    let replay = cmd::events::replay(&args);
    let (tx, mut rx) = mpsc::channel::<(usize, Item)>(256);
    let mut tasks = JoinSet::new();
    for i in 0..hosts.len() {
        let (hosts, args, tx) = (hosts.clone(), args.clone(), tx.clone());
        tasks.spawn(async move {
            let ctx = &hosts[i].ctx;
            let mut stream = match cmd::events::open(ctx, &args, replay).await {
                Ok(stream) => stream,
                Err(err) => {
                    let _ = tx.send((i, Item::Failed(err))).await;
                    return;
                }
            };
            if tx.send((i, Item::Opened)).await.is_err() {
                return;
            }
            loop {
                let item = match stream.message().await {
                    Ok(Some(ev)) => Item::Event(Box::new(ev)),
                    Ok(None) => Item::Ended,
                    Err(status) => Item::Failed(Error::from_status(&ctx.endpoint.text, status)),
                };
                let last = !matches!(item, Item::Event(_));
                if tx.send((i, item)).await.is_err() || last {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut state = vec![Stream::Opening; hosts.len()];
    let mut outcomes = vec![None; hosts.len()];
    let mut printed = 0u64;
    let counting = |printed: u64| args.count.is_none_or(|n| printed < n);
    while counting(printed) || state.contains(&Stream::Opening) {
        let Some((i, item)) = rx.recv().await else {
            break;
        };
        let label = &hosts[i].label;
        match item {
            Item::Opened => state[i] = Stream::Open,
            Item::Event(ev) => {
                if counting(printed) {
                    out.event(label, &ev)?;
                    printed += 1;
                }
            }
            Item::Ended => state[i] = Stream::Done,
            Item::Failed(err) => {
                state[i] = Stream::Done;
                out.failure(label, &err)?;
                outcomes[i] = Some(err.exit());
            }
        }
    }
    tasks.abort_all();
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Endpoint;

    #[test]
    fn tags_prefix_every_line_aligned() {
        let tags = Tags::new(["h1", "host-22", "10.0.0.3:7070"]);
        assert_eq!(tags.text("h1", "one"), "[h1]            one\n");
        assert_eq!(
            tags.text("10.0.0.3:7070", "ID  PID\n7   123\n"),
            "[10.0.0.3:7070] ID  PID\n[10.0.0.3:7070] 7   123\n"
        );
        // Blank lines keep their tag; no trailing spaces.
        assert_eq!(
            tags.text("host-22", "a\n\nb"),
            "[host-22]       a\n[host-22]\n[host-22]       b\n"
        );
    }

    #[test]
    fn json_records_carry_the_host() {
        let v = tag_json("h1", json!({ "hits": 3, "watchpoints": [] }));
        assert_eq!(v, json!({ "host": "h1", "hits": 3, "watchpoints": [] }));
        let v = tag_json("h2", json!([1, 2]));
        assert_eq!(v, json!({ "host": "h2", "value": [1, 2] }));
        let err = Error::Unreachable {
            endpoint: "tcp://h:1".into(),
            detail: "Connection refused (os error 111)".into(),
        };
        let mut record = err.to_json();
        record["host"] = json!("h1");
        assert_eq!(record["host"], "h1");
        assert_eq!(record["error"]["code"], "UNAVAILABLE");
        assert_eq!(record["error"]["exit_code"], 3);
    }

    #[test]
    fn exit_codes_of_a_fleet() {
        fn check(outcomes: &[Option<Exit>], expected: Exit) {
            assert_eq!(exit_of(outcomes), expected, "{outcomes:?}");
        }
        check(&[None, None, None], Exit::Ok);
        check(&[None, Some(Exit::Unreachable), None], Exit::Partial);
        check(
            &[Some(Exit::Unreachable), Some(Exit::Unreachable)],
            Exit::Unreachable,
        );
        check(
            &[Some(Exit::Unreachable), Some(Exit::PermissionDenied)],
            Exit::Partial,
        );
        check(&[Some(Exit::NotFound)], Exit::NotFound);
        check(&[], Exit::Ok);
    }

    #[test]
    fn default_labels() {
        fn check(endpoint: &str, expected: &str) {
            let e: Endpoint = endpoint.parse().unwrap();
            assert_eq!(default_label(&e), expected, "{endpoint}");
        }
        check("tcp://10.0.0.1:7070", "10.0.0.1:7070");
        check("http://h:1", "h:1");
        check("https://farm-3.example:7070", "farm-3.example:7070");
        check("unix:/run/wpd/wpd.sock", "unix:/run/wpd/wpd.sock");
        check("/tmp/w.sock", "/tmp/w.sock");
    }
}
