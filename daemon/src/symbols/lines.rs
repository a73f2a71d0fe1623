//! Code breakpoints' places, from the DWARF line tables: a function's
//! first instruction past its prologue (where its body starts, so that
//! parameters and locals are where their DWARF says), and the first
//! instruction of a source line.

use std::collections::HashMap;
use std::sync::Arc;

use super::dwarf::{DwarfFile, R};

/// A row of a line table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineRow {
    /// Link-time address.
    pub addr: u64,
    /// The source file, as the table names it (directory joined; shared
    /// by the rows of the file).
    pub file: Arc<str>,
    /// 1-based line (0: no line).
    pub line: u32,
    /// A recommended breakpoint place (`is_stmt`).
    pub stmt: bool,
    /// The compiler marked the end of the function's prologue here.
    pub prologue_end: bool,
}

/// Why a source line has no place to break at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoCode {
    /// No line table names the file; the files named closest to it.
    NoFile(Vec<String>),
    /// The file is known, the line has no code (a comment, between
    /// functions, past the end); the last line with code, if any.
    NoLine(Option<u32>),
}

/// Whether `full` (a line table's path) is the file `asked` names: the
/// same path, or one ends with the other at a `/`.
fn same_file(full: &str, asked: &str) -> bool {
    let asked = asked.trim_start_matches("./");
    full == asked
        || full
            .strip_suffix(asked)
            .is_some_and(|head| head.ends_with('/'))
        || asked
            .strip_suffix(full)
            .is_some_and(|head| head.ends_with('/'))
}

/// Files asked for whose closest names a module keeps.
const CLOSEST_KEPT: usize = 64;

fn base_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

impl DwarfFile {
    /// The source files its line tables' headers name, sorted, each once;
    /// read once per file (a look for a file that the module does not
    /// name, as a pending breakpoint's at each library loaded, reads no
    /// line table's rows).
    pub fn line_files(&self) -> &[Arc<str>] {
        self.files.get_or_init(|| {
            let Some(dwarf) = self.dwarf() else {
                return Vec::new();
            };
            let mut out: Vec<Arc<str>> = Vec::new();
            let mut units = dwarf.units();
            while let Ok(Some(header)) = units.next() {
                let Ok(unit) = dwarf.unit(header) else {
                    continue;
                };
                let Some(program) = unit.line_program.as_ref() else {
                    continue;
                };
                let header = program.header();
                for entry in header.file_names() {
                    if let Some(name) = entry_name(&dwarf, &unit, header, entry) {
                        out.push(name.into());
                    }
                }
            }
            out.sort_unstable();
            out.dedup();
            out
        })
    }

    /// Every line table's sequences, each its rows in address order (the
    /// end-of-sequence row left out).
    pub fn line_sequences(&self) -> Vec<Vec<LineRow>> {
        let Some(dwarf) = self.dwarf() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let mut names: HashMap<u64, Arc<str>> = HashMap::new();
            let mut rows = program.rows();
            let mut seq = Vec::new();
            while let Ok(Some((header, row))) = rows.next_row() {
                if row.end_sequence() {
                    if !seq.is_empty() {
                        out.push(std::mem::take(&mut seq));
                    }
                    continue;
                }
                let index = row.file_index();
                let file = names
                    .entry(index)
                    .or_insert_with(|| {
                        file_name(&dwarf, &unit, header, row)
                            .unwrap_or_default()
                            .into()
                    })
                    .clone();
                seq.push(LineRow {
                    addr: row.address(),
                    file,
                    line: row.line().map_or(0, |l| l.get() as u32),
                    stmt: row.is_stmt(),
                    prologue_end: row.prologue_end(),
                });
            }
        }
        out
    }

    /// Where the body of the function whose first instruction is at
    /// link-time `entry` (and which ends before `end`) starts: the row the
    /// compiler marked as the prologue's end, else the first row of
    /// another line after the entry (GCC's prologue is the function's
    /// opening line), else the entry's own row.
    pub fn body_start(&self, entry: u64, end: u64) -> Option<LineRow> {
        let seqs = self.line_sequences();
        let seq = seqs.iter().find(|s| s.iter().any(|r| r.addr == entry))?;
        let rows: Vec<&LineRow> = seq
            .iter()
            .filter(|r| r.addr >= entry && r.addr < end)
            .collect();
        let first = (*rows.first()?).clone();
        if let Some(r) = rows.iter().find(|r| r.prologue_end) {
            return Some((*r).clone());
        }
        rows.iter()
            .find(|r| r.addr > entry && r.line != 0 && r.line != first.line && r.stmt)
            .map(|r| (*r).clone())
            .or(Some(first))
    }

    /// The first instruction of `file`:`line`, or of the next line with
    /// code when `line` has none, if that one is in a function that
    /// starts at or before `line` (`function_entry` gives the entry of the
    /// function holding an address).
    pub fn line_start(
        &self,
        file: &str,
        line: u32,
        function_entry: impl Fn(u64) -> Option<u64>,
    ) -> Result<LineRow, NoCode> {
        // A file it does not name, asked for before: what was answered.
        if let Some(closest) = self.closest.lock().unwrap().get(file) {
            return Err(NoCode::NoFile(closest.clone()));
        }
        let names = self.line_files();
        if !names
            .iter()
            .any(|f| same_file(f, file) || base_name(f) == base_name(file))
        {
            let closest = closest_files(names, file);
            let mut seen = self.closest.lock().unwrap();
            if seen.len() >= CLOSEST_KEPT {
                seen.clear();
            }
            seen.insert(file.to_string(), closest.clone());
            return Err(NoCode::NoFile(closest));
        }
        let seqs = self.line_sequences();
        let all = || seqs.iter().flatten();
        let mut rows: Vec<&LineRow> = all().filter(|r| same_file(&r.file, file)).collect();
        if rows.is_empty() {
            // Another checkout of the same sources: the file's name alone.
            rows = all()
                .filter(|r| base_name(&r.file) == base_name(file))
                .collect();
        }
        if rows.is_empty() {
            let mut files: Vec<Arc<str>> = all().map(|r| r.file.clone()).collect();
            files.sort_unstable();
            files.dedup();
            return Err(NoCode::NoFile(closest_files(&files, file)));
        }
        let lowest = |l: u32| {
            rows.iter()
                .filter(|r| r.line == l && r.stmt)
                .min_by_key(|r| r.addr)
                .map(|r| (*r).clone())
        };
        if let Some(r) = lowest(line) {
            return Ok(r);
        }
        let next = rows
            .iter()
            .map(|r| r.line)
            .filter(|&l| l > line)
            .min()
            .and_then(lowest);
        let last = rows.iter().map(|r| r.line).max();
        let Some(r) = next else {
            return Err(NoCode::NoLine(last));
        };
        // The next line with code belongs to `line` only if its function
        // starts at or before `line` (not in a comment above it).
        let opening = function_entry(r.addr).and_then(|entry| {
            all()
                .filter(|x| x.addr == entry && x.line != 0)
                .map(|x| x.line)
                .min()
        });
        match opening {
            Some(l) if l <= line => Ok(r),
            _ => Err(NoCode::NoLine(last)),
        }
    }
}

/// The three files named closest to `file` (by their names alone).
fn closest_files(files: &[Arc<str>], file: &str) -> Vec<String> {
    let mut scored: Vec<(f64, &str)> = files
        .iter()
        .map(|f| (strsim::jaro_winkler(base_name(file), base_name(f)), &**f))
        .filter(|(s, _)| *s >= 0.8)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().take(3).map(|(_, f)| f.into()).collect()
}

/// The path of the file a row names: its directory and the unit's
/// directory joined where the name is relative.
fn file_name<'d>(
    dwarf: &gimli::Dwarf<R<'d>>,
    unit: &gimli::Unit<R<'d>>,
    header: &gimli::LineProgramHeader<R<'d>>,
    row: &gimli::LineRow,
) -> Option<String> {
    entry_name(dwarf, unit, header, row.file(header)?)
}

/// The path of a line table's file entry (see [`file_name`]).
fn entry_name<'d>(
    dwarf: &gimli::Dwarf<R<'d>>,
    unit: &gimli::Unit<R<'d>>,
    header: &gimli::LineProgramHeader<R<'d>>,
    entry: &gimli::FileEntry<R<'d>>,
) -> Option<String> {
    let text = |v: gimli::AttributeValue<R<'d>>| -> Option<String> {
        let s = dwarf.attr_string(unit, v).ok()?;
        Some(s.to_string_lossy().into_owned())
    };
    let name = text(entry.path_name())?;
    if name.starts_with('/') {
        return Some(name);
    }
    let mut path = String::new();
    if let Some(dir) = entry.directory(header).and_then(text) {
        path = dir;
    }
    if !path.starts_with('/')
        && let Some(comp) = unit.comp_dir.as_ref()
    {
        let c = comp.to_string_lossy();
        path = if path.is_empty() {
            c.into_owned()
        } else {
            format!("{c}/{path}")
        };
    }
    Some(if path.is_empty() {
        name
    } else {
        format!("{}/{name}", path.trim_end_matches('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_match_by_path_or_its_last_components() {
        assert!(same_file("/src/tests/c/bp.c", "/src/tests/c/bp.c"));
        assert!(same_file("/src/tests/c/bp.c", "bp.c"));
        assert!(same_file("/src/tests/c/bp.c", "c/bp.c"));
        assert!(same_file("/src/tests/c/bp.c", "./c/bp.c"));
        assert!(same_file("tests/c/bp.c", "/src/tests/c/bp.c"));
        assert!(!same_file("/src/tests/c/xbp.c", "bp.c"));
        assert!(!same_file("/src/tests/c/bp.c", "/other/bp.c"));
    }
}
