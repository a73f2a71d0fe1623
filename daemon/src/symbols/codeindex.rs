//! A module's line rows and functions sorted by link-time address, built
//! the first time a step needs them (`step.rs`) and kept with the module's
//! DWARF (`dwarf/`).

use std::sync::Arc;

/// One row of a line table, with the address where the next row starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Row {
    pub(super) addr: u64,
    pub(super) end: u64,
    pub(super) file: Arc<str>,
    pub(super) line: u32,
    pub(super) stmt: bool,
    pub(super) prologue_end: bool,
}

/// One address range of a function (a function split in parts has one per
/// part, each with the function's entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Func {
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) entry: u64,
    pub(super) name: String,
}

/// A module's line rows and functions sorted by link-time address.
#[derive(Debug, Default)]
pub struct CodeIndex {
    pub(super) rows: Vec<Row>,
    pub(super) funcs: Vec<Func>,
}
