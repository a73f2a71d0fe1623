//! Steps: next, stepIn, stepOut and an instruction step (`next` with
//! granularity `instruction`) in one thread of a process of N threads
//! (`ct-step`, tests/c/stepping.c at -O0: its thread `stepper` loops over
//! a chain of calls while N − 2 workers run), timed from the request to
//! its `stopped` event, through `wpctl dap` and through lldb-dap (Debian's
//! `lldb-19`) in the same run, each session on a fresh target, sessions
//! alternating.
//!
//! A session attaches by pid, sets a function breakpoint on `step_here`,
//! sends configurationDone, and once the stepper stops there removes the
//! breakpoint; then, per cycle: `next` to the loop's call of `middle`,
//! stepIn (into `middle`), stepIn (into `leaf`), next, stepOut, next,
//! next, stepOut (back in the loop), three instruction steps. Each stop is
//! followed by a stackTrace of the thread (untimed), as an IDE does, and
//! the cycle goes on from where it is. The DAP requests leave
//! `singleThread` unset (false), as an IDE sends them: the other threads
//! run during the step. In wpd's sessions the same cycles are then made
//! with `singleThread: true` (the others stay held) and with the daemon's
//! Step over gRPC directly (others run; the floor the adapter adds to),
//! whose answer counts the step's legs (single steps and runs to an
//! internal breakpoint, each a resume and a stop of the stepping thread;
//! a line step reads the line table at each).
//!
//! Every wait is bounded: a session whose adapter does not answer, does
//! not attach or whose step does not stop in time is ended (its adapter,
//! the adapter's children and the target killed) and counted.

use crate::sections::dap::{Dap, p50_p90};
use crate::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;
use wpd_proto::v1::*;
use wpd_tests::{Daemon, line_of};

/// lldb-dap of Debian's `lldb-19`.
const LLDB_DAP: &str = "/usr/bin/lldb-dap-19";
/// Most time a step may take before its session is counted failed.
const STEP_WAIT: Duration = Duration::from_secs(20);
/// Most time a session's setup (start, initialize, attach, first stop)
/// may take.
const SETUP_WAIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Next,
    In,
    Out,
    Insn,
}

const KINDS: [Kind; 4] = [Kind::Next, Kind::In, Kind::Out, Kind::Insn];

/// One path's figures over its sessions.
#[derive(Default)]
struct Path {
    /// ms per step, by kind (`KINDS` order).
    ms: [Vec<f64>; 4],
    /// Legs per step, by kind (gRPC only).
    legs: [Vec<f64>; 4],
    sessions: usize,
    failed: Vec<String>,
    /// Stops whose reason was not `step` (or another thread's).
    odd: usize,
}

/// Where the stepping thread is: function, line.
type At = (String, i64);

/// The target: `ct-step` with `workers` workers, its stdout's "ready" read.
struct Target(tokio::process::Child);

impl Target {
    async fn start(workers: usize) -> Result<Target> {
        let mut child = tokio::process::Command::new(wpd_tests::ctarget_path("ct-step"))
            .arg(workers.to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let out = child.stdout.take().context("stdout")?;
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(60),
            tokio::io::BufReader::new(out).read_line(&mut line),
        )
        .await
        .context("ct-step not ready in 60 s")??;
        ensure!(line.starts_with("ready"), "ct-step said {line:?}");
        Ok(Target(child))
    }

    fn pid(&self) -> i32 {
        self.0.id().map_or(0, |p| p as i32)
    }

    async fn kill(mut self) {
        let _ = self.0.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.0.wait()).await;
    }
}

/// Processes whose parent is `pid`, and theirs.
fn descendants(pid: i32) -> Vec<i32> {
    let mut all = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return all;
    };
    let parents: Vec<(i32, i32)> = dir
        .flatten()
        .filter_map(|e| {
            let p: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            Some((p, ppid.parse().ok()?))
        })
        .collect();
    let mut todo = vec![pid];
    while let Some(q) = todo.pop() {
        for &(p, pp) in &parents {
            if pp == q && !all.contains(&p) {
                all.push(p);
                todo.push(p);
            }
        }
    }
    all
}

/// Ends an adapter: its children (lldb-dap's lldb-server) and itself
/// killed, by pid.
async fn end_adapter(mut d: Dap) {
    if let Some(pid) = d.child.id() {
        for p in descendants(pid as i32) {
            // SAFETY: kill(2) on a pid this bench's adapter started.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
    let _ = d.child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(10), d.child.wait()).await;
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Next => "next",
        Kind::In => "stepIn",
        Kind::Out => "stepOut",
        Kind::Insn => "instruction",
    }
}

/// Steps one thread, over DAP or over gRPC.
enum Driver<'a> {
    Dap {
        d: &'a mut Dap,
        tid: i64,
        single: bool,
    },
    Grpc {
        c: &'a mut wpd_tests::Client,
        pid: i32,
        tid: i32,
    },
}

impl Driver<'_> {
    /// One step of `kind`, timed into `path`; where it ended.
    async fn step(&mut self, kind: Kind, path: &mut Path) -> Result<At> {
        let i = KINDS.iter().position(|&k| k == kind).unwrap_or(0);
        match self {
            Driver::Dap { d, tid, single } => {
                let command = match kind {
                    Kind::Next | Kind::Insn => "next",
                    Kind::In => "stepIn",
                    Kind::Out => "stepOut",
                };
                let mut args = json!({"threadId": *tid, "singleThread": *single});
                if kind == Kind::Insn {
                    args["granularity"] = json!("instruction");
                }
                d.events.clear();
                let tid = *tid;
                let t = Instant::now();
                let stop = tokio::time::timeout(STEP_WAIT, async {
                    d.call(command, args).await?;
                    d.event_where("stopped", |e| {
                        e["body"]["threadId"] == tid || e["body"]["threadId"].is_null()
                    })
                    .await
                })
                .await
                .with_context(|| format!("{}: no stop in {STEP_WAIT:?}", kind_name(kind)))??;
                path.ms[i].push(ms(t.elapsed()));
                if stop["body"]["reason"] != "step" {
                    path.odd += 1;
                }
                let st = d
                    .call("stackTrace", json!({"threadId": tid, "levels": 1}))
                    .await?;
                let f = &st["stackFrames"][0];
                Ok((
                    f["name"].as_str().unwrap_or_default().to_string(),
                    f["line"].as_i64().unwrap_or(0),
                ))
            }
            Driver::Grpc { c, pid, tid } => {
                let kind_pb = match kind {
                    Kind::Next => StepKind::Line,
                    Kind::In => StepKind::Into,
                    Kind::Out => StepKind::Out,
                    Kind::Insn => StepKind::InstructionOver,
                };
                let t = Instant::now();
                let r = tokio::time::timeout(
                    STEP_WAIT,
                    c.step(StepRequest {
                        pid: *pid,
                        tid: *tid,
                        kind: kind_pb as i32,
                        others_run: true,
                        depth: 1,
                    }),
                )
                .await
                .with_context(|| format!("Step {}: no answer in {STEP_WAIT:?}", kind_name(kind)))?
                .map_err(|s| anyhow::anyhow!("Step {}: {}", kind_name(kind), s.message()))?
                .into_inner();
                path.ms[i].push(ms(t.elapsed()));
                path.legs[i].push(f64::from(r.legs));
                if r.end != StepEnd::Done as i32 {
                    path.odd += 1;
                }
                let f = r.frames.first().cloned().unwrap_or_default();
                Ok((f.function, i64::from(f.line)))
            }
        }
    }
}

/// `cycles` cycles of steps (see the module's comment) from `at`.
async fn cycles(drv: &mut Driver<'_>, mut at: At, cycles: usize, path: &mut Path) -> Result<()> {
    let loop_call = i64::from(line_of("loop_call").1);
    let in_fn = |at: &At, f: &str| at.0 == f || at.0.starts_with(&format!("{f}("));
    for _ in 0..cycles {
        // To the loop's call of middle(): out of whatever function, then
        // over the loop's lines.
        let mut n = 0;
        while !(in_fn(&at, "stepper") && at.1 == loop_call) {
            n += 1;
            ensure!(
                n <= 16,
                "not at stepper:{loop_call} after 16 steps: at {at:?}"
            );
            let k = if in_fn(&at, "stepper") {
                Kind::Next
            } else {
                Kind::Out
            };
            at = drv
                .step(k, path)
                .await
                .with_context(|| format!("{} from {at:?}", kind_name(k)))?;
        }
        for k in [
            Kind::In,
            Kind::In,
            Kind::Next,
            Kind::Out,
            Kind::Next,
            Kind::Next,
            Kind::Out,
            Kind::Insn,
            Kind::Insn,
            Kind::Insn,
        ] {
            at = drv
                .step(k, path)
                .await
                .with_context(|| format!("{} from {at:?}", kind_name(k)))?;
        }
    }
    Ok(())
}

/// initialize, attach by pid, a function breakpoint on `step_here`,
/// configurationDone, its stop, the breakpoint removed: the stepper's tid
/// and where it is.
async fn first_stop(d: &mut Dap, adapter_id: &str, attach_args: Value) -> Result<(i64, At)> {
    d.call(
        "initialize",
        json!({"adapterID": adapter_id, "clientID": "wpd-bench", "linesStartAt1": true,
               "columnsStartAt1": true, "pathFormat": "path"}),
    )
    .await?;
    d.call("attach", attach_args).await?;
    d.event("initialized").await?;
    let set = d
        .call(
            "setFunctionBreakpoints",
            json!({"breakpoints": [{"name": "step_here"}]}),
        )
        .await?;
    ensure!(
        set["breakpoints"][0]["verified"] == true,
        "function breakpoint not verified: {set}"
    );
    d.call("configurationDone", json!({})).await?;
    let stop = d
        .event_where("stopped", |e| {
            e["body"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("breakpoint"))
        })
        .await?;
    let tid = stop["body"]["threadId"].as_i64().context("no threadId")?;
    d.call("setFunctionBreakpoints", json!({"breakpoints": []}))
        .await?;
    let st = d
        .call("stackTrace", json!({"threadId": tid, "levels": 1}))
        .await?;
    let f = &st["stackFrames"][0];
    Ok((
        tid,
        (
            f["name"].as_str().unwrap_or_default().to_string(),
            f["line"].as_i64().unwrap_or(0),
        ),
    ))
}

/// One wpd session: `wpctl dap` (singleThread unset, then true), then
/// gRPC Step, on one target.
async fn wpd_session(n: usize, cycles_n: usize, paths: &mut [Path; 3]) -> Result<()> {
    let daemon = Daemon::start().await?;
    let target = Target::start(n.saturating_sub(2).max(1)).await?;
    let pid = target.pid();
    for p in paths.iter_mut() {
        p.sessions += 1;
    }
    let mut d = Dap::start(&daemon, true).await?;
    // The path whose steps run (a failure is counted there).
    let mut phase = 0;
    let result: Result<()> = async {
        let (tid, at) =
            tokio::time::timeout(SETUP_WAIT, first_stop(&mut d, "wpd", json!({"pid": pid})))
                .await
                .context("setup not done in time")??;
        let mut drv = Driver::Dap {
            d: &mut d,
            tid,
            single: false,
        };
        cycles(&mut drv, at, cycles_n, &mut paths[0]).await?;
        let at = drv.step(Kind::Next, &mut paths[0]).await?;
        phase = 1;
        let mut drv = Driver::Dap {
            d: &mut d,
            tid,
            single: true,
        };
        cycles(&mut drv, at, cycles_n, &mut paths[1]).await?;
        let at = drv.step(Kind::Next, &mut paths[1]).await?;
        phase = 2;
        let mut c = daemon.client().await?;
        let mut drv = Driver::Grpc {
            c: &mut c,
            pid,
            tid: tid as i32,
        };
        cycles(&mut drv, at, cycles_n, &mut paths[2]).await?;
        phase = 0;
        d.call("continue", json!({"threadId": tid})).await?;
        d.call("disconnect", json!({"terminateDebuggee": false}))
            .await?;
        Ok(())
    }
    .await;
    end_adapter(d).await;
    target.kill().await;
    if let Err(e) = &result {
        daemon.print_log("a steps session failed");
        paths[phase].failed.push(format!("{e:#}"));
    }
    Ok(())
}

/// One lldb-dap session on a fresh target; a failure is counted, not
/// returned.
async fn lldb_session(n: usize, cycles_n: usize, path: &mut Path) -> Result<()> {
    let target = Target::start(n.saturating_sub(2).max(1)).await?;
    let pid = target.pid();
    path.sessions += 1;
    let mut cmd = tokio::process::Command::new(LLDB_DAP);
    cmd.stderr(Stdio::null());
    let mut d = Dap::spawn(cmd, SETUP_WAIT)?;
    let result: Result<()> = async {
        let (tid, at) = tokio::time::timeout(
            SETUP_WAIT,
            first_stop(&mut d, "lldb-dap", json!({"pid": pid})),
        )
        .await
        .context("setup (initialize, attach, first stop) not done in time")??;
        d.wait = STEP_WAIT;
        let mut drv = Driver::Dap {
            d: &mut d,
            tid,
            single: false,
        };
        cycles(&mut drv, at, cycles_n, path).await?;
        tokio::time::timeout(
            STEP_WAIT,
            d.call("disconnect", json!({"terminateDebuggee": false})),
        )
        .await
        .context("disconnect: no answer")??;
        Ok(())
    }
    .await;
    end_adapter(d).await;
    target.kill().await;
    if let Err(e) = result {
        path.failed.push(format!("{e:#}"));
    }
    Ok(())
}

fn cell(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let (p50, p90) = p50_p90(v.to_vec());
    format!("{p50:.2} / {p90:.2} ({})", v.len())
}

fn ratio(a: &[f64], b: &[f64]) -> String {
    if a.is_empty() || b.is_empty() {
        return "–".into();
    }
    let (a50, a90) = p50_p90(a.to_vec());
    let (b50, b90) = p50_p90(b.to_vec());
    format!("{:.3}× / {:.3}×", a50 / b50, a90 / b90)
}

pub(crate) async fn section_steps(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let sizes: Vec<usize> = if args.threads.iter().all(|&n| n <= 100) {
        args.threads.clone()
    } else {
        vec![1000]
    };
    let cycles_n = if args.smoke { 2 } else { 10 };
    let lldb = args.peers && std::path::Path::new(LLDB_DAP).exists();
    println!(
        "## steps: request → `stopped` of next, stepIn, stepOut and an instruction step, wpd against lldb-dap \
         (ct-step -O0, one thread stepping; sessions: {} of each, {cycles_n} cycles of 15 steps or more in each)\n",
        args.reps
    );
    println!(
        "| threads | path | sessions failed / run | next, ms p50 / p90 (steps) | stepIn | stepOut | instruction | stops not `step` |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for n in sizes {
        let mut wpd: [Path; 3] = Default::default();
        let mut peer = Path::default();
        for _ in 0..args.reps {
            wpd_session(n, cycles_n, &mut wpd).await?;
            if lldb {
                lldb_session(n, cycles_n, &mut peer).await?;
            }
        }
        let names = [
            "wpctl dap (singleThread unset: the others run)",
            "wpctl dap, singleThread (the others held)",
            "gRPC direct Step (others run)",
        ];
        let mut rows: Vec<(&str, &Path)> = names.iter().copied().zip(wpd.iter()).collect();
        if lldb {
            rows.push(("lldb-dap 19 (singleThread unset)", &peer));
        }
        for (name, p) in &rows {
            println!(
                "| {n} | {name} | {} / {} | {} | {} | {} | {} | {} |",
                p.failed.len(),
                p.sessions,
                cell(&p.ms[0]),
                cell(&p.ms[1]),
                cell(&p.ms[2]),
                cell(&p.ms[3]),
                p.odd
            );
        }
        if !lldb {
            println!(
                "| {n} | lldb-dap 19 | not run ({}) | – | – | – | – | – |",
                if args.peers {
                    "no /usr/bin/lldb-dap-19"
                } else {
                    "no peers"
                }
            );
        }
        if lldb {
            println!(
                "| {n} | wpctl dap / lldb-dap, p50 / p90 | – | {} | {} | {} | {} | – |",
                ratio(&wpd[0].ms[0], &peer.ms[0]),
                ratio(&wpd[0].ms[1], &peer.ms[1]),
                ratio(&wpd[0].ms[2], &peer.ms[2]),
                ratio(&wpd[0].ms[3], &peer.ms[3]),
            );
        }
        println!(
            "| {n} | wpctl dap / gRPC direct, p50 / p90 | – | {} | {} | {} | {} | – |",
            ratio(&wpd[0].ms[0], &wpd[2].ms[0]),
            ratio(&wpd[0].ms[1], &wpd[2].ms[1]),
            ratio(&wpd[0].ms[2], &wpd[2].ms[2]),
            ratio(&wpd[0].ms[3], &wpd[2].ms[3]),
        );
        println!();
        let legs: Vec<String> = KINDS
            .iter()
            .zip(&wpd[2].legs)
            .map(|(k, v)| {
                if v.is_empty() {
                    return format!("{} –", kind_name(*k));
                }
                let (p50, p90) = p50_p90(v.clone());
                let max = v.iter().copied().fold(0.0, f64::max);
                format!("{} {p50:.0} / {p90:.0} / {max:.0}", kind_name(*k))
            })
            .collect();
        println!(
            "wpd's legs per step (gRPC Step's answer, p50 / p90 / max; a leg is one resume and one stop of the stepping \
             thread, a line step looks its stop up in the line table): {}\n",
            legs.join("; ")
        );
        for (name, p) in &rows {
            for e in &p.failed {
                println!("failed session ({name}): {}", e.replace('\n', " "));
            }
        }
        flush();
    }
    section_done(t0);
    Ok(())
}
