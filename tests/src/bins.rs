//! Binaries: finding the workspace's programs.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail, ensure};

/// The directory holding the workspace's binaries: the running executable's directory, or its
/// parent when the executable is a test in `target/<profile>/deps/`.
pub fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", exe.display()))?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// The path of the workspace binary `name` (`wpd`, `wpctl`, `wpd-target`, ...).
///
/// `$<NAME>_BIN` (e.g. `WPD_BIN`, `WPD_TARGET_BIN`) overrides the lookup; otherwise the binary
/// must sit in [`bin_dir`].
pub fn find_bin(name: &str) -> Result<PathBuf> {
    let var = format!("{}_BIN", name.to_uppercase().replace('-', "_"));
    if let Some(path) = std::env::var_os(&var) {
        let path = PathBuf::from(path);
        ensure!(
            path.is_file(),
            "${var} points to {}, which is not a file",
            path.display()
        );
        return Ok(path);
    }
    let dir = bin_dir()?;
    let path = dir.join(name);
    if path.is_file() {
        return Ok(path);
    }
    let release = if dir.file_name().is_some_and(|n| n == "release") {
        " --release"
    } else {
        ""
    };
    bail!(
        "`{name}` not found at {}: run `cargo build{release} --workspace --bins` first \
         (or set ${var} to the binary)",
        path.display()
    )
}

/// Like [`find_bin`], but panics with the explanation (for tests).
pub fn bin_path(name: &str) -> PathBuf {
    find_bin(name).unwrap_or_else(|e| panic!("{e:#}"))
}
