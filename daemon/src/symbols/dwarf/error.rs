//! Why a path into a variable fails ([`PathError`]), each reason with what
//! the user can do about it.

use super::Member;

/// Why a path into a variable fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `.member` of something that has none.
    #[error("{what} is {}, not a struct or union: it has no members{hint}", a(ty))]
    NotARecord {
        /// What was walked so far.
        what: String,
        /// Its type.
        ty: String,
        /// More on why (empty, or a hint).
        hint: &'static str,
    },
    /// No such member.
    #[error(
        "{ty} has no member {member:?}{} (members: {})",
        if closest.is_empty() { String::new() } else { format!("; closest: {}", closest.join(", ")) },
        members.join(", ")
    )]
    NoSuchMember {
        /// The record type.
        ty: String,
        /// Asked for.
        member: String,
        /// The closest names among its members.
        closest: Vec<String>,
        /// Those it has (the first 24).
        members: Vec<String>,
    },
    /// A type name the module's DWARF does not define.
    #[error(
        "no type named {name:?} in the module's debug information{}",
        if closest.is_empty() { String::new() } else { format!(" (closest: {})", closest.join(", ")) }
    )]
    UnknownType {
        /// As written.
        name: String,
        /// The closest type names.
        closest: Vec<String>,
    },
    /// A number where an object is meant.
    #[error(
        "{what} is a number, not an object: cast it to a pointer type and follow it \
         (((struct T *){what})->member, *(int *){what})"
    )]
    Number {
        /// The number.
        what: String,
    },
    /// `*` or `->` of a number.
    #[error(
        "{what} is a number, not a pointer: cast it to a pointer type first (*(int *){what}, \
         ((struct T *){what})->member)"
    )]
    NumberNotPointer {
        /// The number.
        what: String,
    },
    /// `&` of something that is not in memory.
    #[error("cannot take the address of {what}: it is a value, not an object in memory")]
    AddressOfValue {
        /// What `&` applied to.
        what: String,
    },
    /// A local whose value cannot be had in this frame.
    #[error("{what} cannot be read in this frame: {why}")]
    LocalUnavailable {
        /// The local.
        what: String,
        /// Why not.
        why: String,
    },
    /// A cast C does not allow, or that cannot be made here.
    #[error("cannot cast {what} to {to}: {why}")]
    BadCast {
        /// What was cast.
        what: String,
        /// To what.
        to: String,
        /// Why not.
        why: String,
    },
    /// `[i]` of something that is not an array.
    #[error("{what} is {}, not an array: it cannot be indexed{hint}", a(ty))]
    NotAnArray {
        /// What was walked so far.
        what: String,
        /// Its type.
        ty: String,
        /// More on why (empty, or a hint).
        hint: &'static str,
    },
    /// Past the end.
    #[error("index {index} is past the end of {what} ({count} elements)")]
    OutOfRange {
        /// What was walked so far.
        what: String,
        /// Asked for.
        index: u64,
        /// Elements.
        count: u64,
    },
    /// `->` or `*` of something that is not a pointer.
    #[error("{what} is {}, not a pointer: it cannot be followed", a(ty))]
    NotAPointer {
        /// What was walked so far.
        what: String,
        /// Its type.
        ty: String,
    },
    /// A null pointer on the way.
    #[error("{what} is a null pointer: there is no object to watch behind it yet")]
    NullPointer {
        /// The pointer.
        what: String,
    },
    /// A pointer whose value could not be read, or that points nowhere
    /// readable.
    #[error("cannot read {what} at {addr:#x} in the process: {why}")]
    Unreadable {
        /// The pointer.
        what: String,
        /// Where it was read.
        addr: u64,
        /// Why not.
        why: String,
    },
    /// `[i]` of a pointer to something without a size.
    #[error("{what} points to {ty}, which has no size: it cannot be indexed")]
    Unsized {
        /// The pointer.
        what: String,
        /// What it points to.
        ty: String,
    },
    /// The DWARF could not be read.
    #[error("the debug information is unreadable here: {0}")]
    Dwarf(String),
}

/// `a int` is `an int`.
fn a(ty: &str) -> String {
    let vowel = ty.starts_with(|c: char| "aeiouAEIOU".contains(c));
    format!("{} {ty}", if vowel { "an" } else { "a" })
}

impl PathError {
    /// No member `member` in record type `ty` of `members`: the closest
    /// of them named, and the first 24 listed.
    pub fn no_such_member(ty: String, member: &str, members: &[Member]) -> PathError {
        let names: Vec<String> = members
            .iter()
            .filter(|x| !x.name.is_empty())
            .map(|x| x.name.clone())
            .collect();
        let mut scored: Vec<(f64, &String)> = names
            .iter()
            .map(|n| (strsim::jaro_winkler(member, n), n))
            .filter(|(s, n)| *s >= 0.8 || (member.len() >= 3 && n.contains(member)))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut listed: Vec<String> = names.iter().take(24).cloned().collect();
        if names.len() > 24 {
            listed.push(format!("and {} more", names.len() - 24));
        }
        PathError::NoSuchMember {
            ty,
            member: member.to_string(),
            closest: scored.into_iter().take(3).map(|(_, n)| n.clone()).collect(),
            members: listed,
        }
    }
}

impl From<gimli::Error> for PathError {
    fn from(e: gimli::Error) -> Self {
        PathError::Dwarf(e.to_string())
    }
}
