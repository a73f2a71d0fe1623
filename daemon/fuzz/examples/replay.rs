//! Replays inputs through their fuzz target's checks on stable Rust (no
//! sanitizer, no libFuzzer): a file left in `artifacts/<target>/` by a crash,
//! or any corpus file. The target is taken from the path (`status_mapping`
//! in it, else `decode_spec`); a `status_mapping` input is printed as the
//! error it builds first. Exits non-zero (a panic) where a check fails.
//!
//!     cargo run --manifest-path daemon/fuzz/Cargo.toml --example replay -- FILE...

use std::path::PathBuf;

use arbitrary::{Arbitrary, Unstructured};
use wpd_fuzz::status::ErrorInput;

fn main() {
    let files: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if files.is_empty() {
        eprintln!("usage: replay FILE... (inputs of decode_spec or status_mapping)");
        std::process::exit(2);
    }
    for p in files {
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if p.to_string_lossy().contains("status_mapping") {
            let input = ErrorInput::arbitrary_take_rest(Unstructured::new(&bytes));
            println!("{}: {input:?}", p.display());
            if let Ok(input) = input {
                wpd_fuzz::status::check_input(input);
            }
        } else {
            println!("{}: decode_spec", p.display());
            wpd_fuzz::request::check(&bytes);
        }
        println!("{}: every check passed", p.display());
    }
}
