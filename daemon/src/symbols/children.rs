//! Variables views (`ListVariables`, an IDE's Globals scope): the global
//! and static variables the executable defines, and what an expression has
//! under it — a record's members, an array's elements, a pointer's target —
//! each evaluated as `ResolveSymbol` evaluates a name (`eval/`), with its
//! bytes when small.

use super::dwarf::VarLoc;
use super::eval::Children;
use super::resolve::exe_key;
use super::{FileKey, SymbolError, Symbols, maps};
use crate::model::{Access, Pid};

/// Children listed when the caller gives no count.
pub const DEFAULT_COUNT: u32 = 256;

/// Objects up to this size come with their bytes.
pub const VALUE_BYTES: u64 = 64;

/// One variable of a view.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VariableView {
    /// Its name under its parent (`soft`, `[2]`, `*p`, a global's name).
    pub name: String,
    /// The expression naming it.
    pub expression: String,
    /// Its C type.
    pub type_name: String,
    /// Runtime address (0: none).
    pub address: u64,
    /// Size in bytes (0: not known).
    pub size: u64,
    /// Its bytes (objects of at most [`VALUE_BYTES`]).
    pub value: Vec<u8>,
    /// Why it could not be evaluated or read.
    pub error: String,
    /// How many children it has.
    pub children: u32,
}

/// The child expressions of `expr` whose children are `c`: (name, expression).
fn child_names(expr: &str, c: &Children, start: u64, count: u64) -> (Vec<(String, String)>, u64) {
    // A prefix operator binds looser than the postfix ones: `(*p).x`.
    let base = if expr.starts_with(['*', '&', '(']) {
        format!("({expr})")
    } else {
        expr.to_string()
    };
    match c {
        Children::Members(names) => (
            names
                .iter()
                .skip(start as usize)
                .take(count as usize)
                .map(|m| (m.clone(), format!("{base}.{m}")))
                .collect(),
            names.len() as u64,
        ),
        Children::Elements(n) => (
            (start..(*n).min(start.saturating_add(count)))
                .map(|i| (format!("[{i}]"), format!("{base}[{i}]")))
                .collect(),
            *n,
        ),
        Children::Pointee => (
            if start == 0 && count > 0 {
                vec![(format!("*{expr}"), format!("*{base}"))]
            } else {
                vec![]
            },
            1,
        ),
    }
}

fn count_of(c: &Option<Children>) -> u32 {
    match c {
        None => 0,
        Some(Children::Members(m)) => m.len() as u32,
        Some(Children::Elements(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        Some(Children::Pointee) => 1,
    }
}

impl Symbols {
    /// The variables under `expression` in `pid` (empty: the executable's
    /// globals), from the `start`th, `count` of them (0: up to
    /// [`DEFAULT_COUNT`]); and how many there are in all.
    pub fn list_variables(
        &self,
        pid: Pid,
        expression: &str,
        start: u32,
        count: u32,
    ) -> Result<(Vec<VariableView>, u64), SymbolError> {
        let count = if count == 0 { DEFAULT_COUNT } else { count };
        let (names, total) = if expression.trim().is_empty() {
            let all = self.global_names(pid)?;
            let total = all.len() as u64;
            (
                all.into_iter()
                    .skip(start as usize)
                    .take(count as usize)
                    .map(|n| (n.clone(), n))
                    .collect(),
                total,
            )
        } else {
            let r = self.evaluate(pid, expression, Access::Write, 0)?;
            match &r.children {
                Some(c) => child_names(&r.expr, c, u64::from(start), u64::from(count)),
                None => (Vec::new(), 0),
            }
        };
        let views = names
            .into_iter()
            .map(|(name, expr)| self.view(pid, name, expr))
            .collect();
        Ok((views, total))
    }

    /// One variable, evaluated and read.
    fn view(&self, pid: Pid, name: String, expression: String) -> VariableView {
        let mut v = VariableView {
            name,
            expression,
            ..Default::default()
        };
        match self.evaluate(pid, &v.expression, Access::Write, 0) {
            Err(e) => v.error = e.to_string(),
            Ok(r) => {
                v.type_name = r.type_name.clone().unwrap_or_default();
                v.size = r.size;
                v.children = count_of(&r.children);
                match r.value {
                    Some(bytes) => v.value = bytes,
                    None => {
                        v.address = r.address;
                        if r.size <= VALUE_BYTES {
                            match crate::procfs::read_memory(pid, pid, r.address, r.size as usize) {
                                Ok(b) => v.value = b,
                                Err(e) => v.error = e,
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// The names of the variables with a static address the executable's
    /// DWARF defines (globals, file and function statics), sorted.
    fn global_names(&self, pid: Pid) -> Result<Vec<String>, SymbolError> {
        let unreadable = |why: String| SymbolError::Unreadable { pid, why };
        let files = maps::read(pid).map_err(|e| unreadable(e.to_string()))?;
        let exe = exe_key(pid).ok_or_else(|| unreadable("no executable".into()))?;
        let Some(f) = files.iter().find(|f| FileKey::of(f) == exe) else {
            return Err(unreadable("its executable is not mapped".into()));
        };
        let elf = self
            .files
            .file(pid, f)
            .map_err(|e| SymbolError::loading(pid, e))?;
        let Some(d) = &elf.dwarf else {
            return Ok(Vec::new());
        };
        let mut names: Vec<String> = d
            .names()
            .filter(|n| {
                d.variables(n)
                    .iter()
                    .any(|v| matches!(v.loc, VarLoc::Addr(_)))
            })
            .map(str::to_string)
            .collect();
        names.sort_unstable();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_named_as_c_names_them() {
        let m = Children::Members(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(
            child_names("s", &m, 1, 5).0,
            [("b".into(), "s.b".into()), ("c".into(), "s.c".into())]
        );
        assert_eq!(child_names("s", &m, 0, 1).1, 3);
        assert_eq!(
            child_names("*p", &m, 0, 1).0,
            [("a".to_string(), "(*p).a".to_string())]
        );
        let e = Children::Elements(4);
        let (names, total) = child_names("t.x", &e, 2, 10);
        assert_eq!(total, 4);
        assert_eq!(
            names,
            [
                ("[2]".to_string(), "t.x[2]".to_string()),
                ("[3]".to_string(), "t.x[3]".to_string())
            ]
        );
        assert_eq!(
            child_names("p", &Children::Pointee, 0, 1).0,
            [("*p".to_string(), "*p".to_string())]
        );
        assert!(child_names("p", &Children::Pointee, 1, 1).0.is_empty());
    }
}
