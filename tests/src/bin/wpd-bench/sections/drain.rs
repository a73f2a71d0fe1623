//! Drain: what the daemon's reading of the kernel's records costs while it
//! waits (its wake-ups and CPU with nothing tracked, with one process
//! watched, with a policy), per child of a process forking as a fork server
//! does, and what a hit costs a thread that stores to a watched variable
//! now and then (each hit alone in the ring) rather than in a flood
//! (`hitcost`).

use crate::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::fuzzers::unwatch;
use anyhow::{Context, Result, ensure};
use wpd_tests::{Daemon, run_wpctl, unique_temp_dir};

/// The target: waits for its go file, then idles, forks, or stores paced.
const DRAIN_TARGET: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long watched_var;

static double now_us(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    const char *mode = argv[1], *go = argv[3];
    long n = atol(argv[2]);
    while (access(go, F_OK) != 0)
        usleep(2000);
    if (mode[0] == 'i') { /* idle: n seconds */
        sleep((unsigned)n);
    } else if (mode[0] == 'f') { /* fork: n children, each _exit at once */
        double t = now_us(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++) {
            pid_t p = fork();
            if (p == 0)
                _exit(0);
            waitpid(p, NULL, 0);
        }
        printf("%.3f\n", (now_us(CLOCK_MONOTONIC) - t) / n);
    } else if (mode[0] == 'm') { /* memset: n clears of 64 KiB (glibc picks rep stosb) */
        static unsigned char big[65536];
        double t = now_us(CLOCK_MONOTONIC);
        for (long i = 0; i < n; i++) {
            memset(big, (int)i, sizeof big);
            __asm__ volatile("" : : "r"(big) : "memory");
        }
        printf("%.3f\n", (now_us(CLOCK_MONOTONIC) - t) / n);
    } else { /* paced: n stores, argv[4] µs apart; the store's own CPU and wall time */
        long gap = atol(argv[4]);
        struct timespec d = {gap / 1000000, (gap % 1000000) * 1000};
        double cpu = 0, wall = 0;
        for (long i = 0; i < n; i++) {
            nanosleep(&d, NULL);
            double w = now_us(CLOCK_MONOTONIC), c = now_us(CLOCK_THREAD_CPUTIME_ID);
            watched_var = (unsigned long)i;
            cpu += now_us(CLOCK_THREAD_CPUTIME_ID) - c;
            wall += now_us(CLOCK_MONOTONIC) - w;
        }
        printf("%.3f %.3f\n", cpu / n, wall / n);
    }
    return 0;
}
"#;

/// CPU time (ns, `schedstat`) and context switches of a process's live
/// threads.
fn daemon_usage(pid: i32) -> Result<(f64, f64)> {
    let (mut ns, mut switches) = (0.0, 0.0);
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = e?.path();
        let (Ok(sched), Ok(status)) = (
            std::fs::read_to_string(dir.join("schedstat")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // exited meanwhile
        };
        ns += sched
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        for l in status.lines() {
            if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    Ok((ns, switches))
}

/// The target, started under `name` and waiting for `go`.
struct Target {
    child: tokio::process::Child,
    go: PathBuf,
}

impl Target {
    fn start(bin: &Path, dir: &Path, args: &[&str]) -> Result<Target> {
        Self::start_env(bin, dir, args, None)
    }

    /// With `GLIBC_TUNABLES` set to `tunables` when given.
    fn start_env(bin: &Path, dir: &Path, args: &[&str], tunables: Option<&str>) -> Result<Target> {
        let go = dir.join(format!(
            "go-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        ));
        let mut a: Vec<String> = vec![args[0].into(), args[1].into(), go.display().to_string()];
        a.extend(args[2..].iter().map(|s| s.to_string()));
        let mut cmd = tokio::process::Command::new(bin);
        if let Some(t) = tunables {
            cmd.env("GLIBC_TUNABLES", t);
        }
        let child = cmd
            .args(&a)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the drain target")?;
        Ok(Target { child, go })
    }

    fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(0)
    }

    /// Lets it run and returns what it printed.
    async fn run(self) -> Result<String> {
        std::fs::write(&self.go, b"")?;
        let out = tokio::time::timeout(Duration::from_secs(300), self.child.wait_with_output())
            .await
            .context("the drain target did not finish")??;
        let _ = std::fs::remove_file(&self.go);
        ensure!(out.status.success(), "drain target failed: {}", out.status);
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `wpctl watch` with `args`; the watchpoint's or policy's id.
async fn watch(daemon: &Daemon, args: &[&str]) -> Result<u64> {
    let endpoint = daemon.endpoint();
    let mut a = vec!["--endpoint", endpoint.as_str(), "--json", "watch"];
    a.extend_from_slice(args);
    let out = run_wpctl(&a, Duration::from_secs(20)).await?;
    ensure!(out.code == Some(0), "wpctl watch failed: {out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("wpctl --json watch printed {:?}", out.stdout))?;
    v["policy"]["id"]
        .as_u64()
        .or_else(|| v["watchpoint"]["id"].as_u64())
        .or_else(|| v["id"].as_u64())
        .with_context(|| format!("no id in {}", out.stdout))
}

/// The daemon's CPU (ms per second) and wake-ups (context switches per
/// second) over `secs` of the idle target, watched as `how`.
async fn idle_rate(
    daemon: &Daemon,
    bin: &Path,
    dir: &Path,
    how: Option<&[&str]>,
    secs: u64,
) -> Result<(f64, f64)> {
    let t = Target::start(bin, dir, &["idle", &(secs + 1).to_string()])?;
    let pid = t.pid().to_string();
    let id = match how {
        Some(extra) => {
            let mut a: Vec<&str> = extra.to_vec();
            if !a.contains(&"--comm") {
                a.extend(["--pid", &pid]);
            }
            a.extend(["--symbol", "watched_var"]);
            Some(watch(daemon, &a).await?)
        }
        None => None,
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (ns0, sw0) = daemon_usage(daemon.pid())?;
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (ns1, sw1) = daemon_usage(daemon.pid())?;
    let wall = t0.elapsed().as_secs_f64();
    t.run().await?;
    if let Some(id) = id {
        let _ = unwatch(daemon, id).await;
    }
    Ok(((ns1 - ns0) / 1e6 / wall, (sw1 - sw0) / wall))
}

pub(crate) async fn section_drain(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let dir = unique_temp_dir("wpd-bench-drain")?;
    let result: Result<()> = async {
        let src = dir.join("draintgt.c");
        std::fs::write(&src, DRAIN_TARGET)?;
        let bin = dir.join("draintgt");
        let o = std::process::Command::new("cc")
            .args(["-O1", "-g", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .context("running cc")?;
        ensure!(
            o.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let daemon = Daemon::start().await?;
        let secs = if args.smoke { 1 } else { 5 };

        println!("## drain: the daemon at rest, {secs} s of an idle target (medians of {} runs)\n", args.reps);
        println!("| what the daemon has | CPU, ms per second | wake-ups (context switches) per second |");
        println!("|---|---:|---:|");
        let comm = "draintgt";
        let idle_modes: [(&str, Option<&[&str]>); 3] = [
            ("nothing tracked", None),
            ("one process watched (`--pid`, perf)", Some(&[])),
            (
                "a policy matching it (`--comm`, perf)",
                Some(&["--comm", comm]),
            ),
        ];
        let mut rest = [0.0; 2];
        for (i, (label, how)) in idle_modes.iter().enumerate() {
            let mut cpu = Vec::new();
            let mut wakes = Vec::new();
            for _ in 0..args.reps {
                let (c, w) = idle_rate(&daemon, &bin, &dir, *how, secs).await?;
                cpu.push(c);
                wakes.push(w);
            }
            let (c, w) = (median(cpu), median(wakes));
            if i < 2 {
                rest[i] = c;
            }
            println!("| {label} | {c:.2} | {w:.0} |");
            flush();
        }
        println!();

        let forks: u32 = if args.smoke { 500 } else { 5000 };
        println!(
            "## drain: a process forking {forks} children (fork, _exit, waitpid), watched with --follow-forks (medians of {} runs)\n",
            args.reps
        );
        println!(
            "| mode | µs per fork (median) | ratio to alone in the same round (median, min–max) | daemon CPU µs per child (above its rate at rest) |"
        );
        println!("|---|---:|---:|---:|");
        // The modes alternate within each round, so that a slow swing of
        // the machine's load falls on both.
        let mut per_fork: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut per_child: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..args.reps {
            for watched in [false, true] {
                let t = Target::start(&bin, &dir, &["fork", &forks.to_string()])?;
                let pid = t.pid().to_string();
                let id = if watched {
                    Some(
                        watch(
                            &daemon,
                            &["--pid", &pid, "--symbol", "watched_var", "--follow-forks"],
                        )
                        .await?,
                    )
                } else {
                    None
                };
                tokio::time::sleep(Duration::from_millis(300)).await;
                let (ns0, _) = daemon_usage(daemon.pid())?;
                let w0 = Instant::now();
                let out = t.run().await?;
                // The last records read and booked.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let (ns1, _) = daemon_usage(daemon.pid())?;
                let wall = w0.elapsed().as_secs_f64();
                if let Some(id) = id {
                    let _ = unwatch(&daemon, id).await;
                }
                let i = usize::from(watched);
                per_fork[i].push(out.trim().parse::<f64>().context("fork output")?);
                per_child[i].push(((ns1 - ns0) / 1e3 - rest[i] * 1e3 * wall) / f64::from(forks));
            }
        }
        let paired = spread(
            per_fork[1]
                .iter()
                .zip(&per_fork[0])
                .map(|(w, a)| w / a)
                .collect(),
        );
        for (i, label) in ["alone", "watched, --follow-forks"].iter().enumerate() {
            let ratio = if i == 0 {
                "1.00".to_string()
            } else {
                format!("{:.2} ({:.2}–{:.2})", paired.med, paired.min, paired.max)
            };
            println!(
                "| {label} | {:.1} | {ratio} | {:.2} |",
                median(per_fork[i].clone()),
                median(per_child[i].clone())
            );
        }
        flush();
        println!();

        let clears: u32 = if args.smoke { 2000 } else { 20000 };
        println!(
            "## drain: a 64 KiB memset, with a watchpoint armed that it never touches ({clears} memsets; medians of {} runs)\n",
            args.reps
        );
        println!("| mode | µs per memset (median) | ratio to alone in the same round (median, min–max) |");
        println!("|---|---:|---:|");
        let memset_modes = [
            ("alone", false, false),
            ("watched (another variable)", true, false),
            ("alone, GLIBC_TUNABLES without rep stosb", false, true),
            ("watched, GLIBC_TUNABLES without rep stosb", true, true),
        ];
        let mut us: Vec<Vec<f64>> = vec![Vec::new(); memset_modes.len()];
        for _ in 0..args.reps {
            for (i, (_, watched, tuned)) in memset_modes.iter().enumerate() {
                let t = Target::start_env(
                    &bin,
                    &dir,
                    &["memset", &clears.to_string()],
                    tuned.then_some(super::fuzzers::NO_REP_STOSB),
                )?;
                let pid = t.pid().to_string();
                let id = if *watched {
                    Some(watch(&daemon, &["--pid", &pid, "--symbol", "watched_var"]).await?)
                } else {
                    None
                };
                let out = t.run().await?;
                if let Some(id) = id {
                    let _ = unwatch(&daemon, id).await;
                }
                us[i].push(out.trim().parse::<f64>().context("memset output")?);
            }
        }
        for (i, (label, _, _)) in memset_modes.iter().enumerate() {
            // Each against the run alone with the same library settings.
            let base = if i < 2 { 0 } else { 2 };
            let p = spread(us[i].iter().zip(&us[base]).map(|(m, b)| m / b).collect());
            println!(
                "| {label} | {:.3} | {:.2} ({:.2}–{:.2}) |",
                median(us[i].clone()),
                p.med,
                p.min,
                p.max
            );
        }
        flush();
        println!();

        let stores: u32 = if args.smoke { 200 } else { 2000 };
        println!(
            "## drain: what a hit costs a thread storing now and then ({stores} stores, each alone; medians of {} runs)\n",
            args.reps
        );
        println!(
            "| stores every | watched | writer CPU µs per store | writer wall µs per store | cost of one hit, CPU µs |"
        );
        println!("|---|---|---:|---:|---:|");
        for gap in ["2000", "200"] {
            let mut cpu: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            let mut wall: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            for _ in 0..args.reps {
                for watched in [false, true] {
                    let t = Target::start(&bin, &dir, &["paced", &stores.to_string(), gap])?;
                    let pid = t.pid().to_string();
                    let id = if watched {
                        Some(watch(&daemon, &["--pid", &pid, "--symbol", "watched_var"]).await?)
                    } else {
                        None
                    };
                    let out = t.run().await?;
                    if let Some(id) = id {
                        let _ = unwatch(&daemon, id).await;
                    }
                    let mut f = out.split_whitespace().map(|v| v.parse::<f64>());
                    let i = usize::from(watched);
                    cpu[i].push(f.next().context("paced output")??);
                    wall[i].push(f.next().context("paced output")??);
                }
            }
            let base = median(cpu[0].clone());
            for (i, label) in ["no", "yes"].iter().enumerate() {
                let c = median(cpu[i].clone());
                println!(
                    "| {gap} µs | {label} | {c:.2} | {:.2} | {} |",
                    median(wall[i].clone()),
                    if i == 1 {
                        format!("{:.2}", c - base)
                    } else {
                        "–".into()
                    }
                );
            }
            flush();
        }
        println!();
        Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    section_done(t0);
    Ok(())
}
