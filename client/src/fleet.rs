//! Several daemons from one command: the subcommand runs on every host at
//! once, each line of output (or JSON record) is tagged with its host, a host
//! that fails is reported without stopping the others, and the exit code
//! sums up (see [`exit_of`]).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use wpd_proto::text::escape;
use wpd_proto::v1::StreamEventsResponse;

use crate::Command;
use crate::cmd::events::EventsArgs;
use crate::cmd::{self, Ctx, Report};
use crate::error::{Error, Exit};
use crate::hosts::Host;
use crate::output;

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
        Command::Break(_) => Some("break"),
        Command::Detach(_) => Some("detach"),
        Command::Resume(_) => Some("resume"),
        Command::Last(_) => Some("last"),
        Command::Aggregates(_) => Some("aggregates"),
        Command::Pause(_) => Some("pause"),
        Command::Stack(_) => Some("stack"),
        Command::Step(_) => Some("step"),
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
            .map(|l| escape(l).chars().count() + 2)
            .max()
            .unwrap_or(0);
        Tags { width }
    }

    /// `text` with every line prefixed by `[label]` and a space (a blank line
    /// keeps the tag alone), without trailing spaces.
    pub fn text(&self, label: &str, text: &str) -> String {
        let tag = format!("[{}]", escape(label));
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

/// Most bytes of answers, rendered, that wait for the hosts before them
/// (answers are printed in host order). An answer that would pass it is
/// not kept: its host is reported as failed ([`Error::TooLarge`]).
pub const HELD_BACK_LIMIT: usize = 256 << 20;

/// Most bytes of events, rendered, between the hosts' streams and stdout.
/// A host's stream waits (and, through HTTP/2 flow control, its daemon)
/// while they are taken.
pub const EVENT_BUFFER: usize = 32 << 20;

/// Runs `command` on every host and returns the exit code (see [`exit_of`]).
pub async fn run(hosts: Vec<Host>, command: Command, json: bool) -> Exit {
    let hosts = Arc::new(hosts);
    let tags = Tags::new(hosts.iter().map(|h| h.label.as_str()));
    let out = Arc::new(Out { tags, json });
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

/// A host's answer as it will be written: its warnings for stderr (text
/// mode), and its tagged text or its JSON record for stdout.
#[derive(Debug)]
struct Rendered {
    warnings: Vec<String>,
    stdout: String,
}

impl Rendered {
    /// Bytes it holds.
    fn size(&self) -> usize {
        self.stdout.len() + self.warnings.iter().map(String::len).sum::<usize>()
    }
}

impl Out {
    /// A host's answer: its warnings (text mode), then its text with every
    /// line tagged, or its JSON as one record with `"host"`.
    fn render(&self, label: &str, report: Report) -> Rendered {
        if self.json {
            return Rendered {
                warnings: Vec::new(),
                stdout: output::json_line(&tag_json(label, report.json)),
            };
        }
        Rendered {
            warnings: report
                .warnings
                .iter()
                .map(|w| format!("wpctl: [{}] warning: {}", escape(label), escape(w)))
                .collect(),
            stdout: self.tags.text(label, &report.text),
        }
    }

    /// Writes what [`Out::render`] made.
    fn print(&self, rendered: &Rendered) -> Result<(), Error> {
        for w in &rendered.warnings {
            output::warn(w);
        }
        output::emit(&rendered.stdout)
    }

    /// A host's failure: one line on stderr naming the host (JSON in `--json`
    /// mode), and in `--json` mode also an `{"host", "error"}` record on
    /// stdout, so that the stream accounts for every host.
    fn failure(&self, label: &str, err: &Error) -> Result<(), Error> {
        if self.json {
            let mut record = err.to_json();
            record["host"] = json!(label);
            record["error"]["message"] = json!(err.host_message());
            let line = output::json_line(&record);
            output::warn(&line);
            output::emit(&line)
        } else {
            output::warn(&format!(
                "wpctl: [{}] {}",
                escape(label),
                err.host_message()
            ));
            Ok(())
        }
    }

    /// One event of a host, as it will be written on stdout.
    fn event(&self, label: &str, ev: &StreamEventsResponse) -> String {
        if self.json {
            output::json_line(&tag_json(label, cmd::events::to_json(ev)))
        } else {
            self.tags.text(label, &cmd::events::to_text(ev))
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

/// Answers put in host order: each is taken out as soon as those before it
/// are, and those that wait hold at most `limit` bytes in all.
#[derive(Debug)]
struct InOrder<T> {
    /// Per host, its answer and its size, until taken out.
    slots: Vec<Option<(T, usize)>>,
    /// The host whose answer is taken out next.
    next: usize,
    /// Bytes of the answers in `slots`.
    held: usize,
    /// Most bytes of answers that wait for an earlier host.
    limit: usize,
}

impl<T> InOrder<T> {
    /// For `n` hosts.
    fn new(n: usize, limit: usize) -> Self {
        InOrder {
            slots: (0..n).map(|_| None).collect(),
            next: 0,
            held: 0,
            limit,
        }
    }

    /// Puts host `i`'s answer of `size` bytes. The next host's answer is
    /// always taken; another is given back when it would wait with more
    /// than the limit held.
    fn put(&mut self, i: usize, answer: T, size: usize) -> Result<(), T> {
        if i != self.next && self.held.saturating_add(size) > self.limit {
            return Err(answer);
        }
        self.held += size;
        self.slots[i] = Some((answer, size));
        Ok(())
    }

    /// The next host's answer, when it has come.
    fn take(&mut self) -> Option<(usize, T)> {
        let (answer, size) = self.slots.get_mut(self.next)?.take()?;
        self.held -= size;
        self.next += 1;
        Some((self.next - 1, answer))
    }
}

/// Makes the call on every host at once; prints the answers in the order
/// the hosts were given, each as soon as those before it are printed (at
/// most [`HELD_BACK_LIMIT`] bytes of them waiting).
async fn unary(
    hosts: &Arc<Vec<Host>>,
    command: Arc<Command>,
    out: &Arc<Out>,
) -> Result<Vec<Option<Exit>>, Error> {
    let mut calls = JoinSet::new();
    for i in 0..hosts.len() {
        let (hosts, command, out) = (hosts.clone(), command.clone(), out.clone());
        calls.spawn(async move {
            let host = &hosts[i];
            let answer = report(&host.ctx, &command).await;
            (i, answer.map(|r| out.render(&host.label, r)))
        });
    }
    let mut order = InOrder::new(hosts.len(), HELD_BACK_LIMIT);
    let mut outcomes = Vec::with_capacity(hosts.len());
    while let Some(joined) = calls.join_next().await {
        let (i, answer) = joined.map_err(|e| Error::Local(format!("a call task failed: {e}")))?;
        let size = answer.as_ref().map_or(0, Rendered::size);
        if let Err(answer) = order.put(i, answer, size) {
            drop(answer);
            let err = Error::TooLarge {
                endpoint: hosts[i].ctx.endpoint.text.clone(),
                detail: format!(
                    "an answer of {} that would wait for the hosts before it, beyond the {} \
                     wpctl holds back (run the command on fewer hosts at once)",
                    output::bytes(size as u64),
                    output::bytes(HELD_BACK_LIMIT as u64)
                ),
            };
            let _ = order.put(i, Err(err), 0);
        }
        while let Some((i, answer)) = order.take() {
            let label = &hosts[i].label;
            match answer {
                Ok(rendered) => {
                    out.print(&rendered)?;
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
    /// An event, rendered, and its share of [`EVENT_BUFFER`].
    Event(String, OwnedSemaphorePermit),
    /// The daemon ended the stream.
    Ended,
    /// The stream could not be opened, or broke (an event over
    /// [`cmd::EVENT_LIMIT`] breaks it: that host is cut off).
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
/// At most [`EVENT_BUFFER`] bytes of events wait to be printed.
async fn events(
    hosts: &Arc<Vec<Host>>,
    args: Arc<EventsArgs>,
    out: &Arc<Out>,
) -> Result<Vec<Option<Exit>>, Error> {
    // One instant for every host: `--since 10m` means the same on each.
    let replay = cmd::events::replay(&args);
    let (tx, mut rx) = mpsc::channel::<(usize, Item)>(256);
    let budget = Arc::new(Semaphore::new(EVENT_BUFFER));
    let mut tasks = JoinSet::new();
    for i in 0..hosts.len() {
        let (hosts, args, tx, out, budget) = (
            hosts.clone(),
            args.clone(),
            tx.clone(),
            out.clone(),
            budget.clone(),
        );
        tasks.spawn(async move {
            let host = &hosts[i];
            let ctx = &host.ctx;
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
            // This host's stream numbers its own places.
            let mut places = wpd_proto::places::Places::new();
            let mut pointers = cmd::events::PointerNames::default();
            loop {
                let item = match stream.message().await {
                    Ok(Some(mut ev)) => {
                        places.fill_event(&mut ev);
                        pointers.fill(ctx, &mut ev).await;
                        let line = out.event(&host.label, &ev);
                        drop(ev);
                        let share = line.len().clamp(1, EVENT_BUFFER) as u32;
                        let Ok(permit) = budget.clone().acquire_many_owned(share).await else {
                            return;
                        };
                        Item::Event(line, permit)
                    }
                    Ok(None) => Item::Ended,
                    Err(status) => Item::Failed(Error::from_status(&ctx.endpoint.text, status)),
                };
                let last = !matches!(item, Item::Event(..));
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
        match item {
            Item::Opened => state[i] = Stream::Open,
            Item::Event(line, _permit) => {
                if counting(printed) {
                    output::emit(&line)?;
                    printed += 1;
                }
            }
            Item::Ended => state[i] = Stream::Done,
            Item::Failed(err) => {
                state[i] = Stream::Done;
                out.failure(&hosts[i].label, &err)?;
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
    use crate::endpoints::Endpoint;
    use crate::hosts::default_label;

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
    fn answers_wait_in_order_within_a_limit() {
        let mut o = InOrder::new(4, 100);
        // Host 2 answers first: held.
        assert!(o.put(2, "c", 60).is_ok());
        assert_eq!(o.take(), None);
        // Host 3 would bring what waits over the limit: given back.
        assert_eq!(o.put(3, "d", 41), Err("d"));
        assert!(o.put(3, "d'", 40).is_ok());
        // Host 0 is next: taken whatever its size, then nothing until 1.
        assert!(o.put(0, "a", 1_000).is_ok());
        assert_eq!(o.take(), Some((0, "a")));
        assert_eq!(o.take(), None);
        assert_eq!(o.held, 100);
        assert!(o.put(1, "b", 5).is_ok());
        assert_eq!(o.take(), Some((1, "b")));
        assert_eq!(o.take(), Some((2, "c")));
        assert_eq!(o.take(), Some((3, "d'")));
        assert_eq!(o.take(), None);
        assert_eq!(o.held, 0);
    }

    #[test]
    fn tags_escape_labels() {
        let tags = Tags::new(["a\nb"]);
        assert_eq!(tags.text("a\nb", "x"), "[a\\nb] x\n");
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
