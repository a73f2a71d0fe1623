//! Smoke test of the end-to-end benchmark binary: it runs, measures every
//! row, and delivers every hit. It asserts no timing (machines are noisy).

use std::process::Command;

use wpd_tests::{find_bin, require_root_perf};

#[test]
fn bench_smoke_runs_every_measurement() {
    if !require_root_perf() {
        return;
    }
    let bench = env!("CARGO_BIN_EXE_wpd-bench");
    // The bench starts wpd from beside itself; make sure it is there.
    find_bin("wpd").expect("wpd binary (cargo build --workspace --bins)");
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
    for row in [
        "floor: perf breakpoint syscalls",
        "wpd, perf backend",
        "floor: ptrace syscalls",
        "wpd, ptrace backend",
    ] {
        assert!(stdout.contains(row), "missing row {row:?} in:\n{stdout}");
    }
    // --smoke makes 2000 writes with perf and 100 with ptrace (a hit stops it).
    for (backend, all) in [
        ("| perf |", "| 2000 of 2000 |"),
        ("| ptrace |", "| 100 of 100 |"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(backend))
            .unwrap_or_else(|| panic!("no hit-cost row {backend:?} in:\n{stdout}"));
        assert!(line.ends_with(all), "every hit must be delivered: {line}");
    }
}
