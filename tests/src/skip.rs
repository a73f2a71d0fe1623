//! Privileges and peers: what the machine allows (tests skip, saying why, where it lacks it), and
//! the peer programs and libraries the tests run against (their absence fails the test).

use crate::*;
use std::fs;
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
/// Otherwise skips ([`machine_skip`]: `SKIP <test>: <reason>` on stderr and in the file named by
/// `WPD_TESTS_SKIPS`) and returns false; the test must return right away. With
/// `WPD_TESTS_REQUIRE=1` in the environment it panics instead, so that a run on a machine
/// known to be able cannot pass by skipping.
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
        Err(reason) => machine_skip(reason),
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
            return machine_skip(&format!(
                "kernel.yama.ptrace_scope={scope} forbids every ptrace attach"
            ));
        }
    }
    true
}

/// Panics, naming `scripts/setup`, when a peer a test runs against (a program, a library, a
/// package: `what`, from `package`) is missing. Peers are never a reason to skip: `scripts/setup`
/// installs every one of them, and `scripts/test` runs it first.
pub fn require_peer(present: bool, what: &str, package: &str) {
    assert!(
        present,
        "{what} is missing ({package}): run scripts/setup as root, which installs every peer \
         the tests run against (scripts/test runs it first)"
    );
}

/// The peer program `name` as found on `PATH` (else [`require_peer`] panics).
pub fn peer_program(name: &str, package: &str) -> std::path::PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    require_peer(found.is_some(), name, package);
    found.unwrap_or_default()
}

/// Panics unless `python3` has the gRPC libraries the client tests use (`grpcio`,
/// `grpcio-tools`, `grpcio-health-checking`, `grpcio-reflection`, `grpclib`).
pub fn require_python_grpc() {
    let ok = std::process::Command::new("python3")
        .args([
            "-c",
            "import grpc, grpc_tools, grpc_health.v1, grpc_reflection.v1alpha, grpclib",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require_peer(
        ok,
        "python3's gRPC libraries",
        "PyPI: grpcio grpcio-tools grpcio-health-checking grpcio-reflection grpclib",
    );
}

/// Panics unless node and the DAP test client (`tests/dap/node_modules`, from `npm ci` in
/// `tests/dap`) are there.
pub fn require_node_dap() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dap");
    let node = std::process::Command::new("node")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    require_peer(node, "node", "Debian: nodejs");
    require_peer(
        dir.join("node_modules/@vscode/debugadapter-testsupport")
            .is_dir(),
        "the DAP test client (tests/dap/node_modules)",
        "npm ci in tests/dap",
    );
}

/// For what this machine or its kernel cannot do (not root, no hardware breakpoints, a Yama
/// scope that forbids a case, no cgroup v2, a low hard `RLIMIT_NOFILE`): prints
/// `SKIP <test>: <reason>` to stderr, appends the line to the file named by `WPD_TESTS_SKIPS` if
/// set, and returns false (the test must return right away, or leave out the part that needs
/// it); or panics under `WPD_TESTS_REQUIRE=1`. The same rule as every unit test's
/// (`wpd-test-skip`).
pub use wpd_test_skip::machine_skip;

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
