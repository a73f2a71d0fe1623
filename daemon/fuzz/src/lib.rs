//! Checks shared by wpd's fuzz targets, kept in a library so that the thin
//! `fuzz_targets/*` wrappers, the seed generator and plain `cargo test`
//! replays all run exactly the same oracle.
//!
//! Every check panics on a violated property; libFuzzer (or AFL) records a
//! panic as a crash.

pub mod request;
pub mod status;

/// Replays every file of a corpus directory through `check`, returning how
/// many inputs ran. Used by the tests (stable, no sanitizer) to make sure the
/// checked-in corpus still passes after daemon changes.
pub fn replay_dir(dir: &std::path::Path, check: impl Fn(&[u8])) -> std::io::Result<usize> {
    let mut n = 0;
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.sort();
    for p in paths.iter().filter(|p| p.is_file()) {
        check(&std::fs::read(p)?);
        n += 1;
    }
    Ok(n)
}
