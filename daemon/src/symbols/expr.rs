//! The name expressions a watchpoint can be set by:
//! `[module:]name[::name]…` followed by any of `.member`, `->member` and
//! `[index]`, and an optional `+offset` or `-offset` (decimal or `0x` hex)
//! in bytes; a leading `*` dereferences the whole (`*cfg.current`). `->`,
//! `*` and `[index]` of a pointer follow pointers: their values are read
//! from the process when the name is resolved.
//!
//! `module` is a module's file name (`libfoo.so`, or a prefix of it up to a
//! dot: `libc.so` names `libc.so.6`) or its full path; it is whatever comes
//! before the first single `:` (a `::` belongs to the name: `ns::var`,
//! `function::static_var`).

use std::fmt;

/// One step into an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `.member` of a struct or union.
    Member(String),
    /// `[index]` of an array, or of a pointer (the element that far from
    /// where it points).
    Index(u64),
    /// Following a pointer: `*` (or the `->` of `->member`).
    Deref,
}

/// A parsed name expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    /// The module asked for, if any.
    pub module: Option<String>,
    /// The symbol's name (`a::b` for a scoped one).
    pub name: String,
    /// Members and elements, in order.
    pub steps: Vec<Step>,
    /// Bytes added at the end.
    pub offset: i64,
}

impl Expr {
    /// Whether resolving it reads pointers from the process (`->`, `*`;
    /// an `[index]` of a pointer is seen only when walking the types).
    pub fn follows_pointers(&self) -> bool {
        self.steps.contains(&Step::Deref)
    }
}

/// Why an expression does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot read {text:?} as a name: {why} (expected [module:]name[.member][[index]][+offset])"
)]
pub struct ExprError {
    /// The expression.
    pub text: String,
    /// What is wrong.
    pub why: String,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == '$'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$'
}

fn number(s: &str) -> Option<u64> {
    let s = s.replace('_', "");
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) if !h.is_empty() => u64::from_str_radix(h, 16).ok(),
        Some(_) => None,
        None if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        None => None,
    }
}

impl Expr {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        let err = |why: &str| ExprError {
            text: text.to_string(),
            why: why.to_string(),
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(err("it is empty"));
        }
        if t.len() > 4096 {
            return Err(err("it is longer than 4096 bytes"));
        }
        // The module: up to the first ':' that is not part of '::'.
        let b = t.as_bytes();
        let mut split = None;
        let mut i = 0;
        while i < b.len() {
            if b[i] == b':' {
                if i + 1 < b.len() && b[i + 1] == b':' {
                    i += 2;
                    continue;
                }
                split = Some(i);
                break;
            }
            i += 1;
        }
        let (module, mut rest) = match split {
            Some(at) => {
                let m = t[..at].trim();
                if m.is_empty() {
                    return Err(err("the module before ':' is empty"));
                }
                (Some(m.to_string()), &t[at + 1..])
            }
            None => (None, t),
        };
        // Leading '*': each follows the pointer the rest designates.
        let mut derefs = 0usize;
        while let Some(r) = rest.strip_prefix('*') {
            derefs += 1;
            rest = r.trim_start();
        }
        let mut chars = rest.char_indices().peekable();
        // The name: identifiers joined by '::'.
        let mut name = String::new();
        loop {
            match chars.peek() {
                Some(&(_, c)) if is_ident_start(c) => {}
                _ => return Err(err("a name must start with a letter, '_' or '$'")),
            }
            while let Some(&(_, c)) = chars.peek() {
                if !is_ident(c) {
                    break;
                }
                name.push(c);
                chars.next();
            }
            let at = chars.peek().map(|&(i, _)| i);
            if at.is_some_and(|i| rest[i..].starts_with("::")) {
                name.push_str("::");
                chars.next();
                chars.next();
                continue;
            }
            break;
        }
        let mut steps = Vec::new();
        let mut offset = 0i64;
        while let Some(&(i, c)) = chars.peek() {
            match c {
                '.' => {
                    chars.next();
                    let mut m = String::new();
                    while let Some(&(_, c)) = chars.peek() {
                        if !is_ident(c) {
                            break;
                        }
                        m.push(c);
                        chars.next();
                    }
                    if m.is_empty() || !m.starts_with(is_ident_start) {
                        return Err(err("'.' must be followed by a member name"));
                    }
                    steps.push(Step::Member(m));
                }
                '[' => {
                    let Some(close) = rest[i..].find(']') else {
                        return Err(err("'[' without ']'"));
                    };
                    let inner = rest[i + 1..i + close].trim();
                    let n = number(inner).ok_or_else(|| err("an index must be a number"))?;
                    steps.push(Step::Index(n));
                    for _ in 0..rest[i..i + close + 1].chars().count() {
                        chars.next();
                    }
                }
                '-' if rest[i..].starts_with("->") => {
                    chars.next();
                    chars.next();
                    let mut m = String::new();
                    while let Some(&(_, c)) = chars.peek() {
                        if !is_ident(c) {
                            break;
                        }
                        m.push(c);
                        chars.next();
                    }
                    if m.is_empty() || !m.starts_with(is_ident_start) {
                        return Err(err("'->' must be followed by a member name"));
                    }
                    steps.push(Step::Deref);
                    steps.push(Step::Member(m));
                }
                '+' | '-' => {
                    let tail = rest[i + 1..].trim();
                    let n = number(tail).ok_or_else(|| err("an offset must be a number"))?;
                    let n = i64::try_from(n).map_err(|_| err("the offset is too large"))?;
                    offset = if c == '-' { -n } else { n };
                    break;
                }
                c if c.is_whitespace() => return Err(err("spaces are not allowed inside a name")),
                _ => return Err(err(&format!("unexpected {c:?}"))),
            }
        }
        if derefs > 0 && offset != 0 {
            return Err(err(
                "an offset cannot follow a leading '*' (write the member instead)",
            ));
        }
        steps.extend(std::iter::repeat_n(Step::Deref, derefs));
        Ok(Expr {
            module,
            name,
            steps,
            offset,
        })
    }

    /// The part after the module, as written canonically
    /// (`stats.flags[2]+1`).
    pub fn path(&self) -> String {
        let mut s = self.name.clone();
        let mut steps = self.steps.as_slice();
        // Trailing derefs are the leading '*'s.
        let mut stars = 0;
        while let [rest @ .., Step::Deref] = steps {
            stars += 1;
            steps = rest;
        }
        let mut i = 0;
        while i < steps.len() {
            match (&steps[i], steps.get(i + 1)) {
                (Step::Deref, Some(Step::Member(m))) => {
                    s.push_str("->");
                    s.push_str(m);
                    i += 1;
                }
                (Step::Deref, _) => s = format!("(*{s})"),
                (Step::Member(m), _) => {
                    s.push('.');
                    s.push_str(m);
                }
                (Step::Index(n), _) => s.push_str(&format!("[{n}]")),
            }
            i += 1;
        }
        s = format!("{}{s}", "*".repeat(stars));
        match self.offset {
            0 => {}
            o if o > 0 => s.push_str(&format!("+{o}")),
            o => s.push_str(&format!("{o}")),
        }
        s
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(m) = &self.module {
            write!(f, "{m}:")?;
        }
        f.write_str(&self.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str, module: Option<&str>, name: &str, steps: &[Step], offset: i64) {
        let e = Expr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(e.module.as_deref(), module, "{text}");
        assert_eq!(e.name, name, "{text}");
        assert_eq!(e.steps, steps, "{text}");
        assert_eq!(e.offset, offset, "{text}");
    }

    fn m(s: &str) -> Step {
        Step::Member(s.into())
    }

    #[test]
    fn names_modules_members_indices_offsets() {
        ok("counter", None, "counter", &[], 0);
        ok(" counter ", None, "counter", &[], 0);
        ok("libfoo.so:counter", Some("libfoo.so"), "counter", &[], 0);
        ok(
            "/usr/lib/libfoo.so.1:x",
            Some("/usr/lib/libfoo.so.1"),
            "x",
            &[],
            0,
        );
        ok("stats.errors", None, "stats", &[m("errors")], 0);
        ok(
            "stats.flags[2]",
            None,
            "stats",
            &[m("flags"), Step::Index(2)],
            0,
        );
        ok(
            "a[0x10].b[3]",
            None,
            "a",
            &[Step::Index(16), m("b"), Step::Index(3)],
            0,
        );
        ok("stats+8", None, "stats", &[], 8);
        ok("stats+0x10", None, "stats", &[], 16);
        ok("stats.name-1", None, "stats", &[m("name")], -1);
        ok("ns::inner::var", None, "ns::inner::var", &[], 0);
        ok("lib.so:main::count", Some("lib.so"), "main::count", &[], 0);
        ok("_$x1", None, "_$x1", &[], 0);
        ok(
            "cfg->conns[2].state",
            None,
            "cfg",
            &[Step::Deref, m("conns"), Step::Index(2), m("state")],
            0,
        );
        ok(
            "*head.next->next",
            None,
            "head",
            &[m("next"), Step::Deref, m("next"), Step::Deref],
            0,
        );
        ok("p->a-1", None, "p", &[Step::Deref, m("a")], -1);
    }

    #[test]
    fn pointer_paths_display_as_written() {
        for text in ["cfg->conns[2].state", "*head.next->next", "**pp", "p->a+4"] {
            let e = Expr::parse(text).unwrap();
            assert_eq!(e.to_string(), text);
            assert_eq!(Expr::parse(&e.to_string()).unwrap(), e, "{text}");
            assert!(e.follows_pointers(), "{text}");
        }
        assert!(!Expr::parse("a.b[1]").unwrap().follows_pointers());
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        for (text, why) in [
            ("", "empty"),
            (":x", "module before ':' is empty"),
            ("1abc", "must start with a letter"),
            ("a.", "followed by a member name"),
            ("a.1", "followed by a member name"),
            ("a[", "'[' without ']'"),
            ("a[x]", "index must be a number"),
            ("a+", "offset must be a number"),
            ("a+b", "offset must be a number"),
            ("a b", "spaces"),
            ("a*b", "unexpected '*'"),
            ("a->", "'->' must be followed by a member name"),
            ("a->1", "'->' must be followed by a member name"),
            ("*a+4", "offset cannot follow a leading '*'"),
            ("*", "must start with a letter"),
            ("lib.so:", "must start with a letter"),
        ] {
            let e = Expr::parse(text).expect_err(text);
            assert!(e.to_string().contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn displays_canonically() {
        let e = Expr::parse("libx.so:s.a[0x2]+0x4").unwrap();
        assert_eq!(e.to_string(), "libx.so:s.a[2]+4");
        assert_eq!(e.path(), "s.a[2]+4");
    }
}
