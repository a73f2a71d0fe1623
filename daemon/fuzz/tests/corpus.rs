//! Replays the checked-in corpora through the targets' checks on stable
//! Rust (no sanitizer, no libFuzzer): `cargo test` in `daemon/fuzz`. A file
//! from `artifacts/<target>/` can be replayed the same way with
//! `WPD_FUZZ_REPLAY=<path> cargo test replay_one -- --nocapture`.

use std::path::{Path, PathBuf};

use arbitrary::{Arbitrary, Unstructured};
use wpd_fuzz::status::ErrorInput;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

fn status_bytes(b: &[u8]) {
    if let Ok(input) = ErrorInput::arbitrary_take_rest(Unstructured::new(b)) {
        wpd_fuzz::status::check_input(input);
    }
}

#[test]
fn decode_spec_corpus_passes() {
    let n = wpd_fuzz::replay_dir(&corpus("decode_spec"), wpd_fuzz::request::check).unwrap();
    assert!(n > 0, "empty corpus");
}

#[test]
fn status_mapping_corpus_passes() {
    let n = wpd_fuzz::replay_dir(&corpus("status_mapping"), status_bytes).unwrap();
    assert!(n > 0, "empty corpus");
}

#[test]
fn replay_one() {
    let Some(p) = std::env::var_os("WPD_FUZZ_REPLAY") else {
        return;
    };
    let p = PathBuf::from(p);
    let bytes = std::fs::read(&p).unwrap();
    if p.to_string_lossy().contains("status_mapping") {
        let input = ErrorInput::arbitrary_take_rest(Unstructured::new(&bytes));
        println!("input: {input:?}");
        status_bytes(&bytes);
    } else {
        wpd_fuzz::request::check(&bytes);
    }
}
