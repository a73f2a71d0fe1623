//! The one rule for a test that this machine or its kernel cannot run,
//! shared by every crate's tests (the end-to-end harness `wpd-tests`
//! re-exports it; the daemon, `wpctl` and the DAP adapter take it as a
//! dev-dependency, having no other test dependency in common).
//!
//! A skip is never silent: [`machine_skip`] prints `SKIP <test>: <reason>`
//! to stderr and appends the same line to the file named by
//! `WPD_TESTS_SKIPS` (`scripts/test` sets it and lists every line in its
//! summary: nextest shows a passing test's output only with
//! `--no-capture`). With `WPD_TESTS_REQUIRE=1` (set by `.ci/run`) it panics
//! instead: on a machine known to be able, no test can pass by skipping.
//!
//! Only what the machine lacks is a reason (not root, no `bpf()`, no
//! hardware breakpoints, no IPv6 loopback, a Yama scope, no cgroup v2, a
//! low hard `RLIMIT_NOFILE`); a missing program or package the tests run
//! against is not (`scripts/setup` installs them, and their absence fails).

use std::fs;
use std::io::Write;

/// The file [`machine_skip`] appends its line to, when set.
pub const SKIPS_FILE_VAR: &str = "WPD_TESTS_SKIPS";

/// `1` in this variable turns every skip into a panic.
pub const REQUIRE_VAR: &str = "WPD_TESTS_REQUIRE";

/// Skips what follows for `reason`: prints `SKIP <test>: <reason>` to
/// stderr, appends the line to the file named by `WPD_TESTS_SKIPS` if set,
/// and returns false (a test returns right away, or leaves out the part
/// that needs what is missing); or panics under `WPD_TESTS_REQUIRE=1`.
/// `<test>` is the running test's name (its thread's, as the test harness
/// names it).
pub fn machine_skip(reason: &str) -> bool {
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    if std::env::var_os(REQUIRE_VAR).is_some_and(|v| v == "1") {
        panic!("{name}: cannot run ({reason}) and {REQUIRE_VAR}=1");
    }
    let line = format!("SKIP {name}: {reason}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(SKIPS_FILE_VAR) {
        // One append of one line: lines of tests running at once do not mix.
        let _ = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
    false
}

/// True when this process runs as root; otherwise [`machine_skip`]s, saying
/// that `what` needs root, and returns false.
pub fn require_root(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    euid == 0 || machine_skip(&format!("not root (euid {euid}): {what} needs root"))
}
