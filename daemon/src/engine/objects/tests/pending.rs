//! Pending code events: a name that does not resolve yet is kept, listed
//! with why, and looked for again at the dynamic linker's hook.

use super::super::CodeSpec;
use super::{Armer, OWNER, Rig, breakpoint, record, spec};
use crate::backend::CodeHold;
use crate::error::WpdError;
use crate::symbols::SymbolError;

fn pending(function: &str) -> CodeSpec {
    CodeSpec {
        pending: true,
        ..breakpoint(function)
    }
}

#[test]
fn a_function_of_a_module_not_loaded_is_kept_pending_with_why() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(pending("libwpd-none.so.7:frob"));
    assert!(view.pending && view.ready);
    let why = "no module \"libwpd-none.so.7\" is loaded yet";
    assert_eq!(view.pending_why.as_deref(), Some(why));
    // Listed, counted against its owner, on its process.
    let listed = rig.core.object_watches();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].pending && listed[0].id == view.id);
    assert_eq!(rig.view(view.id).pending_why.as_deref(), Some(why));
    assert_eq!(rig.core.objects.held_by(OWNER), 1);
    assert_eq!(rig.core.objects.ids_on(pid), [view.id]);
    // No probe of its own: one at the loader's hook, called only once its
    // list is consistent again.
    let hook = probes.event();
    assert!(hook.path.to_string_lossy().contains("ld-linux"), "{hook:?}");
    assert!(!hook.ret);
    assert_eq!(hook.gate.map(|g| g.1), Some(0), "RT_CONSISTENT");
    assert!(rig.core.objects.has_loader_hook(pid));
}

#[test]
fn a_function_found_nowhere_says_how_many_modules_were_searched() {
    let rig = Rig::start();
    let (view, _) = rig.set(pending("wpd_no_such_function"));
    let why = view.pending_why.unwrap();
    assert!(
        why.starts_with("no function named \"wpd_no_such_function\" in the ")
            && why.contains(" modules loaded"),
        "{why}"
    );
}

#[test]
fn without_pending_a_name_not_found_is_refused() {
    let rig = Rig::start();
    let pid = rig.pid;
    let refused = |c: CodeSpec| {
        rig.core
            .set_object_watch(spec(pid), c, OWNER)
            .expect_err("refused")
    };
    let e = refused(breakpoint("libwpd-none.so.7:frob"));
    assert!(
        matches!(
            e,
            WpdError::Symbol(SymbolError::ModuleNotLoaded { ref module, .. })
                if module == "libwpd-none.so.7"
        ),
        "{e:?}"
    );
    let e = refused(breakpoint("wpd_no_such_function"));
    assert!(
        matches!(e, WpdError::Symbol(SymbolError::UnknownFunction { .. })),
        "{e:?}"
    );
    assert_eq!(rig.core.objects.count(), 0);
    assert!(rig.kernel.probes(pid).is_empty());
    assert!(!rig.core.objects.has_loader_hook(pid));
}

#[test]
fn a_thread_at_the_loader_hook_is_held_while_the_names_are_looked_for() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (view, probes) = rig.set(pending("libwpd-none.so.7:frob"));
    let hook = probes.event().key;
    let mut armer = Armer::reaching(&[pid]);
    // The target's loader is done: its list is consistent.
    let r = record(pid, hook, pid, 0, 0);
    assert_eq!(rig.stop(pid, &[r], &mut armer), CodeHold::Hold);
    rig.wait_resumed(pid, 1);
    let v = rig.view(view.id);
    assert!(v.pending, "still nowhere");
    assert_eq!(
        v.pending_why.as_deref(),
        Some("no module \"libwpd-none.so.7\" is loaded yet")
    );
    assert!(armer.armed.is_empty());
}

#[test]
fn the_loader_hook_closes_with_the_last_pending_event() {
    let rig = Rig::start();
    let pid = rig.pid;
    let (a, probes) = rig.set(pending("libwpd-none.so.7:frob"));
    let hook = probes.event().key;
    let (b, more) = rig.set(pending("libwpd-none.so.7:frob2"));
    assert!(more.0.is_empty(), "one hook per process: {more:?}");
    let removed = rig.core.remove_object_watch(a.id).unwrap();
    assert!(removed.pending);
    assert!(rig.kernel.closed_probes(pid).is_empty());
    assert!(rig.core.objects.has_loader_hook(pid));
    rig.core.remove_object_watch(b.id).unwrap();
    assert_eq!(rig.kernel.closed_probes(pid), [hook]);
    assert!(rig.kernel.probes(pid).is_empty());
    assert!(!rig.core.objects.has_loader_hook(pid));
    assert_eq!(rig.core.objects.count(), 0);
    assert!(rig.core.object_watches().is_empty());
}
