//! AFL++ on the maze: its command lines, how long it runs, and what it saved.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use wpd_tests::{run_fuzzer, run_fuzzer_until};

use super::{Saved, feedback_library};

/// Where a test shows that a build or a selector gets the feedback rather than that it walks
/// the whole way (the exit takes one to three minutes on 2 CPUs and several times that in a
/// slow run; `afl_with_state_feedback_walks_the_maze_to_its_exit` walks it), AFL++ runs for
/// [`LEARN_LEAST`] and until it has saved this many inputs for new coverage (alone it saves
/// none), each then replayed to check its credit. The first come within seconds (bit flips
/// of the seed's moves); 25 to 30 s gave 4 to 8 on an idle machine, 4 beside another AFL++.
pub(super) const LEARNT: usize = 3;

/// How long AFL++ runs with the feedback at least, where it stops at [`LEARNT`]: thousands of
/// runs, most of them walking beyond the seed's two moves and dying there.
pub(super) const LEARN_LEAST: Duration = Duration::from_secs(20);

/// The longest AFL++ may take to save [`LEARNT`] inputs for new positions (seconds): a run
/// that takes that long has not been learning from the feedback.
pub(super) const LEARN_CAP: u32 = 180;

/// The longest AFL++ may take to the maze's exit with the feedback (seconds). A median of
/// 136 s on an idle machine (78 to 162 s, docs/benchmarks.md, 14a); under the load of the other
/// tests one CI run took 420 s, so the bound is five idle medians.
pub(super) const EXIT_BOUND: u32 = 720;

/// `afl-fuzz -i in -o OUT -V SECONDS -- BIN` in `dir` (seeds in `dir/in`), the library
/// preloaded; `until_crash`: it stops at its first crash.
pub(super) fn afl(
    dir: &Path,
    bin: &Path,
    out: &str,
    seconds: u32,
    until_crash: bool,
) -> Result<tokio::process::Command> {
    afl_in(None, dir, bin, out, seconds, until_crash)
}

/// [`afl`], started in the cgroup at directory `cgroup` if one is given (it moves itself in
/// before its exec of afl-fuzz).
pub(super) fn afl_in(
    cgroup: Option<&Path>,
    dir: &Path,
    bin: &Path,
    out: &str,
    seconds: u32,
    until_crash: bool,
) -> Result<tokio::process::Command> {
    let mut c = match cgroup {
        None => tokio::process::Command::new("afl-fuzz"),
        Some(cg) => {
            let mut c = tokio::process::Command::new("sh");
            c.args(["-c", r#"echo $$ > "$0/cgroup.procs" && exec afl-fuzz "$@""#])
                .arg(cg);
            c
        }
    };
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
pub(super) fn seed(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("in"))?;
    Ok(std::fs::write(dir.join("in/seed"), [1u8, 0])?)
}

/// How many inputs an afl-fuzz run saved in its queue for new coverage so far (`+cov`, the
/// seeds left out): names only, read while it runs.
fn saved_for_coverage(dir: &Path, out: &str) -> usize {
    std::fs::read_dir(dir.join(out).join("default").join("queue"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with("id:") && name.contains("+cov") && !name.contains("orig")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Runs AFL++ (`afl`, started with `-V LEARN_CAP`) for [`LEARN_LEAST`] and until it has saved
/// [`LEARNT`] inputs for new coverage into `dir/out`: afl-fuzz's output.
pub(super) async fn afl_until_learnt(
    afl: tokio::process::Command,
    dir: &Path,
    out: &str,
) -> Result<String> {
    let cap = Duration::from_secs(u64::from(LEARN_CAP) + 60);
    let start = std::time::Instant::now();
    let o = run_fuzzer_until(afl, cap, || {
        start.elapsed() >= LEARN_LEAST && saved_for_coverage(dir, out) >= LEARNT
    })
    .await?;
    let log = String::from_utf8_lossy(&o.stdout).into_owned();
    ensure!(o.status.success(), "afl-fuzz failed: {log}");
    Ok(log)
}

/// The inputs an afl-fuzz run saved (`kind`: queue or crashes), by name, in order.
pub(crate) fn saved(dir: &Path, out: &str, kind: &str) -> Result<Saved> {
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

/// Runs AFL++ on `bin` until its first crash ([`EXIT_BOUND`] at most; `dir/out`), in the cgroup at
/// `cgroup` if one is given: afl-fuzz's output and the crashes it saved (at least one).
pub(super) async fn afl_until_crash(
    cgroup: Option<&Path>,
    dir: &Path,
    bin: &Path,
    out: &str,
) -> Result<(String, Saved)> {
    let afl = afl_in(cgroup, dir, bin, out, EXIT_BOUND, true)?;
    let o = run_fuzzer(afl, Duration::from_secs(u64::from(EXIT_BOUND) + 60)).await?;
    let log = String::from_utf8_lossy(&o.stdout).into_owned();
    ensure!(o.status.success(), "afl-fuzz failed: {log}");
    let found = saved(dir, out, "crashes")?;
    ensure!(!found.is_empty(), "AFL++ saved no crash in {EXIT_BOUND} s");
    Ok((log, found))
}
