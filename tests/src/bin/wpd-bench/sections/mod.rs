//! One module per benchmark section (see `main.rs` for the list).

pub mod arm;
pub mod churn;
pub mod closes;
pub mod dap;
pub mod drain;
pub mod farm;
pub mod feedback;
pub mod fleet;
pub mod fuzzers;
pub mod hitcost;
pub mod holds;
pub mod memory;
pub mod objects;
pub mod pending;
pub mod rpc;
pub mod steps;
pub mod symbols;
pub mod throughput;
pub mod unpriv;
