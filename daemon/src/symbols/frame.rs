//! The parameters and local variables of a stack frame, from DWARF: the
//! function (and the lexical blocks) whose address ranges hold the frame's
//! address, their variables' types, and their locations evaluated with
//! gimli against the frame — its registers (every general one in the
//! innermost frame; the stack and frame pointers and the instruction
//! pointer in the others, as unwinding recovers them), its canonical frame
//! address (`DW_OP_call_frame_cfa`, what GCC and clang give as a function's
//! frame base) and the process's memory.

use gimli::{AttributeValue, EvaluationResult, Location, UnitOffset, Value};

use super::dwarf::{DwarfFile, R, name_of, type_info, type_ref};

/// A variable of a frame, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalVar {
    /// Its name.
    pub name: String,
    /// Its type as C writes it.
    pub type_name: String,
    /// A parameter of the function (else a local variable).
    pub parameter: bool,
    /// Where it is in memory (not for one held in a register).
    pub address: Option<u64>,
    /// Its bytes, or why they cannot be read.
    pub value: Result<Vec<u8>, String>,
    /// Its type's DIE (for expressions that start from it).
    pub ty: Option<super::dwarf::TypeRef>,
}

/// What evaluating a frame's variables needs of the frame and the process.
pub struct FrameAccess<'a> {
    /// A register by its DWARF number, where known in this frame.
    pub register: &'a dyn Fn(u16) -> Option<u64>,
    /// The frame's canonical frame address, if unwinding found it.
    pub cfa: Option<u64>,
    /// `len` bytes of the process at a runtime address.
    pub read: &'a mut dyn FnMut(u64, usize) -> Option<Vec<u8>>,
    /// Runtime address minus link-time address of the module.
    pub bias: u64,
}

/// Where an evaluated location puts a variable.
enum Place {
    Memory(u64),
    Register(u16),
    Value(u64),
    Bytes(Vec<u8>),
}

/// At most this many bytes of a variable are read (a large array).
const MAX_VALUE: usize = 4096;

impl DwarfFile {
    /// The parameters and variables in scope at link-time address `pc`:
    /// those of the function holding it and of its lexical blocks that hold
    /// it, outermost first. `None` when no function's DWARF holds `pc`.
    pub fn frame_variables(&self, pc: u64, f: &mut FrameAccess<'_>) -> Option<Vec<LocalVar>> {
        let dwarf = self.dwarf()?;
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let mut covers = false;
            if let Ok(mut ranges) = dwarf.unit_ranges(&unit) {
                while let Ok(Some(r)) = ranges.next() {
                    if r.begin <= pc && pc < r.end {
                        covers = true;
                        break;
                    }
                }
            }
            if !covers {
                continue;
            }
            if let Some(vars) = in_unit(&dwarf, &unit, pc, f) {
                return Some(vars);
            }
        }
        None
    }
}

pub(super) fn holds<'d>(
    dwarf: &gimli::Dwarf<R<'d>>,
    unit: &gimli::Unit<R<'d>>,
    e: &gimli::DebuggingInformationEntry<R<'d>>,
    pc: u64,
) -> bool {
    let Ok(mut ranges) = dwarf.die_ranges(unit, e) else {
        return false;
    };
    while let Ok(Some(r)) = ranges.next() {
        if r.begin <= pc && pc < r.end {
            return true;
        }
    }
    false
}

/// The variables in scope at `pc` in `unit`, if a function of it holds `pc`.
fn in_unit<'d>(
    dwarf: &gimli::Dwarf<R<'d>>,
    unit: &gimli::Unit<R<'d>>,
    pc: u64,
    f: &mut FrameAccess<'_>,
) -> Option<Vec<LocalVar>> {
    let mut entries = unit.entries();
    // Depths of the function and lexical blocks that hold `pc`, outermost
    // first; the variables found directly inside them.
    let mut scopes: Vec<isize> = Vec::new();
    let mut frame_base: Option<AttributeValue<R<'d>>> = None;
    let mut found: Vec<(UnitOffset, bool)> = Vec::new();
    let mut function_depth: Option<isize> = None;
    while let Ok(Some(e)) = entries.next_dfs() {
        let depth = e.depth();
        if function_depth.is_some_and(|d| depth <= d) {
            break; // past the function
        }
        while scopes.last().is_some_and(|&d| d >= depth) {
            scopes.pop();
        }
        match e.tag() {
            gimli::DW_TAG_subprogram if function_depth.is_none() && holds(dwarf, unit, e, pc) => {
                function_depth = Some(depth);
                frame_base = e.attr_value(gimli::DW_AT_frame_base);
                scopes.push(depth);
            }
            gimli::DW_TAG_lexical_block
                if scopes.last() == Some(&(depth - 1)) && holds(dwarf, unit, e, pc) =>
            {
                scopes.push(depth);
            }
            gimli::DW_TAG_formal_parameter | gimli::DW_TAG_variable
                if scopes.last() == Some(&(depth - 1)) =>
            {
                found.push((e.offset(), e.tag() == gimli::DW_TAG_formal_parameter));
            }
            _ => {}
        }
    }
    function_depth?;
    let base = frame_base.and_then(|fb| match fb {
        AttributeValue::Exprloc(expr) => match evaluate(dwarf, unit, expr, None, f) {
            Ok(Place::Memory(a)) | Ok(Place::Value(a)) => Some(a),
            Ok(Place::Register(r)) => (f.register)(r),
            _ => None,
        },
        _ => None,
    });
    let mut out = Vec::with_capacity(found.len());
    for (off, parameter) in found {
        let Ok(e) = unit.entry(off) else { continue };
        // A concrete instance names its abstract origin for name and type.
        let origin = match e.attr_value(gimli::DW_AT_abstract_origin) {
            Some(AttributeValue::UnitRef(o)) => unit.entry(o).ok(),
            _ => None,
        };
        let Some(name) = name_of(dwarf, unit, &e)
            .or_else(|| origin.as_ref().and_then(|o| name_of(dwarf, unit, o)))
        else {
            continue;
        };
        let ty = type_ref(&e).or_else(|| origin.as_ref().and_then(type_ref));
        let info = type_info(dwarf, unit, ty).ok();
        let type_name = info.as_ref().map_or_else(|| "?".into(), |i| i.name.clone());
        let size = info
            .as_ref()
            .and_then(|i| i.size)
            .map_or(0, |s| s.min(MAX_VALUE as u64) as usize);
        let (address, value) = match variable_place(dwarf, unit, &e, pc, base, f) {
            Err(why) => (None, Err(why)),
            Ok(Place::Memory(a)) => (
                Some(a),
                (f.read)(a, size).ok_or_else(|| format!("cannot read {size} bytes at {a:#x}")),
            ),
            Ok(Place::Register(r)) => (
                None,
                (f.register)(r)
                    .map(|v| v.to_le_bytes()[..size.min(8)].to_vec())
                    .ok_or_else(|| format!("in register {r}, not known in this frame")),
            ),
            Ok(Place::Value(v)) => (None, Ok(v.to_le_bytes()[..size.min(8)].to_vec())),
            Ok(Place::Bytes(b)) => (None, Ok(b)),
        };
        let unit_off = unit.header.debug_info_offset().map(|o| o.0);
        out.push(LocalVar {
            name,
            type_name,
            parameter,
            address,
            value,
            ty: ty
                .zip(unit_off)
                .map(|(die, unit)| super::dwarf::TypeRef { unit, die }),
        });
    }
    Some(out)
}

/// Where variable `e` is at `pc`: its location expression, or the entry of
/// its location list that covers `pc`.
fn variable_place<'d>(
    dwarf: &gimli::Dwarf<R<'d>>,
    unit: &gimli::Unit<R<'d>>,
    e: &gimli::DebuggingInformationEntry<R<'d>>,
    pc: u64,
    base: Option<u64>,
    f: &mut FrameAccess<'_>,
) -> Result<Place, String> {
    const GONE: &str = "optimized out";
    let attr = e.attr_value(gimli::DW_AT_location).ok_or(GONE)?;
    let expr = match attr {
        AttributeValue::Exprloc(expr) => expr,
        other => {
            let mut list = dwarf
                .attr_locations(unit, other)
                .map_err(|e| e.to_string())?
                .ok_or(GONE)?;
            let mut hit = None;
            while let Ok(Some(entry)) = list.next() {
                if entry.range.begin <= pc && pc < entry.range.end {
                    hit = Some(entry.data);
                    break;
                }
            }
            hit.ok_or("optimized out here")?
        }
    };
    evaluate(dwarf, unit, expr, base, f)
}

/// Evaluates a DWARF location expression against the frame.
fn evaluate<'d>(
    dwarf: &gimli::Dwarf<R<'d>>,
    unit: &gimli::Unit<R<'d>>,
    expr: gimli::Expression<R<'d>>,
    frame_base: Option<u64>,
    f: &mut FrameAccess<'_>,
) -> Result<Place, String> {
    let err = |e: gimli::Error| e.to_string();
    let mut eval = expr.evaluation(unit.encoding());
    let mut state = eval.evaluate().map_err(err)?;
    loop {
        state = match state {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresMemory { address, size, .. } => {
                let b = (f.read)(address, usize::from(size))
                    .ok_or_else(|| format!("cannot read memory at {address:#x}"))?;
                let mut v = [0u8; 8];
                v[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
                eval.resume_with_memory(Value::Generic(u64::from_le_bytes(v)))
                    .map_err(err)?
            }
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = (f.register)(register.0)
                    .ok_or_else(|| format!("register {} is not known in this frame", register.0))?;
                eval.resume_with_register(Value::Generic(v)).map_err(err)?
            }
            EvaluationResult::RequiresFrameBase => {
                let fb = frame_base.ok_or("the function's frame base is not known")?;
                eval.resume_with_frame_base(fb).map_err(err)?
            }
            EvaluationResult::RequiresCallFrameCfa => {
                let cfa = f
                    .cfa
                    .ok_or("the frame's canonical frame address is not known")?;
                eval.resume_with_call_frame_cfa(cfa).map_err(err)?
            }
            EvaluationResult::RequiresRelocatedAddress(a) => eval
                .resume_with_relocated_address(a.wrapping_add(f.bias))
                .map_err(err)?,
            EvaluationResult::RequiresIndexedAddress { index, relocate } => {
                let a = dwarf.address(unit, index).map_err(err)?;
                let a = if relocate { a.wrapping_add(f.bias) } else { a };
                eval.resume_with_indexed_address(a).map_err(err)?
            }
            EvaluationResult::RequiresEntryValue(_) => {
                return Err("optimized out (its value at the function's entry)".into());
            }
            _ => return Err("a location this reader does not evaluate".into()),
        };
    }
    let pieces = eval.result();
    match pieces.as_slice() {
        [p] => match &p.location {
            Location::Address { address } => Ok(Place::Memory(*address)),
            Location::Register { register } => Ok(Place::Register(register.0)),
            Location::Value { value } => value.to_u64(u64::MAX).map(Place::Value).map_err(err),
            Location::Bytes { value } => Ok(Place::Bytes(value.to_vec())),
            Location::Empty => Err("optimized out".into()),
            Location::ImplicitPointer { .. } => Err("an implicit pointer (optimized out)".into()),
        },
        [] => Err("optimized out".into()),
        _ => Err("in several pieces (registers and memory)".into()),
    }
}
