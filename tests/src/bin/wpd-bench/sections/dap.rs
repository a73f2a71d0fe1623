//! DAP: an IDE's session through `wpctl dap` on a C target of N threads,
//! two of which write the watched variable all the time (so every stop is a
//! stop-all of N threads), against the same steps made directly over gRPC
//! (the floor the adapter adds to), in one run:
//!
//! - attach + arm: `initialize` … `setDataBreakpoints` answered, against
//!   Attach + SetWatchpoint (by name, stop-all);
//! - first stop: `setDataBreakpoints` sent (and answered) → `stopped`,
//!   against SetWatchpoint sent (and answered) → the stopping hit on a
//!   stream (0 when the stop came before the answer);
//! - continue → next stop, against Resume → the next stopping hit;
//! - `threads` + `stackTrace` of the stopped thread, against ListThreads +
//!   GetThreadStack.
//!
//! First, at one stop of a launched program inside a function with 50
//! locals (`ct-locals`): `scopes` + `variables` of its Locals scope,
//! against GetThreadStack with the locals of that one frame, its floor.
//!
//! With a hit stopping every thread, and only the thread that hit; the
//! adapter at its default `--priority realtime` (SCHED_FIFO 1, the footing
//! of the daemon and of this bench's direct client) and at `normal`.

use crate::*;
use std::collections::VecDeque;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use tokio::io::BufReader;
use tokio::process::{Child, ChildStdin, ChildStdout};
use wpd_proto::v1::stream_events_response::Event;
use wpd_proto::v1::*;
use wpd_tests::{CTarget, Daemon, EventStream, attach, find_bin, rpc_ok};

/// Continues timed per repetition.
const STEPS: usize = 20;

/// A DAP client on an adapter's stdio (`wpctl dap` here; the `steps`
/// section drives lldb-dap with it too). Every wait is bounded by `wait`.
pub(crate) struct Dap {
    pub(crate) child: Child,
    w: ChildStdin,
    r: BufReader<ChildStdout>,
    seq: i64,
    pub(crate) events: VecDeque<Value>,
    pub(crate) wait: Duration,
}

impl Dap {
    /// `fifo`: `--priority realtime` (the default), else `normal`.
    pub(crate) async fn start(daemon: &Daemon, fifo: bool) -> Result<Dap> {
        let priority = if fifo { "realtime" } else { "normal" };
        let mut cmd = tokio::process::Command::new(find_bin("wpctl")?);
        cmd.args([
            "--endpoint",
            &daemon.endpoint(),
            "dap",
            "--priority",
            priority,
        ]);
        Dap::spawn(cmd, Duration::from_secs(60))
    }

    /// The adapter `cmd` started, spoken to over its stdin and stdout.
    pub(crate) fn spawn(mut cmd: tokio::process::Command, wait: Duration) -> Result<Dap> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let w = child.stdin.take().context("stdin")?;
        let r = BufReader::new(child.stdout.take().context("stdout")?);
        Ok(Dap {
            child,
            w,
            r,
            seq: 0,
            events: VecDeque::new(),
            wait,
        })
    }

    /// The next message, within `self.wait`.
    async fn read(&mut self, what: &str) -> Result<Value> {
        Ok(
            tokio::time::timeout(self.wait, wpd_dap::wire::read_message(&mut self.r))
                .await
                .with_context(|| format!("{what}: nothing in {:?}", self.wait))??,
        )
    }

    /// Sends a request; returns its response's body (events meanwhile are
    /// queued).
    pub(crate) async fn call(&mut self, command: &str, arguments: Value) -> Result<Value> {
        self.seq += 1;
        let seq = self.seq;
        let m = json!({"seq": seq, "type": "request", "command": command, "arguments": arguments});
        wpd_dap::wire::write_message(&mut self.w, &m).await?;
        loop {
            let v = self.read(command).await?;
            if v["type"] == "response" && v["request_seq"] == seq {
                ensure!(v["success"] == true, "{command}: {v}");
                return Ok(v["body"].clone());
            }
            if v["type"] == "event" {
                self.events.push_back(v);
            }
        }
    }

    /// The next event named `name` (earlier ones of other names dropped).
    pub(crate) async fn event(&mut self, name: &str) -> Result<Value> {
        self.event_where(name, |_| true).await
    }

    /// The next event named `name` for which `pred` holds (earlier ones
    /// dropped).
    pub(crate) async fn event_where(
        &mut self,
        name: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        while let Some(v) = self.events.pop_front() {
            if v["event"] == name && pred(&v) {
                return Ok(v);
            }
        }
        loop {
            let v = self.read(&format!("a {name} event")).await?;
            if v["type"] == "event" && v["event"] == name && pred(&v) {
                return Ok(v);
            }
        }
    }
}

/// One repetition's figures, ms.
#[derive(Default)]
struct Rep {
    arm: f64,
    /// Arm request sent → first stop.
    first: f64,
    /// Arm answered → first stop (0 when the stop came first).
    after_arm: f64,
    cont: Vec<f64>,
    look: Vec<f64>,
}

pub(crate) async fn section_dap(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    locals_table(args).await?;
    let sizes: Vec<usize> = if args.threads.iter().all(|&n| n <= 100) {
        args.threads.clone()
    } else {
        vec![1000]
    };
    println!(
        "## dap: an IDE session through `wpctl dap` against the same steps over gRPC (C target, 2 writing threads; stop-all; medians of {} reps, continue over {STEPS} stops each)\n",
        args.reps
    );
    println!(
        "| threads | path | attach + arm, ms | arm sent → first stop, ms | armed → first stop, ms | continue → next stop, ms p50 / p90 | threads + stackTrace, ms p50 / p90 |"
    );
    println!("|---|---|---|---|---|---|---|");
    for n in sizes {
        // (label, DAP adapter at SCHED_FIFO?, stop all threads?)
        let paths: [(&str, Option<bool>, bool); 5] = [
            ("wpctl dap, stop all", Some(true), true),
            ("wpctl dap --priority normal, stop all", Some(false), true),
            ("gRPC direct (SCHED_FIFO), stop all", None, true),
            ("wpctl dap, stop the thread", Some(true), false),
            ("gRPC direct (SCHED_FIFO), stop the thread", None, false),
        ];
        let mut reps: Vec<Vec<Rep>> = (0..paths.len()).map(|_| Vec::new()).collect();
        for _ in 0..args.reps {
            for (i, (_, dap, all)) in paths.iter().enumerate() {
                reps[i].push(match dap {
                    Some(fifo) => dap_rep(n, *fifo, *all).await?,
                    None => grpc_rep(n, *all).await?,
                });
            }
        }
        for ((name, _, _), reps) in paths.iter().zip(&reps) {
            let arm = median(reps.iter().map(|r| r.arm).collect());
            let first = median(reps.iter().map(|r| r.first).collect());
            let after = median(reps.iter().map(|r| r.after_arm).collect());
            let cont = p50_p90(reps.iter().flat_map(|r| r.cont.clone()).collect());
            let look = p50_p90(reps.iter().flat_map(|r| r.look.clone()).collect());
            println!(
                "| {n} | {name} | {arm:.1} | {first:.1} | {after:.1} | {:.2} / {:.2} | {:.2} / {:.2} |",
                cont.0, cont.1, look.0, look.1
            );
        }
        let ratio = |a: &[Rep], b: &[Rep], f: fn(&Rep) -> f64| {
            median(a.iter().map(f).collect()) / median(b.iter().map(f).collect())
        };
        for (name, a, b) in [
            ("dap / gRPC, stop all", &reps[0], &reps[2]),
            ("dap / gRPC, stop the thread", &reps[3], &reps[4]),
        ] {
            println!(
                "| {n} | {name} | {:.2}× | {:.2}× | – | {:.2}× | {:.2}× |",
                ratio(a, b, |x| x.arm),
                ratio(a, b, |x| x.first),
                ratio(a, b, |x| median(x.cont.clone())),
                ratio(a, b, |x| median(x.look.clone()))
            );
        }
        flush();
    }
    println!();
    section_done(t0);
    Ok(())
}

/// Requests timed per repetition of the locals table.
const LOOKS: usize = 200;

/// `scopes` + `variables` (Locals) of a frame with 50 locals, against
/// GetThreadStack{locals} of that frame, at one stop; reps alternate.
async fn locals_table(args: &Args) -> Result<()> {
    println!(
        "## dap: scopes + variables of a frame with 50 locals (a launched `ct-locals` held in `fifty()`; {LOOKS} requests each, per rep, {} reps)\n",
        args.reps
    );
    println!("| path | ms p50 | ms p90 | variables |");
    println!("|---|---|---|---|");
    let daemon = Daemon::start().await?;
    let result = async {
        let mut d = Dap::start(&daemon, true).await?;
        d.call(
            "initialize",
            json!({"adapterID": "wpd", "linesStartAt1": true}),
        )
        .await?;
        let program = wpd_tests::ctarget_path("ct-locals");
        let t = Instant::now();
        d.call("launch", json!({"program": program})).await?;
        let launched = ms(t.elapsed());
        let process = d.event("process").await?;
        let pid = process["body"]["systemProcessId"]
            .as_i64()
            .context("no pid")? as i32;
        d.event("initialized").await?;
        let info = d.call("dataBreakpointInfo", json!({"name": "hit"})).await?;
        d.call(
            "setDataBreakpoints",
            json!({"breakpoints": [{"dataId": info["dataId"]}]}),
        )
        .await?;
        let t = Instant::now();
        d.call("configurationDone", json!({})).await?;
        let stop = d.event("stopped").await?;
        let first = ms(t.elapsed());
        let tid = stop["body"]["threadId"].clone();
        let st = d
            .call("stackTrace", json!({"threadId": tid, "levels": 1}))
            .await?;
        ensure!(st["stackFrames"][0]["name"] == "fifty", "{st}");
        let frame = st["stackFrames"][0]["id"].clone();
        let mut c = daemon.client().await?;
        let (mut dap, mut grpc) = (Vec::new(), Vec::new());
        let mut shown = 0;
        for _ in 0..args.reps {
            for _ in 0..LOOKS {
                let t = Instant::now();
                let scopes = d.call("scopes", json!({"frameId": frame})).await?;
                let r = scopes["scopes"][0]["variablesReference"].clone();
                let vars = d
                    .call("variables", json!({"variablesReference": r}))
                    .await?;
                dap.push(ms(t.elapsed()));
                shown = vars["variables"].as_array().map_or(0, Vec::len);
            }
            for _ in 0..LOOKS {
                let t = Instant::now();
                let s = rpc_ok(
                    "GetThreadStack",
                    c.get_thread_stack(GetThreadStackRequest {
                        pid,
                        tid: tid.as_i64().context("tid")? as i32,
                        depth: 1,
                        raw: true,
                        locals: true,
                    }),
                )
                .await?;
                grpc.push(ms(t.elapsed()));
                ensure!(s.locals.first().map_or(0, |f| f.variables.len()) == 50);
            }
        }
        ensure!(shown == 50, "the Locals scope showed {shown} variables");
        let (d50, d90) = p50_p90(dap);
        let (g50, g90) = p50_p90(grpc);
        println!("| wpctl dap: scopes + variables | {d50:.3} | {d90:.3} | {shown} |");
        println!("| gRPC direct: GetThreadStack, locals of 1 frame | {g50:.3} | {g90:.3} | 50 |");
        println!("| dap / gRPC | {:.2}× | {:.2}× | |\n", d50 / g50, d90 / g90);
        println!(
            "launch answered (started, held at its exec, attached): {launched:.1} ms; \
             configurationDone → `hit`'s first store stopped: {first:.1} ms\n"
        );
        d.call("disconnect", json!({})).await?;
        let _ = tokio::time::timeout(Duration::from_secs(10), d.child.wait()).await;
        Ok(())
    }
    .await;
    flush();
    daemon.finish(result)
}

pub(crate) fn p50_p90(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let p90 = ((v.len() as f64 * 0.9).ceil() as usize).clamp(1, v.len()) - 1;
    (v[v.len() / 2], v[p90])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A fresh daemon and target of `n` threads (2 writing `counter`).
async fn setup(n: usize) -> Result<(Daemon, CTarget)> {
    let daemon = Daemon::start().await?;
    let mut t = CTarget::start("ct-pie").await?;
    let idle = n.saturating_sub(3).max(1);
    let got = t.cmd(&format!("threads {idle}")).await?;
    ensure!(got.starts_with("THREADS"), "{got}");
    t.cmd("spin 2").await?;
    Ok((daemon, t))
}

async fn dap_rep(n: usize, fifo: bool, all: bool) -> Result<Rep> {
    let (daemon, t) = setup(n).await?;
    let result = async {
        let mut d = Dap::start(&daemon, fifo).await?;
        let mut rep = Rep::default();
        let start = Instant::now();
        d.call(
            "initialize",
            json!({"adapterID": "wpd", "linesStartAt1": true}),
        )
        .await?;
        let mode = if all { "all" } else { "thread" };
        d.call("attach", json!({"pid": t.pid, "stopOnHit": mode}))
            .await?;
        d.event("initialized").await?;
        d.call("configurationDone", json!({})).await?;
        let info = d
            .call("dataBreakpointInfo", json!({"name": "counter"}))
            .await?;
        let set_at = Instant::now();
        let set = d
            .call(
                "setDataBreakpoints",
                json!({"breakpoints": [{"dataId": info["dataId"]}]}),
            )
            .await?;
        rep.arm = ms(start.elapsed());
        let armed = Instant::now();
        ensure!(set["breakpoints"][0]["verified"] == true, "{set}");
        let queued = d.events.iter().any(|e| e["event"] == "stopped");
        let mut stop = d.event("stopped").await?;
        rep.first = ms(set_at.elapsed());
        rep.after_arm = if queued { 0.0 } else { ms(armed.elapsed()) };
        for _ in 0..STEPS {
            let tid = stop["body"]["threadId"].clone();
            let look = Instant::now();
            d.call("threads", json!({})).await?;
            let st = d
                .call("stackTrace", json!({"threadId": tid, "levels": 20}))
                .await?;
            rep.look.push(ms(look.elapsed()));
            ensure!(st["stackFrames"][0]["name"] == "bump_counter", "{st}");
            let c = Instant::now();
            // Stopping one thread: continue that one (another may be held).
            d.call("continue", json!({"threadId": tid, "singleThread": !all}))
                .await?;
            if all {
                // Every thread runs: stops shown before the answer are over
                // (the adapter handles one input at a time).
                d.events.clear();
            }
            let answered = ms(c.elapsed());
            stop = d.event("stopped").await?;
            rep.cont.push(ms(c.elapsed()));
            if std::env::var_os("WPD_BENCH_TRACE").is_some() {
                eprintln!(
                    "continue answered {answered:.2} ms, stopped {:.2} ms",
                    ms(c.elapsed())
                );
            }
        }
        d.call("disconnect", json!({})).await?;
        let _ = tokio::time::timeout(Duration::from_secs(10), d.child.wait()).await;
        Ok(rep)
    }
    .await;
    daemon.finish(result)
}

/// The next hit that stopped its thread.
async fn next_stop(events: &mut EventStream) -> Result<i32> {
    events
        .wait_for(Duration::from_secs(60), "a stopping hit", |e| {
            Ok(match e {
                Event::Hit(h) if h.stopped => Some(h.tid),
                _ => None,
            })
        })
        .await
}

async fn grpc_rep(n: usize, all: bool) -> Result<Rep> {
    let (daemon, t) = setup(n).await?;
    let result = async {
        let mut c = daemon.client().await?;
        let mut rep = Rep::default();
        let mut events = EventStream::subscribe(
            &mut c,
            StreamEventsRequest {
                pid: t.pid,
                hits_only: true,
                ..Default::default()
            },
        )
        .await?;
        let start = Instant::now();
        attach(&mut c, t.pid, Backend::Ptrace).await?;
        let spec = WatchpointSpec {
            pid: t.pid,
            symbol: "counter".into(),
            access: Access::Write as i32,
            action: if all {
                HitAction::StopAll
            } else {
                HitAction::Stop
            } as i32,
            ..Default::default()
        };
        let set_at = Instant::now();
        rpc_ok(
            "SetWatchpoint",
            c.set_watchpoint(SetWatchpointRequest { spec: Some(spec) }),
        )
        .await?;
        rep.arm = ms(start.elapsed());
        let armed = Instant::now();
        let mut tid = next_stop(&mut events).await?;
        rep.first = ms(set_at.elapsed());
        rep.after_arm = ms(armed.elapsed());
        for _ in 0..STEPS {
            let look = Instant::now();
            rpc_ok(
                "ListThreads",
                c.list_threads(ListThreadsRequest {
                    pid: t.pid,
                    ..Default::default()
                }),
            )
            .await?;
            rpc_ok(
                "GetThreadStack",
                c.get_thread_stack(GetThreadStackRequest {
                    pid: t.pid,
                    tid,
                    depth: 20,
                    raw: false,
                    locals: false,
                }),
            )
            .await?;
            rep.look.push(ms(look.elapsed()));
            let r = Instant::now();
            rpc_ok(
                "Resume",
                c.resume(ResumeRequest {
                    pid: t.pid,
                    tids: if all { vec![] } else { vec![tid] },
                }),
            )
            .await?;
            // A hit of the previous stop may come after the Resume: the
            // next stop is the first whose thread is held when it comes.
            loop {
                tid = next_stop(&mut events).await?;
                let held = rpc_ok(
                    "ListThreads",
                    c.list_threads(ListThreadsRequest {
                        pid: t.pid,
                        tids: vec![tid],
                        probe: false,
                    }),
                )
                .await?
                .threads
                .iter()
                .any(|th| th.state == ThreadState::StoppedAtHit as i32);
                if held {
                    break;
                }
                if r.elapsed() > Duration::from_secs(60) {
                    bail!("no held thread after Resume");
                }
            }
            rep.cont.push(ms(r.elapsed()));
        }
        Ok(rep)
    }
    .await;
    daemon.finish(result)
}
