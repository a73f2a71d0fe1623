//! The expressions a watchpoint can be set by: a small part of C over the
//! types DWARF describes.
//!
//! ```text
//! expr    := [module ':'] unary [('+' | '-') number]
//! unary   := '*' unary | '&' unary | '(' type ')' unary | postfix
//! postfix := primary ('.' member | '->' member | '[' number ']')*
//! primary := name ('::' name)* | number | '(' unary ')'
//! type    := [const|volatile] (struct|union|enum|class) name | type words | typedef name, then '*'s
//! ```
//!
//! As in C, the postfix operators (`.`, `->`, `[]`) bind tighter than the
//! prefix ones (`*`, `&`, casts): `*a.b` is `*(a.b)`, `&a[2]` is `&(a[2])`,
//! `(struct conn *)p->next` casts `p->next`. `->`, `*` and `[index]` of a
//! pointer follow pointers: their values are read from the process when the
//! expression is resolved. The trailing `+offset` / `-offset` (decimal or
//! `0x` hex) is in bytes, from the object the rest designates.
//!
//! `module` is a module's file name (`libfoo.so`, or a prefix of it up to a
//! dot: `libc.so` names `libc.so.6`) or its full path; it is whatever comes
//! before the first single `:` (a `::` belongs to the name: `ns::var`,
//! `function::static_var`).
//!
//! This file holds the expression's tree and how it is written back;
//! `parse.rs` reads it from text.

mod parse;

use std::fmt;

/// A type as written in a cast: its name and the pointer levels after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeName {
    /// `struct conn`, `uint32_t`, `unsigned long` (qualifiers dropped,
    /// words as written, single spaces).
    pub base: String,
    /// The `*`s after it.
    pub stars: usize,
}

impl fmt::Display for TypeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)?;
        if self.stars > 0 {
            write!(f, " {}", "*".repeat(self.stars))?;
        }
        Ok(())
    }
}

/// A node of an expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A variable (`a::b` for a scoped one).
    Name(String),
    /// A number (an address, once cast to a pointer type).
    Number(u64),
    /// `e.member`.
    Member(Box<Node>, String),
    /// `e->member`.
    Arrow(Box<Node>, String),
    /// `e[index]`.
    Index(Box<Node>, u64),
    /// `*e`.
    Deref(Box<Node>),
    /// `&e`.
    AddrOf(Box<Node>),
    /// `(type)e`.
    Cast(TypeName, Box<Node>),
}

impl Node {
    /// The variable the expression starts from, if any.
    pub fn root_name(&self) -> Option<&str> {
        match self {
            Node::Name(n) => Some(n),
            Node::Number(_) => None,
            Node::Member(e, _)
            | Node::Arrow(e, _)
            | Node::Index(e, _)
            | Node::Deref(e)
            | Node::AddrOf(e)
            | Node::Cast(_, e) => e.root_name(),
        }
    }

    /// Every type name a cast in it names, outermost first.
    pub fn type_names(&self) -> Vec<&TypeName> {
        let mut out = Vec::new();
        let mut n = self;
        loop {
            match n {
                Node::Name(_) | Node::Number(_) => return out,
                Node::Cast(t, e) => {
                    out.push(t);
                    n = e;
                }
                Node::Member(e, _)
                | Node::Arrow(e, _)
                | Node::Index(e, _)
                | Node::Deref(e)
                | Node::AddrOf(e) => n = e,
            }
        }
    }

    /// Whether resolving it reads pointers from the process.
    pub fn follows_pointers(&self) -> bool {
        match self {
            Node::Name(_) | Node::Number(_) => false,
            Node::Arrow(..) | Node::Deref(_) => true,
            Node::Member(e, _) | Node::Index(e, _) | Node::AddrOf(e) | Node::Cast(_, e) => {
                e.follows_pointers()
            }
        }
    }

    /// A prefix form (`*e`, `&e`, a cast): a postfix operator after it
    /// needs parentheses around it.
    fn is_prefix(&self) -> bool {
        matches!(self, Node::Deref(_) | Node::AddrOf(_) | Node::Cast(..))
    }

    fn write_postfix_operand(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_prefix() {
            write!(f, "({self})")
        } else {
            write!(f, "{self}")
        }
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Name(n) => f.write_str(n),
            Node::Number(n) => write!(f, "{n:#x}"),
            Node::Member(e, m) => {
                e.write_postfix_operand(f)?;
                write!(f, ".{m}")
            }
            Node::Arrow(e, m) => {
                e.write_postfix_operand(f)?;
                write!(f, "->{m}")
            }
            Node::Index(e, i) => {
                e.write_postfix_operand(f)?;
                write!(f, "[{i}]")
            }
            Node::Deref(e) => write!(f, "*{e}"),
            Node::AddrOf(e) => write!(f, "&{e}"),
            Node::Cast(t, e) => write!(f, "({t}){e}"),
        }
    }
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    /// The module asked for, if any.
    pub module: Option<String>,
    /// The variable it starts from (empty when it starts from a number).
    pub name: String,
    /// The expression.
    pub root: Node,
    /// Bytes added at the end.
    pub offset: i64,
}

impl Expr {
    /// Whether resolving it reads pointers from the process.
    pub fn follows_pointers(&self) -> bool {
        self.root.follows_pointers()
    }

    /// Nothing but a name (and an offset): what a symbol table alone can
    /// resolve.
    pub fn is_bare_name(&self) -> bool {
        matches!(self.root, Node::Name(_))
    }

    /// The part after the module, as written canonically
    /// (`stats.flags[2]+1`).
    pub fn path(&self) -> String {
        let mut s = self.root.to_string();
        match self.offset {
            0 => {}
            o if o > 0 => s.push_str(&format!("+{o}")),
            o => s.push_str(&format!("{o}")),
        }
        s
    }
}

/// Why an expression does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {text:?} as an expression: {why}{}", where_(text, *at))]
pub struct ExprError {
    /// The expression.
    pub text: String,
    /// Byte offset in `text` where reading stopped, when it is one place.
    pub at: Option<usize>,
    /// What is wrong.
    pub why: String,
}

/// ` at column N ("rest")` for an error at byte `at` of `text`.
fn where_(text: &str, at: Option<usize>) -> String {
    let Some(at) = at.filter(|&a| a <= text.len() && text.is_char_boundary(a)) else {
        return String::new();
    };
    let column = text[..at].chars().count() + 1;
    let rest: String = text[at..].chars().take(24).collect();
    if rest.is_empty() {
        format!(" at column {column} (the end)")
    } else {
        format!(" at column {column} ({rest:?})")
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

    #[test]
    fn display_is_canonical_and_parses_back() {
        for text in [
            "cfg->conns[2].state",
            "*head.next->next",
            "**pp",
            "p->a+4",
            "&a.b[1]",
            "(*p).a",
            "((struct conn *)0x7f00)->state",
            "*(int *)0x1000",
            "(unsigned int)x",
            "(&arr[2])->f",
            "*&x",
            "lib.so:((T **)g)[1]",
        ] {
            let e = Expr::parse(text).unwrap();
            assert_eq!(e.to_string(), text);
            assert_eq!(Expr::parse(&e.to_string()).unwrap(), e, "{text}");
        }
        let e = Expr::parse("libx.so:s.a[0x2]+0x4").unwrap();
        assert_eq!(e.to_string(), "libx.so:s.a[2]+4");
        assert_eq!(e.path(), "s.a[2]+4");
        assert_eq!(
            Expr::parse("( struct conn * ) 0x10 -> state")
                .unwrap()
                .to_string(),
            "(struct conn *)0x10->state"
        );
        assert!(Expr::parse("a->b").unwrap().follows_pointers());
        assert!(Expr::parse("*(int *)&a").unwrap().follows_pointers());
        assert!(!Expr::parse("a.b[1]").unwrap().follows_pointers());
        assert!(!Expr::parse("&a.b").unwrap().follows_pointers());
    }
}
