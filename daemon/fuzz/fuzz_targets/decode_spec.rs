//! Fuzz target: arbitrary bytes → one of five wpd.v1 requests (first byte
//! picks which) → wire → domain conversions. See `wpd_fuzz::request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| wpd_fuzz::request::check(data));
