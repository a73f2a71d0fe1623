//! A variable's value now, as `ResolveSymbol` answers it (what `wpctl
//! symbol` prints as gdb's `print` does), read under the same check as
//! `ReadMemory`, and the name a value's bytes carry (an enumerator, the
//! symbol a pointer points into).

use crate::model::Pid;
use crate::symbols::{Resolved, Symbols};
use crate::value::{Kind, ValueType};

/// The largest object whose bytes `ResolveSymbol` reads with its answer.
pub const VALUE_BYTES: u64 = 64;
/// A variable's value now, as `ResolveSymbol` answers it: its bytes (or
/// why none), and their name. Blocking (reads the process's memory and,
/// for a pointer, its maps).
pub fn current(symbols: &Symbols, pid: Pid, r: &Resolved) -> (Vec<u8>, String, String) {
    if r.size > VALUE_BYTES {
        return (
            Vec::new(),
            format!(
                "{} bytes: more than the {VALUE_BYTES} read with the name (read them with \
                 ReadMemory)",
                r.size
            ),
            String::new(),
        );
    }
    let Some(via) = crate::procfs::live_thread(pid) else {
        return (Vec::new(), "the process has exited".into(), String::new());
    };
    match crate::procfs::read_memory(pid, via, r.address, r.size as usize) {
        Ok(bytes) => {
            let name = name_of(symbols, pid, r.value_type.as_ref(), &bytes).unwrap_or_default();
            (bytes, String::new(), name)
        }
        Err(why) => (Vec::new(), why, String::new()),
    }
}
/// What `ResolveSymbol` answers of a name's value (bytes, why none, their
/// name), by what the name is: an object's bytes now, a value's own.
/// Blocking.
pub fn of_name(
    symbols: &Symbols,
    pid: Pid,
    r: &Resolved,
    kind: crate::symbols::NameKind,
) -> (Vec<u8>, String, String) {
    use crate::symbols::NameKind;
    match (kind, &r.value) {
        (NameKind::Value, Some(bytes)) => {
            let name = name_of(symbols, pid, r.value_type.as_ref(), bytes).unwrap_or_default();
            (bytes.clone(), String::new(), name)
        }
        (NameKind::Variable, _) => current(symbols, pid, r),
        _ => (Vec::new(), String::new(), String::new()),
    }
}
/// The name of a value's `bytes` read as `t`: its enumerator, or the
/// symbol a pointer points into. Blocking for a pointer.
pub fn name_of(symbols: &Symbols, pid: Pid, t: Option<&ValueType>, bytes: &[u8]) -> Option<String> {
    let t = t?;
    if t.kind == Kind::Pointer && bytes.len() == 8 {
        let addr = crate::filter::value_u64(bytes);
        return symbols.points_into(pid, &[addr]).pop().flatten();
    }
    t.enumerator(bytes).map(str::to_string)
}
