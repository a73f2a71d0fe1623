//! Smoke test of the end-to-end benchmark binary: it runs, prints every
//! section with its rows, delivers every hit of the hit-cost runs, and the
//! rows of `docs/benchmarks.md` that say "met" and are counts hold as
//! written (2c and 6d: none lost; 3c: maps reads per new instruction; 6a:
//! fds per armed thread; 6c: every child of a fork server caught; 12:
//! every store of the processes held at their exec seen). It
//! asserts no timing (machines are noisy), nor memory (2d: page-granular
//! RSS over the smoke's 50 threads is a measurement, not a count).

use std::process::Command;

use wpd_tests::{find_bin, nats_server_bin, require_peer, require_root_perf};

/// Every section heading of `wpd-bench`, and rows each must contain.
const SECTIONS: &[(&str, &[&str])] = &[
    (
        "## mass-arm: one process-wide write watchpoint, idle target",
        &[
            "floor: perf breakpoint syscalls",
            "wpd, perf backend",
            "floor: ptrace syscalls",
            "floor: free-slot check + ptrace syscalls",
            "wpd, ptrace backend",
        ],
    ),
    (
        "## mass-arm: one process-wide write watchpoint, spinning target",
        &[
            "floor: perf breakpoint + thread-tracking syscalls",
            "wpd, perf backend",
            "wpd, ptrace backend",
        ],
    ),
    (
        "## hit cost: what one hit costs the writing thread",
        &["| perf |", "| ptrace |"],
    ),
    (
        "## thread churn:",
        &[
            "no watchpoint",
            "floor: 4 kernel-inherited breakpoints",
            "floor: wpd's perf event layout",
            "wpd, 4 process-wide watchpoints, perf backend",
            "wpd, 4 process-wide watchpoints, ptrace backend",
        ],
    ),
    (
        "## hit throughput:",
        &[
            "| perf, per-thread | 1 |",
            "| perf, per-thread, aggregate mode | 1 |",
            "| perf, per-cpu | 1 |",
            "| ptrace, signal stops | 1 |",
            "| ptrace, debug registers | 1 |",
        ],
    ),
    (
        "## dap: scopes + variables of a frame with 50 locals",
        &[
            "| wpctl dap: scopes + variables |",
            "| gRPC direct: GetThreadStack, locals of 1 frame |",
            "| dap / gRPC |",
        ],
    ),
    (
        "## dap: an IDE session",
        &[
            "| wpctl dap, stop all |",
            "| gRPC direct (SCHED_FIFO), stop all |",
            "| wpctl dap, stop the thread |",
        ],
    ),
    (
        "## steps: request → `stopped`",
        &[
            "| wpctl dap (singleThread unset: the others run) |",
            "| wpctl dap, singleThread (the others held) |",
            "| gRPC direct Step (others run) |",
            "| wpctl dap / gRPC direct, p50 / p90 |",
        ],
    ),
    ("## daemon memory:", &["| perf | 50 |", "| ptrace | 50 |"]),
    (
        "## RPC latency:",
        &[
            "floor: gRPC round trip",
            "wpd perf: SetWatchpoint, 1 thread",
            "wpd perf: RemoveWatchpoint, 1 thread",
            "wpd perf: ListThreads",
            "wpd ptrace: SetWatchpoint, 1 thread",
            "wpd ptrace: ListThreads",
        ],
    ),
    (
        "## ledger lock hold times under thread churn",
        &["| 1 | perf |", "| 1 | ptrace |"],
    ),
    (
        "## symbols: hit throughput, symbolized hits against raw ones",
        &["| perf |", "| ptrace |"],
    ),
    (
        "## symbols: SetWatchpoint by name against by address",
        &["| perf |", "| ptrace |"],
    ),
    (
        "## symbols: 1000 distinct hitting instructions",
        &[
            "| raw | first |",
            "| symbolized | first |",
            "| symbolized | again (cached) |",
        ],
    ),
    (
        "## farm: one policy over",
        &[
            "| floor: perf_event_open(cpu -1) + SET_BPF per thread, no daemon |",
            "| wpd: SetPolicy by command name",
        ],
    ),
    (
        "## farm: what one watched thread costs",
        &["| per-thread (BPF ring) |", "| per-cpu (rings per CPU) |"],
    ),
    ("## farm: a fork server", &["| per-thread |", "| per-cpu |"]),
    ("## fleet: recovery after SIGKILL", &["| 50 |"]),
    (
        "## fleet: the journal at full hit rate",
        &["| journal (default) |", "| --state-dir none |"],
    ),
    ("## export of a backlog", &["| backlog events |"]),
    (
        "## fuzzers: AFL++ on a fork server",
        &[
            "| alone (daemon idle) |",
            "| watched, never written (parser_limit: the cost of being watched) |",
            "| log, every store a hit (no condition) |",
            "| log, condition > 100 (judged at the trap) |",
            "| signal, condition > 100 |",
        ],
    ),
    (
        "## fuzzers: AFL++ in persistent mode",
        &[
            "| alone (daemon idle), tunable |",
            "| watched, never written (parser_limit), tunable |",
            "| the kernel's floor: no wpd, the same inherited breakpoint and no-op program opened by the target itself (preloaded), tunable |",
            "| log, every store a hit, tunable |",
            "| signal, condition > 100, tunable |",
            "| alone (daemon idle), without the tunable |",
            "| alone, tunable, the target aborts at level > 100 itself (the signal action's crashes without wpd) |",
        ],
    ),
    (
        "## fuzzers: libFuzzer in fork mode",
        &[
            "| alone (daemon idle) |",
            "| watched, never written (parser_limit: the cost of being watched) |",
            "| log, condition > 100 (judged at the trap; every input's memset stores it) |",
            "| alone, memset without rep stosb (GLIBC_TUNABLES) |",
            "| watched, never written, memset without rep stosb (GLIBC_TUNABLES) |",
        ],
    ),
    (
        "## fuzzers: the kernel's floor",
        &[
            "| bare fork (no breakpoint) |",
            "| breakpoint, not inherited |",
            "| breakpoint, inherited (inherit=1) |",
            "| breakpoint, inherited, no-op BPF program attached",
        ],
    ),
    (
        "## drain: the daemon at rest",
        &[
            "| nothing tracked |",
            "| one process watched (`--pid`, perf) |",
            "| a policy matching it (`--comm`, perf) |",
        ],
    ),
    (
        "## drain: a process forking",
        &["| alone |", "| watched, --follow-forks |"],
    ),
    (
        "## drain: a 64 KiB memset",
        &[
            "| alone |",
            "| watched (another variable) |",
            "| alone, GLIBC_TUNABLES without rep stosb |",
            "| watched, GLIBC_TUNABLES without rep stosb |",
        ],
    ),
    (
        "## drain: what a hit costs a thread storing now and then",
        &["| 2000 µs | no |", "| 2000 µs | yes |", "| 200 µs | yes |"],
    ),
    (
        "## objects: a target creating 10,000 objects a second",
        &[
            "| alone | 500 |",
            "| wpd (ptrace): ",
            "| wpd (ptrace), the same with `--scope creator` |",
            "| wpd (ptrace), every thread, 4 more threads started after the attach |",
            "| wpd (ptrace), every thread, 4 more threads started before the attach |",
            "| the kernel's floor: the same probes, stop and breakpoints from a bare tracer (`ct-objfloor`, no wpd) |",
        ],
    ),
    (
        "## pending: what a pending code event costs",
        &[
            "| not attached |",
            "| attached (ptrace), nothing pending |",
            "| a pending MODULE:NAME (loader hook) |",
            "| a pending NAME, in no module |",
            "| a pending FILE:LINE, in no line table |",
        ],
    ),
    (
        "## closes: code events closed at a detach and at a SIGTERM",
        &[
            "| the floor: 10 uprobe links closed at once |",
            "| the same links closed one after another |",
            "| uprobe perf events closed one after another (before Linux 6.6) |",
            "| wpd: `wpctl detach` of the process |",
            "| wpd: SIGTERM to exit |",
        ],
    ),
    (
        "## holds: what holding a new process at its exec adds to the exec",
        &[
            "| none | no |",
            "| by executable, naming another program | no |",
            "| by executable, naming it | yes, armed |",
            "| by command name, the file learnt, the run not matching | yes, let go |",
        ],
    ),
    (
        "## without root: an ordinary user's daemon beside root's",
        &[
            "| root (per-thread, BPF) | arm 16 threads, ms |",
            "| user (per-CPU, own rings) | arm 16 threads, ms |",
            "| root (per-thread, BPF) | hits per second (stores per second) |",
            "| user (per-CPU, own rings) | hits per second (stores per second) |",
        ],
    ),
];

#[test]
fn bench_smoke_runs_every_measurement() {
    if !require_root_perf() {
        return;
    }
    let bench = env!("CARGO_BIN_EXE_wpd-bench");
    // The bench starts wpd from beside itself; make sure it is there.
    find_bin("wpd").expect("wpd binary (cargo build --workspace --bins)");
    // Its export section runs against a NATS server (and says "skipped" without one).
    require_peer(
        nats_server_bin().is_some(),
        "nats-server",
        "Debian: nats-server",
    );
    let out = Command::new(bench)
        .arg("--smoke")
        .output()
        .expect("run wpd-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "wpd-bench --smoke failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for &(heading, rows) in SECTIONS {
        let start = stdout
            .find(heading)
            .unwrap_or_else(|| panic!("missing section {heading:?} in:\n{stdout}"));
        // The section runs to the next heading.
        let body = &stdout[start + heading.len()..];
        let body = &body[..body.find("\n## ").unwrap_or(body.len())];
        for row in rows {
            assert!(
                body.contains(row),
                "section {heading:?} has no row {row:?}:\n{body}"
            );
        }
        assert!(
            !body.contains("skipped"),
            "section {heading:?} skipped a measurement at --smoke sizes:\n{body}"
        );
    }
    // --smoke makes 2000 writes with perf and 100 with ptrace (a hit stops it).
    let hit_cost = section(&stdout, "## hit cost");
    for (backend, all) in [
        ("| perf |", "| 2000 of 2000 |"),
        ("| ptrace |", "| 100 of 100 |"),
    ] {
        let line = hit_cost
            .lines()
            .find(|l| l.starts_with(backend))
            .unwrap_or_else(|| panic!("no hit-cost row {backend:?} in:\n{stdout}"));
        assert!(line.ends_with(all), "every hit must be delivered: {line}");
    }
    counted_rows_hold(&stdout);
    // 12: every process held at its exec had its three stores seen.
    let rows = table_rows(section(&stdout, "## holds:"));
    let held = rows
        .iter()
        .find(|r| r[0] == "by executable, naming it")
        .unwrap_or_else(|| panic!("no held row: {rows:?}"));
    assert_eq!(
        held[6], "120 of 120 (40 of 40 processes)",
        "stores seen of held processes: {held:?}"
    );
    // feedback: every feedback store trapped and was counted by the preloaded library; the
    // fuzzing rows ran, AFL++ and libFuzzer alone among them, each row well formed. That a
    // fuzzer alone does not reach the exit is the e2e feedback tests' claim, not the
    // smoke's (a smoke run checks that the benchmark works, not what it measures).
    let rows = table_rows(section(&stdout, "## feedback:"));
    let fed = rows
        .iter()
        .find(|r| r[0].starts_with("feedback ("))
        .unwrap_or_else(|| panic!("no feedback store row: {rows:?}"));
    assert_eq!(fed[3], "4000 of 4000", "feedback traps counted: {fed:?}");
    let alone = rows
        .iter()
        .find(|r| r[0] == "alone")
        .unwrap_or_else(|| panic!("no maze row alone: {rows:?}"));
    assert!(
        ["0 of 1", "1 of 1"].contains(&alone[1].as_str()),
        "AFL++ alone: {alone:?}"
    );
    let lf_alone = rows
        .iter()
        .find(|r| r[0] == "libFuzzer alone")
        .unwrap_or_else(|| panic!("no libFuzzer maze row alone: {rows:?}"));
    assert!(
        ["0 of 1", "1 of 1"].contains(&lf_alone[1].as_str()),
        "libFuzzer alone: {lf_alone:?}"
    );
    for name in [
        "with wpd's feedback",
        "counting in its source (the floor)",
        "libFuzzer with wpd's feedback",
        "libFuzzer counting in its source (the floor)",
    ] {
        assert!(
            rows.iter().any(|r| r[0] == name),
            "no maze row {name:?}: {rows:?}"
        );
    }
    // steps: every session of wpd's three paths (through the adapter with the others
    // running and held, and the direct Step) ran all its steps (lldb-dap, a peer, is not
    // run at --smoke).
    let rows = table_rows(section(&stdout, "## steps: request"));
    let ours: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| {
            (r[1].starts_with("wpctl dap") || r[1].starts_with("gRPC direct"))
                && !r[1].contains(" / ")
        })
        .collect();
    assert_eq!(ours.len(), 3, "wpd's three steps rows:\n{stdout}");
    for r in ours {
        assert_eq!(r[2], "0 / 1", "a steps session failed: {r:?}\n{stdout}");
    }
}

/// The rows of `docs/benchmarks.md` that say "met" and are counts, not timings, hold at the
/// smoke's sizes exactly as written there (the timings stay measurements).
fn counted_rows_hold(stdout: &str) {
    // 2c, 6d: hit throughput, none lost on any path: no event dropped or record lost (on the
    // stream or in GetStats), every store counted by wpd and, but for aggregate mode's
    // samples, received.
    let rows = table_rows(section(stdout, "## hit throughput:"));
    assert!(rows.len() >= 10, "hit throughput rows: {rows:?}");
    for r in &rows {
        let (stores, counted, received) = (&r[3], &r[4], &r[5]);
        assert_eq!(r[6], "0 / 0 / 0 / 0", "hits lost: {r:?}");
        assert_eq!(counted, stores, "hits counted: {r:?}");
        if !r[0].contains("aggregate") {
            assert_eq!(received, stores, "hits received: {r:?}");
        }
    }
    // 3c: the first sweep over 1,000 new instructions reads the maps once and caches 1,000
    // places; the second reads nothing; a raw subscriber makes the daemon symbolize nothing,
    // and the maps are read once all the same, to find each hit's store in the program's code
    // (`backend::stored`, through the same image the symbolizer reads).
    let rows = table_rows(section(
        stdout,
        "## symbols: 1000 distinct hitting instructions",
    ));
    for (subscriber, sweep, reads, cached) in [
        ("raw", "first", "1", "0"),
        ("raw", "again (cached)", "0", "0"),
        ("symbolized", "first", "1", "1000"),
        ("symbolized", "again (cached)", "0", "1000"),
    ] {
        let r = rows
            .iter()
            .find(|r| r[0] == subscriber && r[1] == sweep)
            .unwrap_or_else(|| panic!("no row {subscriber} {sweep}: {rows:?}"));
        assert_eq!(
            (&*r[3], &*r[4]),
            (reads, cached),
            "maps reads, places: {r:?}"
        );
    }
    // 6a: one perf fd per armed thread on the per-thread path (50 threads).
    let rows = table_rows(section(stdout, "## farm: what one watched thread costs"));
    let r = rows
        .iter()
        .find(|r| r[0] == "per-thread (BPF ring)")
        .unwrap_or_else(|| panic!("no per-thread row: {rows:?}"));
    assert_eq!((&*r[1], &*r[2]), ("50", "1.00"), "fds, per thread: {r:?}");
    // 6c: a fork server's children: each one's first store caught with its value on the
    // per-thread path (read at the trap), each one hit on both paths.
    let rows = table_rows(section(stdout, "## farm: a fork server"));
    assert_eq!(rows.len(), 2, "fork server rows: {rows:?}");
    for r in &rows {
        let children: u64 = r[1].parse().unwrap();
        assert!(children > 0, "{r:?}");
        assert_eq!(r[4], r[1], "children with any hit: {r:?}");
        if r[0] == "per-thread" {
            assert_eq!(r[2], r[1], "children whose first store was caught: {r:?}");
        }
    }
}

/// The text of the section starting at `heading`, up to the next one.
fn section<'a>(stdout: &'a str, heading: &str) -> &'a str {
    let start = stdout
        .find(heading)
        .unwrap_or_else(|| panic!("no section {heading:?} in:\n{stdout}"));
    let body = &stdout[start + heading.len()..];
    &body[..body.find("\n## ").unwrap_or(body.len())]
}

/// The cells of each data row of the section's table (its header and rule left out).
fn table_rows(section: &str) -> Vec<Vec<String>> {
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("|---"))
        .skip(1)
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}
