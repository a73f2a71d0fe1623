//! Replays the checked-in corpora through the targets' checks on stable
//! Rust (no sanitizer, no libFuzzer): `cargo test` in `daemon/fuzz`. One
//! file (from `artifacts/<target>/`) is replayed by the `replay` example.

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
