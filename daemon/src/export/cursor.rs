//! The acknowledged position kept on disk (`<state dir>/export/nats.cursor`):
//! the journal's identity and the last sequence number acknowledged in
//! order, and where the export starts from it.

use std::path::{Path, PathBuf};

/// The acknowledged position kept on disk.
fn cursor_path(dir: &Path) -> PathBuf {
    dir.join("nats.cursor")
}

/// Reads the position: (journal id, last acknowledged seq). A file that
/// does not parse is reported and counts as none.
fn read_cursor(dir: &Path) -> Option<(String, u64)> {
    let path = cursor_path(dir);
    let b = match crate::statedir::read(&path, 4096) {
        Ok(b) => b?,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "export: position unreadable");
            return None;
        }
    };
    let parsed = String::from_utf8(b).ok().and_then(|s| {
        let (id, seq) = s.trim().split_once(' ')?;
        let seq: u64 = seq.parse().ok()?;
        (!id.is_empty() && id.len() <= 64 && seq <= crate::journal::segment::MAX_SEQ)
            .then(|| (id.to_string(), seq))
    });
    if parsed.is_none() {
        tracing::warn!(
            file = %path.display(),
            "export: the position is damaged; the export starts over from the oldest event"
        );
    }
    parsed
}

/// Where the export starts: the position kept, if it is this journal's,
/// and never beyond what the journal holds (a forged or damaged position,
/// or a tail cut at start: the numbers after the end will be given to new
/// events, which must not be skipped); else the oldest event.
pub(super) fn start_position(dir: &Path, journal_id: &str, written: u64) -> u64 {
    match read_cursor(dir) {
        Some((id, seq)) if id == journal_id && seq <= written => seq,
        Some((id, seq)) if id == journal_id => {
            tracing::warn!(
                acked = seq,
                written,
                "export: the position kept is beyond the journal's end; the export goes on from \
                 the end"
            );
            written
        }
        // Another journal's (the state directory was replaced): nothing
        // here.
        _ => 0,
    }
}

pub(super) fn write_cursor(dir: &Path, journal_id: &str, seq: u64) -> std::io::Result<()> {
    crate::statedir::replace(
        &cursor_path(dir),
        format!("{journal_id} {seq}\n").as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_names_its_journal() {
        let d = std::env::temp_dir().join(format!("wpd-export-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(read_cursor(&d), None);
        write_cursor(&d, "abc", 42).unwrap();
        assert_eq!(read_cursor(&d), Some(("abc".into(), 42)));
        assert_eq!(start_position(&d, "abc", 50), 42);
        assert_eq!(start_position(&d, "other", 50), 0, "another journal's");
        assert_eq!(
            start_position(&d, "abc", 41),
            41,
            "beyond the journal's end"
        );
        // Garbage of every kind: none, never a panic or a huge position.
        for junk in [
            &b"abc 18446744073709551615\n"[..],
            b"abc -1",
            b"abc",
            b" 5",
            b"\xff\xfe 3",
            b"abc 1 2",
            &[b'a'; 4096],
        ] {
            crate::statedir::replace(&cursor_path(&d), junk).unwrap();
            assert_eq!(read_cursor(&d), None, "{junk:?}");
            assert_eq!(start_position(&d, "abc", u64::MAX), 0);
        }
        std::fs::remove_dir_all(d).unwrap();
    }
}
