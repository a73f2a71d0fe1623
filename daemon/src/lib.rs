//! wpd: a hardware-watchpoint daemon. All logic lives in this library;
//! `main.rs` only parses flags and calls [`rpc::serve::run`].

pub mod aggregate;
pub mod arch;
pub mod authz;
pub mod backend;
pub mod bpf;
pub mod clock;
pub mod cpus;
pub mod engine;
pub mod error;
pub mod events;
pub mod export;
pub mod faststrings;
pub mod filter;
pub mod journal;
pub mod ledger;
pub mod model;
pub mod pidns;
pub mod procfs;
pub mod rpc;
pub mod sched;
pub mod secret;
pub mod signals;
pub mod startup;
pub mod state;
pub mod statedir;
pub mod symbols;
