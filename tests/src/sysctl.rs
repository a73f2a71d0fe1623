//! A sysctl changed for one test and put back by a guard, also when the test fails or panics.
//! Such knobs are machine-wide: the tests that change one run one at a time (the nextest test
//! group `machine-sysctl` in `.config/nextest.toml`).

use anyhow::{Context, Result};

/// The value a sysctl had before [`Sysctl::set`]; written back when dropped.
pub struct Sysctl {
    path: &'static str,
    old: String,
}

impl Sysctl {
    /// Writes `value` to `path` (under `/proc/sys`), keeping the old value.
    pub fn set(path: &'static str, value: &str) -> Result<Sysctl> {
        let old = std::fs::read_to_string(path)
            .with_context(|| format!("reading {path}"))?
            .trim()
            .to_string();
        std::fs::write(path, value).with_context(|| format!("writing {value} to {path}"))?;
        Ok(Sysctl { path, old })
    }

    /// The value before the change.
    pub fn old(&self) -> &str {
        &self.old
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(self.path, &self.old) {
            eprintln!("could not restore {} to {}: {e}", self.path, self.old);
        }
    }
}
