//! wpd: a hardware-watchpoint daemon. All logic lives in this library;
//! `main.rs` reads the flags into a [`startup::Config`] and calls
//! [`startup::run`], which wires the daemon and serves it.

pub mod aggregate;
pub mod arch;
pub mod authz;
pub mod backend;
pub mod bpf;
pub mod clock;
pub mod convert;
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
pub mod range;
pub mod rpc;
pub mod sched;
pub mod secret;
pub mod service;
pub mod signals;
pub mod startup;
pub mod state;
pub mod statedir;
pub mod symbols;
pub mod value;
pub mod wire;
