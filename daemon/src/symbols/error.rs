//! Why a name does not resolve: [`SymbolError`], one variant per case,
//! each its own status and reason (`rpc/status.rs`).

use super::{dwarf, expr};
use crate::model::Pid;

impl SymbolError {
    /// Whether the name may resolve in the same process a moment later: a
    /// module or name not mapped yet (a program just started or exec'd,
    /// whose dynamic linker has not loaded its libraries).
    pub fn may_resolve_later(&self) -> bool {
        matches!(
            self,
            SymbolError::NoSuchModule { .. }
                | SymbolError::Unknown { .. }
                | SymbolError::SourceNotLoaded { .. }
        )
    }
}

/// Why a name does not resolve. Each is a refusal that changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SymbolError {
    /// Not a name.
    #[error("{0}")]
    Syntax(#[from] expr::ExprError),
    /// No module of that name.
    #[error("process {pid} maps no module {module:?} (it maps {})", loaded.join(", "))]
    NoSuchModule {
        /// Process.
        pid: Pid,
        /// Asked for.
        module: String,
        /// The modules it maps.
        loaded: Vec<String>,
    },
    /// A code event's module that the process has not loaded (yet), asked
    /// for without `pending`.
    #[error(
        "process {pid} has not loaded a module {module:?} (it maps {}): to arm this code event when the module is loaded (at a dlopen, or by the dynamic linker at startup), set it pending (wpctl --pending; CodeEvent.pending)",
        loaded.join(", ")
    )]
    ModuleNotLoaded {
        /// Process.
        pid: Pid,
        /// Asked for.
        module: String,
        /// The modules it maps.
        loaded: Vec<String>,
    },
    /// Nothing of that name.
    #[error("{}", unknown_message(name, *pid, *searched, closest, stripped))]
    Unknown {
        /// Process.
        pid: Pid,
        /// The name.
        name: String,
        /// Modules searched.
        searched: usize,
        /// The closest names found.
        closest: Vec<String>,
        /// Modules searched that have no symbol table and no debug file.
        stripped: Vec<String>,
    },
    /// A code event's function (named without its module) that no module
    /// the process has loaded defines, asked for without `pending`: like
    /// [`SymbolError::Unknown`], naming the way to wait for a library.
    #[error("{}", unknown_function_message(name, *pid, *searched, closest, stripped))]
    UnknownFunction {
        /// Process.
        pid: Pid,
        /// The name.
        name: String,
        /// Modules searched.
        searched: usize,
        /// The closest names found.
        closest: Vec<String>,
        /// Modules searched that have no symbol table and no debug file.
        stripped: Vec<String>,
    },
    /// Several unrelated variables of that name.
    #[error(
        "{name:?} names {} variables in process {pid}: {}; say which with MODULE:{name}",
        modules.len(),
        modules.join(", ")
    )]
    Ambiguous {
        /// Process.
        pid: Pid,
        /// The name.
        name: String,
        /// `module (static|global)` of each.
        modules: Vec<String>,
    },
    /// A function, not a variable.
    #[error(
        "{name:?} is a function in {module}, not a variable: to watch it being executed, use --access exec (a 1-byte exec watchpoint at its entry)"
    )]
    NotAVariable {
        /// The name.
        name: String,
        /// Its module.
        module: String,
    },
    /// A thread-local variable.
    #[error(
        "{name:?} in {module} is thread-local: every thread has its own copy at its own address, which one watchpoint cannot follow across threads; watch one thread's copy by its address with --tid"
    )]
    ThreadLocal {
        /// The name.
        name: String,
        /// Its module.
        module: String,
    },
    /// Members or elements asked for without DWARF.
    #[error(
        "{expr} needs the type of {name:?}, and {module} has no debug information ({why}): build it with -g, install its debug file, or give an address and --len"
    )]
    NoDebugInfo {
        /// The expression.
        expr: String,
        /// The variable.
        name: String,
        /// Its module.
        module: String,
        /// What was looked for.
        why: String,
    },
    /// A path into the variable that does not exist.
    #[error("{expr}: {error}")]
    Path {
        /// The expression.
        expr: String,
        /// What is wrong.
        error: dwarf::PathError,
    },
    /// An offset outside the object with no length given.
    #[error(
        "{expr}: offset {offset} is outside the {size} bytes of {name:?}; give --len to watch there"
    )]
    Offset {
        /// The expression.
        expr: String,
        /// The variable.
        name: String,
        /// Offset asked for.
        offset: i64,
        /// Size of the object.
        size: u64,
    },
    /// The size is not known.
    #[error("the size of {expr} is not known ({why}): give --len")]
    NoSize {
        /// The expression.
        expr: String,
        /// Why.
        why: String,
    },
    /// An object larger than a thread's slots cover.
    #[error(
        "{expr} ({}{size} bytes) needs {needed} debug-register slots per thread and a thread has {slots}: watch part of it (a member, an element, or fewer bytes with --len)",
        type_name.as_ref().map(|t| format!("{t}, ")).unwrap_or_default()
    )]
    TooLarge {
        /// The expression.
        expr: String,
        /// Its type.
        type_name: Option<String>,
        /// Its size.
        size: u64,
        /// Slots it would take.
        needed: usize,
        /// Slots per thread.
        slots: usize,
    },
    /// A type name the module's DWARF does not define.
    #[error(
        "{expr}: no type named {name:?} in {module}'s debug information{}",
        if closest.is_empty() { String::new() } else { format!(" (closest: {})", closest.join(", ")) }
    )]
    UnknownType {
        /// The expression.
        expr: String,
        /// The type name.
        name: String,
        /// The module searched.
        module: String,
        /// The closest type names.
        closest: Vec<String>,
    },
    /// A variable the compiler left out: DWARF describes it, without a
    /// place in memory.
    #[error(
        "{name:?} is optimized out in {module}: its debug information gives it no place in memory (build with -O0, or watch what it was folded into)"
    )]
    OptimizedOut {
        /// The variable.
        name: String,
        /// Its module.
        module: String,
    },
    /// An expression that computes a value where an object is needed.
    #[error(
        "{expr} is a value ({type_name}), not an object in memory: there is nothing to watch{hint}"
    )]
    NotAnObject {
        /// The expression.
        expr: String,
        /// The value's type.
        type_name: String,
        /// What to watch instead.
        hint: String,
    },
    /// A source line with no code to break at, or a file no line table
    /// names.
    #[error("no code at {file}:{line} in process {pid}: {why}")]
    NoCodeAtLine {
        /// Process.
        pid: Pid,
        /// The file asked for.
        file: String,
        /// The line asked for.
        line: u32,
        /// Why, and what is there instead.
        why: String,
    },
    /// A source file that no line table of the modules the process has
    /// loaded names: misspelled, or a source of a library loaded later
    /// (which `pending` waits for).
    #[error("{}", source_not_loaded_message(file, *line, *pid, *searched, closest))]
    SourceNotLoaded {
        /// Process.
        pid: Pid,
        /// The file asked for.
        file: String,
        /// The line asked for.
        line: u32,
        /// Modules with line tables searched.
        searched: usize,
        /// The files named closest to it.
        closest: Vec<String>,
    },
    /// The process's files could not be read.
    #[error("cannot read the mappings of process {pid}: {why}")]
    Unreadable {
        /// Process.
        pid: Pid,
        /// Why.
        why: String,
    },
    /// A module file the answer needs has been loading for longer than a
    /// request waits (its file is slow to open or read): its load goes on,
    /// and the same request may succeed later.
    #[error(
        "module {module} of process {pid} is still loading (for {since_ms} ms: its file is slow \
         to open or read); ask again later"
    )]
    ModuleLoading {
        /// Process.
        pid: Pid,
        /// The module's path in the process.
        module: String,
        /// How long it has been loading.
        since_ms: u64,
    },
    /// A module file the answer needs was not loaded: the processes of its
    /// owner have as many loads in flight as they may (or the daemon has).
    #[error(
        "module {module} of process {pid} was not loaded: {in_flight} module files of processes \
         of uid {uid} are loading already (at most {max} at once); ask again once they are \
         loaded"
    )]
    TooManyLoads {
        /// Process.
        pid: Pid,
        /// The module's path in the process.
        module: String,
        /// The owner (real uid) whose loads count together.
        uid: u32,
        /// Loads in flight.
        in_flight: usize,
        /// The bound reached.
        max: usize,
    },
}

impl SymbolError {
    /// The error for a module file of `pid` still loading or not loaded
    /// for the loads in flight; [`SymbolError::Unreadable`] for one that
    /// cannot be read.
    pub fn loading(pid: Pid, e: super::LoadError) -> SymbolError {
        use super::LoadError as L;
        match e {
            L::Loading { module, since } => SymbolError::ModuleLoading {
                pid,
                module,
                since_ms: since.as_millis() as u64,
            },
            L::Busy {
                module,
                uid,
                in_flight,
                max,
            } => SymbolError::TooManyLoads {
                pid,
                module,
                uid,
                in_flight,
                max,
            },
            L::Unreadable(e) => SymbolError::Unreadable {
                pid,
                why: e.to_string(),
            },
        }
    }
}

fn unknown_message(
    name: &str,
    pid: Pid,
    searched: usize,
    closest: &[String],
    stripped: &[String],
) -> String {
    let mut s = format!(
        "no variable or function named {name:?} in process {pid} ({searched} module{} searched",
        if searched == 1 { "" } else { "s" }
    );
    if !closest.is_empty() {
        s.push_str(&format!("; closest: {}", closest.join(", ")));
    }
    s.push(')');
    if !stripped.is_empty() {
        s.push_str(&format!(
            "; {} {} stripped (no symbol table, and no debug file was found): only {} exported names are known",
            stripped.join(", "),
            if stripped.len() == 1 { "is" } else { "are" },
            if stripped.len() == 1 { "its" } else { "their" }
        ));
    }
    s
}

/// `UnknownFunction`'s text: `Unknown`'s, then how to wait for a library.
fn unknown_function_message(
    name: &str,
    pid: Pid,
    searched: usize,
    closest: &[String],
    stripped: &[String],
) -> String {
    let mut s = format!(
        "no function named {name:?} in the {searched} module{} process {pid} has loaded",
        if searched == 1 { "" } else { "s" }
    );
    if !closest.is_empty() {
        s.push_str(&format!(" (closest: {})", closest.join(", ")));
    }
    if !stripped.is_empty() {
        s.push_str(&format!(
            "; {} {} stripped (only exported names are known)",
            stripped.join(", "),
            if stripped.len() == 1 { "is" } else { "are" },
        ));
    }
    s.push_str(&format!(
        ": if a library it loads later defines it, set it pending (wpctl --pending \
         LIBRARY:{name}, e.g. libfoo.so:{name}; CodeEvent.pending)"
    ));
    s
}

/// `SourceNotLoaded`'s text.
fn source_not_loaded_message(
    file: &str,
    line: u32,
    pid: Pid,
    searched: usize,
    closest: &[String],
) -> String {
    let mut s = if searched == 0 {
        format!(
            "no code at {file}:{line} in process {pid}: no module it has loaded has DWARF \
             line tables (build with -g)"
        )
    } else {
        format!(
            "no code at {file}:{line} in process {pid}: no line table names that file ({searched} \
             module{} with line tables loaded",
            if searched == 1 { "" } else { "s" }
        )
    };
    if searched > 0 {
        if !closest.is_empty() {
            s.push_str(&format!("; closest: {}", closest.join(", ")));
        }
        s.push(')');
    }
    s.push_str(
        "; if it is a source of a library the process loads later, set the breakpoint \
         pending (wpctl --pending; CodeEvent.pending)",
    );
    s
}
