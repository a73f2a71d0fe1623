//! wpd's end-to-end tests, one test binary: the real `wpd` and `wpctl`, real targets the tests
//! start, real peers (Prometheus, NATS, systemd, Python gRPC, a Node DAP client). One module
//! per area; a test's name is `<module>::<test>` (`hits::new_threads_first_store_is_caught`),
//! so `cargo nextest run -p wpd-tests -E 'test(/^hits::/)'` runs one area. nextest runs each
//! test in a process of its own, so a test may change its process (rlimits, umask).
//!
//! Every file here is a module declared below (a tidy test in `daemon/tests/invariants.rs`
//! checks that none is left out); the harness is the `wpd_tests` library (`tests/src/`).

mod aggregate;
mod bad_input;
mod bench_smoke;
mod breaks;
mod cli;
mod dap;
mod demo;
mod deploy;
mod disk_full;
mod export;
mod farm_cost;
mod farm_forks;
mod faults_arming;
mod faults_contention;
mod faults_daemon_kill;
mod faults_fds;
mod faults_fork;
mod faults_ptrace_death;
mod faults_sigtrap;
mod faults_streams;
mod feedback;
mod filters;
mod fleet;
mod fuzzers;
mod grpc_clients;
mod harness;
mod held_at_exec;
mod hit_values;
mod hits;
mod ide_rpcs;
mod journal;
mod leader_exit;
mod lifecycle;
mod limits;
mod losses;
mod metrics;
mod objects;
mod pending;
mod persist;
mod pidns;
mod policies;
mod ptrace;
mod recent_hits;
mod security;
mod shares;
mod slots;
mod step;
mod symbols;
mod sysboot;
mod thread_names;
mod typed;
mod unprivileged;
