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
//! | `ct-nofp` | `-g -O2 -fomit-frame-pointer` (no frame-pointer chain) |

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
    std::fs::copy(out.join("ct-pie"), out.join("ct-stripped")).unwrap();
    tool("strip", &["--strip-all", "ct-stripped"]);
    println!("cargo:rustc-env=WPD_CTARGETS={}", out.display());
}
