//! One module per benchmark section (see `main.rs` for the list).

pub mod arm;
pub mod churn;
pub mod hitcost;
pub mod memory;
pub mod rpc;
pub mod symbols;
pub mod throughput;
