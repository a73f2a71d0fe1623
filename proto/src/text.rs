//! Text a watched program chooses (thread and process names, paths, DWARF
//! names), made safe for wherever it is shown or sent.
//!
//! A thread name is 15 bytes the program sets with `prctl(PR_SET_NAME)`:
//! it may hold a newline (which ends a NATS or HTTP header, a log line or a
//! `[host]`-tagged output line), an escape sequence (which moves a
//! terminal's cursor or rewrites its title), a right-to-left override
//! (which shows text other than what is there), or bytes that are not
//! UTF-8. [`escape`] writes every such character as a visible escape, so
//! what comes out is one printable line that names the same bytes, and
//! plain names pass unchanged (no allocation). [`location_text`] shows a
//! place (function, file:line) built from such names, as `wpctl` prints it.
//!
//! Escapes: `\\` for a backslash, `\n`, `\r`, `\t`, `\xNN` for other C0
//! controls and DEL, `\u{NNNN}` for C1 controls, bidirectional overrides
//! and isolates, line and paragraph separators, and the replacement
//! character that stands for bytes that were not UTF-8.

use std::borrow::Cow;
use std::fmt::Write;

use crate::v1::Location;

/// Whether `c` is shown as an escape.
fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}'                  // left-to-right / right-to-left marks
            | '\u{2028}' | '\u{2029}'                // line / paragraph separators
            | '\u{202a}'..='\u{202e}'                // embeddings and overrides
            | '\u{2066}'..='\u{2069}'                // isolates
            | '\u{feff}'                             // zero-width no-break space (BOM)
            | '\u{fffd}' // replacement: bytes that were not UTF-8
        )
}

/// `s` with every control, bidirectional-formatting character and
/// backslash escaped: one line of printable text, safe in a terminal, a
/// log line, a header value or a label. Unchanged (borrowed) when nothing
/// needs escaping.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !needs_escape(c) {
            out.push(c);
            continue;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// Bytes a program chose (a `comm`, a path read from `/proc`) as text:
/// invalid UTF-8 becomes U+FFFD, then [`escape`]d.
pub fn escape_bytes(b: &[u8]) -> String {
    escape(&String::from_utf8_lossy(b)).into_owned()
}

/// Whether `s` would pass through [`escape`] unchanged.
pub fn is_plain(s: &str) -> bool {
    !s.chars().any(needs_escape)
}

/// A file's name from its path (`/usr/lib/libfoo.so` → `libfoo.so`).
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A place as `wpctl` (and `wpd-demo`) shows it: `bump_counter
/// (ctarget.c:61)`, `bump_counter+0x12 (libfoo.so+0x1234)` without line
/// information, or the raw address when nothing is known; then each
/// function its code was inlined into (`write_volatile<u64> (mod.rs:2178)
/// inlined in store (wpd-target.rs:91)`). Every name is [`escape`]d.
pub fn location_text(l: &Location) -> String {
    let module = escape(file_name(&l.module));
    let function = escape(&l.function);
    let func = match (l.function.is_empty(), l.function_offset) {
        (true, _) => None,
        (false, _) if l.line > 0 => Some(function.into_owned()),
        (false, 0) => Some(function.into_owned()),
        (false, off) => Some(format!("{function}+{off:#x}")),
    };
    let place = if l.line > 0 && !l.file.is_empty() {
        Some(format!("{}:{}", escape(file_name(&l.file)), l.line))
    } else if !module.is_empty() {
        Some(format!("{module}+{:#x}", l.module_address))
    } else {
        None
    };
    let mut s = match (func, place) {
        (Some(f), Some(p)) => format!("{f} ({p})"),
        (Some(f), None) => f,
        (None, Some(p)) => p,
        (None, None) => format!("{:#x}", l.ip),
    };
    for i in &l.inlined {
        s.push_str(&format!(" inlined in {}", escape(&i.function)));
        if i.line > 0 {
            s.push_str(&format!(" ({}:{})", escape(file_name(&i.file)), i.line));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &str) {
        assert_eq!(escape(input), expected, "escape({input:?})");
        assert!(is_plain(&escape(input)) || escape(input).contains('\\'));
    }

    #[test]
    fn plain_names_pass_unchanged_without_copy() {
        for s in ["pool-3", "worker/12", "Ünïcødé", "日本語", "", "a b"] {
            assert!(matches!(escape(s), Cow::Borrowed(_)), "{s:?}");
            assert!(is_plain(s));
        }
    }

    #[test]
    fn controls_and_separators_become_visible_escapes() {
        check("evil\nname", "evil\\nname");
        check("a\r\nb\tc", "a\\r\\nb\\tc");
        check("\x1b[2J\x1b]0;title\x07", "\\x1b[2J\\x1b]0;title\\x07");
        check("nul\0del\x7f", "nul\\x00del\\x7f");
        check("c1\u{85}\u{9b}", "c1\\u{0085}\\u{009b}");
        check("back\\slash", "back\\\\slash");
        check("\u{202e}gpj.exe", "\\u{202e}gpj.exe");
        check("iso\u{2066}x\u{2069}", "iso\\u{2066}x\\u{2069}");
        check("ls\u{2028}ps\u{2029}", "ls\\u{2028}ps\\u{2029}");
    }

    #[test]
    fn escaped_text_never_holds_a_line_break_or_escape_character() {
        // Every char from 0 to 0x3000, one at a time and all at once.
        let all: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        let e = escape(&all);
        assert!(!e.contains(['\n', '\r', '\x1b', '\u{85}', '\u{2028}', '\u{202e}']));
        assert!(e.chars().all(|c| !c.is_control()));
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_as_such() {
        assert_eq!(escape_bytes(b"ok"), "ok");
        assert_eq!(escape_bytes(b"bad\xff\xfe"), "bad\\u{fffd}\\u{fffd}");
    }

    #[test]
    fn an_escaped_backslash_cannot_forge_an_escape() {
        // A name that spells an escape is told apart from one that holds
        // the character.
        assert_ne!(escape("a\\nb"), escape("a\nb"));
    }

    #[test]
    fn a_location_reads_as_function_and_line_or_what_is_known() {
        use crate::v1::InlinedCall;
        let full = Location {
            ip: 0x5555_0000_1234,
            function: "bump_counter".into(),
            function_offset: 0x12,
            file: "/src/ct/ctarget.c".into(),
            line: 61,
            module: "/usr/bin/ct-pie".into(),
            module_address: 0x1234,
            ..Default::default()
        };
        let no_line = Location {
            file: String::new(),
            line: 0,
            ..full.clone()
        };
        let inlined = Location {
            function: "write_volatile<u64>".into(),
            file: "/rustc/x/library/core/src/ptr/mod.rs".into(),
            line: 2178,
            inlined: vec![InlinedCall {
                function: "wpd_target::AlignedU64::store".into(),
                file: "/w/tests/src/bin/wpd-target.rs".into(),
                line: 91,
            }],
            ..full.clone()
        };
        let module_only = Location {
            function: String::new(),
            ..no_line.clone()
        };
        let nothing = Location {
            ip: 0x5555_0000_1234,
            ..Default::default()
        };
        let evil = Location {
            function: "f\n\x1b[2J".into(),
            ..full.clone()
        };
        for (l, want) in [
            (&full, "bump_counter (ctarget.c:61)"),
            (&no_line, "bump_counter+0x12 (ct-pie+0x1234)"),
            (
                &inlined,
                "write_volatile<u64> (mod.rs:2178) inlined in wpd_target::AlignedU64::store \
                 (wpd-target.rs:91)",
            ),
            (&module_only, "ct-pie+0x1234"),
            (&nothing, "0x555500001234"),
            (&evil, "f\\n\\x1b[2J (ctarget.c:61)"),
        ] {
            assert_eq!(location_text(l), want, "{l:?}");
        }
    }
}
