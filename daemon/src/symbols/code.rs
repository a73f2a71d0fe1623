//! Code events' names: a function of a process (where its probe goes: the
//! module file and the file offset of its first instruction), what its
//! DWARF says it takes and returns, and the expression of a code event
//! evaluated from the registers a probe recorded (`$ret`, `$arg0`…`$arg5`,
//! and the parameters by their DWARF names).

use std::path::PathBuf;
use std::sync::Arc;

use gimli::{AttributeValue, UnitOffset};

use super::dwarf::TypeRef;
use super::dwarf::{DwarfFile, name_of, type_info, type_ref};
use super::elf::{ElfFile, SymKind};
use super::expr::{Expr, Node};
use super::frame::LocalVar;
use super::lines::NoCode;
use super::maps::{self, MappedFile};
use super::unwind::FrameScope;
use super::{Resolved, SymbolError, Symbols};
use crate::model::Pid;

/// Integer argument registers the ABI has (`$arg0`…`$arg5`).
pub const ARG_REGISTERS: usize = 6;

/// A function of a process, as a probe needs it.
#[derive(Clone)]
pub struct CodeSite {
    /// The function's name.
    pub function: String,
    /// Its module.
    pub module: MappedFile,
    /// The module's file.
    pub elf: Arc<ElfFile>,
    /// The module's load bias.
    pub bias: u64,
    /// Link-time address of its first instruction.
    pub vaddr: u64,
    /// File offset of its first instruction (the uprobe's `config2`).
    pub offset: u64,
    /// Where the daemon opens the module (the uprobe's path).
    pub path: PathBuf,
    /// What its DWARF says, if it has any.
    pub signature: Option<Signature>,
}

impl std::fmt::Debug for CodeSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeSite")
            .field("function", &self.function)
            .field("module", &self.module.path)
            .field("offset", &self.offset)
            .finish()
    }
}

/// A function's return type and parameters, from DWARF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// Its return type (`None`: void).
    pub ret: Option<TypeRef>,
    /// The return type as C writes it.
    pub ret_name: String,
    /// Its parameters in order: name, type, type as C writes it.
    pub params: Vec<(String, Option<TypeRef>, String)>,
}

/// Where a code breakpoint is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakAt {
    /// A function, `[MODULE:]NAME`: past its prologue.
    Function(String),
    /// The first instruction of a source line.
    Line {
        /// The file: a path or its last components.
        file: String,
        /// 1-based.
        line: u32,
    },
}

/// Where a code breakpoint's probe is.
#[derive(Debug, Clone)]
pub struct BreakSite {
    /// The probe's module, offset and address (`vaddr`), its function.
    pub site: CodeSite,
    /// The source file of the probed instruction ("" without DWARF).
    pub file: String,
    /// Its line (0 without DWARF).
    pub line: u32,
}

/// The registers a probe recorded that an expression can start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeRegs {
    /// The return value (at a return).
    pub ret: u64,
    /// The argument registers in ABI order (at an entry).
    pub args: [u64; ARG_REGISTERS],
}

/// `[MODULE:]FUNCTION` into its parts: the module ends at the first `:`
/// that is not half of a `::` (C++ and Rust paths: `ns::f` is a function,
/// `libfoo.so:ns::f` one of `libfoo.so`).
pub fn split_module(name: &str) -> (Option<&str>, &str) {
    let b = name.as_bytes();
    let single = (0..b.len())
        .find(|&i| b[i] == b':' && (i == 0 || b[i - 1] != b':') && b.get(i + 1) != Some(&b':'));
    match single {
        Some(i) => (Some(&name[..i]), &name[i + 1..]),
        None => (None, name),
    }
}

/// The expression's root names a register (`$ret`, `$argN`) or a parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Root {
    /// `$ret`.
    Ret,
    /// `$argN` or the Nth parameter.
    Arg(usize),
}

impl Symbols {
    /// The function `name` (`[MODULE:]FUNCTION`) of process `pid`: the
    /// executable's first, then the libraries' in the order loaded
    /// (`Symbols::load_order`).
    pub fn code_site(&self, pid: Pid, name: &str) -> Result<CodeSite, SymbolError> {
        let (module, function) = split_module(name);
        let files = maps::read(pid).map_err(|e| SymbolError::Unreadable {
            pid,
            why: e.to_string(),
        })?;
        let order: Vec<&MappedFile> = files
            .iter()
            .filter(|f| f.mappings.iter().any(|m| m.exec))
            .filter(|f| {
                module.is_none_or(|m| {
                    f.name() == m || f.path == m || f.name().starts_with(&format!("{m}."))
                })
            })
            .collect();
        let order = self.load_order(pid, &files, order);
        if let Some(m) = module
            && order.is_empty()
        {
            return Err(SymbolError::NoSuchModule {
                pid,
                module: m.to_string(),
                loaded: files.iter().map(|f| f.name().to_string()).collect(),
            });
        }
        let mut loaded = Vec::new();
        let mut stripped = Vec::new();
        for f in &order {
            let Some(elf) = self.module(pid, f)? else {
                continue;
            };
            let Some(bias) = Self::bias(&elf, f) else {
                continue;
            };
            if !elf.has_symtab && elf.dwarf.is_none() {
                stripped.push(f.name().to_string());
            }
            let sym = elf
                .lookup(function)
                .into_iter()
                .find(|s| s.kind == SymKind::Func)
                .map(|s| s.vaddr);
            if let Some(vaddr) = sym
                && let Some(offset) = elf.file_offset(vaddr)
            {
                let signature = elf.dwarf.as_ref().and_then(|d| d.signature(vaddr));
                return Ok(CodeSite {
                    function: function.to_string(),
                    module: (*f).clone(),
                    path: f.open_path(pid),
                    bias,
                    vaddr,
                    offset,
                    signature,
                    elf,
                });
            }
            loaded.push(elf);
        }
        Err(SymbolError::Unknown {
            pid,
            name: function.to_string(),
            searched: order.len(),
            closest: closest_function(function, &loaded),
            stripped,
        })
    }

    /// Where a code breakpoint's probe goes in process `pid`: past the
    /// prologue of a function (`[MODULE:]NAME`), or at the first
    /// instruction of a source line (the executable's line tables first,
    /// then the libraries' in the order loaded: the first that names the
    /// file decides).
    pub fn break_site(&self, pid: Pid, at: &BreakAt) -> Result<BreakSite, SymbolError> {
        match at {
            BreakAt::Function(name) => {
                let mut site = self.code_site(pid, name)?;
                let (mut file, mut line) = (String::new(), 0);
                if let Some(d) = site.elf.dwarf.as_ref() {
                    let end = site
                        .elf
                        .containing(site.vaddr)
                        .filter(|s| s.vaddr == site.vaddr && s.size > 0)
                        .map_or(u64::MAX, |s| s.vaddr + s.size);
                    if let Some(row) = d.body_start(site.vaddr, end)
                        && let Some(offset) = site.elf.file_offset(row.addr)
                    {
                        site.vaddr = row.addr;
                        site.offset = offset;
                        (file, line) = (row.file.to_string(), row.line);
                    }
                }
                Ok(BreakSite { site, file, line })
            }
            BreakAt::Line { file, line } => self.line_site(pid, file, *line),
        }
    }

    fn line_site(&self, pid: Pid, file: &str, line: u32) -> Result<BreakSite, SymbolError> {
        let no_code = |why: String| SymbolError::NoCodeAtLine {
            pid,
            file: file.to_string(),
            line,
            why,
        };
        let files = maps::read(pid).map_err(|e| SymbolError::Unreadable {
            pid,
            why: e.to_string(),
        })?;
        let order: Vec<&MappedFile> = files
            .iter()
            .filter(|f| f.mappings.iter().any(|m| m.exec))
            .collect();
        let order = self.load_order(pid, &files, order);
        let mut with_lines = 0;
        let mut closest: Vec<String> = Vec::new();
        let mut last_line: Option<u32> = None;
        for f in order {
            let Some(elf) = self.module(pid, f)? else {
                continue;
            };
            let Some(bias) = Self::bias(&elf, f) else {
                continue;
            };
            let Some(d) = elf.dwarf.as_ref() else {
                continue;
            };
            with_lines += 1;
            let entry = |addr: u64| {
                elf.containing(addr)
                    .filter(|s| s.kind == SymKind::Func)
                    .map(|s| s.vaddr)
            };
            match d.line_start(file, line, entry) {
                Ok(row) => {
                    let offset = elf
                        .file_offset(row.addr)
                        .ok_or_else(|| no_code(format!("{:#x} is in no segment", row.addr)))?;
                    let function = elf
                        .containing(row.addr)
                        .filter(|s| s.kind == SymKind::Func)
                        .map(|s| s.name.clone())
                        .unwrap_or_default();
                    let site = CodeSite {
                        function,
                        module: f.clone(),
                        path: f.open_path(pid),
                        bias,
                        vaddr: row.addr,
                        offset,
                        signature: None,
                        elf: elf.clone(),
                    };
                    return Ok(BreakSite {
                        site,
                        file: row.file.to_string(),
                        line: row.line,
                    });
                }
                Err(NoCode::NoFile(c)) => closest.extend(c),
                Err(NoCode::NoLine(last)) => {
                    last_line = last_line.max(last).or(Some(0));
                }
            }
        }
        match last_line {
            Some(last) => Err(no_code(format!(
                "the file has no code at or after that line in a function that holds it \
                 (a comment, a declaration, between functions{})",
                if last > 0 {
                    format!("; its last line with code is {last}")
                } else {
                    String::new()
                }
            ))),
            // No module loaded names the file: misspelled, or a library's
            // source that a pending breakpoint waits for.
            None => Err(SymbolError::SourceNotLoaded {
                closest: {
                    let mut seen = std::collections::HashSet::new();
                    closest.retain(|c| seen.insert(c.clone()));
                    closest.truncate(3);
                    closest
                },
                pid,
                file: file.to_string(),
                line,
                searched: with_lines,
            }),
        }
    }

    /// Checks a code event's expression against `site` before any probe
    /// is set: it parses, and its root is `$ret` (at a return only),
    /// `$argN` (N below 6) or a parameter the function's DWARF names.
    pub fn check_code_expr(site: &CodeSite, text: &str, ret: bool) -> Result<Root, String> {
        let expr = Expr::parse(text).map_err(|e| e.to_string())?;
        let Some(name) = expr.root.root_name() else {
            return Err(format!(
                "{text:?} starts from no name: a code event's expression starts from $ret, \
                 $arg0…$arg5 or a parameter of {}",
                site.function
            ));
        };
        root_of(site, name, ret)
    }

    /// The object a code event's expression names, from the registers the
    /// probe recorded. Also returns the base: the value of the root
    /// register.
    pub fn code_object(
        &self,
        pid: Pid,
        site: &CodeSite,
        text: &str,
        at_return: bool,
        regs: &CodeRegs,
        len: u32,
    ) -> Result<(Resolved, u64), SymbolError> {
        let expr = Expr::parse(text)?;
        let name = expr.root.root_name().unwrap_or_default().to_string();
        let root = root_of(site, &name, at_return).map_err(|why| SymbolError::Unknown {
            pid,
            name: why,
            searched: 1,
            closest: Vec::new(),
            stripped: Vec::new(),
        })?;
        let base = match root {
            Root::Ret => regs.ret,
            Root::Arg(i) => regs.args[i],
        };
        // A bare register (`$ret`, `$arg0+8`): the bytes it points at.
        if matches!(expr.root, Node::Name(_)) {
            let addr = base.wrapping_add_signed(expr.offset);
            let size = if len > 0 { u64::from(len) } else { 8 };
            return Ok((
                Resolved {
                    expr: expr.to_string(),
                    symbol: name,
                    module: site.module.path.clone(),
                    module_key: super::files::FileKey {
                        dev: site.module.dev.clone(),
                        inode: site.module.inode,
                    },
                    build_id: site.elf.build_id.clone(),
                    address: addr,
                    size,
                    type_name: None,
                    value_type: None,
                    source: super::Source::Dwarf,
                    module_address: 0,
                    note: None,
                    value: None,
                    children: None,
                },
                base,
            ));
        }
        let (ty, type_name) = match (&root, &site.signature) {
            (Root::Ret, Some(s)) => (s.ret, s.ret_name.clone()),
            (Root::Arg(i), Some(s)) if name.starts_with('$') || *i < s.params.len() => s
                .params
                .get(*i)
                .map(|p| (p.1, p.2.clone()))
                .unwrap_or((None, "?".into())),
            _ => (None, "?".into()),
        };
        let scope = FrameScope {
            file: site.module.clone(),
            elf: site.elf.clone(),
            bias: site.bias,
            vars: vec![LocalVar {
                name: name.clone(),
                type_name,
                parameter: true,
                address: None,
                value: Ok(base.to_le_bytes().to_vec()),
                ty,
            }],
        };
        let (mut r, _, _) = self.look_up_in_frame(pid, text, &scope, 0)?;
        if r.value.is_some() {
            return Err(SymbolError::NotAnObject {
                expr: r.expr.clone(),
                type_name: r.type_name.clone().unwrap_or_default(),
                hint: String::new(),
            });
        }
        if len > 0 {
            r.size = u64::from(len);
        }
        Ok((r, base))
    }
}

/// What `name` stands for in a code event of `site`.
fn root_of(site: &CodeSite, name: &str, ret: bool) -> Result<Root, String> {
    if name == "$ret" {
        return if ret {
            Ok(Root::Ret)
        } else {
            Err(format!(
                "$ret is what {} returns: only with --on-return",
                site.function
            ))
        };
    }
    if let Some(n) = name.strip_prefix("$arg") {
        return match n.parse::<usize>() {
            Ok(i) if i < ARG_REGISTERS && !ret => Ok(Root::Arg(i)),
            Ok(i) if i < ARG_REGISTERS => Err(format!(
                "{name} is an argument register, known at {}'s entry only (use --on-entry)",
                site.function
            )),
            _ => Err(format!(
                "{name}: the arguments in registers are $arg0…$arg5 (rdi, rsi, rdx, rcx, r8, r9)"
            )),
        };
    }
    let params: Vec<&str> = site
        .signature
        .as_ref()
        .map(|s| s.params.iter().map(|p| p.0.as_str()).collect())
        .unwrap_or_default();
    match params.iter().position(|p| *p == name) {
        Some(_) if ret => Err(format!(
            "{name} is a parameter of {}, known at its entry only (use --on-entry, or $ret)",
            site.function
        )),
        Some(i) if i < ARG_REGISTERS => Ok(Root::Arg(i)),
        Some(i) => Err(format!(
            "{name} is parameter {i} of {}: only the first {ARG_REGISTERS} are in registers",
            site.function
        )),
        None if site.signature.is_none() => Err(format!(
            "{name:?}: {} has no DWARF in {} (build with -g), so its parameters have no names: \
             use $arg0…$arg5{}",
            site.function,
            site.module.name(),
            if ret { " at entry, or $ret" } else { "" }
        )),
        None => Err(format!(
            "{name:?} is not a parameter of {} (its parameters: {}); the roots are $ret, \
             $arg0…$arg5 and the parameters",
            site.function,
            if params.is_empty() {
                "none".to_string()
            } else {
                params.join(", ")
            }
        )),
    }
}

/// Up to three function names like `name` in `files`.
fn closest_function(name: &str, files: &[Arc<ElfFile>]) -> Vec<String> {
    let mut scored: Vec<(f64, String)> =
        files.iter().flat_map(|f| f.functions_like(name)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, n)| n).collect()
}

impl DwarfFile {
    /// The return type and parameters of the function whose DWARF range
    /// holds link-time address `pc` (its first instruction).
    pub fn signature(&self, pc: u64) -> Option<Signature> {
        let dwarf = self.dwarf()?;
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let unit_off = unit.header.debug_info_offset().map(|o| o.0)?;
            let mut entries = unit.entries();
            let mut depth_of_fn: Option<isize> = None;
            let mut sig: Option<Signature> = None;
            while let Ok(Some(e)) = entries.next_dfs() {
                let depth = e.depth();
                if let Some(d) = depth_of_fn {
                    if depth <= d {
                        break;
                    }
                    if depth == d + 1 && e.tag() == gimli::DW_TAG_formal_parameter {
                        let origin = match e.attr_value(gimli::DW_AT_abstract_origin) {
                            Some(AttributeValue::UnitRef(o)) => unit.entry(o).ok(),
                            _ => None,
                        };
                        let name = name_of(&dwarf, &unit, e)
                            .or_else(|| origin.as_ref().and_then(|o| name_of(&dwarf, &unit, o)))
                            .unwrap_or_default();
                        let ty = type_ref(e).or_else(|| origin.as_ref().and_then(type_ref));
                        let tname = type_info(&dwarf, &unit, ty).map_or("?".into(), |i| i.name);
                        if let Some(s) = sig.as_mut() {
                            s.params.push((
                                name,
                                ty.map(|die| TypeRef {
                                    unit: unit_off,
                                    die,
                                }),
                                tname,
                            ));
                        }
                    }
                    continue;
                }
                if e.tag() == gimli::DW_TAG_subprogram && super::frame::holds(&dwarf, &unit, e, pc)
                {
                    depth_of_fn = Some(depth);
                    // A concrete out-of-line instance names its abstract
                    // origin (or specification) for its type.
                    let mut ty = type_ref(e);
                    if ty.is_none() {
                        for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
                            if let Some(AttributeValue::UnitRef(o)) = e.attr_value(at)
                                && let Ok(oe) = unit.entry(UnitOffset(o.0))
                            {
                                ty = type_ref(&oe);
                                break;
                            }
                        }
                    }
                    let ret_name = type_info(&dwarf, &unit, ty).map_or("?".into(), |i| i.name);
                    sig = Some(Signature {
                        ret: ty.map(|die| TypeRef {
                            unit: unit_off,
                            die,
                        }),
                        ret_name,
                        params: Vec::new(),
                    });
                }
            }
            if sig.is_some() {
                return sig;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::split_module;

    #[test]
    fn module_prefix_is_a_single_colon() {
        assert_eq!(split_module("conn_new"), (None, "conn_new"));
        assert_eq!(split_module("libc.so.6:free"), (Some("libc.so.6"), "free"));
        assert_eq!(split_module("ns::conn::open"), (None, "ns::conn::open"));
        assert_eq!(
            split_module("libfoo.so:ns::open"),
            (Some("libfoo.so"), "ns::open")
        );
    }
}
