//! State feedback: how soon AFL++, then libFuzzer, reach the exit of
//! `tests/c/maze.c` (22 exact moves, every step through the same code)
//! alone, with wpd's feedback on the position (`px` with `py`), and with the
//! same position counted by the program's own source in the same bytes
//! (IJON's way: the floor); then what one feedback store costs the storing
//! thread against a store wpd only records, in the same run.

use crate::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use wpd_proto::v1::{
    Feedback, ProcessSelector, RemoveWatchpointRequest, SetPolicyRequest, SetWatchpointRequest,
    WatchpointSpec,
};
use wpd_tests::{Backend, Daemon, rpc_ok, unique_temp_dir};

const MAZE: &str = include_str!("../../../../c/maze.c");

/// Stores `v` as often as each line it reads says, then prints the time
/// taken (ns) and the feedback traps the preloaded library has counted.
const STORER: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
volatile int64_t v;
extern struct { uint64_t magic, map; uint32_t base, room; uint64_t traps; }
    wpd_feedback_state __attribute__((weak));
int main(void) {
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        long n = atol(line);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < n; i++) v = i;
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%lld %llu\n", (long long)((b.tv_sec - a.tv_sec) * 1000000000LL + b.tv_nsec - a.tv_nsec),
               (unsigned long long)(&wpd_feedback_state ? wpd_feedback_state.traps : 0));
        fflush(stdout);
    }
    return 0;
}
"#;

fn library() -> PathBuf {
    wpd_tests::bin_path("wpd").with_file_name("libwpd_feedback.so")
}

fn afl_cc(dir: &Path, source: &str, name: &str, extra: &[&str]) -> Result<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source)?;
    let out = dir.join(name);
    let o = std::process::Command::new("afl-cc")
        .args(["-g", "-O1"])
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .env("AFL_QUIET", "1")
        .output()
        .context("afl-cc (Debian's afl++)")?;
    ensure!(
        o.status.success(),
        "afl-cc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(out)
}

/// One AFL++ run until the first crash or `cap` seconds: the time to the
/// crash (s, from AFL++'s own record of it) and the executions per second.
async fn until_crash(dir: &Path, bin: &Path, out: &str, cap: u64) -> Result<(Option<f64>, f64)> {
    let mut c = tokio::process::Command::new("afl-fuzz");
    c.args(["-i", "in", "-o", out, "-V", &cap.to_string(), "--"])
        .arg(bin)
        .current_dir(dir)
        .env("AFL_PRELOAD", library())
        .env("AFL_BENCH_UNTIL_CRASH", "1")
        .env("AFL_NO_UI", "1")
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_NO_AFFINITY", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = c.spawn().context("starting afl-fuzz")?;
    let pid = child.id().context("afl-fuzz's pid")?;
    let st = tokio::time::timeout(Duration::from_secs(cap + 60), child.wait()).await;
    drop(child);
    wpd_tests::remove_segments_left_by(pid);
    let st = st.context("afl-fuzz overran its time")??;
    ensure!(st.success(), "afl-fuzz: {st:?}");
    let base = dir.join(out).join("default");
    let crash = std::fs::read_dir(base.join("crashes"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("id:"))
        .filter_map(|n| {
            let t = n.split(",time:").nth(1)?.split(',').next()?;
            t.parse::<f64>().ok()
        })
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.min(t))));
    let stats = std::fs::read_to_string(base.join("fuzzer_stats"))?;
    let eps = stats
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "execs_per_sec").then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0.0);
    Ok((crash.map(|ms| ms / 1000.0), eps))
}

/// Compiles the maze as a libFuzzer target with clang-19.
fn libfuzzer_cc(dir: &Path, name: &str, extra: &[&str]) -> Result<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, MAZE)?;
    let out = dir.join(name);
    let o = std::process::Command::new("clang-19")
        .args(["-g", "-O1", "-fsanitize=fuzzer", "-DFUZZ_LIBFUZZER"])
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .context("clang-19 (Debian's clang-19, libfuzzer-19-dev)")?;
    ensure!(
        o.status.success(),
        "clang-19: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(out)
}

/// One libFuzzer run (an empty corpus, `preload`: the library in its
/// `LD_PRELOAD`) until its first crash or `cap` seconds: the wall time to
/// the crash (s), the executions per second libFuzzer reports, and the
/// inputs it ran.
async fn libfuzzer_until_crash(
    dir: &Path,
    bin: &Path,
    corpus: &str,
    cap: u64,
    preload: bool,
) -> Result<((Option<f64>, f64), f64)> {
    std::fs::create_dir_all(dir.join(corpus))?;
    let mut c = tokio::process::Command::new(bin);
    c.arg(format!("-max_total_time={cap}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={corpus}-"))
        .arg(corpus)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if preload {
        c.env("LD_PRELOAD", library());
    }
    let t = Instant::now();
    let o = tokio::time::timeout(Duration::from_secs(cap + 60), c.output())
        .await
        .context("libFuzzer overran its time")??;
    let took = t.elapsed().as_secs_f64();
    let log = String::from_utf8_lossy(&o.stderr);
    let crashed = log.contains("ERROR: libFuzzer: deadly signal");
    ensure!(
        crashed || o.status.success(),
        "libFuzzer: {:?}: {}",
        o.status,
        &log[log.len().saturating_sub(1500)..]
    );
    let stat = |name: &str| -> f64 {
        log.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok((
        (crashed.then_some(took), stat("stat::average_exec_per_sec:")),
        stat("stat::number_of_executed_units:"),
    ))
}

/// Prints a table row: how many runs reached the exit, the time they took
/// and the execs/s, then `extra` cells; the median time if every run got
/// there.
fn row(what: &str, runs: &[(Option<f64>, f64)], cap: u64, extra: &[String]) -> Option<f64> {
    let reached: Vec<f64> = runs.iter().filter_map(|r| r.0).collect();
    let eps = spread(runs.iter().map(|r| r.1).collect());
    let time = if reached.is_empty() {
        format!("none in {cap} s")
    } else {
        let s = spread(reached.clone());
        format!("{:.1} ({:.1}–{:.1})", s.med, s.min, s.max)
    };
    println!(
        "| {what} | {} of {} | {time} | {:.0} ({:.0}–{:.0}) |{}",
        reached.len(),
        runs.len(),
        eps.med,
        eps.min,
        eps.max,
        extra.iter().map(|c| format!(" {c} |")).collect::<String>()
    );
    (reached.len() == runs.len()).then(|| spread(reached).med)
}

/// A policy on every run of `maze` watching the position (`px`, with `py`) as feedback, its
/// forked children too if `follow_forks` (AFL++'s fork server): its id.
async fn watch_position(
    client: &mut wpd_tests::Client,
    maze: &Path,
    follow_forks: bool,
) -> Result<u64> {
    Ok(rpc_ok(
        "SetPolicy",
        client.set_policy(SetPolicyRequest {
            selector: Some(ProcessSelector {
                exe: maze.display().to_string(),
                ..Default::default()
            }),
            spec: Some(WatchpointSpec {
                symbol: "px".into(),
                access: wpd_proto::v1::Access::Write as i32,
                backend: Backend::Perf as i32,
                follow_forks,
                feedback: Some(Feedback {
                    mode: 0,
                    with: "py".into(),
                }),
                ..Default::default()
            }),
        }),
    )
    .await?
    .policy
    .context("no policy")?
    .id)
}

pub(crate) async fn section_feedback(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    // A fuzzer alone is given `cap`; the walks with feedback `walk_cap`, long enough for
    // their slow runs (a median of about two minutes here, the slowest several times that).
    let (reps, cap, walk_cap) = if args.smoke {
        (1, 20, 20)
    } else {
        (args.reps.max(3), 180, 600)
    };
    println!("## feedback: state feedback on the maze, and what a feedback store costs\n");
    println!(
        "AFL++ on `tests/c/maze.c` (22 exact moves; every step the same code) until its first \
         crash (the exit) or {walk_cap} s ({cap} s alone), {reps} runs each, \
         `libwpd_feedback.so` preloaded in every run: alone (nothing counts in its room), \
         with wpd's feedback on `px` with `py` (a policy by executable, following forks), \
         and with the program counting the same key in the same bytes itself (`-DSTATE_IN_SOURCE`: the floor). Time to the exit as \
         AFL++ records it, s, median (range).\n"
    );
    println!("| AFL++ | reached the exit | time to the exit, s | execs/s |");
    println!("|---|---|---:|---:|");
    let dir = unique_temp_dir("wpd-bench-feedback")?;
    std::fs::create_dir(dir.join("in"))?;
    std::fs::write(dir.join("in/seed"), [1u8, 0])?;
    let lib = library();
    let libdir = lib.parent().context("library dir")?.display().to_string();
    let maze = afl_cc(&dir, MAZE, "maze", &[])?;
    let floor = afl_cc(
        &dir,
        MAZE,
        "maze-in-source",
        &[
            "-DSTATE_IN_SOURCE",
            &format!("-L{libdir}"),
            &format!("-Wl,-rpath,{libdir}"),
            "-lwpd_feedback",
        ],
    )?;
    let mut alone = Vec::new();
    for i in 0..reps {
        alone.push(until_crash(&dir, &maze, &format!("alone{i}"), cap).await?);
    }
    row("alone", &alone, cap, &[]);
    let daemon = Daemon::start().await?;
    let mut client = daemon.client().await?;
    let policy = watch_position(&mut client, &maze, true).await?;
    let mut fed = Vec::new();
    for i in 0..reps {
        fed.push(until_crash(&dir, &maze, &format!("fed{i}"), walk_cap).await?);
    }
    let fed_med = row("with wpd's feedback", &fed, walk_cap, &[]);
    rpc_ok(
        "RemoveWatchpoint(policy)",
        client.remove_watchpoint(RemoveWatchpointRequest { id: policy }),
    )
    .await?;
    let mut source = Vec::new();
    for i in 0..reps {
        source.push(until_crash(&dir, &floor, &format!("source{i}"), walk_cap).await?);
    }
    let source_med = row("counting in its source (the floor)", &source, walk_cap, &[]);
    match (fed_med, source_med) {
        (Some(f), Some(s)) => println!(
            "\nwpd's feedback / the floor: {:.2}× the time to the exit (medians).\n",
            f / s
        ),
        _ => println!("\nwpd's feedback / the floor: not every run reached the exit.\n"),
    }
    libfuzzer_rows(args, &dir, &daemon).await?;
    store_cost(args, &dir, &daemon).await?;
    flush();
    drop(client);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
    section_done(t0);
    Ok(())
}

/// The same three cases with libFuzzer (in-process: the library registers
/// counters of its own, and libFuzzer counts them as features).
async fn libfuzzer_rows(args: &Args, dir: &Path, daemon: &Daemon) -> Result<()> {
    let (reps, cap) = if args.smoke {
        (1, 10)
    } else {
        (args.reps.max(3), 120)
    };
    println!(
        "libFuzzer (clang 19) on the same maze built with `-fsanitize=fuzzer`, an empty \
         corpus, until its first crash or {cap} s, {reps} runs each: alone (the library \
         preloaded, its counters registered, nothing counted), with wpd's feedback (a policy \
         by executable), and counting in its source (linked with the library). Wall time to \
         the exit, s, median (range); execs/s as libFuzzer reports them.\n"
    );
    println!("| libFuzzer | reached the exit | time to the exit, s | execs/s | inputs run |");
    println!("|---|---|---:|---:|---:|");
    let lib = library();
    let libdir = lib.parent().context("library dir")?.display().to_string();
    let maze = libfuzzer_cc(dir, "lfmaze", &[])?;
    let floor = libfuzzer_cc(
        dir,
        "lfmaze-in-source",
        &[
            "-DSTATE_IN_SOURCE",
            &format!("-L{libdir}"),
            &format!("-Wl,-rpath,{libdir}"),
            "-lwpd_feedback",
        ],
    )?;
    let mut alone = (Vec::new(), Vec::new());
    for i in 0..reps {
        let (r, n) = libfuzzer_until_crash(dir, &maze, &format!("lf-alone{i}"), cap, true).await?;
        alone.0.push(r);
        alone.1.push(n);
    }
    row("libFuzzer alone", &alone.0, cap, &[units(&alone.1)]);
    let mut client = daemon.client().await?;
    let policy = watch_position(&mut client, &maze, false).await?;
    let mut fed = (Vec::new(), Vec::new());
    for i in 0..reps {
        let (r, n) = libfuzzer_until_crash(dir, &maze, &format!("lf-fed{i}"), cap, true).await?;
        fed.0.push(r);
        fed.1.push(n);
    }
    let fed_med = row(
        "libFuzzer with wpd's feedback",
        &fed.0,
        cap,
        &[units(&fed.1)],
    );
    rpc_ok(
        "RemoveWatchpoint(policy)",
        client.remove_watchpoint(RemoveWatchpointRequest { id: policy }),
    )
    .await?;
    let mut source = (Vec::new(), Vec::new());
    for i in 0..reps {
        let (r, n) =
            libfuzzer_until_crash(dir, &floor, &format!("lf-source{i}"), cap, false).await?;
        source.0.push(r);
        source.1.push(n);
    }
    let source_med = row(
        "libFuzzer counting in its source (the floor)",
        &source.0,
        cap,
        &[units(&source.1)],
    );
    match (fed_med, source_med) {
        (Some(f), Some(s)) => println!(
            "\nlibFuzzer: wpd's feedback / the floor: {:.2}× the time to the exit (medians).\n",
            f / s
        ),
        _ => println!("\nlibFuzzer: wpd's feedback / the floor: not every run reached the exit.\n"),
    }
    Ok(())
}

/// Inputs run, median (range).
fn units(v: &[f64]) -> String {
    let s = spread(v.to_vec());
    format!("{:.0} ({:.0}–{:.0})", s.med, s.min, s.max)
}

/// A System V segment standing in for afl-fuzz's map (the AFL++ runtime
/// attaches it from `__AFL_SHM_ID`), removed when dropped.
struct Segment(i32);

impl Segment {
    fn new() -> Result<Segment> {
        // SAFETY: a new private segment; no memory is touched here.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 1 << 20, libc::IPC_CREAT | 0o600) };
        ensure!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        Ok(Segment(id))
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: removes the segment this made (it goes when detached).
        unsafe { libc::shmctl(self.0, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

/// What a store costs the storing thread: nothing watched, a watchpoint
/// wpd only records (its program, the ring), and a feedback watchpoint
/// (the program, the signal, the library's handler), round after round.
async fn store_cost(args: &Args, dir: &Path, daemon: &Daemon) -> Result<()> {
    let (rounds, n) = if args.smoke { (2, 2_000) } else { (7, 50_000) };
    println!(
        "One thread storing an 8-byte variable {n} times per round, {rounds} rounds of each \
         case in turn, in a program built with afl-cc and run as under afl-fuzz (its map a \
         System V segment, the library preloaded); ns per store, median (range). Traps: \
         what the library counted.\n"
    );
    println!("| store | ns per store | / recorded | traps counted |");
    println!("|---|---:|---:|---:|");
    let bin = afl_cc(dir, STORER, "storer", &[])?;
    let seg = Segment::new()?;
    let mut child = tokio::process::Command::new(&bin)
        .env("LD_PRELOAD", library())
        .env("__AFL_SHM_ID", seg.0.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("storer pid")? as i32;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let mut client = daemon.client().await?;
    let mut round = async |n: u64| -> Result<(f64, u64)> {
        stdin.write_all(format!("{n}\n").as_bytes()).await?;
        let l = lines.next_line().await?.context("the storer ended")?;
        let (ns, traps) = l.split_once(' ').context("storer output")?;
        Ok((ns.parse::<f64>()? / n as f64, traps.parse()?))
    };
    round(1000).await?;
    let mut per: [Vec<f64>; 3] = Default::default();
    let mut traps = 0;
    for _ in 0..rounds {
        for (case, v) in per.iter_mut().enumerate() {
            let id = if case == 0 {
                None
            } else {
                let r = rpc_ok(
                    "SetWatchpoint",
                    client.set_watchpoint(SetWatchpointRequest {
                        spec: Some(WatchpointSpec {
                            pid,
                            symbol: "v".into(),
                            access: wpd_proto::v1::Access::Write as i32,
                            backend: Backend::Perf as i32,
                            feedback: (case == 2).then(Feedback::default),
                            ..Default::default()
                        }),
                    }),
                )
                .await?;
                Some(r.watchpoint.context("no watchpoint")?.id)
            };
            let (ns, t) = round(n).await?;
            v.push(ns);
            if case == 2 {
                traps = t;
            }
            if let Some(id) = id {
                rpc_ok(
                    "RemoveWatchpoint",
                    client.remove_watchpoint(RemoveWatchpointRequest { id }),
                )
                .await?;
            }
        }
    }
    let [none, recorded, fed] = per.map(spread);
    let line = |what: &str, s: Spread, t: String| {
        println!(
            "| {what} | {:.0} ({:.0}–{:.0}) | {:.2} | {t} |",
            s.med,
            s.min,
            s.max,
            s.med / recorded.med
        );
    };
    line("not watched", none, String::new());
    line(
        "recorded (wpd's program, the ring)",
        recorded,
        String::new(),
    );
    line(
        "feedback (the program, the signal, the handler)",
        fed,
        format!("{traps} of {}", n * rounds as u64),
    );
    println!();
    drop(stdin);
    let _ = child.wait().await;
    drop(seg);
    Ok(())
}
