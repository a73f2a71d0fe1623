//! Privileges: what the machine allows, and tests that skip with a reason where it lacks it.

use crate::*;
use std::fs;
use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU32;

use anyhow::Result;

/// The online CPUs, from `/sys/devices/system/cpu/online` ("0-3,6"): the CPUs wpd's perf
/// backend opens one event on per thread.
pub fn online_cpus() -> Vec<i32> {
    let s = fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_else(|_| "0".into());
    let mut v = Vec::new();
    for part in s.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<i32>().ok()),
        }
    }
    v
}

/// True when this process may run the end-to-end tests: it is root and the kernel grants a
/// hardware breakpoint (checked once with a throw-away breakpoint on this thread).
///
/// Otherwise prints `SKIP <test>: <reason>` to stderr (uncaptured) and returns false; the test must return
/// right away. With `WPD_TESTS_REQUIRE=1` in the environment it panics instead, so that CI
/// cannot pass by skipping.
pub fn require_root_perf() -> bool {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    let result = PROBE.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return Err(format!(
                "not root (euid {euid}); wpd needs root to watch other processes \
                 (run e.g. `sudo -E ./scripts/test`)"
            ));
        }
        static PROBE_VAR: AtomicU32 = AtomicU32::new(0);
        ForeignBreakpoint::open(0, PROBE_VAR.as_ptr() as u64, 4)
            .map(drop)
            .map_err(|e| format!("the kernel refuses hardware breakpoints here: {e:#}"))
    });
    match result {
        Ok(()) => true,
        Err(reason) => skip(reason),
    }
}

/// [`require_root_perf`], plus, for [`Backend::Ptrace`], a kernel that lets root ptrace
/// (`kernel.yama.ptrace_scope` below 3). Same skip rules.
pub fn require_backend(backend: Backend) -> bool {
    if !require_root_perf() {
        return false;
    }
    if backend == Backend::Ptrace {
        let scope = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(0);
        if scope >= 3 {
            return skip(&format!(
                "kernel.yama.ptrace_scope={scope} forbids every ptrace attach"
            ));
        }
    }
    true
}

/// True when `python3` has the gRPC libraries the client tests use
/// (`grpcio`, `grpcio-tools`, `grpcio-health-checking`,
/// `grpcio-reflection`, `grpclib`: `.ci/run` installs them). Otherwise
/// skips, except under CI (`CI=true`), where their absence fails the test.
pub fn require_python_grpc() -> bool {
    let ok = std::process::Command::new("python3")
        .args([
            "-c",
            "import grpc, grpc_tools, grpc_health.v1, grpc_reflection.v1alpha, grpclib",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok && std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("python3 lacks the gRPC libraries under CI: .ci/run installs them");
    }
    ok || skip(
        "python3 lacks grpcio, grpcio-tools, grpcio-health-checking, grpcio-reflection or grpclib          (pip install them)",
    )
}

/// True when node and the DAP test client (`tests/dap/node_modules`, from
/// `npm ci` in `tests/dap`) are there; under `CI=true` their absence is a
/// failure (`.ci/run` installs them).
pub fn require_node_dap() -> bool {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dap");
    let ok = dir
        .join("node_modules/@vscode/debugadapter-testsupport")
        .is_dir()
        && std::process::Command::new("node")
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !ok && std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("node or tests/dap/node_modules is missing under CI: .ci/run installs them");
    }
    ok || skip("node or the DAP test client is missing (cd tests/dap && npm ci)")
}

/// Prints `SKIP <test>: <reason>` and returns false, or panics under `WPD_TESTS_REQUIRE=1`.
fn skip(reason: &str) -> bool {
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string();
    if std::env::var_os("WPD_TESTS_REQUIRE").is_some_and(|v| v == "1") {
        panic!("{name}: cannot run ({reason}) and WPD_TESTS_REQUIRE=1");
    }
    // Written to the real stderr, past libtest's capture, so that a skip is visible
    // even when the test "passes".
    let _ = writeln!(std::io::stderr(), "SKIP {name}: {reason}");
    false
}

/// Runs a test body against both backends, without copying it: `both_backends!(name)` (or
/// `both_backends!(name, body)`) turns `async fn body(backend: Backend) -> anyhow::Result<()>`
/// into a module `name` with two tokio tests, `name::perf` and `name::ptrace`, each of which
/// skips as [`require_backend`] says and otherwise runs `body(Backend::Perf | Backend::Ptrace)`.
/// Attributes (e.g. a doc comment) before the name go on the module.
#[macro_export]
macro_rules! both_backends {
    ($(#[$attr:meta])* $name:ident) => {
        $crate::both_backends!($(#[$attr])* $name, $name);
    };
    ($(#[$attr:meta])* $name:ident, $body:ident) => {
        $(#[$attr])*
        mod $name {
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn perf() -> ::anyhow::Result<()> {
                if !$crate::require_backend($crate::Backend::Perf) {
                    return Ok(());
                }
                super::$body($crate::Backend::Perf).await
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ptrace() -> ::anyhow::Result<()> {
                if !$crate::require_backend($crate::Backend::Ptrace) {
                    return Ok(());
                }
                super::$body($crate::Backend::Ptrace).await
            }
        }
    };
}

/// This process's soft `RLIMIT_NOFILE`, bounded by the hard one.
pub fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    lim.rlim_cur.min(lim.rlim_max)
}

/// The program `name` as found on `PATH`, or `None` after [`require_tool`] said why.
pub fn require_program(name: &str, install: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if !require_tool(found.is_some(), name, install) {
        return None;
    }
    found
}

/// True when a tool a test needs (`what`) is `present`. When it is missing the test skips
/// saying how to get it (`install`), except under CI (`CI` set), where its absence fails the
/// test: `.ci/run` installs it.
pub fn require_tool(present: bool, what: &str, install: &str) -> bool {
    if present {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
        panic!("{what} is missing under CI: .ci/run installs it ({install})");
    }
    skip(&format!("{what} is missing ({install})"))
}
