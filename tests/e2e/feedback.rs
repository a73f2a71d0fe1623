//! State feedback: a watched variable's values given to a fuzzer as coverage, on an
//! unchanged binary (`wpctl watch --feedback`, kernel-facts §24). The target is
//! `tests/c/maze.c`, a maze whose every step runs the same code: alone, the real AFL++ and
//! libFuzzer find no exit; with the position watched as feedback they walk it step by step.
//! `libwpd_feedback.so`, preloaded, counts each trap's value in the fuzzer's map.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_tests::{
    Backend, CmdOutput, Daemon, poll_until, require_backend, run_wpctl, unique_temp_dir,
};

use crate::fuzzers::{nothing_left, run_fuzzer, unique_comm};

/// The maze (`tests/c/maze.c`): 16 exact moves, every step through the same code.
const MAZE: &str = include_str!("../c/maze.c");

/// The 16 moves from the maze's start to its exit.
const WIN: [u8; 16] = [1, 1, 3, 3, 0, 0, 3, 3, 1, 1, 3, 3, 0, 0, 3, 3];

/// How a maze is built.
#[derive(Clone, Copy)]
enum Build {
    /// afl-cc: a fork server, one input from stdin.
    Afl,
    /// afl-cc, and a walker that dies ends the process at once (`-DEND_MID_INPUT`).
    AflEndingMidInput,
    /// afl-cc, AFL++'s persistent mode: one process walks input after input from shared
    /// memory (`-DPERSISTENT`).
    AflPersistent,
    /// afl-cc with LTO instrumentation (`AFL_CC_COMPILER=LTO`: collision-free edge ids given
    /// at link time, with LLVM 14's lld).
    AflLto,
    /// afl-cc with the classic instrumentation (`AFL_LLVM_INSTRUMENT=CLASSIC`: a map of
    /// 65,536 bytes, hashed edges).
    AflClassic,
    /// clang-19 `-fsanitize=fuzzer`: libFuzzer's target.
    LibFuzzer,
    /// cc: the walk alone, to replay inputs without a fuzzer's runtime.
    Plain,
}

/// Compiles `tests/c/maze.c` into `dir/name`. A missing compiler is a failure that names
/// the package (`scripts/setup` installs it).
fn build_maze(dir: &Path, name: &str, build: Build) -> Result<PathBuf> {
    let src = dir.join("maze.c");
    std::fs::write(&src, MAZE)?;
    let out = dir.join(name);
    let mut env = ("AFL_QUIET", "1");
    let (cc, flags, package): (&str, &[&str], &str) = match build {
        Build::Afl => ("afl-cc", &[], "afl++"),
        Build::AflEndingMidInput => ("afl-cc", &["-DEND_MID_INPUT"], "afl++"),
        Build::AflPersistent => ("afl-cc", &["-DPERSISTENT"], "afl++"),
        Build::AflLto => {
            env = ("AFL_CC_COMPILER", "LTO");
            ("afl-cc", &[], "afl++ and lld-14")
        }
        Build::AflClassic => {
            env = ("AFL_LLVM_INSTRUMENT", "CLASSIC");
            ("afl-cc", &[], "afl++")
        }
        Build::LibFuzzer => (
            "clang-19",
            &["-fsanitize=fuzzer", "-DFUZZ_LIBFUZZER"],
            "clang-19, libfuzzer-19-dev and libclang-rt-19-dev",
        ),
        Build::Plain => ("cc", &[], "gcc"),
    };
    let o = std::process::Command::new(cc)
        .args(["-g", "-O1"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .env("AFL_QUIET", "1")
        .env(env.0, env.1)
        .output()
        .with_context(|| format!("running {cc} (Debian's {package}; scripts/setup installs it)"))?;
    ensure!(
        o.status.success(),
        "{cc} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Ok(out)
}

/// `libwpd_feedback.so`, built beside the daemon.
fn feedback_library() -> Result<PathBuf> {
    let lib = wpd_tests::bin_path("wpd").with_file_name("libwpd_feedback.so");
    ensure!(lib.is_file(), "{} is not built", lib.display());
    Ok(lib)
}

/// Runs a maze built with its `trace` mode on `input` (the tests replay with a copy built
/// with cc, which no policy of theirs names): what each move stored
/// ("py px", -1 once the walker is dead) and whether it aborted (reached the exit).
fn replay_maze(bin: &Path, input: &[u8]) -> Result<(Vec<(i64, i64)>, bool)> {
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    let mut run = std::process::Command::new(bin)
        .arg("trace")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    run.stdin.take().context("no stdin")?.write_all(input)?;
    let out = run.wait_with_output()?;
    let walked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (y, x) = l.split_once(' ')?;
            Some((y.parse().ok()?, x.parse().ok()?))
        })
        .collect();
    Ok((walked, out.status.signal() == Some(libc::SIGABRT)))
}

/// `afl-fuzz -i in -o OUT -V SECONDS -- BIN` in `dir` (seeds in `dir/in`), the library
/// preloaded; `until_crash`: it stops at its first crash.
fn afl(
    dir: &Path,
    bin: &Path,
    out: &str,
    seconds: u32,
    until_crash: bool,
) -> Result<tokio::process::Command> {
    let mut c = tokio::process::Command::new("afl-fuzz");
    c.args(["-i", "in", "-o", out, "-V", &seconds.to_string(), "--"])
        .arg(bin)
        .current_dir(dir)
        .env("AFL_PRELOAD", feedback_library()?)
        .env("AFL_NO_UI", "1")
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_NO_AFFINITY", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1");
    if until_crash {
        c.env("AFL_BENCH_UNTIL_CRASH", "1");
    }
    Ok(c)
}

/// The seeds: two moves (down, up), so the loop's back edge, the one edge a longer walk
/// adds, is covered from the start.
fn seed(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("in"))?;
    Ok(std::fs::write(dir.join("in/seed"), [1u8, 0])?)
}

/// The inputs an afl-fuzz run saved (`kind`: queue or crashes), by name, in order.
fn saved(dir: &Path, out: &str, kind: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let d = dir.join(out).join("default").join(kind);
    let mut v = Vec::new();
    for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("id:") {
            v.push((name, std::fs::read(e.path())?));
        }
    }
    v.sort();
    Ok(v)
}

/// Runs AFL++ on `bin` until its first crash (240 s at most; `dir/out`): afl-fuzz's output
/// and the crashes it saved (at least one).
async fn afl_until_crash(
    dir: &Path,
    bin: &Path,
    out: &str,
) -> Result<(String, Vec<(String, Vec<u8>)>)> {
    let o = run_fuzzer(afl(dir, bin, out, 240, true)?, Duration::from_secs(300)).await?;
    let log = String::from_utf8_lossy(&o.stdout).into_owned();
    ensure!(o.status.success(), "afl-fuzz failed: {log}");
    let found = saved(dir, out, "crashes")?;
    ensure!(!found.is_empty(), "AFL++ saved no crash in 240 s");
    Ok((log, found))
}

/// Each saved crash reaches the maze's exit, replayed by `replay` without wpd.
fn all_reach_the_exit(replay: &Path, found: &[(String, Vec<u8>)]) -> Result<()> {
    for (name, input) in found {
        ensure!(
            replay_maze(replay, input)?.1,
            "{name}: {input:?} does not reach the exit without wpd"
        );
    }
    Ok(())
}

/// The credit: the maze's edges are the same for every input, so each input AFL++ saved
/// for new coverage (`+cov`, not the seed) must walk, replayed without wpd by `replay`, a
/// position no earlier saved input walked. Returns how many were saved for new coverage.
fn credited(replay: &Path, queue: &[(String, Vec<u8>)]) -> Result<usize> {
    let mut seen = std::collections::BTreeSet::new();
    let mut credited = 0;
    for (name, input) in queue {
        let (walked, _) = replay_maze(replay, input)?;
        let new = walked.iter().filter(|p| !seen.contains(*p)).count();
        seen.extend(walked);
        if name.contains("+cov") && !name.contains("orig") {
            ensure!(
                new > 0,
                "{name} was saved for new coverage but walks nowhere new: the credit went to \
                 another run"
            );
            credited += 1;
        }
    }
    Ok(credited)
}

/// `wpctl watch --exe EXE --symbol px --feedback --feedback-with py [more]`: every run of
/// the program held at its exec and armed before its first instruction (a policy by name
/// arms a program's first process only after its exec, and a fork server would fork
/// unwatched runs meanwhile). Returns the policy's id.
async fn watch_position(ep: &str, exe: &Path, more: &[&str]) -> Result<u64> {
    let exe = exe.display().to_string();
    let mut args = vec![
        "--endpoint",
        ep,
        "watch",
        "--exe",
        &exe,
        "--symbol",
        "px",
        "--feedback",
        "--feedback-with",
        "py",
    ];
    args.extend_from_slice(more);
    let w = run_wpctl(&args, Duration::from_secs(20)).await?;
    ensure!(
        w.code == Some(0) && w.stdout.starts_with("policy "),
        "{w:?}"
    );
    w.stdout["policy ".len()..]
        .split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .context("policy id")
}

/// `wpctl --endpoint EP ARGS`.
async fn wpctl(ep: &str, args: &[&str]) -> Result<CmdOutput> {
    let mut all = vec!["--endpoint", ep];
    all.extend_from_slice(args);
    run_wpctl(&all, Duration::from_secs(20)).await
}

/// Starts `bin` in its directory (waiting on its input, or fuzzing), with the library
/// preloaded or not.
fn start_waiting(bin: &Path, args: &[&str], preload: bool) -> Result<std::process::Child> {
    let mut c = std::process::Command::new(bin);
    c.args(args)
        .current_dir(bin.parent().context("no directory")?)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if preload {
        c.env("LD_PRELOAD", feedback_library()?);
    }
    Ok(c.spawn()?)
}

/// Waits until process `pid` has mapped the library (or, `preload` false, has started).
async fn loaded(pid: u32, preload: bool) -> Result<()> {
    poll_until(Duration::from_secs(10), "the program started", async || {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        Ok(if !preload || maps.contains("libwpd_feedback.so") {
            Ok(())
        } else {
            Err("library not mapped yet".to_string())
        })
    })
    .await
}

/// State feedback from outside: AFL++ on the maze (every step through the same code, a
/// wrong move kills the walker) finds no exit alone, with wpd's library preloaded and
/// nothing watched; with a policy watching the position (`px`, with `py`) as feedback, the
/// breakpoint's trap counts each new position in the map the fuzzer reads for that run,
/// and AFL++ walks the maze step by step to the exit. The credit goes to the run that made
/// the store (each input saved for new coverage walks a position no earlier one did,
/// replayed without wpd). A maze process without the library, or not under afl-fuzz, is
/// refused in one line saying which. When AFL++ ends, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn afl_with_state_feedback_walks_the_maze_to_its_exit() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze")?;
    let comm = unique_comm("fzmaze");
    let bin = build_maze(&dir, &comm, Build::Afl)?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    // The maze's rules: the 16 moves abort, 15 of them do not.
    ensure!(replay_maze(&bin, &WIN)?.1 && !replay_maze(&bin, &WIN[..15])?.1);
    seed(&dir)?;

    // Alone (the library preloaded, its room in the map empty): no exit.
    let o = run_fuzzer(afl(&dir, &bin, "alone", 20, true)?, Duration::from_secs(60)).await?;
    ensure!(
        o.status.success(),
        "afl-fuzz failed: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    ensure!(
        saved(&dir, "alone", "crashes")?.is_empty(),
        "AFL++ alone found the exit"
    );

    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        // Refused where the trap would have no one to count it.
        for (preload, says) in [
            (false, "AFL_PRELOAD="),
            (true, "not running under afl-fuzz"),
        ] {
            let mut alone = start_waiting(&bin, &[], preload)?;
            let pid = alone.id();
            let r = async {
                loaded(pid, preload).await?;
                wpctl(
                    &ep,
                    &[
                        "watch",
                        "--pid",
                        &pid.to_string(),
                        "--symbol",
                        "px",
                        "--feedback",
                    ],
                )
                .await
            }
            .await;
            let _ = alone.kill();
            let _ = alone.wait();
            let r = r?;
            ensure!(
                r.code != Some(0) && r.stderr.lines().count() == 1 && r.stderr.contains(says),
                "a feedback watch on a maze with the library {preload}: {r:?}"
            );
        }
        let policy_id = watch_position(&ep, &bin, &["--follow-forks"]).await?;
        let (_, found) = afl_until_crash(&dir, &bin, "fed").await?;
        all_reach_the_exit(&replay, &found)?;
        let n = credited(&replay, &saved(&dir, "fed", "queue")?)?;
        ensure!(
            n >= 8,
            "only {n} inputs saved for new positions: the walk was not learnt step by step"
        );
        nothing_left(&daemon, &comm, policy_id).await?;
        let r = wpctl(&ep, &["unwatch", &policy_id.to_string()]).await?;
        ensure!(r.code == Some(0), "{r:?}");
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// AFL++'s other instrumentations: LTO (edge ids given at link time, the map as small as
/// the edges) and classic (65,536 bytes of hashed edges). The library makes its room after
/// the map's size either way, and AFL++ walks each build to the exit with the position as
/// feedback, the credit exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lto_and_classic_builds_walk_the_maze_too() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze-lto")?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    seed(&dir)?;
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        for (build, prefix) in [(Build::AflLto, "fzlto"), (Build::AflClassic, "fzcls")] {
            let comm = unique_comm(prefix);
            let bin = build_maze(&dir, &comm, build)?;
            let policy_id = watch_position(&ep, &bin, &["--follow-forks"]).await?;
            let (_, found) = afl_until_crash(&dir, &bin, prefix).await?;
            all_reach_the_exit(&replay, &found)?;
            let n = credited(&replay, &saved(&dir, prefix, "queue")?)?;
            ensure!(n >= 8, "{prefix}: only {n} inputs saved for new positions");
            nothing_left(&daemon, &comm, policy_id).await?;
        }
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// Runs that end mid-input: the maze built so that a walker that dies ends the process at
/// once (`_exit(0)` right after the store of its death, the rest of the input unread), and
/// the one that reaches the exit aborts there. The trap of the last store is counted
/// before the process ends (the signal comes before the next instruction), so AFL++ still
/// learns the walk and reaches the exit; every input saved for new coverage walks somewhere
/// new, replayed without wpd; and the thousands of runs that ended mid-input leave nothing
/// behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_that_end_mid_input_keep_their_credit() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze-mid")?;
    let comm = unique_comm("fzmid");
    let bin = build_maze(&dir, &comm, Build::AflEndingMidInput)?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    // A death ends the walk: the moves after it are not made.
    let (walked, won) = replay_maze(&bin, &[1, 0, 0, 1, 1])?;
    ensure!(
        !won && walked == [(2, 1), (1, 1), (-1, -1)],
        "the maze went on after a death: {walked:?}"
    );
    ensure!(replay_maze(&bin, &WIN)?.1);
    seed(&dir)?;
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        let policy_id = watch_position(&ep, &bin, &["--follow-forks"]).await?;
        let (_, found) = afl_until_crash(&dir, &bin, "fed").await?;
        all_reach_the_exit(&replay, &found)?;
        let queue = saved(&dir, "fed", "queue")?;
        let n = credited(&replay, &queue)?;
        ensure!(n >= 8, "only {n} inputs saved for new positions");
        // Most inputs ended with a death: the walks AFL++ learnt from were cut short.
        let died = queue
            .iter()
            .map(|(_, i)| replay_maze(&replay, i).map(|(w, _)| w.last() == Some(&(-1, -1))))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .filter(|&d| d)
            .count();
        ensure!(died > 0, "no saved input ends with a death");
        nothing_left(&daemon, &comm, policy_id).await
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// AFL++'s persistent mode: each process the fork server forks walks input after input,
/// read from shared memory, and afl-fuzz clears the map (the room included) before each.
/// With the position watched as feedback AFL++ reaches the exit; each input saved for new
/// coverage walks somewhere new (replayed by the same walk built without AFL++): the credit
/// goes to the iteration that made the store, not to the next one in the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn afl_in_persistent_mode_walks_the_maze_too() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze-pers")?;
    let comm = unique_comm("fzpers");
    let bin = build_maze(&dir, &comm, Build::AflPersistent)?;
    let plain = build_maze(&dir, "replay", Build::Plain)?;
    seed(&dir)?;
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        let policy_id = watch_position(&ep, &bin, &["--follow-forks"]).await?;
        let (log, found) = afl_until_crash(&dir, &bin, "fed").await?;
        ensure!(
            log.contains("Persistent mode binary detected"),
            "afl-fuzz did not run the maze in persistent mode: {log}"
        );
        all_reach_the_exit(&plain, &found)?;
        let n = credited(&plain, &saved(&dir, "fed", "queue")?)?;
        ensure!(n >= 8, "only {n} inputs saved for new positions");
        nothing_left(&daemon, &comm, policy_id).await
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// A stripped program (its symbols in a separate debug file, named by its `.gnu_debuglink`,
/// as distributions ship them): the library cannot find `__afl_map_size` in the program, so
/// it raises the map size the fork server's handshake sends instead; wpd finds `px`, `py`
/// and AFL++'s map pointer in the debug file. AFL++ reaches the exit and each input saved
/// for new coverage walks somewhere new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_program_gets_its_room_from_the_handshake() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze-strip")?;
    let comm = unique_comm("fzstrip");
    let bin = build_maze(&dir, &comm, Build::Afl)?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    let debug = dir.join(format!("{comm}.debug"));
    let tool = |prog: &str, args: &[&std::ffi::OsStr]| -> Result<()> {
        let o = std::process::Command::new(prog).args(args).output()?;
        ensure!(
            o.status.success(),
            "{prog}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(())
    };
    tool(
        "objcopy",
        &["--only-keep-debug".as_ref(), bin.as_ref(), debug.as_ref()],
    )?;
    tool("strip", &["--strip-all".as_ref(), bin.as_ref()])?;
    let link = format!("--add-gnu-debuglink={}", debug.display());
    tool("objcopy", &[link.as_ref(), bin.as_ref()])?;
    let nm = std::process::Command::new("nm").arg(&bin).output()?;
    ensure!(
        !String::from_utf8_lossy(&nm.stdout).contains("__afl_map_size"),
        "the program still has its symbol table"
    );
    seed(&dir)?;
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        let policy_id = watch_position(&ep, &bin, &["--follow-forks"]).await?;
        let (_, found) = afl_until_crash(&dir, &bin, "fed").await?;
        all_reach_the_exit(&replay, &found)?;
        let n = credited(&replay, &saved(&dir, "fed", "queue")?)?;
        ensure!(n >= 8, "only {n} inputs saved for new positions");
        nothing_left(&daemon, &comm, policy_id).await
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// Feedback beside an oracle: one policy gives AFL++ the position as feedback, another on
/// the same program sends the writing thread SIGSEGV when a store puts the walker on the
/// maze's bottom row (`py == 5`, a dead end six moves from the start). Both watch every
/// run: AFL++'s first crash is the oracle's signal (`sig:11`, the maze's own crash being
/// SIGABRT), its input walks the bottom row, replayed without wpd, and the inputs saved
/// for new coverage on the way walk somewhere new each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_beside_a_signal_action_on_another_watch() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze-oracle")?;
    let comm = unique_comm("fzorc");
    let bin = build_maze(&dir, &comm, Build::Afl)?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    seed(&dir)?;
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        let policy_id = watch_position(&ep, &bin, &["--follow-forks"]).await?;
        let exe = bin.display().to_string();
        let w = wpctl(
            &ep,
            &[
                "watch",
                "--exe",
                &exe,
                "--symbol",
                "py",
                "--condition",
                "== 5",
                "--action",
                "signal",
                "--signal",
                "SIGSEGV",
                "--follow-forks",
            ],
        )
        .await?;
        ensure!(w.code == Some(0), "{w:?}");
        let (_, found) = afl_until_crash(&dir, &bin, "fed").await?;
        for (name, input) in &found {
            ensure!(name.contains("sig:11"), "{name}: not the oracle's signal");
            let (walked, won) = replay_maze(&replay, input)?;
            ensure!(
                !won && walked.iter().any(|&(y, _)| y == 5),
                "{name} does not walk the bottom row: {walked:?}"
            );
        }
        let n = credited(&replay, &saved(&dir, "fed", "queue")?)?;
        ensure!(n >= 1, "no input saved for a new position");
        nothing_left(&daemon, &comm, policy_id).await
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// `--feedback max`: a value higher than any before counts, in buckets (each value below
/// 16, then four per power of two). The maze's `steps` (the moves survived, stored at every
/// move) climbs as a walk survives: every input AFL++ saved for new coverage survives, replayed
/// without wpd, into a bucket no earlier saved input reached (walking into walls later is
/// the only coverage there is to find), and within 30 s the walks climb from the seed's 2
/// moves to 12 and more (below 16 each value is a bucket of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_max_rewards_each_new_high() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze-max")?;
    let comm = unique_comm("fzmax");
    let bin = build_maze(&dir, &comm, Build::Afl)?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    seed(&dir)?;
    // The moves an input's walker survives, and their bucket (wpd_feedback_key's).
    let survived = |input: &[u8]| -> Result<u64> {
        let (walked, _) = replay_maze(&replay, input)?;
        Ok(walked.iter().take_while(|&&p| p != (-1, -1)).count() as u64)
    };
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        let exe = bin.display().to_string();
        let w = wpctl(
            &ep,
            &[
                "watch",
                "--exe",
                &exe,
                "--symbol",
                "steps",
                "--feedback",
                "max",
                "--follow-forks",
            ],
        )
        .await?;
        ensure!(
            w.code == Some(0) && w.stdout.starts_with("policy "),
            "{w:?}"
        );
        let o = run_fuzzer(afl(&dir, &bin, "fed", 30, false)?, Duration::from_secs(120)).await?;
        ensure!(
            o.status.success(),
            "afl-fuzz failed: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        let mut high = None;
        let mut credited = 0;
        for (name, input) in saved(&dir, "fed", "queue")? {
            let b = wpd_feedback_key::max_bucket(survived(&input)?);
            if name.contains("+cov") && !name.contains("orig") {
                ensure!(
                    high.is_none_or(|h| b > h),
                    "{name} was saved for new coverage but survives into bucket {b}, not above \
                     {high:?}"
                );
                credited += 1;
            }
            high = high.max(Some(b));
        }
        let best = saved(&dir, "fed", "queue")?
            .iter()
            .map(|(_, i)| survived(i))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .max()
            .unwrap_or(0);
        ensure!(
            credited >= 6 && best >= 12,
            "{credited} inputs saved for new highs, the best surviving {best} moves"
        );
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// Two fuzzers on one host, each with its own map: AFL++ on a watched copy of the maze and
/// AFL++ on an unwatched copy, at the same time, both with the library preloaded. Only the
/// watched one's inputs are saved for new positions (each walking somewhere no earlier one
/// did, replayed without wpd); the other saves none for new coverage: no feedback of the
/// first lands in the second's map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fuzzers_on_one_host_each_get_only_their_own_feedback() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze2")?;
    let watched = build_maze(&dir, &unique_comm("fzmw"), Build::Afl)?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    let other = build_maze(&dir, &unique_comm("fzmo"), Build::Afl)?;
    seed(&dir)?;
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        watch_position(&ep, &watched, &["--follow-forks"]).await?;
        let (a, b) = tokio::join!(
            run_fuzzer(
                afl(&dir, &watched, "watched", 25, false)?,
                Duration::from_secs(90)
            ),
            run_fuzzer(
                afl(&dir, &other, "other", 25, false)?,
                Duration::from_secs(90)
            ),
        );
        for (what, o) in [("watched", a?), ("other", b?)] {
            ensure!(
                o.status.success(),
                "afl-fuzz ({what}) failed: {}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
        let n = credited(&replay, &saved(&dir, "watched", "queue")?)?;
        ensure!(
            n >= 5,
            "the watched fuzzer saved {n} inputs for new positions"
        );
        let theirs = saved(&dir, "other", "queue")?
            .into_iter()
            .filter(|(name, _)| name.contains("+cov") && !name.contains("orig"))
            .count();
        ensure!(
            theirs == 0,
            "the unwatched fuzzer saved {theirs} inputs for new coverage: feedback landed in its \
             map"
        );
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}

/// The feedback traps the library in process `pid` has counted: `wpd_feedback_state`'s
/// fourth word, as `wpctl symbol` reads it.
async fn traps_counted(ep: &str, pid: u32) -> Result<u64> {
    let r = wpctl(
        ep,
        &[
            "--json",
            "symbol",
            "--pid",
            &pid.to_string(),
            "libwpd_feedback.so:wpd_feedback_state",
        ],
    )
    .await?;
    ensure!(r.code == Some(0), "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.stdout)?;
    let hex = v["value"]
        .as_str()
        .with_context(|| format!("no value in {v}"))?;
    let word = hex
        .get(48..64)
        .with_context(|| format!("a state of {} hex digits", hex.len()))?;
    let mut bytes = [0u8; 8];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&word[2 * i..2 * i + 2], 16)?;
    }
    Ok(u64::from_le_bytes(bytes))
}

/// libFuzzer: the library registers counters of its own with libFuzzer (the program
/// exports its registration calls) and counts the traps there, in the same process,
/// between libFuzzer's clearing of the counters and its reading of them. Alone, libFuzzer
/// runs millions of walks without an exit; with a policy on the program (`--exe`, armed
/// before its first instruction) it reaches the exit, and the input it saves reaches it
/// replayed without wpd. A libFuzzer process without the library is refused, naming
/// `LD_PRELOAD`; a condition on a feedback watch is judged at the trap (a store it rejects
/// sends no signal and counts nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libfuzzer_with_state_feedback_walks_the_maze_to_its_exit() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let dir = unique_temp_dir("wpd-maze-lf")?;
    let comm = unique_comm("fzlfm");
    let bin = build_maze(&dir, &comm, Build::LibFuzzer)?;
    let plain = build_maze(&dir, "replay", Build::Plain)?;
    let lib = feedback_library()?;
    ensure!(replay_maze(&plain, &WIN)?.1);
    let artifacts = dir.join("artifacts");
    std::fs::create_dir(&artifacts)?;
    let libfuzzer = |corpus: &str, seconds: u32| -> Result<tokio::process::Command> {
        std::fs::create_dir_all(dir.join(corpus))?;
        let mut c = tokio::process::Command::new(&bin);
        c.arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg(corpus)
            .current_dir(&dir)
            .env("LD_PRELOAD", &lib);
        Ok(c)
    };
    let crashes = || -> Result<Vec<Vec<u8>>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(&artifacts)? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with("crash-") {
                v.push(std::fs::read(e.path())?);
            }
        }
        Ok(v)
    };

    // Alone (the library preloaded, its counters registered and never counted): no exit.
    let o = run_fuzzer(libfuzzer("alone", 15)?, Duration::from_secs(60)).await?;
    let log = String::from_utf8_lossy(&o.stderr);
    ensure!(
        o.status.success() && crashes()?.is_empty(),
        "libFuzzer alone ended with {:?} or found the exit: {}",
        o.status,
        &log[log.len().saturating_sub(2000)..]
    );
    ensure!(
        log.contains("Loaded 2 modules") && log.contains("512 ["),
        "libFuzzer did not take the library's 512 counters: {}",
        &log[..log.len().min(2000)]
    );

    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        // Without the library: refused, naming LD_PRELOAD.
        std::fs::create_dir_all(dir.join("bare"))?;
        let mut bare = start_waiting(&bin, &["-max_total_time=60", "bare"], false)?;
        let r = async {
            loaded(bare.id(), false).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            wpctl(
                &ep,
                &[
                    "watch",
                    "--pid",
                    &bare.id().to_string(),
                    "--symbol",
                    "px",
                    "--feedback",
                ],
            )
            .await
        }
        .await;
        let _ = bare.kill();
        let _ = bare.wait();
        let r = r?;
        ensure!(
            r.code != Some(0)
                && r.stderr.lines().count() == 1
                && r.stderr.contains(&format!("LD_PRELOAD={}", lib.display())),
            "a feedback watch on libFuzzer without the library: {r:?}"
        );

        // A condition no store meets: the traps are judged in the kernel, none signalled.
        std::fs::create_dir_all(dir.join("probe"))?;
        let mut probe = start_waiting(&bin, &["-max_total_time=60", "probe"], true)?;
        let pid = probe.id();
        let r = async {
            loaded(pid, true).await?;
            let w = wpctl(
                &ep,
                &[
                    "--json",
                    "watch",
                    "--pid",
                    &pid.to_string(),
                    "--symbol",
                    "px",
                    "--feedback",
                    "--condition",
                    "== 100",
                ],
            )
            .await?;
            ensure!(w.code == Some(0), "{w:?}");
            tokio::time::sleep(Duration::from_secs(2)).await;
            let none = traps_counted(&ep, pid).await?;
            ensure!(
                none == 0,
                "{none} traps counted under a condition no store meets"
            );
            let w = wpctl(
                &ep,
                &[
                    "watch",
                    "--pid",
                    &pid.to_string(),
                    "--symbol",
                    "py",
                    "--feedback",
                    "--condition",
                    ">= 1",
                ],
            )
            .await?;
            ensure!(w.code == Some(0), "{w:?}");
            poll_until(Duration::from_secs(10), "traps counted", async || {
                let n = traps_counted(&ep, pid).await?;
                Ok(if n > 0 {
                    Ok(())
                } else {
                    Err("none".to_string())
                })
            })
            .await
        }
        .await;
        let _ = probe.kill();
        let _ = probe.wait();
        r?;

        let policy_id = watch_position(&ep, &bin, &[]).await?;
        let o = run_fuzzer(libfuzzer("fed", 180)?, Duration::from_secs(240)).await?;
        let log = String::from_utf8_lossy(&o.stderr);
        let found = crashes()?;
        ensure!(
            !found.is_empty(),
            "libFuzzer with state feedback found no exit in 180 s ({:?}): {}",
            o.status,
            &log[log.len().saturating_sub(2000)..]
        );
        for input in &found {
            ensure!(
                replay_maze(&plain, input)?.1,
                "{input:?} does not reach the exit without wpd"
            );
        }
        nothing_left(&daemon, &comm, policy_id).await
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    daemon.finish(result)
}
