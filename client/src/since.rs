//! `wpctl events --since SPEC`: a sequence number, an RFC 3339 time or an age, and the
//! replay fields of `StreamEventsRequest` it sets.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::{Span, SpanRelativeTo, Timestamp};

/// Where a replay from the daemon's journal starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// Events whose sequence number is greater than this (`1234`).
    AfterSeq(u64),
    /// Events published at or after this time, in Unix nanoseconds
    /// (`2026-12-02T10:00:00Z`).
    Time(u64),
    /// Events of this last stretch of time (`10m`), counted back from the
    /// moment the command starts.
    Age(Duration),
}

/// The replay fields of a `StreamEventsRequest` (both unset: live events only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Replay {
    /// `StreamEventsRequest.after_seq`.
    pub after_seq: Option<u64>,
    /// `StreamEventsRequest.since_time_ns`.
    pub since_time_ns: Option<u64>,
}

/// Why a `--since` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinceError {
    /// Nothing was given.
    #[error(
        "empty --since: give a sequence number (1234), a time (2026-12-02T10:00:00Z) or an age (10m)"
    )]
    Empty,
    /// All digits, but too many of them.
    #[error("sequence number {0} does not fit in 64 bits")]
    SeqOverflow(String),
    /// Shaped like a date, but not an RFC 3339 time with an offset.
    #[error(
        "{text:?} is not an RFC 3339 time ({detail}); write e.g. 2026-12-02T10:00:00Z or \
         2026-12-02T11:00:00+01:00"
    )]
    BadTime {
        /// The value given.
        text: String,
        /// What the time parser said.
        detail: String,
    },
    /// A time before the Unix epoch, which the daemon's clock cannot name.
    #[error("{0} is before 1970-01-01T00:00:00Z")]
    BeforeEpoch(String),
    /// Neither a number, nor a time, nor an age.
    #[error(
        "{text:?} is neither a sequence number (1234), an RFC 3339 time (2026-12-02T10:00:00Z) \
         nor an age (10m, 90s, 2h, 1h30m, 2d) ({detail})"
    )]
    Unrecognized {
        /// The value given.
        text: String,
        /// What the duration parser said.
        detail: String,
    },
    /// Months and years have no fixed length.
    #[error("age {0:?} is in months or years, which have no fixed length: use days (30d)")]
    CalendarAge(String),
    /// An age of nothing.
    #[error("age {0:?} is zero: leave out --since to follow live events only")]
    ZeroAge(String),
}

/// Parses `--since`: digits are a sequence number, text that starts like a
/// date (`YYYY-`) is an RFC 3339 time, anything else an age in jiff's
/// "friendly" duration format (`10m`, `90s`, `2h`, `1h30m`, `2d`, `10 minutes`;
/// `ago` may follow) or ISO 8601 (`PT10M`). Days count 24 hours.
pub fn parse(s: &str) -> Result<Since, SinceError> {
    let text = s.trim();
    if text.is_empty() {
        return Err(SinceError::Empty);
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Since::AfterSeq)
            .map_err(|_| SinceError::SeqOverflow(text.to_string()));
    }
    let b = text.as_bytes();
    if b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' {
        let t: Timestamp = text.parse().map_err(|e: jiff::Error| SinceError::BadTime {
            text: text.to_string(),
            detail: e.to_string(),
        })?;
        let ns = u64::try_from(t.as_nanosecond())
            .map_err(|_| SinceError::BeforeEpoch(text.to_string()))?;
        return Ok(Since::Time(ns));
    }
    let span: Span = text
        .parse()
        .map_err(|e: jiff::Error| SinceError::Unrecognized {
            text: text.to_string(),
            detail: e.to_string(),
        })?;
    let d = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|_| SinceError::CalendarAge(text.to_string()))?;
    // `10m ago` is a negative span: the age is its length either way.
    let d = d.unsigned_abs();
    if d.is_zero() {
        return Err(SinceError::ZeroAge(text.to_string()));
    }
    Ok(Since::Age(d))
}

/// `--since` for clap: the error as its one-line message.
pub fn parse_arg(s: &str) -> Result<Since, String> {
    parse(s).map_err(|e| e.to_string())
}

impl Since {
    /// The replay fields, an age counted back from `now` (before 1970: from
    /// the start of the journal).
    pub fn replay(self, now: SystemTime) -> Replay {
        match self {
            Since::AfterSeq(seq) => Replay {
                after_seq: Some(seq),
                since_time_ns: None,
            },
            Since::Time(ns) => Replay {
                after_seq: None,
                since_time_ns: Some(ns),
            },
            Since::Age(age) => {
                let now_ns = now
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                let age_ns = u64::try_from(age.as_nanos()).unwrap_or(u64::MAX);
                Replay {
                    after_seq: None,
                    since_time_ns: Some(now_ns.saturating_sub(age_ns)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn check(input: &str, expected: Result<Since, &str>) {
        let got = parse(input);
        match expected {
            Ok(since) => assert_eq!(got, Ok(since), "parse({input:?})"),
            Err(part) => {
                let msg = got.expect_err(input).to_string();
                assert!(msg.contains(part), "parse({input:?}) = {msg:?}");
                assert!(!msg.contains('\n'), "{msg:?}");
            }
        }
    }

    #[test]
    fn sequence_numbers() {
        check("1234", Ok(Since::AfterSeq(1234)));
        check("0", Ok(Since::AfterSeq(0)));
        check(" 42 ", Ok(Since::AfterSeq(42)));
        check("18446744073709551615", Ok(Since::AfterSeq(u64::MAX)));
        check("18446744073709551616", Err("64 bits"));
        check("", Err("empty"));
        check("   ", Err("empty"));
    }

    #[test]
    fn times() {
        // 2026-12-02T10:00:00Z.
        let t = 1_796_205_600 * S;
        check("2026-12-02T10:00:00Z", Ok(Since::Time(t)));
        check("2026-12-02T11:00:00+01:00", Ok(Since::Time(t)));
        check("2026-12-02T05:00:00-05:00", Ok(Since::Time(t)));
        check("2026-12-02t10:00:00z", Ok(Since::Time(t)));
        check("2026-12-02T10:00:00.25Z", Ok(Since::Time(t + S / 4)));
        check("1970-01-01T00:00:00Z", Ok(Since::Time(0)));
        check("2026-12-02T10:00:00", Err("RFC 3339"));
        check("2026-12-02", Err("RFC 3339"));
        check("2026-13-02T10:00:00Z", Err("RFC 3339"));
        check("1969-12-31T23:59:59Z", Err("before 1970"));
    }

    #[test]
    fn ages() {
        check("10m", Ok(Since::Age(Duration::from_secs(600))));
        check("90s", Ok(Since::Age(Duration::from_secs(90))));
        check("2h", Ok(Since::Age(Duration::from_secs(7200))));
        check("1h30m", Ok(Since::Age(Duration::from_secs(5400))));
        check("1h 30m", Ok(Since::Age(Duration::from_secs(5400))));
        check("2d", Ok(Since::Age(Duration::from_secs(2 * 86_400))));
        check("1w", Ok(Since::Age(Duration::from_secs(7 * 86_400))));
        check("10 minutes", Ok(Since::Age(Duration::from_secs(600))));
        check("10m ago", Ok(Since::Age(Duration::from_secs(600))));
        check("500ms", Ok(Since::Age(Duration::from_millis(500))));
        check("PT10M", Ok(Since::Age(Duration::from_secs(600))));
        check("0s", Err("zero"));
        check("1mo", Err("months or years"));
        check("1y", Err("months or years"));
        check("yesterday", Err("neither a sequence number"));
        check("10x", Err("neither a sequence number"));
        check("-5", Err("neither a sequence number"));
    }

    #[test]
    fn replay_fields() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            Since::AfterSeq(7).replay(now),
            Replay {
                after_seq: Some(7),
                since_time_ns: None
            }
        );
        assert_eq!(
            Since::Time(5).replay(now),
            Replay {
                after_seq: None,
                since_time_ns: Some(5)
            }
        );
        assert_eq!(
            Since::Age(Duration::from_secs(600))
                .replay(now)
                .since_time_ns,
            Some(400 * S)
        );
        // Longer ago than the epoch: from the start of the journal.
        assert_eq!(
            Since::Age(Duration::from_secs(5_000))
                .replay(now)
                .since_time_ns,
            Some(0)
        );
    }
}
