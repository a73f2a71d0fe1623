//! `wpctl step` against a real daemon and `tests/c/stepping.c`: a thread
//! held at a function breakpoint (`wpctl break --wait`) steps out, over,
//! into a call, one instruction, out of the call, each printing the new
//! place with its source line as the file has it; `wpctl stack` agrees.
//! A breakpoint on a line that starts with a call, or with a jump, holds
//! the thread before it, as the line says, and runs it once on.
//! With the others running (`--all-threads`), a step over a call that
//! waits for another thread ends, and the others are held again after it.
//! Refusals (a running thread, a tid of no thread, a process not
//! attached) exit non-zero with one line on stderr and change nothing; the
//! target runs on, untraced, after the detach.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_tests::{Backend, CmdOutput, Daemon, line_of, require_backend, run_wpctl};

use crate::dap::Stepping;

const CLI_TIMEOUT: Duration = Duration::from_secs(20);

async fn wpctl(daemon: &Daemon, args: &[&str]) -> Result<CmdOutput> {
    let ep = daemon.endpoint();
    let mut all = vec!["--endpoint", ep.as_str()];
    all.extend_from_slice(args);
    run_wpctl(&all, CLI_TIMEOUT).await
}

/// The text of line `n` of stepping.c, as `wpctl step` prints it.
fn source(n: u32) -> String {
    include_str!("../c/stepping.c")
        .lines()
        .nth(n as usize - 1)
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

/// `wpctl step --pid P --tid T KIND`: succeeded, its first frame in
/// `function`, and (with `tag`) at that line, the line's text under it.
async fn step(daemon: &Daemon, pid: i32, tid: i32, kind: &str) -> Result<String> {
    let (p, t) = (pid.to_string(), tid.to_string());
    let out = wpctl(daemon, &["step", "--pid", &p, "--tid", &t, kind]).await?;
    ensure!(
        out.code == Some(0) && out.stderr.trim().is_empty(),
        "wpctl step {kind}: {:?}\nstdout: {}\nstderr: {}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(out.stdout)
}

/// `out` is a step's print at `function`, line `tag` of stepping.c, with
/// that line's text.
fn at(out: &str, function: &str, tag: &str) -> Result<()> {
    let (_, line) = line_of(tag);
    let mut lines = out.lines();
    let first = lines.next().unwrap_or_default();
    ensure!(
        first.starts_with("#0") && first.contains(&format!(" {function} (")),
        "expected #0 in {function}: {out:?}"
    );
    ensure!(
        first.contains(&format!("stepping.c:{line}")),
        "expected stepping.c:{line} ({tag}): {out:?}"
    );
    let shown = lines.next().unwrap_or_default();
    ensure!(
        shown.trim_start().starts_with(&line.to_string())
            && shown.trim_end().ends_with(source(line).trim()),
        "expected line {line}'s text under the place: {out:?}"
    );
    Ok(())
}

/// A refusal: a non-zero exit, nothing on stdout, one `wpctl: ` line on
/// stderr that says `says`.
fn refused(out: &CmdOutput, says: &str, what: &str) -> Result<()> {
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    ensure!(
        out.code.is_some_and(|c| c != 0)
            && out.stdout.trim().is_empty()
            && lines.len() == 1
            && lines[0].starts_with("wpctl: ")
            && lines[0].contains(says),
        "{what}: expected a non-zero exit and one line saying {says:?}: {:?}\nstdout: {}\nstderr: {}",
        out.code,
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// The number after `word` in `line`.
fn number_after(line: &str, word: &str) -> Result<i64> {
    let rest = line
        .split_once(word)
        .with_context(|| format!("no {word:?} in {line:?}"))?
        .1;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits
        .parse()
        .with_context(|| format!("no number after {word:?} in {line:?}"))
}

/// Out of `step_here`, over to the call of `middle`, into it and into
/// `leaf`, one instruction there, out again and over the next line, then
/// instruction steps into the C library's PLT stub and out of it: each
/// print
/// names the function and the line, with the line's text; `wpctl stack`
/// shows the same place. Then the refusals, and the target free after the
/// detach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpctl_steps_over_into_out_and_by_instruction() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = Stepping::start("ct-step", 4)?;
    let other = Stepping::start("ct-step", 1)?;
    let result = async {
        let pid = t.pid();
        let p = pid.to_string();
        let out = wpctl(&daemon, &["break", "--pid", &p, "step_here", "--wait"]).await?;
        ensure!(out.code == Some(0), "wpctl break --wait: {out:?}");
        let lines: Vec<&str> = out.stdout.lines().collect();
        ensure!(lines.len() >= 2, "set, stopped: {:?}", out.stdout);
        let id = number_after(lines[0], "breakpoint ")?;
        let tid = number_after(lines[1], "thread ")? as i32;
        // Not passed again by the steps below; removed, it holds no one.
        let out = wpctl(&daemon, &["unwatch", &id.to_string()]).await?;
        ensure!(out.code == Some(0), "wpctl unwatch: {out:?}");

        let out = step(&daemon, pid, tid, "--out").await?;
        ensure!(
            out.starts_with("#0") && out.lines().next().unwrap_or("").contains(" stepper ("),
            "out of step_here, in stepper: {out:?}"
        );
        let (_, call) = line_of("loop_call");
        let mut here = out;
        for _ in 0..8 {
            if here
                .lines()
                .next()
                .unwrap_or("")
                .contains(&format!("stepping.c:{call}"))
            {
                break;
            }
            here = step(&daemon, pid, tid, "--over").await?;
        }
        at(&here, "stepper", "loop_call")?;
        at(
            &step(&daemon, pid, tid, "--into").await?,
            "middle",
            "middle_call",
        )?;
        at(
            &step(&daemon, pid, tid, "--into").await?,
            "leaf",
            "leaf_first",
        )?;
        // One instruction: on in leaf, on the same line.
        at(
            &step(&daemon, pid, tid, "--instruction").await?,
            "leaf",
            "leaf_first",
        )?;
        at(
            &step(&daemon, pid, tid, "--out").await?,
            "middle",
            "middle_call",
        )?;
        at(
            &step(&daemon, pid, tid, "--over").await?,
            "middle",
            "middle_libc",
        )?;
        // Instruction steps into the C library's call land in its PLT stub
        // (no symbol of its own; the linker describes its frame with an
        // expression); out of there is back in middle, on the same line.
        let mut inst = String::new();
        for _ in 0..12 {
            inst = step(&daemon, pid, tid, "--instruction").await?;
            if !inst.lines().next().unwrap_or("").contains(" middle (") {
                break;
            }
        }
        ensure!(
            !inst.lines().next().unwrap_or("").contains(" middle ("),
            "12 instruction steps did not enter the call: {inst:?}"
        );
        at(
            &step(&daemon, pid, tid, "--out").await?,
            "middle",
            "middle_libc",
        )?;
        let t_s = tid.to_string();
        let stack = wpctl(&daemon, &["stack", "--pid", &p, "--tid", &t_s]).await?;
        ensure!(
            stack.code == Some(0)
                && stack.stdout.lines().next().unwrap_or("").contains("middle")
                && stack.stdout.contains("stepper"),
            "wpctl stack after the steps: {stack:?}"
        );

        // Refusals, one line each.
        let worker = std::fs::read_dir(format!("/proc/{pid}/task"))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|&w| w != pid && w != tid)
            .context("no worker thread")?;
        let w = worker.to_string();
        let out = wpctl(&daemon, &["step", "--pid", &p, "--tid", &w, "--over"]).await?;
        refused(&out, "running", "a running thread")?;
        let out = wpctl(&daemon, &["step", "--pid", &p, "--tid", "999999", "--over"]).await?;
        refused(&out, "999999", "a tid of no thread")?;
        let o = other.pid().to_string();
        let out = wpctl(&daemon, &["step", "--pid", &o, "--tid", &o, "--into"]).await?;
        refused(&out, "not attached", "a process not attached")?;
        // The held thread is where it was.
        let stack2 = wpctl(&daemon, &["stack", "--pid", &p, "--tid", &t_s]).await?;
        ensure!(
            stack2.stdout.lines().next() == stack.stdout.lines().next(),
            "the refusals moved the thread: {stack2:?}"
        );

        let out = wpctl(&daemon, &["resume", "--pid", &p]).await?;
        ensure!(out.code == Some(0), "wpctl resume: {out:?}");
        t.is_free(&daemon).await
    }
    .await;
    daemon.finish(result)
}

/// `wpctl break --pid P LOCATION --wait` in stepping.c: the breakpoint's
/// id and the thread it holds.
async fn break_at(daemon: &Daemon, pid: i32, tag: &str) -> Result<(i64, i32)> {
    break_at_with(daemon, pid, tag, &[]).await
}

/// [`break_at`] with more arguments to `wpctl break` (`--all-threads`).
async fn break_at_with(daemon: &Daemon, pid: i32, tag: &str, extra: &[&str]) -> Result<(i64, i32)> {
    let (_, line) = line_of(tag);
    let (p, loc) = (pid.to_string(), format!("stepping.c:{line}"));
    let mut args = vec!["break", "--pid", &p, &loc];
    args.extend_from_slice(extra);
    args.push("--wait");
    let out = wpctl(daemon, &args).await?;
    ensure!(out.code == Some(0), "wpctl {args:?}: {out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    ensure!(lines.len() >= 2, "set, stopped: {:?}", out.stdout);
    Ok((
        number_after(lines[0], "breakpoint ")?,
        number_after(lines[1], "thread ")? as i32,
    ))
}

/// The first line of `wpctl stack` of a held thread.
async fn top_of(daemon: &Daemon, pid: i32, tid: i32) -> Result<String> {
    let (p, t) = (pid.to_string(), tid.to_string());
    let out = wpctl(daemon, &["stack", "--pid", &p, "--tid", &t]).await?;
    ensure!(out.code == Some(0), "wpctl stack: {out:?}");
    Ok(out.stdout.lines().next().unwrap_or_default().to_string())
}

/// A line whose first instruction is a call (`getpid()`, through its PLT
/// stub) or a jump (the `for (;;)` back to the loop's top, at -O0): the
/// kernel runs a branch under a uprobe before the stop is seen, so the
/// thread would be held in the callee, or at the loop's top. It is held
/// before the branch instead, where the line says (stack, `next`); one
/// instruction from there is the branch itself, run once (in the PLT stub,
/// not stopped a second time by the breakpoint still set), and out of the
/// stub lands on the return address, without a note. After the resumes
/// and the detach the program runs on, untraced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breakpoint_on_a_call_or_a_jump_holds_the_thread_before_it() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = Stepping::start("ct-step", 4)?;
    let result = async {
        let pid = t.pid();
        let p = pid.to_string();
        let (_, libc_line) = line_of("middle_libc");
        let (id, tid) = break_at(&daemon, pid, "middle_libc").await?;
        let top = top_of(&daemon, pid, tid).await?;
        ensure!(
            top.contains(" middle (") && top.contains(&format!("stepping.c:{libc_line}")),
            "held before the call of getpid, in middle: {top:?}"
        );
        // The breakpoint kept: the instruction step runs the call once.
        let inst = step(&daemon, pid, tid, "--instruction").await?;
        ensure!(
            inst.lines().next().unwrap_or("").contains(" getpid@plt"),
            "one instruction from before the call is in its PLT stub, named so: {inst:?}"
        );
        let out = step(&daemon, pid, tid, "--out").await?;
        at(&out, "middle", "middle_libc")?;
        ensure!(
            !out.contains("one instruction after"),
            "out of the stub lands on the return address: {out:?}"
        );
        at(
            &step(&daemon, pid, tid, "--over").await?,
            "middle",
            "middle_ret",
        )?;
        ensure!(wpctl(&daemon, &["unwatch", &id.to_string()]).await?.code == Some(0));
        ensure!(wpctl(&daemon, &["resume", "--pid", &p]).await?.code == Some(0));

        // Held before the call again, `next` runs it through to the next line.
        let (id, tid) = break_at(&daemon, pid, "middle_libc").await?;
        ensure!(wpctl(&daemon, &["unwatch", &id.to_string()]).await?.code == Some(0));
        at(
            &step(&daemon, pid, tid, "--over").await?,
            "middle",
            "middle_ret",
        )?;
        ensure!(wpctl(&daemon, &["resume", "--pid", &p]).await?.code == Some(0));

        // The loop's jump back: held at the `for`, not at the loop's top.
        let (_, for_line) = line_of("loop_for");
        let (id, tid) = break_at(&daemon, pid, "loop_for").await?;
        let top = top_of(&daemon, pid, tid).await?;
        ensure!(
            top.contains(" stepper (") && top.contains(&format!("stepping.c:{for_line}")),
            "held before the jump back, at the for: {top:?}"
        );
        ensure!(wpctl(&daemon, &["unwatch", &id.to_string()]).await?.code == Some(0));
        at(
            &step(&daemon, pid, tid, "--over").await?,
            "stepper",
            "loop_top",
        )?;
        // Resumed at the jump itself, with no step: it runs on.
        ensure!(wpctl(&daemon, &["resume", "--pid", &p]).await?.code == Some(0));
        let (id, _) = break_at(&daemon, pid, "loop_for").await?;
        ensure!(wpctl(&daemon, &["unwatch", &id.to_string()]).await?.code == Some(0));
        ensure!(wpctl(&daemon, &["resume", "--pid", &p]).await?.code == Some(0));
        // Detached while held before the call: it runs on.
        let (id, _) = break_at(&daemon, pid, "middle_libc").await?;
        ensure!(wpctl(&daemon, &["unwatch", &id.to_string()]).await?.code == Some(0));
        let out = wpctl(&daemon, &["detach", "--pid", &p]).await?;
        ensure!(out.code == Some(0), "wpctl detach: {out:?}");
        t.is_free(&daemon).await
    }
    .await;
    daemon.finish(result)
}

/// How many threads of `pid` the daemon lists as running.
async fn running_threads(daemon: &Daemon, pid: i32) -> Result<usize> {
    let mut client = daemon.client().await?;
    let threads = client
        .list_threads(wpd_proto::v1::ListThreadsRequest {
            pid,
            ..Default::default()
        })
        .await?
        .into_inner()
        .threads;
    Ok(threads
        .iter()
        .filter(|t| t.state == wpd_proto::v1::ThreadState::Running as i32)
        .count())
}

/// The others held at a stop-all breakpoint (`--all-threads`) run during
/// a step that asks for it (`wpctl step --all-threads`), but the daemon
/// resumes them only once a leg has run 5 ms or the step 50 ms: a step
/// over `handoff()`, which waits until a worker answers (one call of 5 ms
/// and more), and a step over the line that spins in it until then (only
/// instructions: a loop on one line) both end, where the line after them
/// starts; each time every thread is held again after it. A daemon that
/// left the others held would never end either step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_waits_for_another_thread_lets_the_others_run() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = Stepping::start_with("ct-step", 4, &["handoff"])?;
    let result = async {
        let pid = t.pid();
        let p = pid.to_string();
        for (at_tag, over, then) in [
            ("loop_handoff", "stepper", "loop_sleep"),
            ("handoff_wait", "handoff", "handoff_done"),
        ] {
            let (id, tid) = break_at_with(&daemon, pid, at_tag, &["--all-threads"]).await?;
            ensure!(wpctl(&daemon, &["unwatch", &id.to_string()]).await?.code == Some(0));
            ensure!(
                running_threads(&daemon, pid).await? == 0,
                "a stop-all holds every thread"
            );
            let (ps, ts) = (p.clone(), tid.to_string());
            let out = wpctl(
                &daemon,
                &[
                    "step",
                    "--pid",
                    &ps,
                    "--tid",
                    &ts,
                    "--over",
                    "--all-threads",
                ],
            )
            .await?;
            ensure!(
                out.code == Some(0),
                "the step over {at_tag} (it waits for a worker): {out:?}"
            );
            at(&out.stdout, over, then)?;
            ensure!(
                running_threads(&daemon, pid).await? == 0,
                "held again after the step"
            );
            ensure!(wpctl(&daemon, &["resume", "--pid", &p]).await?.code == Some(0));
        }
        t.is_free(&daemon).await
    }
    .await;
    daemon.finish(result)
}

/// A step over `middle()` that a breakpoint in `leaf` ends leaves a
/// return probe's mark on `middle`'s return address (the kernel's return
/// trampoline takes that return). Stepping on from the breakpoint, by line
/// out of `leaf`, and then out of `middle` (a probe on its `ret`), and
/// again by line over its return, each lands in real code with its line,
/// never in the trampoline (where no step could go on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_out_of_a_call_a_breakpoint_stopped_return_where_it_returns() -> Result<()> {
    if !require_backend(Backend::Ptrace) {
        return Ok(());
    }
    let daemon = Daemon::start().await?;
    let mut t = Stepping::start("ct-step", 4)?;
    let result = async {
        let pid = t.pid();
        let p = pid.to_string();
        for out_kind in ["--out", "--over"] {
            let (id, tid) = break_at(&daemon, pid, "loop_call").await?;
            ensure!(wpctl(&daemon, &["unwatch", &id.to_string()]).await?.code == Some(0));
            let out = wpctl(&daemon, &["break", "--pid", &p, "leaf"]).await?;
            ensure!(out.code == Some(0), "wpctl break leaf: {out:?}");
            let leaf_bp = number_after(out.stdout.lines().next().unwrap_or(""), "breakpoint ")?;
            // Over middle(): ended in leaf by its breakpoint.
            let (t_s, w) = (tid.to_string(), "--over");
            let out = wpctl(&daemon, &["step", "--pid", &p, "--tid", &t_s, w]).await?;
            ensure!(
                out.code == Some(0)
                    && out.stdout.starts_with("step ended: a code breakpoint")
                    && out.stdout.contains("#0  leaf ("),
                "the step over middle() ends at leaf's breakpoint: {out:?}"
            );
            ensure!(
                wpctl(&daemon, &["unwatch", &leaf_bp.to_string()])
                    .await?
                    .code
                    == Some(0)
            );
            at(
                &step(&daemon, pid, tid, "--out").await?,
                "middle",
                "middle_call",
            )?;
            // Out of middle, or over its lines until it returns.
            let mut here = String::new();
            for _ in 0..8 {
                here = step(&daemon, pid, tid, out_kind).await?;
                if !here.lines().next().unwrap_or("").contains(" middle (") {
                    break;
                }
            }
            ensure!(
                here.lines().next().unwrap_or("").contains(" stepper (")
                    && here.contains(&format!("stepping.c:{}", line_of("loop_call").1)),
                "{out_kind} out of middle lands in stepper, on the line of the call: {here:?}"
            );
            ensure!(wpctl(&daemon, &["resume", "--pid", &p]).await?.code == Some(0));
        }
        t.is_free(&daemon).await
    }
    .await;
    daemon.finish(result)
}
