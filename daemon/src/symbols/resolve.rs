//! Resolution of a name in a process, in steps: the modules to search in
//! the dynamic linker's lookup order ([`search_order`], `Symbols::load_order`), what each has
//! under the name ([`Symbols::candidates`]), the one the process uses
//! ([`pick`]), and the object it names after members, elements and
//! offset ([`object`], [`Symbols::finish`]).

use std::sync::Arc;

use super::dwarf::{self, VarLoc};
use super::elf::{self, DebugSource, ElfFile, SymKind, SymTable};
use super::eval;
use super::expr::Expr;
use super::files::FileKey;
use super::maps::{self, MappedFile};
use super::{Resolved, Source, SymbolError, Symbols};
use crate::model::{Access, Pid};

/// What one candidate module has under the name.
#[derive(Debug, Clone)]
enum Hit {
    Var(dwarf::VarDie),
    Sym(elf::Sym),
}

struct Candidate<'a> {
    file: &'a MappedFile,
    elf: Arc<ElfFile>,
    bias: u64,
    hit: Hit,
}

impl Candidate<'_> {
    fn global(&self) -> bool {
        match &self.hit {
            Hit::Var(v) => v.external,
            Hit::Sym(s) => s.global,
        }
    }

    /// A variable one can watch (not thread-local, not optimized out).
    fn variable(&self) -> bool {
        match &self.hit {
            Hit::Var(v) => matches!(v.loc, VarLoc::Addr(_)),
            Hit::Sym(s) => s.kind == SymKind::Object,
        }
    }

    fn function(&self) -> bool {
        matches!(&self.hit, Hit::Sym(s) if s.kind == SymKind::Func)
    }

    fn thread_local(&self) -> bool {
        matches!(&self.hit, Hit::Sym(s) if s.kind == SymKind::Tls)
            || matches!(&self.hit, Hit::Var(v) if v.loc == VarLoc::Tls)
    }

    fn describe(&self) -> String {
        format!(
            "{} ({})",
            self.file.name(),
            if self.global() { "global" } else { "static" }
        )
    }
}

/// What the searched modules have under the name.
struct Found<'a> {
    candidates: Vec<Candidate<'a>>,
    /// Modules searched with neither a symbol table nor DWARF.
    stripped: Vec<String>,
    /// The module files read (for the closest names).
    loaded: Vec<Arc<ElfFile>>,
}

fn matches_module(f: &MappedFile, want: &str) -> bool {
    if want.contains('/') {
        return f.path == want;
    }
    let name = f.name();
    name == want
        || name
            .strip_prefix(want)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// The modules to search: the executable first (its definitions interpose
/// on the libraries'), then the libraries in address order (put in the
/// dynamic linker's load order by [`Symbols::evaluate`] when more than one
/// defines the name); only those `MODULE:` names if it names one.
fn search_order<'f>(
    pid: Pid,
    expr: &Expr,
    files: &'f [MappedFile],
) -> Result<Vec<&'f MappedFile>, SymbolError> {
    let exe = exe_key(pid);
    let mut order: Vec<&MappedFile> = files.iter().collect();
    order.sort_by_key(|f| Some(FileKey::of(f)) != exe);
    let Some(m) = &expr.module else {
        return Ok(order);
    };
    let searched: Vec<&MappedFile> = order.into_iter().filter(|f| matches_module(f, m)).collect();
    if searched.is_empty() {
        let mut loaded: Vec<String> = files.iter().map(|f| f.name().to_string()).collect();
        loaded.dedup();
        return Err(SymbolError::NoSuchModule {
            pid,
            module: m.clone(),
            loaded,
        });
    }
    Ok(searched)
}

/// The candidate the process uses among `found`, and a note when it was a
/// choice among several: a variable (a function for `exec`), the first
/// global definition in lookup order, as the dynamic linker binds it; two
/// unrelated ones are ambiguous.
fn pick<'c, 'f>(
    pid: Pid,
    expr: &Expr,
    access: Access,
    found: &'c Found<'f>,
    searched: usize,
) -> Result<(&'c Candidate<'f>, Option<String>), SymbolError> {
    let all = &found.candidates;
    let wanted: Vec<&Candidate<'_>> = if access == Access::Exec {
        all.iter().filter(|c| c.function()).collect()
    } else {
        all.iter().filter(|c| c.variable()).collect()
    };
    let pick = match wanted.as_slice() {
        // A function or a TLS variable is refused as such, unless a
        // variable of the name exists too.
        [] => return Err(refusal(pid, expr, access, &all[0], searched, found)),
        [one] => *one,
        // Global definitions of one name: the process uses the first in
        // lookup order (the executable, then the libraries in load order).
        many if many.iter().all(|c| c.global()) && expr.module.is_none() => many[0],
        // One module describing it twice (DWARF in two units).
        many if many.iter().all(|c| std::ptr::eq(c.file, many[0].file)) => many[0],
        many => {
            return Err(SymbolError::Ambiguous {
                pid,
                name: expr.name.clone(),
                modules: many.iter().map(|c| c.describe()).collect(),
            });
        }
    };
    let note = (wanted.len() > 1).then(|| {
        format!(
            "{} modules define {:?} globally; the process uses {}'s (the first in lookup order)",
            wanted.len(),
            expr.name,
            pick.file.name()
        )
    });
    Ok((pick, note))
}

/// Why the name, found as `c` but not as what `access` needs, is refused.
fn refusal(
    pid: Pid,
    expr: &Expr,
    access: Access,
    c: &Candidate<'_>,
    searched: usize,
    found: &Found<'_>,
) -> SymbolError {
    let module = c.file.name().to_string();
    if matches!(&c.hit, Hit::Var(v) if v.loc == VarLoc::OptimizedOut) {
        SymbolError::OptimizedOut {
            name: expr.name.clone(),
            module,
        }
    } else if c.function() && access != Access::Exec {
        SymbolError::NotAVariable {
            name: expr.name.clone(),
            module,
        }
    } else if c.thread_local() {
        SymbolError::ThreadLocal {
            name: expr.name.clone(),
            module,
        }
    } else {
        // A variable asked for as code.
        SymbolError::Unknown {
            pid,
            name: format!("{} (as code)", expr.name),
            searched,
            closest: Vec::new(),
            stripped: found.stripped.clone(),
        }
    }
}

/// What an expression designates in its module: an object (link-time
/// address, or past a pointer runtime address; size when known; type) or
/// a value, and where they came from.
struct Object {
    vaddr: u64,
    /// `vaddr` is a runtime address found by following pointers: the object
    /// is in no module (heap, stack, another module's data).
    followed: bool,
    size: Option<u64>,
    type_name: Option<String>,
    /// How its value reads (a DWARF type's).
    value_type: Option<crate::value::ValueType>,
    source: Source,
    /// Set when the offset fell inside a member.
    note: Option<String>,
    /// A value, not an object.
    value: Option<Vec<u8>>,
    /// What the object has under it (a variables view's children).
    children: Option<eval::Children>,
}

/// The error for a path that fails in module `module`.
fn path_error(expr: &Expr, module: &str, error: dwarf::PathError) -> SymbolError {
    match error {
        dwarf::PathError::UnknownType { name, closest } => SymbolError::UnknownType {
            expr: expr.to_string(),
            name,
            module: module.to_string(),
            closest,
        },
        error => SymbolError::Path {
            expr: expr.to_string(),
            error,
        },
    }
}

/// What an expression starts from.
enum Root<'v> {
    /// A number.
    Number,
    /// A global or static: its unit, type DIE and link-time address.
    Global(usize, usize, u64),
    /// A local of a frame.
    Local(&'v super::frame::LocalVar),
}

/// Evaluates `expr` in the module of `elf` (loaded with `bias`), from
/// `root`: the object after members, elements and pointers, then the
/// byte offset (`stats+8`: from byte 8 to the end of the member holding
/// it; outside the object only with a length given, `len > 0`).
fn evaluate(
    expr: &Expr,
    elf: &ElfFile,
    module: &str,
    bias: u64,
    root: Root<'_>,
    len: u32,
    read: eval::ReadMemory<'_>,
) -> Result<Object, SymbolError> {
    let text = expr.to_string();
    let fail = |e| path_error(expr, module, e);
    let d = elf.dwarf.as_ref().ok_or_else(|| SymbolError::NoDebugInfo {
        expr: text.clone(),
        name: expr.name.clone(),
        module: module.to_string(),
        why: "no DWARF in it and no debug file found".into(),
    })?;
    let mut ev = eval::Eval::new(d, bias, read).map_err(fail)?;
    match root {
        Root::Number => {}
        Root::Global(unit, die, addr) => ev = ev.with_variable(unit, die, addr).map_err(fail)?,
        Root::Local(v) => {
            let bytes = match (&v.value, v.address) {
                (Ok(b), _) => b.clone(),
                (Err(_), Some(_)) => Vec::new(),
                (Err(why), None) if why.contains("optimized out") => {
                    return Err(SymbolError::OptimizedOut {
                        name: v.name.clone(),
                        module: module.to_string(),
                    });
                }
                (Err(why), None) => {
                    return Err(SymbolError::Path {
                        expr: text,
                        error: dwarf::PathError::LocalUnavailable {
                            what: v.name.clone(),
                            why: why.clone(),
                        },
                    });
                }
            };
            ev = ev.with_local(v.ty, v.address, bytes);
        }
    }
    let (at, ty, type_name, size) = match ev.outcome(&expr.root).map_err(fail)? {
        eval::Outcome::Value {
            bytes,
            type_name,
            pointer,
            value_type,
        } => {
            if expr.offset != 0 {
                return Err(SymbolError::Path {
                    expr: text,
                    error: dwarf::PathError::AddressOfValue {
                        what: format!("{} (for the offset)", expr.root),
                    },
                });
            }
            return Ok(Object {
                vaddr: pointer.unwrap_or(0),
                followed: true,
                size: Some(bytes.len() as u64),
                type_name: Some(type_name),
                value_type,
                source: Source::Dwarf,
                note: None,
                value: Some(bytes),
                children: None,
            });
        }
        eval::Outcome::Object {
            at,
            ty,
            type_name,
            size,
        } => (at, ty, type_name, size),
    };
    let (vaddr, followed) = match at {
        eval::Place::InModule(a) => (a, false),
        eval::Place::At(a) => (a, true),
    };
    let mut o = Object {
        vaddr,
        followed,
        size,
        type_name: Some(type_name),
        value_type: ev.value_type(&ty).ok(),
        source: Source::Dwarf,
        note: (followed && expr.follows_pointers() && !expr.name.is_empty()).then(|| {
            format!(
                "{} was followed when the watchpoint was set: the watchpoint stays on \
                 that object if the pointers change later",
                expr.path()
            )
        }),
        value: None,
        children: None,
    };
    if expr.offset == 0 {
        // Unknown to the evaluation (a broken DIE): shown without children.
        o.children = ev.children(&ty).ok().flatten();
        return Ok(o);
    }
    let whole = o.size.unwrap_or(0);
    match u64::try_from(expr.offset).ok().filter(|&o| o < whole) {
        Some(at) => {
            o.vaddr = o.vaddr.wrapping_add(at);
            match ev.member_at(&ty, at) {
                Ok(Some((m_off, m_size, m_path, m_type))) => {
                    o.size = Some(m_off + m_size - at);
                    o.type_name = Some(m_type);
                    // The member's type is known by name only here: its
                    // bytes read untyped.
                    o.value_type = None;
                    if !m_path.is_empty() {
                        o.note = Some(format!("{} is in {}{m_path}", expr.path(), expr.root));
                    }
                }
                _ => {
                    o.size = Some(whole - at);
                    o.value_type = None;
                }
            }
        }
        None if len > 0 => {
            o.vaddr = o.vaddr.wrapping_add_signed(expr.offset);
            o.type_name = None;
            o.value_type = None;
        }
        None => {
            return Err(SymbolError::Offset {
                expr: text,
                name: expr.root.to_string(),
                offset: expr.offset,
                size: whole,
            });
        }
    }
    Ok(o)
}

/// The object `expr` designates in candidate `c`.
fn object(
    expr: &Expr,
    c: &Candidate<'_>,
    len: u32,
    read: eval::ReadMemory<'_>,
) -> Result<Object, SymbolError> {
    let text = expr.to_string();
    let outside = |whole: u64| SymbolError::Offset {
        expr: text.clone(),
        name: expr.name.clone(),
        offset: expr.offset,
        size: whole,
    };
    // The offset inside an object of `whole` bytes, if it is inside.
    let inside = |whole: u64| u64::try_from(expr.offset).ok().filter(|&o| o < whole);
    match &c.hit {
        Hit::Var(v) => {
            let VarLoc::Addr(a) = v.loc else {
                unreachable!("TLS and optimized out refused by pick")
            };
            evaluate(
                expr,
                &c.elf,
                c.file.name(),
                c.bias,
                Root::Global(v.unit, v.die, a),
                len,
                read,
            )
        }
        Hit::Sym(s) => {
            if !expr.is_bare_name() {
                return Err(SymbolError::NoDebugInfo {
                    expr: text,
                    name: expr.name.clone(),
                    module: c.file.name().to_string(),
                    why: match c.elf.debug_source {
                        DebugSource::None => "no DWARF in it and no debug file found".into(),
                        _ => format!("its DWARF does not describe {:?}", expr.name),
                    },
                });
            }
            let mut o = Object {
                vaddr: s.vaddr,
                followed: false,
                size: (s.size > 0).then_some(s.size),
                type_name: None,
                value_type: None,
                source: match s.table {
                    SymTable::Symtab => Source::Symtab,
                    SymTable::Dynsym => Source::Dynsym,
                },
                note: None,
                value: None,
                children: None,
            };
            if expr.offset != 0 {
                match inside(s.size) {
                    Some(at) => {
                        o.vaddr += at;
                        o.size = Some(s.size - at);
                    }
                    None if len > 0 => o.vaddr = o.vaddr.wrapping_add_signed(expr.offset),
                    None => return Err(outside(s.size)),
                }
            }
            Ok(o)
        }
    }
}

impl Symbols {
    /// Resolves `text` in process `pid` for a watchpoint of kind `access`;
    /// `len` is the length asked for (0: the object's size). An expression
    /// that computes a value (`&x`, `(T)x`) is refused: there is nothing in
    /// memory to watch.
    pub fn resolve(
        &self,
        pid: Pid,
        text: &str,
        access: Access,
        len: u32,
    ) -> Result<Resolved, SymbolError> {
        let r = self.evaluate(pid, text, access, len)?;
        if r.value.is_some() {
            let (expr, hint) = match Expr::parse(text).map(|e| e.root) {
                Ok(super::expr::Node::AddrOf(inner)) => (
                    r.expr.clone(),
                    format!(": the address of {inner}; watch {inner} itself"),
                ),
                Ok(super::expr::Node::Cast(t, inner)) => (
                    r.expr.clone(),
                    format!("; watch {inner}, or *({t} *)&{inner} to watch its bytes as {t}",),
                ),
                _ => (r.expr.clone(), String::new()),
            };
            return Err(SymbolError::NotAnObject {
                expr,
                type_name: r.type_name.unwrap_or_default(),
                hint,
            });
        }
        Ok(r)
    }

    /// [`Symbols::resolve`], values included (`Resolved::value`).
    pub fn evaluate(
        &self,
        pid: Pid,
        text: &str,
        access: Access,
        len: u32,
    ) -> Result<Resolved, SymbolError> {
        let expr = Expr::parse(text)?;
        let files = maps::read(pid).map_err(|e| SymbolError::Unreadable {
            pid,
            why: e.to_string(),
        })?;
        let mut searched = search_order(pid, &expr, &files)?;
        if expr.root.root_name().is_none() {
            return self.at_number(pid, &expr, &searched, len);
        }
        let mut found = self.candidates(pid, &expr, access, &searched)?;
        if found.candidates.is_empty() {
            return Err(SymbolError::Unknown {
                pid,
                name: expr.name.clone(),
                searched: searched.len(),
                closest: closest(&expr.name, &found.loaded),
                stripped: found.stripped,
            });
        }
        if expr.module.is_none()
            && searched.len() > 2
            && found
                .candidates
                .last()
                .is_some_and(|c| Some(FileKey::of(c.file)) != exe_key(pid))
        {
            // Found in a library: the libraries in the order the dynamic
            // linker loaded them (its list, read only then), not their
            // addresses (a library a dlopen needs is mapped after the one
            // opened, usually below it), and the search again if that
            // order differs.
            let order = self.load_order(pid, &files, searched.clone());
            if order
                .iter()
                .zip(&searched)
                .any(|(a, b)| !std::ptr::eq(*a, *b))
            {
                searched = order;
                found = self.candidates(pid, &expr, access, &searched)?;
            }
        }
        let (c, note) = pick(pid, &expr, access, &found, searched.len())?;
        self.finish(pid, &expr, c, access, len, note)
    }

    /// [`Symbols::look_up`] in a frame of a held thread: an expression
    /// that starts from one of `scope`'s parameters or local variables (the
    /// innermost of that name) is evaluated from it; any other is looked up
    /// as a global. The flag says which.
    pub fn look_up_in_frame(
        &self,
        pid: Pid,
        text: &str,
        scope: &super::unwind::FrameScope,
        frame: usize,
    ) -> Result<(Resolved, super::NameKind, bool), SymbolError> {
        let expr = Expr::parse(text)?;
        let local = expr
            .root
            .root_name()
            .and_then(|n| scope.vars.iter().rev().find(|v| v.name == n));
        let Some(v) = local else {
            return self.look_up(pid, text).map(|(r, k)| (r, k, false));
        };
        let mut read = |at: u64, n: usize| crate::procfs::read_memory(pid, pid, at, n);
        let mut o = evaluate(
            &expr,
            &scope.elf,
            scope.file.name(),
            scope.bias,
            Root::Local(v),
            0,
            &mut read,
        )?;
        if o.value.is_none() {
            o.note = Some(format!(
                "{} starts from {} {:?} of frame {frame}: the object where it is now",
                expr.path(),
                if v.parameter {
                    "parameter"
                } else {
                    "local variable"
                },
                v.name
            ));
        }
        let r = self.finished(
            &expr,
            &scope.file,
            &scope.elf,
            scope.bias,
            o,
            Access::Write,
            0,
            None,
        )?;
        let kind = if r.value.is_some() {
            super::NameKind::Value
        } else {
            super::NameKind::Variable
        };
        Ok((r, kind, true))
    }

    /// An expression starting from a number (`((struct conn *)0x…)->state`):
    /// evaluated in the first module, in lookup order, whose DWARF defines
    /// the type its outermost cast names.
    fn at_number(
        &self,
        pid: Pid,
        expr: &Expr,
        searched: &[&MappedFile],
        len: u32,
    ) -> Result<Resolved, SymbolError> {
        let wanted = expr.root.type_names().last().map(|t| t.base.clone());
        let mut first: Option<(&MappedFile, Arc<ElfFile>, u64)> = None;
        let mut chosen = None;
        for &f in searched {
            let Some(elf) = self.module(pid, f)? else {
                continue;
            };
            let Some(bias) = Self::bias(&elf, f) else {
                continue;
            };
            let Some(d) = elf.dwarf.as_ref() else {
                continue;
            };
            let has = match &wanted {
                Some(w) => w == "void" || d.type_named(w).is_some(),
                None => true,
            };
            if has {
                chosen = Some((f, elf.clone(), bias));
                break;
            }
            if first.is_none() {
                first = Some((f, elf.clone(), bias));
            }
        }
        let Some((f, elf, bias)) = chosen.or(first) else {
            return Err(SymbolError::NoDebugInfo {
                expr: expr.to_string(),
                name: expr.root.to_string(),
                module: searched
                    .first()
                    .map(|f| f.name().to_string())
                    .unwrap_or_default(),
                why: "no module searched has DWARF to read its types from".into(),
            });
        };
        let mut read = |at: u64, n: usize| crate::procfs::read_memory(pid, pid, at, n);
        let o = evaluate(expr, &elf, f.name(), bias, Root::Number, len, &mut read)?;
        self.finished(expr, f, &elf, bias, o, Access::Write, len, None)
    }

    /// What each module of `searched` has under the name, in order. A
    /// global definition of a variable binds the name for every module
    /// after it in lookup order (the dynamic linker's rule): the rest are
    /// not read, nor their DWARF indexed.
    fn candidates<'f>(
        &self,
        pid: Pid,
        expr: &Expr,
        access: Access,
        searched: &[&'f MappedFile],
    ) -> Result<Found<'f>, SymbolError> {
        let mut found = Found {
            candidates: Vec::new(),
            stripped: Vec::new(),
            loaded: Vec::new(),
        };
        for &f in searched {
            // A module still loading fails the answer: the name might be
            // its, or bound by it.
            let Some(elf) = self.module(pid, f)? else {
                continue;
            };
            let Some(bias) = Self::bias(&elf, f) else {
                continue;
            };
            if !elf.has_symtab && elf.dwarf.is_none() {
                found.stripped.push(f.name().to_string());
            }
            let vars = elf
                .dwarf
                .as_ref()
                .map(|d| d.variables(&expr.name))
                .unwrap_or_default();
            let hits: Vec<Hit> = if vars.is_empty() {
                elf.lookup(&expr.name)
                    .into_iter()
                    .cloned()
                    .map(Hit::Sym)
                    .collect()
            } else {
                vars.into_iter().map(Hit::Var).collect()
            };
            found
                .candidates
                .extend(hits.into_iter().map(|hit| Candidate {
                    file: f,
                    elf: elf.clone(),
                    bias,
                    hit,
                }));
            found.loaded.push(elf);
            if expr.module.is_none()
                && access != Access::Exec
                && found.candidates.iter().any(|c| c.global() && c.variable())
            {
                break;
            }
        }
        Ok(found)
    }

    /// The resolution of `expr` to candidate `c`: its object, the length
    /// watched (`len`, else the object's size; 1 for `exec`), its runtime
    /// address.
    fn finish(
        &self,
        pid: Pid,
        expr: &Expr,
        c: &Candidate<'_>,
        access: Access,
        len: u32,
        note: Option<String>,
    ) -> Result<Resolved, SymbolError> {
        let mut read = |at: u64, n: usize| crate::procfs::read_memory(pid, pid, at, n);
        let o = object(expr, c, len, &mut read)?;
        self.finished(expr, c.file, &c.elf, c.bias, o, access, len, note)
    }

    /// The resolution of `expr` to object `o` in module `f`.
    #[allow(clippy::too_many_arguments)]
    fn finished(
        &self,
        expr: &Expr,
        f: &MappedFile,
        elf: &ElfFile,
        bias: u64,
        mut o: Object,
        access: Access,
        len: u32,
        note: Option<String>,
    ) -> Result<Resolved, SymbolError> {
        if access == Access::Exec && o.value.is_none() {
            o.size = Some(1);
            o.type_name = None;
            o.value_type = None;
        }
        let text = expr.to_string();
        let size = match (len, o.size) {
            _ if o.value.is_some() => o.size.unwrap_or(0),
            (0, Some(s)) if s > 0 => s,
            (0, _) => {
                return Err(SymbolError::NoSize {
                    expr: text,
                    why: match o.source {
                        Source::Dwarf => "its DWARF type has no size".into(),
                        _ => "its symbol-table entry says size 0".into(),
                    },
                });
            }
            (l, _) => u64::from(l),
        };
        Ok(Resolved {
            expr: text,
            symbol: expr.name.clone(),
            module: f.path.clone(),
            module_key: FileKey::of(f),
            build_id: elf.build_id.clone(),
            address: if o.followed {
                o.vaddr
            } else {
                o.vaddr.wrapping_add(bias)
            },
            size,
            type_name: o.type_name,
            value_type: o.value_type,
            source: o.source,
            // Past a pointer the object is in no module's image.
            module_address: if o.followed { 0 } else { o.vaddr },
            note: o.note.or(note),
            value: o.value,
            children: o.children,
        })
    }
}

/// Device and inode of the process's executable (through a live thread
/// when the leader has exited: its own link has no memory to name it by).
pub(super) fn exe_key(pid: Pid) -> Option<FileKey> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(format!("/proc/{pid}/exe"))
        .ok()
        .or_else(|| std::fs::metadata(crate::procfs::live_task_file(pid, "exe")?).ok())?;
    let d = md.dev();
    let (maj, min) = (
        ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff),
        (d & 0xff) | ((d >> 12) & !0xff),
    );
    Some(FileKey {
        dev: format!("{maj:02x}:{min:02x}"),
        inode: md.ino(),
    })
}

/// Up to three names like `name` among the variables of `files`.
fn closest(name: &str, files: &[Arc<ElfFile>]) -> Vec<String> {
    let mut scored: Vec<(f64, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut consider = |n: &str| {
        if n.starts_with("_") && !name.starts_with('_') {
            return;
        }
        if !seen.insert(n.to_string()) {
            return;
        }
        let score = strsim::jaro_winkler(name, n);
        let contains = n.contains(name) || name.contains(n) && n.len() >= 3;
        if score >= 0.8 || contains {
            scored.push((
                if contains { score.max(0.85) } else { score },
                n.to_string(),
            ));
        }
    };
    for f in files {
        if let Some(d) = &f.dwarf {
            for n in d.names() {
                consider(n);
            }
        }
        for s in f.symbols.iter().filter(|s| s.kind == SymKind::Object) {
            consider(&s.name);
        }
    }
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    scored.into_iter().take(3).map(|(_, n)| n).collect()
}
