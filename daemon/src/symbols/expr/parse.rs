//! The parser of the expression grammar (the module's doc): a recursive
//! descent over the text, each refusal saying what is wrong and where.

use super::{Expr, ExprError, Node, TypeName};

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

/// Words that start a type name (C's type specifiers and qualifiers).
const TYPE_WORDS: [&str; 15] = [
    "struct", "union", "enum", "class", "const", "volatile", "unsigned", "signed", "long", "short",
    "int", "char", "float", "double", "_Bool",
];

/// Words that make up a base type's name.
const BASE_WORDS: [&str; 11] = [
    "unsigned", "signed", "long", "short", "int", "char", "float", "double", "_Bool", "bool",
    "void",
];

struct Parser<'a> {
    /// The whole text (for positions).
    text: &'a str,
    pos: usize,
    end: usize,
    /// Operators read so far (bounded: the tree is walked recursively).
    ops: usize,
}

/// Operators an expression may have.
const MAX_OPS: usize = 256;

type PResult<T> = Result<T, ExprError>;

impl<'a> Parser<'a> {
    fn err(&self, at: usize, why: impl Into<String>) -> ExprError {
        ExprError {
            text: self.text.to_string(),
            at: Some(at),
            why: why.into(),
        }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..self.end]
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start().len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_ws();
        self.rest().chars().next()
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    /// An identifier, if one starts here.
    fn ident(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let r = self.rest();
        if !r.starts_with(is_ident_start) {
            return None;
        }
        let n = r.find(|c| !is_ident(c)).unwrap_or(r.len());
        self.pos += n;
        Some(&r[..n])
    }

    /// A name: identifiers joined by `::`.
    fn scoped(&mut self) -> Option<String> {
        let mut name = self.ident()?.to_string();
        loop {
            let save = self.pos;
            if self.rest().starts_with("::")
                && let Some(next) = {
                    self.pos += 2;
                    self.ident()
                }
            {
                name.push_str("::");
                name.push_str(next);
                continue;
            }
            self.pos = save;
            return Some(name);
        }
    }

    /// A number token (digits, letters, `_`: the whole token, for its error).
    fn number_token(&mut self, what: &str) -> PResult<u64> {
        self.skip_ws();
        let at = self.pos;
        let r = self.rest();
        let n = r
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(r.len());
        let tok = &r[..n];
        let v = number(tok).ok_or_else(|| {
            if tok.is_empty() {
                self.err(at, format!("{what} must be a number"))
            } else {
                self.err(at, format!("{what} must be a number, not {tok:?}"))
            }
        })?;
        self.pos += n;
        Ok(v)
    }

    /// `(type)` at `(`, if what follows the parenthesis is a type name:
    /// it starts with a C type word, or is one name with `*`s, or one name
    /// followed by something a cast applies to (`(uint32_t)x`).
    fn try_cast(&mut self) -> PResult<Option<TypeName>> {
        let open = self.pos;
        debug_assert!(self.rest().starts_with('('));
        self.pos += 1;
        let save = self.pos;
        let Some(first) = self.ident() else {
            self.pos = open;
            return Ok(None);
        };
        let keyword = TYPE_WORDS.contains(&first) || first == "void";
        self.pos = save;
        let mut words: Vec<String> = Vec::new();
        let mut tag = false;
        let word_at = self.pos;
        loop {
            let before = self.pos;
            let Some(w) = self.scoped() else { break };
            match w.as_str() {
                "const" | "volatile" | "restrict" => continue,
                "struct" | "union" | "enum" | "class" => {
                    if !words.is_empty() {
                        return Err(self.err(before, format!("{w:?} cannot follow a type name")));
                    }
                    self.skip_ws();
                    let at = self.pos;
                    let Some(n) = self.scoped() else {
                        return Err(self.err(at, format!("{w:?} must be followed by its name")));
                    };
                    words.push(format!("{w} {n}"));
                    tag = true;
                }
                _ if tag => {
                    self.pos = before;
                    break;
                }
                _ if words.is_empty() || BASE_WORDS.contains(&w.as_str()) => {
                    if !words.is_empty()
                        && !BASE_WORDS.contains(&words.last().map(String::as_str).unwrap_or(""))
                    {
                        self.pos = before;
                        break;
                    }
                    words.push(w);
                }
                _ => {
                    self.pos = before;
                    break;
                }
            }
        }
        let mut stars = 0;
        loop {
            if self.eat("*") {
                stars += 1;
            } else if self.eat("const") || self.eat("volatile") || self.eat("restrict") {
            } else {
                break;
            }
        }
        if !self.eat(")") {
            if keyword {
                let at = {
                    self.skip_ws();
                    self.pos
                };
                return Err(self.err(at, "expected ')' to end the type name of the cast"));
            }
            // A parenthesized expression.
            self.pos = open;
            return Ok(None);
        }
        if words.is_empty() {
            return Err(self.err(word_at, "a cast needs a type name"));
        }
        // `(x)` alone is a parenthesized name, unless something follows
        // that a cast applies to.
        if !keyword && stars == 0 && words.len() == 1 {
            let next = self.peek();
            let applies = next.is_some_and(|c| {
                is_ident_start(c) || c.is_ascii_digit() || c == '(' || c == '*' || c == '&'
            });
            if !applies {
                self.pos = open;
                return Ok(None);
            }
        }
        Ok(Some(TypeName {
            base: words.join(" "),
            stars,
        }))
    }

    /// Counts one operator at `at`.
    fn op(&mut self, at: usize) -> PResult<()> {
        self.ops += 1;
        if self.ops > MAX_OPS {
            return Err(self.err(at, format!("it has more than {MAX_OPS} operators")));
        }
        Ok(())
    }

    fn unary(&mut self, depth: usize) -> PResult<Node> {
        if depth > 64 {
            return Err(self.err(self.pos, "it nests more than 64 levels deep"));
        }
        self.skip_ws();
        self.op(self.pos)?;
        match self.peek() {
            Some('*') => {
                self.pos += 1;
                Ok(Node::Deref(Box::new(self.unary(depth + 1)?)))
            }
            Some('&') => {
                self.pos += 1;
                Ok(Node::AddrOf(Box::new(self.unary(depth + 1)?)))
            }
            Some('(') => match self.try_cast()? {
                Some(t) => Ok(Node::Cast(t, Box::new(self.unary(depth + 1)?))),
                None => self.postfix(depth),
            },
            _ => self.postfix(depth),
        }
    }

    fn primary(&mut self, depth: usize) -> PResult<Node> {
        self.skip_ws();
        let at = self.pos;
        match self.peek() {
            Some('(') => {
                self.pos += 1;
                let inner = self.unary(depth + 1)?;
                if !self.eat(")") {
                    self.skip_ws();
                    return Err(self.err(self.pos, format!("expected ')' to close the '(' of column {}", self.text[..at].chars().count() + 1)));
                }
                Ok(inner)
            }
            Some(c) if c.is_ascii_digit() => {
                let r = self.rest();
                let n = r
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(r.len());
                let v = number(&r[..n]).ok_or_else(|| {
                    self.err(
                        at,
                        format!(
                            "{:?} is not a number, and a name must start with a letter, '_' or '$'",
                            &r[..n]
                        ),
                    )
                })?;
                self.pos += n;
                Ok(Node::Number(v))
            }
            Some(c) if is_ident_start(c) => Ok(Node::Name(self.scoped().expect("starts one"))),
            Some(c) => Err(self.err(
                at,
                format!("expected a name, a number or '(', not {c:?} (a name must start with a letter, '_' or '$')"),
            )),
            None => Err(self.err(
                at,
                "expected a name, a number or '(' (a name must start with a letter, '_' or '$')",
            )),
        }
    }

    fn postfix(&mut self, depth: usize) -> PResult<Node> {
        let mut e = self.primary(depth)?;
        loop {
            self.skip_ws();
            let r = self.rest();
            if r.starts_with('.') || r.starts_with("->") || r.starts_with('[') {
                self.op(self.pos)?;
            }
            if r.starts_with('.') {
                self.pos += 1;
                let at = self.pos;
                match self.member_name() {
                    Some(m) => e = Node::Member(Box::new(e), m),
                    None => return Err(self.err(at, "'.' must be followed by a member name")),
                }
            } else if r.starts_with("->") {
                self.pos += 2;
                let at = self.pos;
                match self.member_name() {
                    Some(m) => e = Node::Arrow(Box::new(e), m),
                    None => return Err(self.err(at, "'->' must be followed by a member name")),
                }
            } else if r.starts_with('[') {
                let open = self.pos;
                self.pos += 1;
                if !self.rest().contains(']') {
                    return Err(self.err(open, "'[' without ']'"));
                }
                let i = self.number_token("an index")?;
                if !self.eat("]") {
                    self.skip_ws();
                    return Err(self.err(self.pos, "an index must be a number, then ']'"));
                }
                e = Node::Index(Box::new(e), i);
            } else {
                return Ok(e);
            }
        }
    }

    fn member_name(&mut self) -> Option<String> {
        self.skip_ws();
        let r = self.rest();
        if !r.starts_with(is_ident_start) {
            return None;
        }
        self.ident().map(str::to_string)
    }
}

impl Expr {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Expr, ExprError> {
        let whole = |why: &str| ExprError {
            text: text.to_string(),
            at: None,
            why: why.to_string(),
        };
        if text.trim().is_empty() {
            return Err(whole("it is empty"));
        }
        if text.len() > 4096 {
            return Err(whole("it is longer than 4096 bytes"));
        }
        // The module: up to the first ':' that is not part of '::'.
        let b = text.as_bytes();
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
        let (module, start) = match split {
            Some(at) => {
                let m = text[..at].trim();
                if m.is_empty() {
                    return Err(ExprError {
                        text: text.to_string(),
                        at: Some(at),
                        why: "the module before ':' is empty".into(),
                    });
                }
                (Some(m.to_string()), at + 1)
            }
            None => (None, 0),
        };
        let mut p = Parser {
            text,
            pos: start,
            end: text.len(),
            ops: 0,
        };
        let root = p.unary(0)?;
        // The byte offset, then the end.
        let mut offset = 0i64;
        p.skip_ws();
        if let Some(c) = p.rest().chars().next()
            && (c == '+' || c == '-')
        {
            let at = p.pos;
            p.pos += 1;
            let n = p.number_token("an offset")?;
            let n = i64::try_from(n).map_err(|_| p.err(at, "the offset is too large"))?;
            offset = if c == '-' { -n } else { n };
        }
        p.skip_ws();
        let spaced = p.text[..p.pos].ends_with(char::is_whitespace);
        match p.peek() {
            None => {}
            Some(')') => return Err(p.err(p.pos, "unexpected ')': no '(' matches it")),
            Some(c) if spaced && is_ident(c) => {
                return Err(p.err(p.pos, "spaces are not allowed inside a name"));
            }
            Some(c) => return Err(p.err(p.pos, format!("unexpected {c:?}"))),
        }
        Ok(Expr {
            module,
            name: root.root_name().unwrap_or_default().to_string(),
            root,
            offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Box<Node> {
        Box::new(Node::Name(s.into()))
    }

    fn ok(text: &str, module: Option<&str>, root: Node, offset: i64) {
        let e = Expr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(e.module.as_deref(), module, "{text}");
        assert_eq!(e.root, root, "{text}");
        assert_eq!(e.offset, offset, "{text}");
    }

    fn member(e: Box<Node>, m: &str) -> Box<Node> {
        Box::new(Node::Member(e, m.into()))
    }

    fn arrow(e: Box<Node>, m: &str) -> Box<Node> {
        Box::new(Node::Arrow(e, m.into()))
    }

    fn index(e: Box<Node>, i: u64) -> Box<Node> {
        Box::new(Node::Index(e, i))
    }

    fn ty(base: &str, stars: usize) -> TypeName {
        TypeName {
            base: base.into(),
            stars,
        }
    }

    #[test]
    fn names_modules_members_indices_offsets() {
        ok("counter", None, Node::Name("counter".into()), 0);
        ok(" counter ", None, Node::Name("counter".into()), 0);
        ok("libfoo.so:counter", Some("libfoo.so"), *name("counter"), 0);
        ok(
            "/usr/lib/libfoo.so.1:x",
            Some("/usr/lib/libfoo.so.1"),
            *name("x"),
            0,
        );
        ok("stats.errors", None, *member(name("stats"), "errors"), 0);
        ok(
            "stats.flags[2]",
            None,
            *index(member(name("stats"), "flags"), 2),
            0,
        );
        ok(
            "a[0x10].b[3]",
            None,
            *index(member(index(name("a"), 16), "b"), 3),
            0,
        );
        ok("stats+8", None, *name("stats"), 8);
        ok("stats+0x10", None, *name("stats"), 16);
        ok("stats.name-1", None, *member(name("stats"), "name"), -1);
        ok("ns::inner::var", None, *name("ns::inner::var"), 0);
        ok(
            "lib.so:main::count",
            Some("lib.so"),
            *name("main::count"),
            0,
        );
        ok("_$x1", None, *name("_$x1"), 0);
        ok(
            "cfg->conns[2].state",
            None,
            *member(index(arrow(name("cfg"), "conns"), 2), "state"),
            0,
        );
        ok("p->a-1", None, *arrow(name("p"), "a"), -1);
        assert_eq!(
            Expr::parse("lib.so:main::count").unwrap().name,
            "main::count"
        );
    }

    #[test]
    fn postfix_binds_tighter_than_prefix() {
        // *head.next->next is *((head.next)->next)
        ok(
            "*head.next->next",
            None,
            Node::Deref(arrow(member(name("head"), "next"), "next")),
            0,
        );
        // &a[2] is &(a[2]); (&a)[2] is not.
        ok("&a[2]", None, Node::AddrOf(index(name("a"), 2)), 0);
        ok(
            "(&a)[2]",
            None,
            *index(Box::new(Node::AddrOf(name("a"))), 2),
            0,
        );
        // A cast applies to the whole postfix expression after it.
        ok(
            "(struct conn *)p->next",
            None,
            Node::Cast(ty("struct conn", 1), arrow(name("p"), "next")),
            0,
        );
        ok(
            "((struct conn *)p)->next",
            None,
            *arrow(
                Box::new(Node::Cast(ty("struct conn", 1), name("p"))),
                "next",
            ),
            0,
        );
        ok(
            "((struct conn *)0x7f0012345678)->state",
            None,
            *arrow(
                Box::new(Node::Cast(
                    ty("struct conn", 1),
                    Box::new(Node::Number(0x7f00_1234_5678)),
                )),
                "state",
            ),
            0,
        );
        ok(
            "*(int *)0x1000",
            None,
            Node::Deref(Box::new(Node::Cast(
                ty("int", 1),
                Box::new(Node::Number(0x1000)),
            ))),
            0,
        );
        ok(
            "*&x",
            None,
            Node::Deref(Box::new(Node::AddrOf(name("x")))),
            0,
        );
        ok(
            "(*p).a",
            None,
            *member(Box::new(Node::Deref(name("p"))), "a"),
            0,
        );
        ok(
            "(&arr[2])->f",
            None,
            *arrow(Box::new(Node::AddrOf(index(name("arr"), 2))), "f"),
            0,
        );
        ok("((x))", None, *name("x"), 0);
        ok("*a+4", None, Node::Deref(name("a")), 4);
    }

    #[test]
    fn type_names_in_casts() {
        for (text, base, stars) in [
            ("(uint32_t)x", "uint32_t", 0),
            ("(unsigned long)x", "unsigned long", 0),
            ("(unsigned long int *)x", "unsigned long int", 1),
            ("(const char **)x", "char", 2),
            ("(struct conn*)x", "struct conn", 1),
            ("( union u * * ) x", "union u", 2),
            ("(enum mode)x", "enum mode", 0),
            ("(conn_t *)x", "conn_t", 1),
            ("(ns::T *)x", "ns::T", 1),
            ("(int)(x)", "int", 0),
            ("(T)*p", "T", 0),
            ("(T)&x", "T", 0),
            ("(T)0x10", "T", 0),
        ] {
            let e = Expr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let Node::Cast(t, _) = &e.root else {
                panic!("{text}: not a cast: {:?}", e.root)
            };
            assert_eq!((t.base.as_str(), t.stars), (base, stars), "{text}");
        }
        // A name in parentheses alone, or before an operator, is no cast.
        ok("(x).a", None, *member(name("x"), "a"), 0);
        ok("(x)", None, *name("x"), 0);
        ok("(x)+4", None, *name("x"), 4);
    }

    #[test]
    fn refusals_say_what_is_wrong_and_where() {
        for (text, why, column) in [
            ("", "empty", None),
            (":x", "module before ':' is empty", Some(1)),
            ("1abc", "\"1abc\" is not a number", Some(1)),
            ("a.", "followed by a member name", Some(3)),
            ("a.1", "followed by a member name", Some(3)),
            ("a[", "'[' without ']'", Some(2)),
            ("a[x]", "index must be a number", Some(3)),
            ("a+", "offset must be a number", Some(3)),
            ("a+b", "offset must be a number", Some(3)),
            ("a b", "spaces", Some(3)),
            ("a*b", "unexpected '*'", Some(2)),
            ("a->", "'->' must be followed by a member name", Some(4)),
            ("a->1", "'->' must be followed by a member name", Some(4)),
            ("*", "expected a name, a number or '('", Some(2)),
            ("lib.so:", "expected a name", Some(8)),
            ("(a", "expected ')' to close the '(' of column 1", Some(3)),
            ("((struct conn *)p->x", "expected ')'", Some(21)),
            ("a)", "no '(' matches it", Some(2)),
            (
                "(struct conn *p)->x",
                "expected ')' to end the type name",
                Some(15),
            ),
            (
                "(struct *)p",
                "\"struct\" must be followed by its name",
                Some(9),
            ),
            ("()x", "expected a name", Some(2)),
            ("&", "expected a name", Some(2)),
            ("(int *)", "expected a name", Some(8)),
        ] {
            let e = Expr::parse(text).expect_err(text);
            let s = e.to_string();
            assert!(s.contains(why), "{text:?}: {s}");
            match column {
                Some(c) => assert!(s.contains(&format!("at column {c} ")), "{text:?}: {s}"),
                None => assert!(!s.contains("at column"), "{text:?}: {s}"),
            }
            assert!(!s.contains('\n'), "{text:?}: one line");
        }
        let deep = format!("{}x", "*".repeat(100));
        assert!(Expr::parse(&deep).unwrap_err().why.contains("64 levels"));
        let long = format!("a{}", "[0]".repeat(300));
        assert!(
            Expr::parse(&long)
                .unwrap_err()
                .why
                .contains("256 operators")
        );
        let long = format!("a{}", ".b".repeat(200));
        assert!(Expr::parse(&long).is_ok());
    }
}
