//! Fuzz target: a `WpdError` of any variant with fuzzed fields →
//! `to_status`. See `wpd_fuzz::status`.
#![no_main]

use wpd_fuzz::status::{ErrorInput, check_input};

libfuzzer_sys::fuzz_target!(|input: ErrorInput| check_input(input));
