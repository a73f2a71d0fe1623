//! Farm scale: one policy over many processes against the floor of the same syscalls; what a
//! watched thread costs in fds and kernel memory at 1, 2, 64 and 256 CPUs on the perf
//! backend's two paths; a fork server's children caught from their first store.

use crate::*;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use wpd_proto::v1::{
    GetStatsRequest, ListWatchpointsRequest, ProcessSelector, SetPolicyRequest, WatchpointSpec,
};
use wpd_tests::{
    Backend, CTarget, Daemon, Event, EventStream, TargetProc, TempDir, ctarget_path,
    floor_bpf_program, floor_perf_arm_bpf, set_watchpoint, write_spec,
};

pub(crate) async fn section_farm(args: &Args) -> Result<()> {
    let t0 = Instant::now();
    let (procs, threads) = if args.smoke { (2, 50) } else { (20, 500) };
    policy_arm(args, procs, threads).await?;
    fds_per_thread(threads).await?;
    fork_server(args).await?;
    section_done(t0);
    Ok(())
}

/// `procs` C targets of `threads` threads each, under a command name of the bench's own.
async fn farm_targets(procs: usize, threads: usize, comm: &str) -> Result<Vec<CTarget>> {
    // The link names the processes (their command name is the name they were started by);
    // once they run, it is not needed (their executable is the file it points to).
    let dir = TempDir::new("wpd-bench-farm")?;
    let link = dir.join(comm);
    std::os::unix::fs::symlink(ctarget_path("ct-pie"), &link)?;
    let mut v = Vec::with_capacity(procs);
    for _ in 0..procs {
        let mut t = CTarget::start_path(&link, comm).await?;
        let r = t.cmd(&format!("threads {}", threads - 1)).await?;
        ensure!(r.starts_with("THREADS"), "threads: {r:?}");
        v.push(t);
    }
    Ok(v)
}

fn tids(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

async fn policy_arm(args: &Args, procs: usize, threads: usize) -> Result<()> {
    println!(
        "## farm: one policy over {procs} processes × {threads} threads (perf, per-thread path)\n"
    );
    println!("| what | total ms (median) | min–max ms | µs/thread | ratio to the floor |");
    println!("|---|---:|---:|---:|---:|");
    let comm = format!("wpdfarm{}", std::process::id() % 100_000);
    let mut floor = Vec::new();
    let mut wpd = Vec::new();
    let mut latency = Vec::new();
    let mut late_latency = Vec::new();
    for _ in 0..args.reps {
        let targets = farm_targets(procs, threads, &comm).await?;
        // The floor: what the daemon's per-thread path asks of the kernel for each thread
        // (a breakpoint on every CPU at once, inherited, with a program attached), no daemon.
        let prog = floor_bpf_program()?;
        let t = Instant::now();
        let mut fds = Vec::with_capacity(procs * threads);
        for tg in &targets {
            let addr = tg.addr("counter");
            for tid in tids(tg.pid) {
                fds.push(floor_perf_arm_bpf(tid, addr, &prog)?);
            }
        }
        floor.push(ms(t.elapsed()));
        let armed = fds.len();
        drop(fds);
        let daemon = Daemon::start().await?;
        let mut client = daemon.client().await?;
        let t = Instant::now();
        let r = client
            .set_policy(SetPolicyRequest {
                selector: Some(ProcessSelector {
                    comm: comm.clone(),
                    ..Default::default()
                }),
                spec: Some(WatchpointSpec {
                    symbol: "counter".into(),
                    access: wpd_proto::v1::Access::Write as i32,
                    backend: Backend::Perf as i32,
                    ..Default::default()
                }),
            })
            .await?
            .into_inner();
        wpd.push(ms(t.elapsed()));
        let p = r.policy.context("no policy")?;
        ensure!(
            p.instances.len() == procs,
            "the policy armed {} of {procs} processes: {:?}",
            p.instances.len(),
            p.refusals
        );
        let l = client
            .list_watchpoints(ListWatchpointsRequest { pid: 0 })
            .await?
            .into_inner();
        let on: u32 = l.watchpoints.iter().map(|w| w.armed_threads).sum();
        ensure!(
            on as usize == armed,
            "armed on {on} threads, the floor on {armed}"
        );
        latency.extend(p.instances.iter().map(|i| i.latency_ns as f64 / 1e6));
        // A process started after the policy: armed from its exec record (or the scan).
        let late = farm_targets(1, 2, &comm).await?;
        let pid = late[0].pid;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let l = client
                .list_watchpoints(ListWatchpointsRequest { pid: 0 })
                .await?
                .into_inner();
            if let Some(i) = l
                .policies
                .iter()
                .flat_map(|p| p.instances.iter())
                .find(|i| i.pid == pid)
            {
                late_latency.push(i.latency_ns as f64 / 1e6);
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "no instance for the late process"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(late);
        drop(daemon);
        drop(targets);
    }
    let n = (procs * threads) as f64;
    let f = spread(floor);
    let w = spread(wpd);
    println!(
        "| floor: perf_event_open(cpu -1) + SET_BPF per thread, no daemon | {:.1} | {:.1}–{:.1} | {:.2} | – |",
        f.med,
        f.min,
        f.max,
        f.med * 1e3 / n
    );
    println!(
        "| wpd: SetPolicy by command name (each process: attach, name resolved, armed) | {:.1} | {:.1}–{:.1} | {:.2} | {:.2} |",
        w.med,
        w.min,
        w.max,
        w.med * 1e3 / n,
        w.med / f.med
    );
    let l = spread(latency);
    let late = spread(late_latency);
    println!(
        "\nInstances armed by SetPolicy, from the call to each one armed (they are armed one \
         process after the other): median {:.1} ms, {:.1}–{:.1} ms. A process started after the \
         policy, from the kernel's exec record to its instance armed: median {:.1} ms, \
         {:.1}–{:.1} ms.\n",
        l.med, l.min, l.max, late.med, late.min, late.max
    );
    flush();
    Ok(())
}

/// `perf_event` objects' size from `/proc/slabinfo` (bytes), if the kernel lists its cache.
fn perf_event_objsize() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/slabinfo").ok()?;
    s.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == "perf_event").then(|| f.nth(2)?.parse().ok())?
    })
}

async fn fds_per_thread(threads: usize) -> Result<()> {
    let cpus = wpd_tests::online_cpus().len().max(1);
    let objsize = perf_event_objsize();
    println!(
        "## farm: what one watched thread costs (one process-wide watchpoint of one slot, {threads} threads)\n"
    );
    println!(
        "| path | perf fds measured here ({cpus} CPUs) | per armed thread | at 1 CPU | at 64 CPUs | at 256 CPUs | kernel memory per armed thread, here (perf_event objects × {} B) |",
        objsize.map_or("?".to_string(), |o| o.to_string())
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, flag) in [
        ("per-thread (BPF ring)", "per-thread"),
        ("per-cpu (rings per CPU)", "per-cpu"),
    ] {
        let mut target = TargetProc::start(&[
            "--threads",
            &(threads - 1).to_string(),
            "--interval-us",
            "1000000",
        ])
        .await?;
        let daemon = Daemon::start_with_args(&["--perf-events", flag]).await?;
        let mut client = daemon.client().await?;
        set_watchpoint(
            &mut client,
            write_spec(Backend::Perf, target.pid, target.vars[QUIET_VAR]),
        )
        .await?;
        let tasks = target.tids()?.len();
        let fds = client
            .get_stats(GetStatsRequest {})
            .await?
            .into_inner()
            .perf_fds;
        let per = fds as f64 / tasks as f64;
        // Per thread: 1 breakpoint (per-thread path); a tracker and a breakpoint per CPU.
        let at = |c: usize| -> f64 {
            if flag == "per-thread" {
                1.0
            } else {
                2.0 * c as f64
            }
        };
        println!(
            "| {label} | {fds} | {per:.2} | {:.0} | {:.0} | {:.0} | {} |",
            at(1),
            at(64),
            at(256),
            objsize.map_or("?".to_string(), |o| format!("{:.0} B", per * o as f64))
        );
        flush();
        drop(daemon);
        target.quit().await.ok();
    }
    println!(
        "\nPlus, for the whole daemon, one collector per CPU (both paths) and, on the per-thread path, one 16 MiB BPF ring buffer and one program per watchpoint piece.\n"
    );
    Ok(())
}

async fn fork_server(args: &Args) -> Result<()> {
    let secs = if args.smoke { 0.5 } else { 4.0 };
    println!(
        "## farm: a fork server making 50 children/s for {secs} s, follow_forks (each child's stores: 1, 2, …, 50)\n"
    );
    println!(
        "| path | children | children with a hit whose value is their first store (1) | share | children with any hit |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (label, flag) in [("per-thread", "per-thread"), ("per-cpu", "per-cpu")] {
        let mut target = TargetProc::start(&["--threads", "1", "--interval-us", "1000000"]).await?;
        let daemon = Daemon::start_with_args(&["--perf-events", flag]).await?;
        let mut client = daemon.client().await?;
        let mut events = EventStream::subscribe(&mut client, Default::default()).await?;
        let mut spec = write_spec(Backend::Perf, target.pid, target.vars[0]);
        spec.follow_forks = true;
        let wp = set_watchpoint(&mut client, spec)
            .await?
            .watchpoint
            .unwrap_or_default();
        let mut children = Vec::new();
        let start = Instant::now();
        let mut next = start;
        while start.elapsed().as_secs_f64() < secs {
            let r = target.cmd("fork").await?;
            let pid: i32 = r
                .strip_prefix("FORKED pid=")
                .and_then(|p| p.trim().parse().ok())
                .with_context(|| format!("fork: {r:?}"))?;
            children.push(pid);
            next += Duration::from_millis(20);
            tokio::time::sleep_until(next.into()).await;
        }
        for &c in &children {
            target.cmd(&format!("wait-child {c}")).await?;
        }
        // The hits streamed so far and those still in flight after the last child exited:
        // until every child's first store came, or 20 s (a loaded machine's daemon may be
        // behind; a missed store never comes).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut first = std::collections::HashSet::new();
        let mut any = std::collections::HashSet::new();
        while first.len() < children.len()
            && let Some(e) = events.next_before(deadline).await?
        {
            if let Event::Hit(h) = e
                && h.watchpoint_id == wp.id
                && children.contains(&h.pid)
            {
                any.insert(h.pid);
                if h.value == 1u64.to_le_bytes().to_vec() {
                    first.insert(h.pid);
                }
            }
        }
        println!(
            "| {label} | {} | {} | {:.1} % | {} |",
            children.len(),
            first.len(),
            100.0 * first.len() as f64 / children.len().max(1) as f64,
            any.len()
        );
        flush();
        drop(daemon);
        target.quit().await.ok();
    }
    println!();
    Ok(())
}
