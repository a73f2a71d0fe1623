//! Value parsers and option types several subcommands share: process and
//! thread ids, addresses, `--timeout`, `--backend`.

use std::time::Duration;

use clap::ValueEnum;
use wpd_proto::v1::Backend;

/// `--backend` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// perf_event_open hardware breakpoints; the target never stops
    Perf,
    /// ptrace: a hit holds its thread (a breakpoint whose BPF program signals it, or the debug registers where bpf() is refused)
    Ptrace,
}

/// Proto value of an optional `--backend` (unset: the daemon's default).
pub fn backend_value(b: Option<BackendArg>) -> i32 {
    let b = match b {
        None => Backend::Unspecified,
        Some(BackendArg::Perf) => Backend::Perf,
        Some(BackendArg::Ptrace) => Backend::Ptrace,
    };
    b as i32
}

/// Process and thread ids: positive 32-bit integers.
pub fn pid_parser() -> clap::builder::RangedI64ValueParser<i32> {
    clap::value_parser!(i32).range(1..)
}

/// Parses an address: `0x`-prefixed hex or decimal, `_` allowed as a separator.
pub fn parse_addr(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    if t.is_empty() {
        return Err("empty address".into());
    }
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if h.is_empty() {
            return Err("no hex digits after 0x".into());
        }
        return u64::from_str_radix(h, 16).map_err(|e| match e.kind() {
            std::num::IntErrorKind::PosOverflow => "address does not fit in 64 bits".into(),
            _ => format!("{h:?} is not a hex number"),
        });
    }
    t.parse::<u64>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow => "address does not fit in 64 bits".into(),
        _ if t.starts_with('-') => "address cannot be negative".into(),
        _ if t.chars().all(|c| c.is_ascii_hexdigit()) => {
            format!("{t:?} is not a decimal number (write hex with a 0x prefix: 0x{t})")
        }
        _ => format!("{t:?} is neither 0x-prefixed hex nor decimal"),
    })
}

/// Parses `--timeout`: positive seconds, fractions allowed.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err("timeout must be more than 0 seconds".into());
    }
    Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Exit;
    use crate::parse;

    #[test]
    fn addresses() {
        fn check(input: &str, expected: Result<u64, &str>) {
            let got = parse_addr(input);
            match expected {
                Ok(v) => assert_eq!(got, Ok(v), "parse_addr({input:?})"),
                Err(part) => {
                    let msg = got.expect_err(input);
                    assert!(msg.contains(part), "parse_addr({input:?}) = {msg:?}");
                    assert!(!msg.contains('\n'));
                }
            }
        }
        check("0x55d0c0a01040", Ok(0x55d0c0a01040));
        check("0X10", Ok(16));
        check("0xDEADbeef", Ok(0xdead_beef));
        check("4096", Ok(4096));
        check("0", Ok(0));
        check("0x7fff_ffff_f000", Ok(0x7fff_ffff_f000));
        check("0xffffffffffffffff", Ok(u64::MAX));
        check(" 0x10 ", Ok(16));
        check("", Err("empty address"));
        check("0x", Err("no hex digits"));
        check("0xzz", Err("not a hex number"));
        check("0x1ffffffffffffffff", Err("64 bits"));
        check("18446744073709551616", Err("64 bits"));
        check("-1", Err("negative"));
        check("55d0c0a01040", Err("0x55d0c0a01040"));
        check("abc", Err("0xabc"));
        check("foo", Err("neither"));
    }

    #[test]
    fn address_errors_are_usage_errors() {
        let err = parse(&["watch", "--pid", "1", "--addr", "0xzz"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert_eq!(err.exit_code(), Exit::Usage as i32);
    }
}
