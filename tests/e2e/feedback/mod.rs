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
    Backend, CmdOutput, Daemon, TempDir, machine_skip, poll_until, require_backend, run_fuzzer,
    run_fuzzer_until, run_wpctl,
};

use crate::fuzzers::{nothing_left, unique_comm};
use crate::policies::{TestCgroup, cgroup2_root};
pub(crate) use afl::saved;
use afl::{LEARN_CAP, LEARNT, afl, afl_in, afl_until_crash, afl_until_learnt, seed};

mod afl;
mod libfuzzer;

/// The maze (`tests/c/maze.c`): 22 exact moves, every step through the same code.
const MAZE: &str = include_str!("../../c/maze.c");

/// The 22 moves from the maze's start to its exit.
const WIN: [u8; 22] = [
    1, 3, 1, 1, 2, 1, 1, 3, 3, 1, 3, 3, 0, 0, 3, 0, 0, 2, 0, 0, 2, 2,
];

/// How far AFL++ goes in a test.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// To the maze's exit (its first crash).
    Exit,
    /// Until it has saved [`LEARNT`] inputs for new coverage.
    Learnt,
}

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

/// The credit: the maze's edges are the same for every input (the seed covers them), so each
/// input AFL++ saved for new coverage (`+cov`: a map byte never set before, not the seed)
/// must walk, replayed without wpd by `replay`, a position that no run credited before
/// walked. Those runs are the saved inputs' where every run was watched, the seed's first
/// run included (`all_watched`: a policy by `--exe` holds each run at its exec); else (a
/// fork server found after its exec, whose first runs went unwatched) only the inputs saved
/// for new coverage, the ones whose stores were counted. Returns how many were saved for
/// new coverage.
fn credited(replay: &Path, queue: &[(String, Vec<u8>)], all_watched: bool) -> Result<usize> {
    let mut seen = std::collections::BTreeSet::new();
    let mut credited = 0;
    for (name, input) in queue {
        let (walked, _) = replay_maze(replay, input)?;
        let new = walked.iter().filter(|p| !seen.contains(*p)).count();
        let for_coverage = name.contains("+cov") && !name.contains("orig");
        if for_coverage {
            ensure!(
                new > 0,
                "{name} was saved for new coverage but walks nowhere new: the credit went to \
                 another run (its {} moves {input:?} walk {walked:?}; walked before: {seen:?})",
                input.len()
            );
            credited += 1;
        }
        if for_coverage || all_watched {
            seen.extend(walked);
        }
    }
    Ok(credited)
}

/// `wpctl watch --exe EXE --symbol px --feedback --feedback-with py [more]`: every run of
/// the program held at its exec and armed before its first instruction (a policy by name
/// arms a program's first process only after its exec, and a fork server would fork
/// unwatched runs meanwhile). Returns the policy's id.
async fn watch_position(ep: &str, exe: &Path, more: &[&str]) -> Result<u64> {
    watch_position_by(ep, &["--exe", &exe.display().to_string()], more).await
}

/// [`watch_position`] with the processes selected by `select` (`--comm NAME`, say).
async fn watch_position_by(ep: &str, select: &[&str], more: &[&str]) -> Result<u64> {
    let mut args = vec!["--endpoint", ep, "watch"];
    args.extend_from_slice(select);
    args.extend_from_slice(&["--symbol", "px", "--feedback", "--feedback-with", "py"]);
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

/// `wpctl watch --pid P --symbol px --feedback` on `bin` started in its directory with
/// `args` (the library preloaded or not), `settle` after it has mapped the library (or
/// started): refused in one line that says `says`.
async fn feedback_refused(
    ep: &str,
    bin: &Path,
    args: &[&str],
    preload: bool,
    settle: Duration,
    says: &str,
) -> Result<()> {
    let mut p = start_waiting(bin, args, preload)?;
    let pid = p.id().to_string();
    let r = async {
        loaded(p.id(), preload).await?;
        tokio::time::sleep(settle).await;
        wpctl(
            ep,
            &["watch", "--pid", &pid, "--symbol", "px", "--feedback"],
        )
        .await
    }
    .await;
    let _ = p.kill();
    let _ = p.wait();
    let r = r?;
    ensure!(
        r.code != Some(0) && r.stderr.lines().count() == 1 && r.stderr.contains(says),
        "a feedback watch on {} (the library preloaded: {preload}): {r:?}",
        bin.display()
    );
    Ok(())
}

/// Inputs AFL++ saved, by name.
type Saved = Vec<(String, Vec<u8>)>;

/// A maze built for one test, in a directory of its own (removed on drop): the program under
/// a unique command name, a copy built with cc that replays inputs, and AFL++'s seeds.
struct Maze {
    dir: TempDir,
    comm: String,
    bin: PathBuf,
    replay: PathBuf,
}

impl Maze {
    /// Builds the maze as `build` says, named `fz<tag>…`, in `wpd-maze-<tag>…`.
    fn new(tag: &str, build: Build) -> Result<Maze> {
        let dir = TempDir::new(&format!("wpd-maze-{tag}"))?;
        let comm = unique_comm(&format!("fz{tag}"));
        let m = Maze {
            bin: dir.join(&comm),
            replay: dir.join("replay"),
            dir,
            comm,
        };
        build_maze(&m.dir, &m.comm, build)?;
        build_maze(&m.dir, "replay", Build::Plain)?;
        seed(&m.dir)?;
        Ok(m)
    }

    /// AFL++ on the maze until its first crash (saving into `out`), under a policy watching
    /// the position as feedback in every run (`--follow-forks`): each crash reaches the exit
    /// and at least 8 inputs saved for new coverage walk somewhere new each, replayed without
    /// wpd; once afl-fuzz ends nothing of the policy's arming is left. Returns the policy's
    /// id, afl-fuzz's output and its queue.
    async fn walk_with_feedback(&self, daemon: &Daemon, out: &str) -> Result<(u64, String, Saved)> {
        self.walk_with_feedback_by(daemon, out, By::Exe, Until::Exit)
            .await
    }

    /// [`Maze::walk_with_feedback`] under a policy selecting the maze's runs `by`, AFL++
    /// going as far as `until` says (with [`Until::Learnt`], the inputs saved for new
    /// coverage show the feedback).
    async fn walk_with_feedback_by(
        &self,
        daemon: &Daemon,
        out: &str,
        by: By<'_>,
        until: Until,
    ) -> Result<(u64, String, Saved)> {
        let exe = self.bin.display().to_string();
        let all_watched = matches!(by, By::Exe);
        let (select, cgroup) = match by {
            By::Exe => (["--exe", &exe], None),
            By::Comm => (["--comm", &self.comm], None),
            By::Cgroup { dir, name } => (["--cgroup", name], Some(dir)),
        };
        let policy = watch_position_by(&daemon.endpoint(), &select, &["--follow-forks"]).await?;
        let log = match until {
            Until::Exit => {
                let (log, found) = afl_until_crash(cgroup, &self.dir, &self.bin, out).await?;
                all_reach_the_exit(&self.replay, &found)?;
                log
            }
            Until::Learnt => {
                let afl = afl_in(cgroup, &self.dir, &self.bin, out, LEARN_CAP, false)?;
                afl_until_learnt(afl, &self.dir, out).await?
            }
        };
        let queue = saved(&self.dir, out, "queue")?;
        let n = credited(&self.replay, &queue, all_watched)?;
        // AFL++ alone saves none for new coverage (the maze's edges are the seed's): each is
        // the feedback's. On the way to the exit there are many; in a short run, a few.
        let least = if until == Until::Learnt { LEARNT } else { 8 };
        ensure!(
            n >= least,
            "only {n} inputs saved for new positions: the walk was not learnt step by step"
        );
        nothing_left(daemon, &self.comm, policy).await?;
        Ok((policy, log, queue))
    }
}

/// How a policy selects the maze's runs.
enum By<'a> {
    /// Its executable (`--exe`): every run held at its exec.
    Exe,
    /// Its command name (`--comm`): the fork server found after its exec.
    Comm,
    /// The cgroup AFL++ runs in (`--cgroup NAME`; `dir` is its directory).
    Cgroup { dir: &'a Path, name: &'a str },
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
    let m = Maze::new("maze", Build::Afl)?;
    let (dir, bin) = (&m.dir, &m.bin);
    // The maze's rules: the 22 moves abort, 21 of them do not.
    ensure!(replay_maze(bin, &WIN)?.1 && !replay_maze(bin, &WIN[..21])?.1);

    // Alone (the library preloaded, its room in the map empty): no exit.
    let o = run_fuzzer(afl(dir, bin, "alone", 20, true)?, Duration::from_secs(60)).await?;
    ensure!(
        o.status.success(),
        "afl-fuzz failed: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    ensure!(
        saved(dir, "alone", "crashes")?.is_empty(),
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
            feedback_refused(&ep, bin, &[], preload, Duration::ZERO, says).await?;
        }
        let (policy_id, _, _) = m.walk_with_feedback(&daemon, "fed").await?;
        let r = wpctl(&ep, &["unwatch", &policy_id.to_string()]).await?;
        ensure!(r.code == Some(0), "{r:?}");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// AFL++'s other instrumentations: LTO (edge ids given at link time, the map as small as
/// the edges) and classic (65,536 bytes of hashed edges). The library makes its room after
/// the map's size either way, and AFL++ learns the walk of each build step by step with the
/// position as feedback ([`LEARNT`] inputs saved for new positions; alone it saves none),
/// the credit exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lto_and_classic_builds_walk_the_maze_too() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let mazes = [
        Maze::new("lto", Build::AflLto)?,
        Maze::new("cls", Build::AflClassic)?,
    ];
    let daemon = Daemon::start().await?;
    let result = async {
        for m in &mazes {
            m.walk_with_feedback_by(&daemon, "fed", By::Exe, Until::Learnt)
                .await
                .with_context(|| m.comm.clone())?;
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Runs that end mid-input: the maze built so that a walker that dies ends the process at
/// once (`_exit(0)` right after the store of its death, the rest of the input unread), and
/// the one that reaches the exit aborts there. The trap of the last store is counted
/// before the process ends (the signal comes before the next instruction), so AFL++ still
/// learns the walk step by step ([`LEARNT`] inputs saved for new positions); every input saved for new coverage walks
/// somewhere new, replayed without wpd; and the thousands of runs that ended mid-input
/// leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_that_end_mid_input_keep_their_credit() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let m = Maze::new("mid", Build::AflEndingMidInput)?;
    // A death ends the walk: the moves after it are not made.
    let (walked, won) = replay_maze(&m.bin, &[1, 0, 0, 1, 1])?;
    ensure!(
        !won && walked == [(2, 1), (1, 1), (-1, -1)],
        "the maze went on after a death: {walked:?}"
    );
    ensure!(replay_maze(&m.bin, &WIN)?.1);
    let daemon = Daemon::start().await?;
    let result = async {
        let (_, _, queue) = m
            .walk_with_feedback_by(&daemon, "fed", By::Exe, Until::Learnt)
            .await?;
        // Most inputs ended with a death: the walks AFL++ learnt from were cut short.
        let died = queue
            .iter()
            .map(|(_, i)| replay_maze(&m.replay, i).map(|(w, _)| w.last() == Some(&(-1, -1))))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .filter(|&d| d)
            .count();
        ensure!(died > 0, "no saved input ends with a death");
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// AFL++'s persistent mode: each process the fork server forks walks input after input,
/// read from shared memory, and afl-fuzz clears the map (the room included) before each.
/// With the position watched as feedback AFL++ learns the walk step by step ([`LEARNT`] inputs);
/// each input saved for new coverage walks somewhere new (replayed by the same walk built
/// without AFL++): the credit goes to the iteration that made the store, not to the next
/// one in the same process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn afl_in_persistent_mode_walks_the_maze_too() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let m = Maze::new("pers", Build::AflPersistent)?;
    let daemon = Daemon::start().await?;
    let result = async {
        let (_, log, _) = m
            .walk_with_feedback_by(&daemon, "fed", By::Exe, Until::Learnt)
            .await?;
        ensure!(
            log.contains("Persistent mode binary detected"),
            "afl-fuzz did not run the maze in persistent mode: {log}"
        );
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// A stripped program (its symbols in a separate debug file, named by its `.gnu_debuglink`,
/// as distributions ship them): the library cannot find `__afl_map_size` in the program, so
/// it raises the map size the fork server's handshake sends instead; wpd finds `px`, `py`
/// and AFL++'s map pointer in the debug file. AFL++ learns the walk step by step
/// ([`LEARNT`] inputs saved for new positions), each walking somewhere new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_program_gets_its_room_from_the_handshake() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let m = Maze::new("strip", Build::Afl)?;
    let bin = &m.bin;
    let debug = m.dir.join(format!("{}.debug", m.comm));
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
    let nm = std::process::Command::new("nm").arg(bin).output()?;
    ensure!(
        !String::from_utf8_lossy(&nm.stdout).contains("__afl_map_size"),
        "the program still has its symbol table"
    );
    let daemon = Daemon::start().await?;
    let result = m
        .walk_with_feedback_by(&daemon, "fed", By::Exe, Until::Learnt)
        .await
        .map(drop);
    daemon.finish(result)
}

/// Feedback under policies by command name and by cgroup, as a farm selects its fuzzers'
/// targets. By `--comm` the fork server is found after its exec and armed, and the runs it
/// forks from then on carry the feedback watch; by `--cgroup` AFL++ runs in a cgroup of its
/// own and the policy covers the maze there. Either way AFL++ saves [`LEARNT`] inputs for new
/// positions (alone it saves none), each walking somewhere no earlier one credited did (the
/// runs before the arming went unwatched: their walks are not counted), and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_by_command_name_and_by_cgroup_give_feedback_too() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let Some(root) = cgroup2_root() else {
        machine_skip("no cgroup v2 here");
        return Ok(());
    };
    let m = Maze::new("sel", Build::Afl)?;
    let name = format!("wpd-{}", m.comm);
    let cg = TestCgroup::new(&root, &name)?;
    let daemon = Daemon::start().await?;
    let result = async {
        let cgroup = format!("/{name}");
        let rounds = [
            (By::Comm, "comm"),
            (
                By::Cgroup {
                    dir: &cg.dir,
                    name: &cgroup,
                },
                "cgroup",
            ),
        ];
        for (by, out) in rounds {
            let (policy, _, _) = m
                .walk_with_feedback_by(&daemon, out, by, Until::Learnt)
                .await
                .with_context(|| format!("by {out}"))?;
            let r = wpctl(&daemon.endpoint(), &["unwatch", &policy.to_string()]).await?;
            ensure!(r.code == Some(0), "{r:?}");
        }
        Ok(())
    }
    .await;
    daemon.finish(result)
}

/// Feedback beside an oracle: one policy gives AFL++ the position as feedback, another on
/// the same program sends the writing thread SIGSEGV when a store puts the walker on the
/// maze's sixth row (`py == 5`, five moves from the start). Both watch every
/// run: AFL++'s first crash is the oracle's signal (`sig:11`, the maze's own crash being
/// SIGABRT), its input walks the sixth row, replayed without wpd, and the inputs saved
/// for new coverage on the way walk somewhere new each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_beside_a_signal_action_on_another_watch() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let m = Maze::new("orc", Build::Afl)?;
    let (dir, bin, replay) = (&m.dir, &m.bin, &m.replay);
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        let policy_id = watch_position(&ep, bin, &["--follow-forks"]).await?;
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
        let (_, found) = afl_until_crash(None, dir, bin, "fed").await?;
        for (name, input) in &found {
            ensure!(name.contains("sig:11"), "{name}: not the oracle's signal");
            let (walked, won) = replay_maze(replay, input)?;
            ensure!(
                !won && walked.iter().any(|&(y, _)| y == 5),
                "{name} does not walk the sixth row: {walked:?}"
            );
        }
        let n = credited(replay, &saved(dir, "fed", "queue")?, true)?;
        ensure!(n >= 1, "no input saved for a new position");
        nothing_left(&daemon, &m.comm, policy_id).await
    }
    .await;
    daemon.finish(result)
}

/// `--feedback max`: a value higher than any before counts, in buckets (each value below
/// 16, then four per power of two). The maze's `steps` (the moves survived, stored at every
/// move) climbs as a walk survives: every input AFL++ saved for new coverage survives, replayed
/// without wpd, into a bucket no earlier saved input reached (walking into walls later is
/// the only coverage there is to find), and the walks climb from the seed's 2 moves, saving
/// one input per new high (AFL++ runs until it has saved [`LEARNT`]; below 16 each value is a
/// bucket of its own; alone AFL++ saves none for new coverage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_max_rewards_each_new_high() -> Result<()> {
    if !require_backend(Backend::Perf) {
        return Ok(());
    }
    let m = Maze::new("max", Build::Afl)?;
    let (dir, bin) = (&m.dir, &m.bin);
    // The moves an input's walker survives, and their bucket (wpd_feedback_key's).
    let survived = |input: &[u8]| -> Result<u64> {
        let (walked, _) = replay_maze(&m.replay, input)?;
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
        afl_until_learnt(afl(dir, bin, "fed", LEARN_CAP, false)?, dir, "fed").await?;
        let mut high = None;
        let mut credited = 0;
        for (name, input) in saved(dir, "fed", "queue")? {
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
        let best = saved(dir, "fed", "queue")?
            .iter()
            .map(|(_, i)| survived(i))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .max()
            .unwrap_or(0);
        // A walker stepping back and forth in the corridor survives, so one input may jump
        // several buckets (in 30 s four runs climbed 9 to 30 moves, saving 5 to 8 highs).
        // Each saved high is above all earlier ones (checked above), so LEARNT of them climb
        // from the seed's 2 moves to 5 at least.
        ensure!(
            credited >= LEARNT,
            "{credited} inputs saved for new highs, the best surviving {best} moves"
        );
        Ok(())
    }
    .await;
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
    let dir = TempDir::new("wpd-maze2")?;
    let watched = build_maze(&dir, &unique_comm("fzmw"), Build::Afl)?;
    let replay = build_maze(&dir, "replay", Build::Plain)?;
    let other = build_maze(&dir, &unique_comm("fzmo"), Build::Afl)?;
    seed(&dir)?;
    let daemon = Daemon::start().await?;
    let ep = daemon.endpoint();
    let result = async {
        watch_position(&ep, &watched, &["--follow-forks"]).await?;
        // The watched one runs until it has learnt, the other as long (beside it all along).
        let learnt = std::sync::atomic::AtomicBool::new(false);
        let cap = Duration::from_secs(u64::from(LEARN_CAP) + 60);
        let watched_run = afl(&dir, &watched, "watched", LEARN_CAP, false)?;
        let other_run = afl(&dir, &other, "other", LEARN_CAP, false)?;
        let (a, b) = tokio::join!(
            async {
                let r = afl_until_learnt(watched_run, &dir, "watched").await;
                learnt.store(true, std::sync::atomic::Ordering::SeqCst);
                r
            },
            run_fuzzer_until(other_run, cap, || learnt
                .load(std::sync::atomic::Ordering::SeqCst)),
        );
        a.context("the watched fuzzer")?;
        let o = b?;
        ensure!(
            o.status.success(),
            "afl-fuzz (other) failed: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        let n = credited(&replay, &saved(&dir, "watched", "queue")?, true)?;
        ensure!(
            n >= LEARNT,
            "the watched fuzzer saved {n} inputs for new positions, fewer than {LEARNT}"
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
    daemon.finish(result)
}
