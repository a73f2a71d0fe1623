//! Builds the C programs the symbol tests watch by name (`c/`), in the
//! variants those tests need, into `$OUT_DIR/ctargets`, and tells the crate
//! where (`WPD_CTARGETS`). Needs a C compiler (`$CC`, else `cc`) and
//! binutils' `objcopy` and `strip`.
//!
//! | file | built |
//! |---|---|
//! | `libctlib.so`, `libctplug.so` | `-g -O0 -fPIC -shared` |
//! | `ct-pie` | `-g -O0 -fPIE -pie`, linked with `libctlib.so` (rpath `$ORIGIN`) |
//! | `ct-nopie` | `-g -O0 -fno-pie -no-pie` |
//! | `ct-nodebug` | `-O0 -fPIE -pie`, no `-g` (an ELF symbol table only) |
//! | `ct-debuglink` (+ `ct-debuglink.debug`) | `ct-pie` stripped, its debug info in a separate file named by `.gnu_debuglink` |
//! | `ct-stripped` | `ct-pie` with every symbol table stripped |
//! | `ct-pie.debug` | `ct-pie`'s debug information alone (`objcopy --only-keep-debug`) |
//! | `ct-fifolink` | `-O0 -fPIE -pie`, no `-g`, no build id, and a `.gnu_debuglink` naming `ct-fifolink.debug` (which a test makes a FIFO) |
//! | `ct-nofp` | `-g -O2 -fomit-frame-pointer` (no frame-pointer chain) |
//! | `ct-launch` | `launched.c`, `-g -O0` (PIE): the program the DAP tests launch |
//! | `ct-breaks` | `breaks.c`, `-g -O0` (PIE): the program the DAP code-breakpoint tests launch |
//! | `ct-step`, `ct-step-o2` | `stepping.c`, `-g -O0` and `-g -O2`: a thread `stepper` looping over marked lines beside N workers (the stepping tests and the bench's `steps`) |
//! | `ct-quick` | `quick.c`: stores `counter` three times at the top of `main` and exits (or lives N ms more) |
//! | `ct-nolibc` | `nolibc.c`, `-static -nostdlib`: no dynamic linker, no C library (no loader hook) |
//! | `ct-plugins`, `libplugin.so`, `libplugin2.so`, `libplugin3.so` | `plugins.c` and `plugin.c` (the libraries built from it, `-fPIC -shared`), `-g -O0`: a program that dlopens a plugin on command (pending code events); `libplugin3.so` has the plugin's names renamed (`-Dplugin_work=plugin3_work`...) and needs `libplugin2.so` (rpath `$ORIGIN`): one dlopen, two modules whose line tables name `plugin.c` |
//! | `ct-locals` | generated: `fifty()` with 50 locals, which stores into `hit` in a loop (the DAP variables benchmark), `-g -O0` |
//! | `ct-objects`, `ct-objects-nodebug` | `objects.c` (code events' heap objects), `-g -O0` and `-O0` |
//! | `ct-objfloor` | `objfloor.c`, `-O2`: the floor of the objects benchmark (a bare tracer doing the kernel's part of `--on-return`) |
//! | `ct-ips` | generated: 1,000 functions that each store into `counter` (`sweep` calls them all), `-g -O0` |
//! | `ct-uprobeclose` | `uprobeclose.c`, `-O2`: N uprobes on a child opened and closed by T threads, as perf events or BPF links (the floor of the bench's `closes` section, kernel-facts §21) |
//! | `ct-typed` | `typed.c`, `-g -O0` (PIE): a global of each kind a value reads as (`long`, `int`, `double`, `float`, `bool`, an enum, a pointer) |

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) {
    let shown = format!("{cmd:?}");
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run {shown}: {e} (the tests need a C compiler and binutils)")
    });
    assert!(status.success(), "{shown} failed: {status}");
}

fn cc(out: &Path, args: &[&str]) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut c = Command::new(cc);
    c.current_dir(out).args(["-Wall", "-Werror"]).args(args);
    run(&mut c);
}

fn main() {
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("c");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("ctargets");
    std::fs::create_dir_all(&out).unwrap();
    let s = |f: &str| src.join(f).display().to_string();
    cc(
        &out,
        &[
            "-g",
            "-O0",
            "-fPIC",
            "-shared",
            "-o",
            "libctlib.so",
            &s("ctlib.c"),
        ],
    );
    cc(
        &out,
        &[
            "-g",
            "-O0",
            "-fPIC",
            "-shared",
            "-o",
            "libctplug.so",
            &s("ctplug.c"),
        ],
    );
    let link = ["-L.", "-lctlib", "-Wl,-rpath,$ORIGIN", "-ldl", "-lpthread"];
    let exe = |name: &str, flags: &[&str]| {
        let target = s("ctarget.c");
        let mut args: Vec<&str> = flags.to_vec();
        args.extend(["-o", name, target.as_str()]);
        args.extend(link);
        cc(&out, &args);
    };
    exe("ct-pie", &["-g", "-O0", "-fPIE", "-pie"]);
    exe("ct-nopie", &["-g", "-O0", "-fno-pie", "-no-pie"]);
    exe("ct-nodebug", &["-O0", "-fPIE", "-pie"]);
    exe(
        "ct-nofp",
        &["-g", "-O2", "-fomit-frame-pointer", "-fPIE", "-pie"],
    );
    exe("ct-debuglink", &["-g", "-O0", "-fPIE", "-pie"]);
    let tool = |name: &str, args: &[&str]| {
        let mut c = Command::new(name);
        c.current_dir(&out).args(args);
        run(&mut c);
    };
    tool(
        "objcopy",
        &["--only-keep-debug", "ct-debuglink", "ct-debuglink.debug"],
    );
    tool("strip", &["--strip-all", "ct-debuglink"]);
    tool(
        "objcopy",
        &["--add-gnu-debuglink=ct-debuglink.debug", "ct-debuglink"],
    );
    // ct-pie's debug information alone: found for ct-stripped by build id
    // (strip keeps the build-id note) in a debug directory a test sets up.
    tool("objcopy", &["--only-keep-debug", "ct-pie", "ct-pie.debug"]);
    std::fs::copy(out.join("ct-pie"), out.join("ct-stripped")).unwrap();
    tool("strip", &["--strip-all", "ct-stripped"]);
    // No DWARF, no build id: its debug file is looked for by its debug link
    // only, beside it, where a test puts a FIFO.
    exe(
        "ct-fifolink",
        &["-O0", "-fPIE", "-pie", "-Wl,--build-id=none"],
    );
    std::fs::write(out.join("ct-fifolink.debug"), "x\n").unwrap();
    tool(
        "objcopy",
        &["--add-gnu-debuglink=ct-fifolink.debug", "ct-fifolink"],
    );
    std::fs::remove_file(out.join("ct-fifolink.debug")).unwrap();
    cc(&out, &["-g", "-O0", "-o", "ct-launch", &s("launched.c")]);
    cc(
        &out,
        &[
            "-g",
            "-O1",
            "-static",
            "-nostdlib",
            "-fno-stack-protector",
            "-fno-pie",
            "-no-pie",
            "-o",
            "ct-nolibc",
            &s("nolibc.c"),
        ],
    );
    cc(&out, &["-g", "-O0", "-o", "ct-breaks", &s("breaks.c")]);
    cc(&out, &["-g", "-O0", "-o", "ct-quick", &s("quick.c")]);
    for (name, opt) in [("ct-step", "-O0"), ("ct-step-o2", "-O2")] {
        cc(&out, &["-g", opt, "-pthread", "-o", name, &s("stepping.c")]);
    }
    cc(
        &out,
        &[
            "-g",
            "-O0",
            "-fPIC",
            "-shared",
            "-o",
            "libplugin.so",
            &s("plugin.c"),
        ],
    );
    // The same source again: a second module whose line table names plugin.c.
    cc(
        &out,
        &[
            "-g",
            "-O0",
            "-fPIC",
            "-shared",
            "-o",
            "libplugin2.so",
            &s("plugin.c"),
        ],
    );
    // The same source a third time, its names renamed so that none
    // interposes on libplugin2.so's, needing libplugin2.so (kept even where
    // the linker drops unused libraries): one dlopen loads both.
    cc(
        &out,
        &[
            "-g",
            "-O0",
            "-fPIC",
            "-shared",
            "-Dplugin_work=plugin3_work",
            "-Dplugin_calls=plugin3_calls",
            "-Dplugin_new=plugin3_new",
            "-o",
            "libplugin3.so",
            &s("plugin.c"),
            "-L.",
            "-Wl,--no-as-needed",
            "-lplugin2",
            "-Wl,-rpath,$ORIGIN",
        ],
    );
    cc(
        &out,
        &[
            "-g",
            "-O0",
            "-o",
            "ct-plugins",
            &s("plugins.c"),
            "-ldl",
            "-lpthread",
        ],
    );
    let objects = s("objects.c");
    cc(
        &out,
        &["-g", "-O0", "-o", "ct-objects", &objects, "-lpthread"],
    );
    cc(
        &out,
        &["-O0", "-o", "ct-objects-nodebug", &objects, "-lpthread"],
    );
    cc(&out, &["-O2", "-o", "ct-objfloor", &s("objfloor.c")]);
    cc(
        &out,
        &[
            "-O2",
            "-pthread",
            "-o",
            "ct-uprobeclose",
            &s("uprobeclose.c"),
        ],
    );
    cc(&out, &["-g", "-O0", "-o", "ct-typed", &s("typed.c")]);
    std::fs::write(out.join("ct-ips.c"), ips_source(IPS)).unwrap();
    cc(&out, &["-g", "-O0", "-o", "ct-ips", "ct-ips.c"]);
    std::fs::write(out.join("ct-locals.c"), locals_source(LOCALS)).unwrap();
    cc(&out, &["-g", "-O0", "-o", "ct-locals", "ct-locals.c"]);
    println!("cargo:rustc-env=WPD_CTARGETS={}", out.display());
    println!("cargo:rustc-env=WPD_CT_IPS={IPS}");
}

/// Locals of `ct-locals`'s `fifty()`.
const LOCALS: usize = 50;

/// A program whose `fifty()` has `n` local variables and stores their sum
/// into `hit`; `main` calls it forever. A data breakpoint on `hit` stops
/// the thread inside `fifty()`, all its locals in scope.
fn locals_source(n: usize) -> String {
    let mut c = String::from(
        "/* Generated by tests/build.rs. */\nlong hit;\nstatic long round_;\n\n__attribute__((noinline)) void fifty(void)\n{\n",
    );
    for i in 0..n {
        c.push_str(&format!("    long l{i} = round_ + {i};\n"));
    }
    c.push_str("    hit = 0");
    for i in 0..n {
        c.push_str(&format!(" + l{i}"));
    }
    c.push_str(";\n}\n\nint main(void)\n{\n    for (;;) {\n        round_++;\n        fifty();\n    }\n}\n");
    c
}

/// Functions in `ct-ips`.
const IPS: usize = 1000;

/// A program with `n` functions, each storing into `counter` from its own
/// instruction (the benchmark of symbolizing many distinct addresses).
/// Commands: `sweep` (calls every function once, `SWEPT n=N`), `quit`.
fn ips_source(n: usize) -> String {
    let mut c = String::from(
        "/* Generated by tests/build.rs. */\n#include <stdio.h>\n#include <string.h>\n#include <unistd.h>\n\nlong counter;\n\n",
    );
    for i in 0..n {
        c.push_str(&format!(
            "__attribute__((noinline)) void store_{i}(long v) {{ counter = v + {i}; }}\n"
        ));
    }
    c.push_str("\nstatic void (*const stores[])(long) = {\n");
    for i in 0..n {
        c.push_str(&format!("    store_{i},\n"));
    }
    c.push_str(
        "};\n\nint main(void)\n{\n    setvbuf(stdout, NULL, _IOLBF, 0);\n    \
         printf(\"READY pid=%d counter=%p\\n\", getpid(), (void *)&counter);\n    \
         char line[64];\n    long round = 0;\n    \
         while (fgets(line, sizeof line, stdin)) {\n        \
         if (!strncmp(line, \"sweep\", 5)) {\n            \
         for (unsigned i = 0; i < sizeof stores / sizeof stores[0]; i++)\n                \
         stores[i](round);\n            round++;\n            \
         printf(\"SWEPT n=%zu\\n\", sizeof stores / sizeof stores[0]);\n        \
         } else if (!strncmp(line, \"quit\", 4)) {\n            puts(\"BYE\");\n            \
         return 0;\n        }\n    }\n    return 0;\n}\n",
    );
    c
}
