//! The journal at start: its identity (`id`), and its newest segment
//! checked and its torn or damaged tail cut off.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use super::segment::{self, SegmentFile, Stop};

/// State recovered from disk at start.
#[derive(Debug)]
pub(super) struct Recovered {
    pub(super) segments: Vec<SegmentFile>,
    /// Last valid sequence number (0: none ever).
    pub(super) last_seq: u64,
    /// Bytes of every segment after the cut.
    pub(super) bytes: u64,
    pub(super) torn: bool,
}

/// A journal identity: a UUID's characters.
fn is_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The identity kept in `dir/id`, made (a random UUID) the first time.
pub(super) fn journal_id(dir: &Path) -> io::Result<String> {
    let path = dir.join("id");
    match crate::statedir::read(&path, 4096) {
        Ok(Some(b)) => match String::from_utf8(b) {
            Ok(s) if is_id(s.trim()) => return Ok(s.trim().to_string()),
            _ => tracing::warn!(
                file = %path.display(),
                "journal: its identity is damaged; it gets a new one (an export starts over)"
            ),
        },
        Ok(None) => {}
        // Larger than any identity: damage too.
        Err(e) if e.kind() == io::ErrorKind::InvalidData => tracing::warn!(
            file = %path.display(),
            error = %e,
            "journal: its identity is damaged; it gets a new one (an export starts over)"
        ),
        Err(e) => return Err(e),
    }
    let id = std::fs::read_to_string("/proc/sys/kernel/random/uuid")?
        .trim()
        .to_string();
    crate::statedir::replace(&path, format!("{id}\n").as_bytes())?;
    Ok(id)
}

/// Largest last sequence number a journal is opened with: half of what a
/// record may hold ([`segment::MAX_SEQ`]), centuries away for a real
/// journal; a larger one is damage, refused before numbering goes on near
/// the end of the range.
pub(super) const SEQ_LIMIT: u64 = segment::MAX_SEQ / 2;

pub(super) fn recover(dir: &Path) -> io::Result<Recovered> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(crate::statedir::DIR_MODE)
            .create(dir)?;
    }
    let mut segments = segment::list(dir)?;
    let mut torn = false;
    let mut last_seq = 0;
    // Newest first: the newest segment with a valid record gives the last
    // sequence number; one with none is dropped (a crash right after it was
    // created), or set aside if it holds bytes (damaged from its header or
    // its first record on: kept for a look, never read).
    while let Some(newest) = segments.last() {
        let s = segment::scan(&newest.path, newest.first_seq)?;
        if s.stop != Stop::End || s.damaged > 0 {
            torn = true;
            tracing::warn!(
                segment = %newest.path.display(),
                valid = s.valid_len,
                cut = s.file_len - s.valid_len,
                damaged_between_records = s.damaged,
                "journal: a torn or damaged tail was cut off (damaged bytes between valid \
                 records are kept and skipped by readers)"
            );
        }
        match s.last_seq {
            Some(last) => {
                if s.valid_len < s.file_len {
                    let f = crate::statedir::open(&newest.path, OpenOptions::new().write(true))?;
                    f.set_len(s.valid_len)?;
                    f.sync_all()?;
                }
                last_seq = last;
                break;
            }
            None => {
                last_seq = newest.first_seq.saturating_sub(1);
                if s.file_len > segment::HEADER_LEN {
                    let mut aside = newest.path.as_os_str().to_owned();
                    aside.push(".damaged");
                    tracing::warn!(
                        segment = %newest.path.display(),
                        kept_as = ?aside,
                        "journal: a segment without one valid record is set aside"
                    );
                    std::fs::rename(&newest.path, &aside)?;
                } else {
                    std::fs::remove_file(&newest.path)?;
                }
                segments.pop();
            }
        }
    }
    if last_seq > SEQ_LIMIT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the journal in {} numbers its events up to {last_seq}, past any journal's \
                 (at most {SEQ_LIMIT}): it is damaged or forged; move it aside to start a new one",
                dir.display()
            ),
        ));
    }
    let mut bytes = 0;
    for s in &segments {
        bytes += std::fs::metadata(&s.path)?.len();
    }
    Ok(Recovered {
        segments,
        last_seq,
        bytes,
        torn,
    })
}
