//! `wpctl watch`: set a hardware watchpoint (SetWatchpoint).

use clap::{Args, ValueEnum};
use serde_json::json;
use wpd_proto::v1::{
    Access, ExecPolicy, HitAction, Policy, ProcessSelector, SetPolicyRequest, SetWatchpointRequest,
    SetWatchpointResponse, WatchpointSpec,
};

use crate::args::{BackendArg, backend_value, parse_addr, pid_parser};
use crate::cmd::{Ctx, Report};
use crate::error::Error;
use crate::output;
use wpd_proto::text::escape;

/// `--on-exec` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnExecArg {
    /// Resolve the name again in the new program and arm it there (the default)
    Resolve,
    /// Remove the watchpoint
    Remove,
}

/// `wpctl watch`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(true)
    .args(["pids", "comm", "exe", "cgroup"])))]
pub struct WatchArgs {
    /// Target process (attached first if needed). Repeat for several: a policy over those
    /// processes
    #[arg(long = "pid", value_name = "PID", value_parser = pid_parser())]
    pub pids: Vec<i32>,
    /// A policy: every process whose command name (/proc/PID/comm, 15 bytes) is NAME, now and
    /// later, each getting its own instance (the symbol resolved in it)
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// A policy: every process running the executable PATH, now and later
    #[arg(long, value_name = "PATH")]
    pub exe: Option<String>,
    /// A policy: every process in the cgroup v2 directory PATH or below it, now and later
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Arm only these threads (repeat or comma-separate); default: every thread, including future ones
    #[arg(long = "tid", value_name = "TID", value_delimiter = ',', value_parser = pid_parser())]
    pub tids: Vec<i32>,
    /// Address to watch: hex with 0x prefix, or decimal
    #[arg(long, value_name = "ADDR", value_parser = parse_addr,
          required_unless_present_any = ["symbol", "expr"], conflicts_with_all = ["symbol", "expr"])]
    pub addr: Option<u64>,
    /// Variable to watch, by name: `[MODULE:]NAME[.MEMBER][->MEMBER][[INDEX]][+OFFSET]`, e.g. `counter`,
    /// `libfoo.so:stats.flags[2]`, `conns->next->state` (pointers are read when it is set),
    /// `((struct conn *)0x7f3a…)->state`, `*(int *)&x` (C casts to the program's DWARF types);
    /// a global or static of the program or of any library it loaded. With --access exec, a
    /// function
    #[arg(long, value_name = "NAME", conflicts_with = "expr")]
    pub symbol: Option<String>,
    /// Every object FUNC returns gets a watchpoint on what --expr names in it (`$ret->state`):
    /// the returning thread is held at the return until the object is armed (ptrace backend)
    #[arg(long, value_name = "FUNC", conflicts_with_all = ["on_entry", "tids", "thread_name", "follow_forks"],
          requires = "expr")]
    pub on_return: Option<String>,
    /// Like --on-return, at FUNC's entry: --expr starts from a parameter by its DWARF name
    /// (`c->refs`), or from `$arg0`…`$arg5` (rdi, rsi, rdx, rcx, r8, r9) without DWARF
    #[arg(long, value_name = "FUNC", conflicts_with_all = ["tids", "thread_name", "follow_forks"],
          requires = "expr")]
    pub on_entry: Option<String>,
    /// With --on-return/--on-entry: the expression evaluated at each event (`$ret->state`,
    /// `c->refs`, `$arg0+8`, `((struct conn *)$arg1)->state`)
    #[arg(long, value_name = "EXPR")]
    pub expr: Option<String>,
    /// With --on-return/--on-entry: an object's watchpoint is removed when FUNC is called
    /// with the object (the value --expr starts from) as first argument (`free`)
    #[arg(long, value_name = "FUNC")]
    pub disarm_on: Option<String>,
    /// With --on-return/--on-entry: accept a function of a library the process has not loaded
    /// yet; the watch is pending (`wpctl list`) and set when the dynamic linker maps it, before
    /// any of its code runs
    #[arg(long)]
    pub pending: bool,
    /// With --on-return/--on-entry: at most N objects armed at once; the others are counted
    /// (`wpctl list`, `wpctl stats`)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_live: Option<u32>,
    /// With --on-return/--on-entry: each object's watchpoint on every thread (all, the default)
    /// or only on the thread that created it (creator)
    #[arg(long, value_enum)]
    pub scope: Option<ScopeArg>,
    /// Bytes to watch (default: 8 from --addr; the object's size for --symbol; exec: 1). A
    /// range one slot cannot watch (longer than 8 bytes, or unaligned) takes several slots
    /// on every thread, up to the 4 a thread has (32 aligned bytes)
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(1..))]
    pub len: Option<u32>,
    /// With each hit, the accessing thread's call chain, up to DEPTH frames (default 16; code
    /// built without frame pointers gives a short chain)
    #[arg(long, value_name = "DEPTH", num_args = 0..=1, default_missing_value = "16",
          value_parser = clap::value_parser!(u32).range(1..=127))]
    pub backtrace: Option<u32>,
    /// What becomes of a watchpoint set by --symbol when the process calls exec
    #[arg(long, value_enum)]
    pub on_exec: Option<OnExecArg>,
    /// Access that triggers the watchpoint
    #[arg(long, value_enum, default_value_t = AccessArg::Write)]
    pub access: AccessArg,
    /// Backend to use if the process is not attached yet
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// What a hit does (stop and stop-all need the ptrace backend; `wpctl resume` continues;
    /// signal sends the writing thread --signal at the hit, before its next instruction: a
    /// fuzzer then saves the input as a crash)
    #[arg(long, value_enum, default_value_t = ActionArg::Log)]
    pub action: ActionArg,
    /// The signal of `--action signal`: a name (SIGABRT, ABRT) or a number (default SIGABRT,
    /// which AFL++, libFuzzer and honggfuzz all treat as a crash)
    #[arg(long, value_name = "SIGNAL", value_parser = parse_signal, requires = "action")]
    pub signal: Option<i32>,
    /// Report a hit only when the watched bytes changed, with old and new value (ptrace backend)
    #[arg(long)]
    pub on_change: bool,
    /// Allow pid 1 (the init process, whose stop or death takes the system with it)
    #[arg(long)]
    pub allow_init: bool,
    /// Report (and, with a stop action, stop on) only hits where the value satisfies this:
    /// `OP VALUE` with OP one of == != < <= > >= and VALUE read as the variable's type
    /// (`'< -1'`, `'>= -273.15'`, `'== DONE'`, `'== true'`; 0x hex is the type's bits),
    /// optionally masked first (`'&0xff == 3'`: unsigned bits), or `changed`. One slot at most;
    /// without a type (--addr, no DWARF) the bytes compare as an unsigned integer
    #[arg(long, value_name = "COND", value_parser = parse_condition)]
    pub condition: Option<wpd_proto::v1::HitCondition>,
    /// Skip the first N hits (those whose condition held)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub ignore: u64,
    /// Report every Nth hit (after --ignore)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub hit_count: Option<u64>,
    /// Report at most N hits per second; the others are dropped and counted
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rate: Option<u32>,
    /// Keep its last N reported hits in the daemon for `wpctl last` (default 16, at most 4096)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub keep: Option<u32>,
    /// Fork-server children too: every process it forks (and they fork) gets the watchpoint
    /// inside fork(), from its first instruction (perf backend; an exec drops it)
    #[arg(long, conflicts_with = "tids")]
    pub follow_forks: bool,
    /// Only threads whose name matches GLOB (`pool-*`), now and later: threads join when
    /// created or renamed with a matching name and leave when renamed to another (perf)
    #[arg(long, value_name = "GLOB", conflicts_with_all = ["tids", "follow_forks"])]
    pub thread_name: Option<String>,
    /// Count hits per instruction and thread in the daemon instead of streaming each
    /// (`wpctl aggregates ID`); only --exemplars samples a second are streamed
    #[arg(long)]
    pub aggregate: bool,
    /// Hits streamed per second in aggregate mode (default 10, at most 10000)
    #[arg(long, value_name = "N", requires = "aggregate",
          value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub exemplars: Option<u32>,
    /// State feedback for a fuzzer: each value stored counts as new coverage for the
    /// input that stored it (`values`, the default), or each new high (`max`). AFL++ with
    /// wpd's library preloaded: `AFL_PRELOAD=.../libwpd_feedback.so afl-fuzz ...` (perf)
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1,
          default_missing_value = "values", conflicts_with = "aggregate")]
    pub feedback: Option<FeedbackArg>,
    /// Another variable whose value joins the feedback's key (a position is x and y:
    /// watch x, --feedback-with y), by name
    #[arg(long, value_name = "EXPR", requires = "feedback")]
    pub feedback_with: Option<String>,
}

/// `--feedback` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FeedbackArg {
    /// Each distinct value is new coverage
    Values,
    /// A value higher than any before is new coverage (in buckets: a counter, a depth)
    Max,
}

/// `--condition`: see [`wpd_proto::condition::parse`].
pub fn parse_condition(s: &str) -> Result<wpd_proto::v1::HitCondition, String> {
    wpd_proto::condition::parse(s)
}

/// `--scope` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScopeArg {
    /// Every thread of the process, including later ones
    All,
    /// The thread that created the object
    Creator,
}

/// `--access` values. `read` is passed through as ACCESS_READ so that the
/// daemon can explain when the hardware cannot do it (it is never widened).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccessArg {
    /// Any store to the watched bytes
    Write,
    /// Any load or store
    #[value(alias = "read-write", alias = "readwrite")]
    Rw,
    /// Instruction fetch at the address (--len 1)
    #[value(alias = "execute")]
    Exec,
    /// Loads only (not supported by x86-64 hardware; the daemon refuses it there)
    Read,
}

impl From<AccessArg> for Access {
    fn from(a: AccessArg) -> Access {
        match a {
            AccessArg::Write => Access::Write,
            AccessArg::Rw => Access::ReadWrite,
            AccessArg::Exec => Access::Exec,
            AccessArg::Read => Access::Read,
        }
    }
}

/// `--action` values: what a hit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ActionArg {
    /// Report the hit; the thread keeps running
    Log,
    /// Report the hit and hold the hitting thread stopped until `wpctl resume`
    Stop,
    /// Report the hit and hold every thread of the process stopped until `wpctl resume`
    StopAll,
    /// Report the hit and send the writing thread a signal (--signal, default SIGABRT)
    Signal,
}

/// `--signal`: a signal by name (`SIGABRT`, `abrt`) or number.
fn parse_signal(s: &str) -> Result<i32, String> {
    if let Ok(n) = s.parse::<i32>() {
        return Ok(n);
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<nix::sys::signal::Signal>()
        .map(|sig| sig as i32)
        .map_err(|_| format!("{s:?} is not a signal (a name such as SIGABRT, or a number)"))
}

impl From<ActionArg> for HitAction {
    fn from(a: ActionArg) -> HitAction {
        match a {
            ActionArg::Log => HitAction::Log,
            ActionArg::Stop => HitAction::Stop,
            ActionArg::StopAll => HitAction::StopAll,
            ActionArg::Signal => HitAction::Signal,
        }
    }
}

/// Runs `wpctl watch`.
pub async fn run(ctx: &Ctx, args: &WatchArgs) -> Result<(), Error> {
    report(ctx, args).await?.emit(ctx.json)
}

/// Sets the watchpoint (or the policy) and renders the daemon's answer.
pub async fn report(ctx: &Ctx, args: &WatchArgs) -> Result<Report, Error> {
    if args.on_exec.is_some() && args.symbol.is_none() {
        return Err(Error::Local(
            "--on-exec needs --symbol: a watchpoint set by address is always removed at exec"
                .into(),
        ));
    }
    let policy =
        args.pids.len() != 1 || args.comm.is_some() || args.exe.is_some() || args.cgroup.is_some();
    if policy && !args.tids.is_empty() {
        return Err(Error::Local(
            "--tid names threads of one process: it cannot go with a policy (several --pid, \
             --comm, --exe or --cgroup)"
                .into(),
        ));
    }
    let code_fn = args.on_return.as_ref().or(args.on_entry.as_ref());
    if code_fn.is_none()
        && (args.expr.is_some()
            || args.disarm_on.is_some()
            || args.max_live.is_some()
            || args.scope.is_some()
            || args.pending)
    {
        return Err(Error::Local(
            "--expr, --disarm-on, --max-live, --scope and --pending go with --on-return or \
             --on-entry"
                .into(),
        ));
    }
    let spec = WatchpointSpec {
        code_event: code_fn.map(|f| wpd_proto::v1::CodeEvent {
            function: f.clone(),
            at_return: args.on_return.is_some(),
            disarm_on: args.disarm_on.clone().unwrap_or_default(),
            max_live: args.max_live.unwrap_or(0),
            creator_only: args.scope == Some(ScopeArg::Creator),
            pending: args.pending,
            ..Default::default()
        }),
        lease: 0,
        pid: if policy { 0 } else { args.pids[0] },
        tids: args.tids.clone(),
        address: args.addr.unwrap_or(0),
        length: match (args.len, &args.symbol, &args.expr) {
            (Some(l), _, _) => l,
            (None, Some(_), _) | (None, _, Some(_)) => 0,
            (None, None, None) => 8,
        },
        access: Access::from(args.access) as i32,
        backend: backend_value(args.backend),
        action: HitAction::from(args.action) as i32,
        signal: match (args.action, args.signal) {
            (ActionArg::Signal, s) => s.unwrap_or(0),
            (_, Some(_)) => {
                return Err(Error::Local("--signal goes with --action signal".into()));
            }
            _ => 0,
        },
        only_on_change: args.on_change,
        allow_init: args.allow_init,
        symbol: args
            .symbol
            .clone()
            .or_else(|| args.expr.clone())
            .unwrap_or_default(),
        on_exec: match args.on_exec {
            None => ExecPolicy::Unspecified,
            Some(OnExecArg::Resolve) => ExecPolicy::ResolveAgain,
            Some(OnExecArg::Remove) => ExecPolicy::Remove,
        } as i32,
        backtrace_depth: args.backtrace.unwrap_or(0),
        condition: args.condition.clone(),
        ignore_count: args.ignore,
        hit_count: args.hit_count.unwrap_or(0),
        max_hits_per_second: args.max_rate.unwrap_or(0),
        keep_recent: args.keep.unwrap_or(0),
        follow_forks: args.follow_forks,
        thread_name: args.thread_name.clone().unwrap_or_default(),
        aggregate: args.aggregate,
        exemplars_per_second: args.exemplars.unwrap_or(0),
        feedback: args.feedback.map(|m| wpd_proto::v1::Feedback {
            mode: match m {
                FeedbackArg::Values => wpd_proto::v1::FeedbackMode::Values,
                FeedbackArg::Max => wpd_proto::v1::FeedbackMode::Max,
            } as i32,
            with: args.feedback_with.clone().unwrap_or_default(),
        }),
    };
    if policy {
        return set_policy(ctx, args, spec).await;
    }
    let request = SetWatchpointRequest { spec: Some(spec) };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.set_watchpoint(r).await })
        .await?;
    Ok(Report {
        text: to_text(&resp),
        json: to_json(&resp),
        warnings: resp.warnings.clone(),
    })
}

/// `wpctl watch` with a selector: SetPolicy.
async fn set_policy(ctx: &Ctx, args: &WatchArgs, spec: WatchpointSpec) -> Result<Report, Error> {
    let request = SetPolicyRequest {
        selector: Some(ProcessSelector {
            pids: args.pids.clone(),
            comm: args.comm.clone().unwrap_or_default(),
            exe: args.exe.clone().unwrap_or_default(),
            cgroup: args.cgroup.clone().unwrap_or_default(),
        }),
        spec: Some(spec),
    };
    let resp = ctx
        .unary(request, |mut c, r| async move { c.set_policy(r).await })
        .await?;
    let p = resp.policy.unwrap_or_default();
    Ok(Report::new(
        policy_text(&p),
        json!({ "policy": output::policy_json(&p) }),
    ))
}

/// `policy 9: write counter in every process with comm fuzzer; 3 instances now (pid 10
/// watchpoint 11, ...)`.
fn policy_text(p: &Policy) -> String {
    let mut s = format!(
        "policy {}: {} in {}; {} now",
        p.id,
        output::policy_what(p),
        output::selector_phrase(p.selector.as_ref()),
        output::plural(p.instances.len() as u32, "instance"),
    );
    if !p.instances.is_empty() {
        let list: Vec<String> = p
            .instances
            .iter()
            .map(|i| format!("pid {} watchpoint {}", i.pid, i.watchpoint_id))
            .collect();
        s.push_str(&format!(" ({})", list.join(", ")));
    }
    for r in &p.refusals {
        s.push_str(&format!(
            "\n  pid {} ({}) refused: {}",
            r.pid,
            escape(&r.comm),
            escape(&r.reason)
        ));
    }
    s
}

fn to_json(resp: &SetWatchpointResponse) -> serde_json::Value {
    json!({
        "watchpoint": resp.watchpoint.as_ref().map(output::watchpoint_json),
        "arm_duration_ns": resp.arm_duration_ns,
        "warnings": resp.warnings,
        "symbol": resp.symbol.as_ref().map(output::symbol_json),
    })
}

/// What a hit does, for the confirmation line; nothing for log.
fn action_phrase(action: i32) -> Option<String> {
    match HitAction::try_from(action) {
        Ok(HitAction::Log | HitAction::Unspecified) => None,
        Ok(HitAction::Stop) => Some("stop on hit".into()),
        Ok(HitAction::StopAll) => Some("stop all threads on hit".into()),
        Ok(HitAction::Signal) => Some("signal the writer on hit".into()),
        Err(_) => Some(format!("action {}", output::action_name(action))),
    }
}

/// `watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, armed on 1001
/// threads (process-wide, 4.2 ms)`; with `--tid`: `(tids 124,125, 0.3 ms)`;
/// with `--action stop --on-change`: `(process-wide, stop on hit, only on
/// change, 4.2 ms)`.
fn to_text(resp: &SetWatchpointResponse) -> String {
    let wp = resp.watchpoint.clone().unwrap_or_default();
    let spec = wp.spec.clone().unwrap_or_default();
    if let Some(c) = &spec.code_event {
        let mut notes = vec![if c.creator_only {
            "on its creating thread".to_string()
        } else {
            "process-wide".to_string()
        }];
        notes.extend(action_phrase(spec.action));
        notes.extend(output::filter_phrases(&spec));
        if !c.disarm_on.is_empty() {
            notes.push(format!("disarmed at {}(object)", escape(&c.disarm_on)));
        }
        if c.max_live > 0 {
            notes.push(format!("at most {} live", c.max_live));
        }
        if wp.pending {
            notes.push("pending: its module is not loaded yet, set when it is".into());
        }
        return format!(
            "watchpoint {}: {} {} of every object {} {} in pid {} ({})",
            wp.id,
            output::access_name(spec.access),
            escape(&spec.symbol),
            if c.at_return {
                "returned by"
            } else {
                "passed to"
            },
            escape(&c.function),
            spec.pid,
            notes.join(", "),
        );
    }
    let mut notes = vec![if wp.process_wide {
        "process-wide".to_string()
    } else if !spec.thread_name.is_empty() {
        format!("threads named {}", escape(&spec.thread_name))
    } else {
        format!("tids {}", output::scope(&wp))
    }];
    if spec.follow_forks {
        notes.push("and forked children".into());
    }
    notes.extend(action_phrase(spec.action));
    if spec.only_on_change {
        notes.push("only on change".into());
    }
    if spec.backtrace_depth > 0 {
        notes.push(format!("backtraces of {} frames", spec.backtrace_depth));
    }
    notes.extend(output::filter_phrases(&spec));
    notes.push(output::duration_ns(resp.arm_duration_ns));
    let mut text = format!(
        "watchpoint {}: {}, armed on {} ({})",
        wp.id,
        output::describe(&wp),
        output::plural(wp.armed_threads, "thread"),
        notes.join(", "),
    );
    // What the name's resolution wants known (pointers followed, a choice
    // among modules).
    if let Some(note) = resp
        .symbol
        .as_ref()
        .map(|s| &s.note)
        .filter(|n| !n.is_empty())
    {
        text.push_str(&format!("\nnote: {}", escape(note)));
    }
    // A condition on a value of no type compares its bytes unsigned: why.
    if let Some(t) = wp.value_type.as_ref().filter(|t| {
        t.kind == wpd_proto::v1::ValueKind::Unspecified as i32
            && !t.note.is_empty()
            && spec.condition.as_ref().is_some_and(|c| {
                c.op != 0 && c.op != wpd_proto::v1::hit_condition::Op::Changed as i32
            })
    }) {
        text.push_str(&format!("\nnote: {}", escape(&t.note)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, parse};

    /// `watch --pid 1 --addr 0x10` and `args`.
    fn watch_args(args: &[&str]) -> Result<WatchArgs, clap::Error> {
        let mut all = vec!["watch", "--pid", "1", "--addr", "0x10"];
        all.extend_from_slice(args);
        match parse(&all)?.command {
            Command::Watch(w) => Ok(*w),
            other => panic!("parsed as {other:?}"),
        }
    }
    use wpd_proto::v1::{Backend, Watchpoint};

    fn response(tids: Vec<i32>, action: HitAction, only_on_change: bool) -> SetWatchpointResponse {
        SetWatchpointResponse {
            symbol: None,
            watchpoint: Some(Watchpoint {
                value_type: None,
                objects: None,
                object_watchpoints: vec![],
                breakpoint: None,
                pending: false,
                pending_reason: String::new(),
                policy_id: 0,
                forked_children: vec![],
                pieces: vec![],
                hits_filtered: 0,
                hits_rate_limited: 0,
                symbol: None,
                id: 7,
                process_wide: tids.is_empty(),
                armed_threads: if tids.is_empty() {
                    1001
                } else {
                    tids.len() as u32
                },
                spec: Some(WatchpointSpec {
                    pid: 123,
                    tids,
                    address: 0x55d0c0a01040,
                    length: 8,
                    access: Access::Write as i32,
                    backend: 0,
                    action: action as i32,
                    only_on_change,
                    ..Default::default()
                }),
                hits: 0,
                created_at_ns: 5,
                backend: if action == HitAction::Log && !only_on_change {
                    Backend::Perf as i32
                } else {
                    Backend::Ptrace as i32
                },
            }),
            arm_duration_ns: 4_200_000,
            warnings: vec![],
        }
    }

    #[test]
    fn renders() {
        assert_eq!(
            to_text(&response(vec![], HitAction::Log, false)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1001 threads (process-wide, 4.2 ms)"
        );
        assert_eq!(
            to_text(&response(vec![124, 125], HitAction::Unspecified, false)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 2 threads (tids 124,125, 4.2 ms)"
        );
        let v = to_json(&response(vec![], HitAction::Log, false));
        assert_eq!(v["watchpoint"]["address"], "0x55d0c0a01040");
        assert_eq!(v["watchpoint"]["access"], "write");
        assert_eq!(v["watchpoint"]["backend"], "perf");
        assert_eq!(v["watchpoint"]["action"], "log");
        assert_eq!(v["watchpoint"]["only_on_change"], false);
        assert_eq!(v["arm_duration_ns"], 4_200_000);
    }

    #[test]
    fn a_condition_without_a_type_says_it_compares_unsigned() {
        let mut r = response(vec![], HitAction::Log, false);
        let wp = r.watchpoint.as_mut().unwrap();
        wp.value_type = Some(wpd_proto::v1::ValueType {
            size: 8,
            note: "set by address: no type is known; values and conditions read its bytes as \
                   an unsigned integer"
                .into(),
            ..Default::default()
        });
        let spec = wp.spec.as_mut().unwrap();
        spec.condition = Some(parse_condition("> 100").unwrap());
        assert_eq!(
            to_text(&r),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, armed on 1001 threads \
             (process-wide, when value > 100, 4.2 ms)\n\
             note: set by address: no type is known; values and conditions read its bytes as an \
             unsigned integer"
        );
        let v = to_json(&r);
        assert_eq!(v["watchpoint"]["value_type"]["kind"], "untyped");
        // Typed: nothing to say.
        let wp = r.watchpoint.as_mut().unwrap();
        wp.value_type = Some(wpd_proto::v1::ValueType {
            kind: wpd_proto::v1::ValueKind::Signed as i32,
            size: 8,
            name: "long".into(),
            ..Default::default()
        });
        assert!(!to_text(&r).contains("note:"));
    }

    #[test]
    fn renders_actions_and_on_change() {
        assert_eq!(
            to_text(&response(vec![], HitAction::Stop, true)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1001 threads (process-wide, stop on hit, only on change, 4.2 ms)"
        );
        assert_eq!(
            to_text(&response(vec![124], HitAction::StopAll, false)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1 thread (tids 124, stop all threads on hit, 4.2 ms)"
        );
        assert_eq!(
            to_text(&response(vec![], HitAction::Log, true)),
            "watchpoint 7: write 8 bytes at 0x55d0c0a01040 in pid 123, \
             armed on 1001 threads (process-wide, only on change, 4.2 ms)"
        );
        let v = to_json(&response(vec![], HitAction::StopAll, true));
        assert_eq!(v["watchpoint"]["action"], "stop-all");
        assert_eq!(v["watchpoint"]["only_on_change"], true);
        assert_eq!(v["watchpoint"]["backend"], "ptrace");
    }

    #[test]
    fn access_kinds() {
        fn check(input: &str, expected: Access) {
            let w = watch_args(&["--access", input]).unwrap();
            assert_eq!(Access::from(w.access), expected, "--access {input}");
        }
        check("write", Access::Write);
        check("rw", Access::ReadWrite);
        check("read-write", Access::ReadWrite);
        check("exec", Access::Exec);
        // Not widened to rw: the daemon explains why it cannot be done.
        check("read", Access::Read);
        assert_eq!(Access::from(watch_args(&[]).unwrap().access), Access::Write);
        assert!(watch_args(&["--access", "bogus"]).is_err());
    }

    #[test]
    fn watch_by_name_or_by_address() {
        let by_name = |args: &[&str]| {
            let mut all = vec!["watch", "--pid", "1"];
            all.extend_from_slice(args);
            parse(&all).map(|c| match c.command {
                Command::Watch(w) => w,
                other => panic!("parsed as {other:?}"),
            })
        };
        let w = by_name(&["--symbol", "libfoo.so:stats.flags[2]"]).unwrap();
        assert_eq!(w.symbol.as_deref(), Some("libfoo.so:stats.flags[2]"));
        assert_eq!((w.addr, w.len), (None, None));
        assert!(
            by_name(&[]).is_err(),
            "one of --addr and --symbol is needed"
        );
        assert!(
            by_name(&["--symbol", "x", "--addr", "0x10"]).is_err(),
            "not both"
        );
        let w = by_name(&["--symbol", "x", "--backtrace"]).unwrap();
        assert_eq!(w.backtrace, Some(16), "--backtrace alone: 16 frames");
        let w = by_name(&["--symbol", "x", "--backtrace", "40", "--on-exec", "remove"]).unwrap();
        assert_eq!(
            (w.backtrace, w.on_exec),
            (Some(40), Some(OnExecArg::Remove))
        );
        assert!(by_name(&["--symbol", "x", "--backtrace", "128"]).is_err());
    }

    #[test]
    fn conditions_parse() {
        use wpd_proto::v1::hit_condition::Op;
        let c = |s: &str| parse_condition(s).map(|c| (c.op, c.operand, c.mask, c.value));
        let v = |s: &str| s.to_string();
        assert_eq!(c("== 42"), Ok((Op::Eq as i32, 42, 0, v("42"))));
        assert_eq!(c(">=0x10"), Ok((Op::Ge as i32, 16, 0, v("0x10"))));
        assert_eq!(c("&0xff != 3"), Ok((Op::Ne as i32, 3, 0xff, v("3"))));
        assert_eq!(c(" < 1_000 "), Ok((Op::Lt as i32, 1000, 0, v("1_000"))));
        assert_eq!(c("CHANGED"), Ok((Op::Changed as i32, 0, 0, v(""))));
        // Read by the daemon as the variable's type.
        assert_eq!(c("== -1"), Ok((Op::Eq as i32, 0, 0, v("-1"))));
        assert_eq!(c("< -273.15"), Ok((Op::Lt as i32, 0, 0, v("-273.15"))));
        assert_eq!(c("== 3.5"), Ok((Op::Eq as i32, 0, 0, v("3.5"))));
        assert_eq!(c("== DONE"), Ok((Op::Eq as i32, 0, 0, v("DONE"))));
        for bad in [
            "", "42", "= 1", "== a.b", "== 1 2", "&0 == 1", "&0xff", "=> 3",
        ] {
            assert!(parse_condition(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn watch_defaults_and_lists() {
        let w = watch_args(&["--tid", "5,6", "--tid", "7", "--backend", "ptrace"]).unwrap();
        assert_eq!(
            w.len, None,
            "8 bytes from --addr, the object's size for --symbol"
        );
        assert_eq!(w.tids, vec![5, 6, 7]);
        assert_eq!(backend_value(w.backend), Backend::Ptrace as i32);
        assert_eq!(watch_args(&["--len", "2"]).unwrap().len, Some(2));
        assert_eq!(
            watch_args(&["--len", "24"]).unwrap().len,
            Some(24),
            "a range of several slots"
        );
        assert!(watch_args(&["--len", "0"]).is_err());
        assert!(watch_args(&["--tid", "0"]).is_err());
        assert_eq!(backend_value(None), Backend::Unspecified as i32);
    }

    #[test]
    fn watch_actions() {
        let w = watch_args(&[]).unwrap();
        assert_eq!(HitAction::from(w.action), HitAction::Log);
        assert!(!w.on_change);
        let w = watch_args(&["--action", "stop", "--on-change"]).unwrap();
        assert_eq!(HitAction::from(w.action), HitAction::Stop);
        assert!(w.on_change);
        let w = watch_args(&["--action", "stop-all", "--backend", "ptrace"]).unwrap();
        assert_eq!(HitAction::from(w.action), HitAction::StopAll);
        assert_eq!(backend_value(w.backend), Backend::Ptrace as i32);
        assert!(watch_args(&["--action", "pause"]).is_err());
        assert!(watch_args(&["--on-change", "yes"]).is_err());
    }
}
