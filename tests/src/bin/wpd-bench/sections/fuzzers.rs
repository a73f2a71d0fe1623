//! Fuzzers: what a policy on a fuzzing target's name costs the fuzzer. AFL++ (a fork server:
//! one child per execution, the policy's watchpoint inherited by each) and libFuzzer in fork
//! mode (jobs of many in-process executions) run `tests/c/fuzzparse.c` alone, with a
//! policy on `parser_limit` (a setting the parser reads and never writes: the cost of being
//! watched) and with policies on `state.level` (written by the parser, and by libFuzzer's
//! target on every input: the cost of the hits), runs of each mode alternating; and the
//! kernel's own floor: what an inherited write breakpoint adds to a fork.

use crate::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use wpd_proto::v1::{GetStatsRequest, ListWatchpointsRequest};
use wpd_tests::{Client, Daemon, poll_until, run_wpctl, unique_temp_dir};

/// The fuzzing target, compiled at run time with each fuzzer's compiler.
const FUZZPARSE: &str = include_str!("../../../../c/fuzzparse.c");
/// The seed: a valid input with an in-range level (16).
const SEED: &[u8] = b"WPL\x10M\x01";

/// C: `noop_prog()` loads a BPF program of type `PERF_EVENT` that only returns 0 (the kind of
/// program wpd attaches to a breakpoint on its per-thread path, doing nothing); its fd, or -1.
/// Needs `<linux/bpf.h>`, `<stdint.h>`, `<string.h>`, `<sys/syscall.h>` and
/// `<unistd.h>`. Spliced into [`FORK_FLOOR`] and [`FLOOR_PRELOAD`] with `concat!`.
macro_rules! noop_bpf_prog_c {
    () => {
        r#"static int noop_prog(void) {
    struct bpf_insn insns[2];
    memset(insns, 0, sizeof insns);
    insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K; /* r0 = 0 */
    insns[1].code = BPF_JMP | BPF_EXIT;
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_PERF_EVENT;
    a.insn_cnt = 2;
    a.insns = (uintptr_t)insns;
    a.license = (uintptr_t)"GPL";
    return (int)syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof a);
}
"#
    };
}

/// The kernel's floor: `forkfloor MODE N` opens, on itself, the breakpoint wpd opens for a
/// process-wide watchpoint that follows forks (MODE `inherit`, `inherit-bpf` with a no-op BPF
/// program attached as on wpd's per-thread path), the same without inheritance (`bp`), or
/// nothing (`bare`); then times N fork + _exit + waitpid cycles and prints µs per cycle.
const FORK_FLOOR: &str = concat!(
    r#"
#include <linux/bpf.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile uint8_t watched;

"#,
    noop_bpf_prog_c!(),
    r#"
int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    const char *mode = argv[1];
    long n = atol(argv[2]);
    if (strcmp(mode, "bare") != 0) {
        struct perf_event_attr a;
        memset(&a, 0, sizeof a);
        a.type = PERF_TYPE_BREAKPOINT;
        a.size = sizeof a;
        a.sample_period = 1;
        a.bp_type = HW_BREAKPOINT_W;
        a.bp_addr = (uintptr_t)&watched;
        a.bp_len = HW_BREAKPOINT_LEN_1;
        a.exclude_kernel = 1;
        a.exclude_hv = 1;
        a.inherit = strncmp(mode, "inherit", 7) == 0;
        int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
        if (fd < 0) {
            perror("perf_event_open");
            return 1;
        }
        if (strcmp(mode, "inherit-bpf") == 0) {
            int prog = noop_prog();
            if (prog < 0 || ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog) != 0) {
                perror("BPF program");
                return 1;
            }
        }
    }
    struct timespec t0, t1;
    /* A tenth of the cycles untimed first: warm caches and the process's page tables. */
    for (long i = -n / 10; i < n; i++) {
        if (i == 0)
            clock_gettime(CLOCK_MONOTONIC, &t0);
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            return 1;
        }
        if (p == 0)
            _exit(0);
        int st;
        if (waitpid(p, &st, 0) != p) {
            perror("waitpid");
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("%.3f\n", ns / 1e3 / n);
    return 0;
}
"#
);

/// The kernel's floor under persistent mode, with the real fuzzer: a library preloaded into
/// the target (`AFL_PRELOAD`) whose constructor opens on the process, before AFL++'s fork
/// server starts, the breakpoint wpd opens for a watchpoint that follows forks (inherited,
/// a no-op BPF program attached as on wpd's per-thread path) on a variable nobody writes.
/// The persistent child inherits it as it inherits wpd's: what is left is the kernel's
/// scheduling of a task whose perf context holds an event, at every stop and continue
/// (`docs/experiments/switch-with-breakpoint.c`).
const FLOOR_PRELOAD: &str = concat!(
    r#"
#include <linux/bpf.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

"#,
    noop_bpf_prog_c!(),
    r#"
static volatile uint64_t never_written;

__attribute__((constructor)) static void arm(void) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.sample_period = 1;
    a.bp_type = HW_BREAKPOINT_W;
    a.bp_addr = (uintptr_t)&never_written;
    a.bp_len = HW_BREAKPOINT_LEN_8;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    a.inherit = 1;
    int fd = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    int prog = noop_prog();
    if (fd < 0 || prog < 0 || ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog) != 0) {
        perror("the floor's breakpoint");
        abort();
    }
}
"#
);

pub(crate) async fn section_fuzzers(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    for (tool, package) in [
        ("afl-fuzz", "afl++"),
        ("afl-cc", "afl++"),
        (
            "clang-19",
            "clang-19, libfuzzer-19-dev and libclang-rt-19-dev",
        ),
        ("cc", "gcc"),
    ] {
        ensure!(
            in_path(tool),
            "fuzzers: `{tool}` not found in PATH: install Debian's {package} \
             (or leave the section out: --skip fuzzers)"
        );
    }
    let secs = args.fuzz_secs;
    let dir = unique_temp_dir("wpd-bench-fuzzers")?;
    let result: Result<()> = async {
        let daemon = Daemon::start().await?;
        let afl = afl(args, &daemon, &dir, secs).await?;
        libfuzzer(args, &daemon, &dir, secs).await?;
        let floor = fork_floor(args, &dir).await?;
        println!(
            "Time per AFL++ execution (one fork of the fork server, one input) minus alone's, \
             from the medians: {:+.1} µs with every store a hit, {:+.1} µs with the condition \
             judged at the trap, {:+.1} µs with the signal action. The kernel's inherited \
             breakpoint adds {:+.1} µs to a bare fork ({:+.1} µs with a no-op BPF program \
             attached).\n",
            afl.every_hit_us, afl.condition_us, afl.signal_us, floor.inherit_us, floor.bpf_us
        );
        flush();
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    section_done(t0);
    Ok(())
}

fn in_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(d.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Compiles `source` into `dir/name` with `compiler` and `flags`.
fn compile(
    dir: &Path,
    source: &str,
    name: &str,
    compiler: &str,
    flags: &[&str],
) -> Result<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source)?;
    let out = dir.join(name);
    let o = std::process::Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .env("AFL_QUIET", "1")
        .output()
        .with_context(|| format!("running {compiler}"))?;
    ensure!(
        o.status.success(),
        "{compiler} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(out)
}

/// Runs `cmd` to its end within `limit` (killed if it overruns); its output and wall time.
async fn run_timed(
    mut cmd: tokio::process::Command,
    limit: Duration,
) -> Result<(std::process::Output, Duration)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let t = Instant::now();
    let child = cmd.spawn().context("starting the fuzzer")?;
    let pid = child.id().context("the fuzzer's pid")?;
    let out = tokio::time::timeout(limit, child.wait_with_output()).await;
    wpd_tests::remove_segments_left_by(pid);
    match out {
        Ok(out) => Ok((out?, t.elapsed())),
        Err(_) => bail!("the fuzzer did not finish within {limit:?}"),
    }
}

/// Processes named `comm` still alive.
fn alive_named(comm: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

/// A policy set with `wpctl --json watch --comm COMM --symbol state.level ...` (or the
/// `--symbol` `extra` names).
async fn watch(daemon: &Daemon, comm: &str, extra: &[&str]) -> Result<u64> {
    let endpoint = daemon.endpoint();
    let mut a = vec![
        "--endpoint",
        endpoint.as_str(),
        "--json",
        "watch",
        "--comm",
        comm,
    ];
    if !extra.contains(&"--symbol") {
        a.extend(["--symbol", "state.level"]);
    }
    a.extend_from_slice(extra);
    let out = run_wpctl(&a, Duration::from_secs(20)).await?;
    ensure!(out.code == Some(0), "wpctl watch failed: {out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("wpctl --json watch printed {:?}", out.stdout))?;
    v["policy"]["id"].as_u64().context("no policy id")
}

/// `wpctl unwatch ID`: a watchpoint or a policy removed.
pub(crate) async fn unwatch(daemon: &Daemon, id: u64) -> Result<()> {
    let endpoint = daemon.endpoint();
    let id = id.to_string();
    let out = run_wpctl(
        &["--endpoint", &endpoint, "unwatch", &id],
        Duration::from_secs(20),
    )
    .await?;
    ensure!(out.code == Some(0), "wpctl unwatch failed: {out:?}");
    Ok(())
}

/// Waits until no process named `comm` is left and, when a policy is on, until it has no
/// instance left (the daemon has seen the fuzzer's processes go); returns the policy's
/// instances made.
async fn settle(client: &mut Client, comm: &str, policy: Option<u64>) -> Result<u64> {
    poll_until(
        Duration::from_secs(15),
        "the fuzzer's processes gone, and their instances",
        async || {
            let alive = alive_named(comm);
            if !alive.is_empty() {
                return Ok(Err(format!("alive {alive:?}")));
            }
            let Some(id) = policy else {
                return Ok(Ok(0));
            };
            let l = client
                .list_watchpoints(ListWatchpointsRequest { pid: 0 })
                .await?
                .into_inner();
            let p = l
                .policies
                .iter()
                .find(|p| p.id == id)
                .context("the policy is gone")?;
            Ok(if p.instances.is_empty() {
                Ok(p.instances_made)
            } else {
                Err(format!("{} instances left", p.instances.len()))
            })
        },
    )
    .await
}

/// One fuzzer run's figures.
#[derive(Default, Clone, Copy)]
struct Run {
    execs: f64,
    rate: f64,
    /// Daemon CPU over the run, µs.
    cpu_us: f64,
    hits: f64,
    instances: f64,
    crashes: f64,
}

/// Per-mode medians over the runs.
struct Row {
    rate: Spread,
    /// Each run's rate over the rate of the run alone in the same round (the runs of a
    /// round follow each other: slow drifts in the machine's load cancel out).
    paired: Spread,
    execs: f64,
    cpu_us: f64,
    hits: f64,
    instances: f64,
    crashes: f64,
}

fn row(runs: &[Run], alone: &[Run]) -> Row {
    let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    Row {
        rate: spread(runs.iter().map(|r| r.rate).collect()),
        paired: spread(
            runs.iter()
                .zip(alone)
                .map(|(r, a)| r.rate / a.rate)
                .collect(),
        ),
        execs: m(|r| r.execs),
        cpu_us: m(|r| r.cpu_us),
        hits: m(|r| r.hits),
        instances: m(|r| r.instances),
        crashes: m(|r| r.crashes),
    }
}

/// Runs `fuzz` (which returns executions, wall time and crashes) with the policy of `extra`
/// on, or alone when `extra` is `None`; the daemon's CPU and hits over the run.
async fn measured(
    daemon: &Daemon,
    comm: &str,
    extra: Option<&[&str]>,
    fuzz: impl AsyncFnOnce() -> Result<(f64, Duration, f64)>,
) -> Result<Run> {
    let mut client = daemon.client().await?;
    let policy = match extra {
        Some(extra) => Some(watch(daemon, comm, extra).await?),
        None => None,
    };
    let hits0 = client
        .get_stats(GetStatsRequest {})
        .await?
        .into_inner()
        .hits;
    let cpu0 = proc_cpu_us(daemon.pid())?;
    let fuzzed = fuzz().await;
    let made = settle(&mut client, comm, policy).await;
    let cpu1 = proc_cpu_us(daemon.pid())?;
    let hits1 = client
        .get_stats(GetStatsRequest {})
        .await?
        .into_inner()
        .hits;
    if let Some(id) = policy {
        unwatch(daemon, id).await?;
    }
    let (execs, wall, crashes) = fuzzed?;
    Ok(Run {
        execs,
        rate: execs / wall.as_secs_f64(),
        cpu_us: cpu1 - cpu0,
        hits: (hits1 - hits0) as f64,
        instances: made? as f64,
        crashes,
    })
}

fn unique_comm(tag: char) -> String {
    format!("fzb{}{tag}", std::process::id() % 100_000)
}

/// Per-execution cost added by each policy mode in AFL++, µs.
struct AflExtra {
    every_hit_us: f64,
    condition_us: f64,
    signal_us: f64,
}

/// One mode of an AFL++ table: its label, the policy's `wpctl watch` options (`None`: no
/// policy), whether the fuzzer (and so the target) runs with [`NO_REP_STOSB`], and a library
/// to preload into the target (`AFL_PRELOAD`).
type AflMode<'a> = (&'a str, Option<&'a [&'a str]>, bool, Option<&'a Path>);

async fn afl(args: &Args, daemon: &Daemon, dir: &Path, secs: u64) -> Result<AflExtra> {
    let seeds = dir.join("in");
    std::fs::create_dir_all(&seeds)?;
    std::fs::write(seeds.join("seed"), SEED)?;

    let comm = unique_comm('a');
    let bin = compile(dir, FUZZPARSE, &comm, "afl-cc", &["-g", "-O1"])?;
    println!(
        "## fuzzers: AFL++ on a fork server, alone and with a policy on state.level (afl-fuzz -V {secs}, fork-server children followed)\n"
    );
    let forked: [AflMode; 5] = [
        ("alone (daemon idle)", None, false, None),
        (
            "watched, never written (parser_limit: the cost of being watched)",
            Some(&["--symbol", "parser_limit", "--follow-forks"]),
            false,
            None,
        ),
        (
            "log, every store a hit (no condition)",
            Some(&["--follow-forks"]),
            false,
            None,
        ),
        (
            "log, condition > 100 (judged at the trap)",
            Some(&["--follow-forks", "--condition", "> 100"]),
            false,
            None,
        ),
        (
            "signal, condition > 100",
            Some(&[
                "--follow-forks",
                "--condition",
                "> 100",
                "--action",
                "signal",
            ]),
            false,
            None,
        ),
    ];
    let rows = afl_table(args, daemon, dir, secs, &[&bin; 5], &comm, &seeds, &forked).await?;
    let alone = rows[0].rate.med;
    let extra_us = |r: &Row| 1e6 / r.rate.med - 1e6 / alone;
    let extra = AflExtra {
        every_hit_us: extra_us(&rows[2]),
        condition_us: extra_us(&rows[3]),
        signal_us: extra_us(&rows[4]),
    };

    let comm = unique_comm('p');
    let bin = compile(
        dir,
        FUZZPARSE,
        &comm,
        "afl-cc",
        &["-g", "-O1", "-DFUZZ_AFL_PERSISTENT"],
    )?;
    // The same loop with the range check as an abort(), in a directory of
    // its own under the same name: the crashes the signal action makes,
    // without wpd.
    let asserting_dir = dir.join("asserting");
    std::fs::create_dir_all(&asserting_dir)?;
    let asserting = compile(
        &asserting_dir,
        FUZZPARSE,
        &comm,
        "afl-cc",
        &["-g", "-O1", "-DFUZZ_AFL_PERSISTENT", "-DFUZZ_ASSERT_LEVEL"],
    )?;
    let secs = args.persistent_secs;
    println!(
        "## fuzzers: AFL++ in persistent mode (10,000 inputs per fork), alone and with a policy (afl-fuzz -V {secs}; \"tunable\": GLIBC_TUNABLES={NO_REP_STOSB}, in every row but the last)\n"
    );
    // The baseline has the tunable too: AFL++ clears its coverage map with
    // a memset at every input, which `rep stosb` would slow once watched
    // (kernel-facts §14), so the README has the fuzzer run with it.
    // The kernel's floor in the same run: the breakpoint wpd would open, opened by the target
    // itself before the fork server starts.
    let floor_lib = dir.join("libwpdfloor.so");
    compile(
        dir,
        FLOOR_PRELOAD,
        "libwpdfloor.so",
        "cc",
        &["-O2", "-shared", "-fPIC"],
    )?;
    let persistent: [AflMode; 7] = [
        ("alone (daemon idle), tunable", None, true, None),
        (
            "watched, never written (parser_limit), tunable",
            Some(&["--symbol", "parser_limit", "--follow-forks"]),
            true,
            None,
        ),
        (
            "the kernel's floor: no wpd, the same inherited breakpoint and no-op program opened by the target itself (preloaded), tunable",
            None,
            true,
            Some(&floor_lib),
        ),
        (
            "log, every store a hit, tunable",
            Some(&["--follow-forks"]),
            true,
            None,
        ),
        (
            "signal, condition > 100, tunable",
            Some(&[
                "--follow-forks",
                "--condition",
                "> 100",
                "--action",
                "signal",
            ]),
            true,
            None,
        ),
        (
            "alone (daemon idle), without the tunable",
            None,
            false,
            None,
        ),
        (
            "alone, tunable, the target aborts at level > 100 itself (the signal action's crashes without wpd)",
            None,
            true,
            None,
        ),
    ];
    let bins = [&bin, &bin, &bin, &bin, &bin, &bin, &asserting];
    let rows = afl_table(args, daemon, dir, secs, &bins, &comm, &seeds, &persistent).await?;
    let us = |r: &Row| 1e6 / r.rate.med.max(1e-9);
    println!(
        "Persistent mode, from the medians: an execution takes {:.1} µs alone, {:.1} µs watched \
         and {:.1} µs with the kernel's floor (the breakpoint without wpd): the floor is {:.2}× \
         alone, and watched is {:.2}× the floor.\n",
        us(&rows[0]),
        us(&rows[1]),
        us(&rows[2]),
        rows[2].rate.med / rows[0].rate.med.max(1e-9),
        rows[1].rate.med / rows[2].rate.med.max(1e-9),
    );
    flush();
    Ok(extra)
}

/// Runs AFL++ in each of `modes` on the target of the same index in `bins` (whose processes
/// are called `comm`), `args.reps` rounds of them in turn, and prints the table; its rows, in
/// the order of `modes`.
#[allow(clippy::too_many_arguments)]
async fn afl_table(
    args: &Args,
    daemon: &Daemon,
    dir: &Path,
    secs: u64,
    bins: &[&PathBuf],
    comm: &str,
    seeds: &Path,
    modes: &[AflMode<'_>],
) -> Result<Vec<Row>> {
    ensure!(bins.len() == modes.len(), "one target per mode");
    println!(
        "| mode | execs/s (median) | min–max | ratio of medians to alone | ratio to alone in the same round (median, min–max) | executions | daemon CPU µs per execution | hits per execution | instances made | crashes saved |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    flush();
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); modes.len()];
    let mut n = 0;
    for _ in 0..args.reps {
        for (i, (_, extra, tunable, preload)) in modes.iter().enumerate() {
            n += 1;
            let out = dir.join(format!("afl-out-{comm}-{n}"));
            let run = measured(daemon, comm, *extra, async || {
                let mut c = tokio::process::Command::new("afl-fuzz");
                c.arg("-i")
                    .arg(seeds)
                    .arg("-o")
                    .arg(&out)
                    .args(["-V", &secs.to_string(), "--"])
                    .arg(bins[i])
                    .current_dir(dir)
                    .env("AFL_NO_UI", "1")
                    .env("AFL_SKIP_CPUFREQ", "1")
                    .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1");
                // afl-fuzz binds itself (and so its target) to a free CPU, as it does
                // unless told not to; the smoke run, alongside other tests, may find none.
                if args.smoke {
                    c.env("AFL_NO_AFFINITY", "1");
                }
                if *tunable {
                    c.env("GLIBC_TUNABLES", NO_REP_STOSB);
                }
                if let Some(lib) = preload {
                    c.env("AFL_PRELOAD", lib);
                }
                let (o, wall) = run_timed(c, Duration::from_secs(secs * 4 + 60)).await?;
                ensure!(
                    o.status.success(),
                    "afl-fuzz failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stdout)
                );
                let stats = std::fs::read_to_string(out.join("default/fuzzer_stats"))
                    .context("reading fuzzer_stats")?;
                let stat = |key: &str| -> Result<f64> {
                    stats
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            (k.trim() == key).then(|| v.trim().parse().ok())?
                        })
                        .with_context(|| format!("no {key} in fuzzer_stats"))
                };
                Ok((stat("execs_done")?, wall, stat("saved_crashes")?))
            })
            .await?;
            let _ = std::fs::remove_dir_all(&out);
            runs[i].push(run);
        }
    }
    let rows: Vec<Row> = runs.iter().map(|r| row(r, &runs[0])).collect();
    let alone = rows[0].rate.med;
    for ((label, extra, _, _), r) in modes.iter().zip(&rows) {
        println!(
            "| {label} | {:.0} | {:.0}–{:.0} | {:.2} | {:.2} ({:.2}–{:.2}) | {:.0} | {:.2} | {:.2} | {} | {} |",
            r.rate.med,
            r.rate.min,
            r.rate.max,
            r.rate.med / alone,
            r.paired.med,
            r.paired.min,
            r.paired.max,
            r.execs,
            r.cpu_us / r.execs.max(1.0),
            r.hits / r.execs.max(1.0),
            if extra.is_some() {
                format!("{:.0}", r.instances)
            } else {
                "–".into()
            },
            r.crashes
        );
    }
    println!();
    flush();
    Ok(rows)
}

/// The executions libFuzzer reports last on stderr (`#N: cov: ...` in fork mode, `#N\t...`
/// otherwise).
fn libfuzzer_execs(stderr: &str) -> Option<f64> {
    stderr.lines().rev().find_map(|l| {
        let rest = l.strip_prefix('#')?;
        let end = rest.find(|c: char| !c.is_ascii_digit())?;
        rest[..end].parse().ok()
    })
}

async fn libfuzzer(args: &Args, daemon: &Daemon, dir: &Path, secs: u64) -> Result<()> {
    let comm = unique_comm('l');
    let bin = compile(
        dir,
        FUZZPARSE,
        &comm,
        "clang-19",
        &["-g", "-O1", "-fsanitize=fuzzer", "-DFUZZ_LIBFUZZER"],
    )?;
    println!(
        "## fuzzers: libFuzzer in fork mode, alone and with a policy on state.level > 100 (-fork=1 -max_total_time={secs}, log action)\n"
    );
    println!(
        "| mode | execs/s (median) | min–max | ratio of medians to alone | ratio to alone in the same round (median, min–max) | executions | daemon CPU µs per 1000 executions | hits | instances made (jobs and the parent) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    flush();
    // The last two modes run libFuzzer with glibc's memset kept off
    // `rep stosb` (NO_REP_STOSB): an armed data breakpoint takes the CPU
    // out of its fast-string mode, and libFuzzer clears its counters with a
    // large memset at every input (docs/kernel-facts.md §14).
    let modes: [(&str, Option<&[&str]>); 5] = [
        ("alone (daemon idle)", None),
        (
            "watched, never written (parser_limit: the cost of being watched)",
            Some(&["--symbol", "parser_limit"]),
        ),
        (
            "log, condition > 100 (judged at the trap; every input's memset stores it)",
            Some(&["--condition", "> 100"]),
        ),
        ("alone, memset without rep stosb (GLIBC_TUNABLES)", None),
        (
            "watched, never written, memset without rep stosb (GLIBC_TUNABLES)",
            Some(&["--symbol", "parser_limit"]),
        ),
    ];
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); modes.len()];
    let mut n = 0;
    for _ in 0..args.reps {
        for (i, (label, extra)) in modes.iter().enumerate() {
            n += 1;
            let tuned = label.contains("GLIBC_TUNABLES");
            // A fresh corpus each run: every run starts from the seed alone.
            let corpus = dir.join(format!("lf-corpus-{n}"));
            std::fs::create_dir_all(&corpus)?;
            std::fs::write(corpus.join("seed"), SEED)?;
            let run = measured(daemon, &comm, *extra, async || {
                let mut c = tokio::process::Command::new(&bin);
                c.arg("-fork=1")
                    .arg(format!("-max_total_time={secs}"))
                    .arg(format!("-artifact_prefix={}/", dir.display()))
                    .arg(&corpus)
                    .current_dir(dir);
                if tuned {
                    c.env("GLIBC_TUNABLES", NO_REP_STOSB);
                }
                let (o, wall) = run_timed(c, Duration::from_secs(secs * 4 + 60)).await?;
                let log = String::from_utf8_lossy(&o.stderr);
                ensure!(
                    o.status.success(),
                    "libFuzzer failed ({}): {}",
                    o.status,
                    &log[log.len().saturating_sub(2000)..]
                );
                let execs = libfuzzer_execs(&log)
                    .with_context(|| format!("no execution count in libFuzzer's output: {log}"))?;
                Ok((execs, wall, 0.0))
            })
            .await?;
            let _ = std::fs::remove_dir_all(&corpus);
            runs[i].push(run);
        }
    }
    let rows: Vec<Row> = runs.iter().map(|r| row(r, &runs[0])).collect();
    let alone = rows[0].rate.med;
    for ((label, extra), r) in modes.iter().zip(&rows) {
        println!(
            "| {label} | {:.0} | {:.0}–{:.0} | {:.2} | {:.2} ({:.2}–{:.2}) | {:.0} | {:.2} | {:.0} | {} |",
            r.rate.med,
            r.rate.min,
            r.rate.max,
            r.rate.med / alone,
            r.paired.med,
            r.paired.min,
            r.paired.max,
            r.execs,
            r.cpu_us * 1e3 / r.execs.max(1.0),
            r.hits,
            if extra.is_some() {
                format!("{:.0}", r.instances)
            } else {
                "–".into()
            },
        );
    }
    println!(
        "With glibc's memset kept off `rep stosb` in both: watched, never written / alone = {:.2} \
         (ratio of medians); alone with the tunable / alone without = {:.2}.\n",
        rows[4].rate.med / rows[3].rate.med.max(1e-9),
        rows[3].rate.med / alone
    );
    flush();
    Ok(())
}

/// glibc's tunable that keeps `memset` on vector stores below 1 TB: no
/// `rep stosb`, whose fast-string mode an armed data breakpoint turns off.
pub(crate) const NO_REP_STOSB: &str = "glibc.cpu.x86_rep_stosb_threshold=1000000000000";

/// What the kernel's inherited breakpoint adds to a fork, µs.
struct FloorExtra {
    inherit_us: f64,
    bpf_us: f64,
}

async fn fork_floor(args: &Args, dir: &Path) -> Result<FloorExtra> {
    let bin = compile(dir, FORK_FLOOR, "forkfloor", "cc", &["-O2"])?;
    // Short runs, many of them, the modes alternating: a run is half a second, and a noisy
    // neighbour then spoils a few runs rather than a mode's whole median.
    let (forks, runs_per_rep): (u32, usize) = if args.smoke { (300, 2) } else { (2000, 5) };
    let rounds = args.reps * runs_per_rep;
    println!(
        "## fuzzers: the kernel's floor, {forks} × fork + _exit + waitpid with a write breakpoint on the forking process ({rounds} runs of each)\n"
    );
    println!(
        "| what | µs per fork (median of the runs) | min–max | ratio of medians to a bare fork | ratio to the bare fork of the same round (median, min–max) |"
    );
    println!("|---|---:|---:|---:|---:|");
    let modes = [
        ("bare fork (no breakpoint)", "bare"),
        ("breakpoint, not inherited", "bp"),
        ("breakpoint, inherited (inherit=1)", "inherit"),
        (
            "breakpoint, inherited, no-op BPF program attached (wpd's per-thread path)",
            "inherit-bpf",
        ),
    ];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for _ in 0..rounds {
        for (i, (_, mode)) in modes.iter().enumerate() {
            let o = tokio::process::Command::new(&bin)
                .args([*mode, &forks.to_string()])
                .output()
                .await?;
            ensure!(
                o.status.success(),
                "forkfloor {mode}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let us: f64 = String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse()
                .context("forkfloor's output")?;
            runs[i].push(us);
        }
    }
    let paired: Vec<Spread> = runs
        .iter()
        .map(|r| spread(r.iter().zip(&runs[0]).map(|(m, b)| m / b).collect()))
        .collect();
    let s: Vec<Spread> = runs.into_iter().map(spread).collect();
    let bare = s[0].med;
    for (((label, _), s), p) in modes.iter().zip(&s).zip(&paired) {
        println!(
            "| {label} | {:.1} | {:.1}–{:.1} | {:.2} | {:.2} ({:.2}–{:.2}) |",
            s.med,
            s.min,
            s.max,
            s.med / bare,
            p.med,
            p.min,
            p.max
        );
    }
    println!();
    flush();
    Ok(FloorExtra {
        inherit_us: s[2].med - bare,
        bpf_us: s[3].med - bare,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both floors carry the one no-op program, and each is C that compiles
    /// (`-Wall -Werror`: `noop_prog` is used in both).
    #[test]
    fn the_floors_share_the_noop_program_and_compile() {
        let noop = noop_bpf_prog_c!();
        assert!(noop.starts_with("static int noop_prog(void) {"));
        let dir = unique_temp_dir("wpd-bench-floors").unwrap();
        for (name, source) in [("forkfloor", FORK_FLOOR), ("floorpreload", FLOOR_PRELOAD)] {
            assert_eq!(source.matches(noop).count(), 1, "{name}");
            assert!(
                source.contains("int prog = noop_prog();"),
                "{name} calls it"
            );
            let src = dir.join(format!("{name}.c"));
            std::fs::write(&src, source).unwrap();
            let o = std::process::Command::new("cc")
                .args(["-fsyntax-only", "-Wall", "-Werror", "-O2", "-fPIC"])
                .arg(&src)
                .output()
                .expect("cc (scripts/setup installs gcc)");
            assert!(
                o.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
