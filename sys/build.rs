//! Build script: binds libpmix from the installed headers, and pins the Slurm release whose
//! plugin ABI is compiled in (the loader demands the exact SLURM_VERSION_NUMBER).

use std::env;
use std::path::PathBuf;

/// Slurm releases (major, minor) whose internal plugin ABI is declared in `src/raw/slurm/`.
/// Adding one is one more module there and one more line here.
const SLURM_RELEASES: &[(u32, u32, &str)] = &[(22, 5, "slurm_22_05")];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for (_, _, cfg) in SLURM_RELEASES {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    if env::var_os("CARGO_FEATURE_PMIX").is_some() {
        #[cfg(feature = "pmix")]
        pmix::bind();
    }
    if env::var_os("CARGO_FEATURE_SLURM").is_some() {
        slurm_release();
    }
}

/// Reads SLURM_VERSION_NUMBER from `slurm_version.h` (directory from `SLURM_INCLUDE_DIR`, else
/// /usr/include/slurm), exports it to the crate, and enables the cfg of its release.
fn slurm_release() {
    let dir = env::var("SLURM_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include/slurm".into());
    println!("cargo::rerun-if-env-changed=SLURM_INCLUDE_DIR");
    let header = PathBuf::from(&dir).join("slurm_version.h");
    println!("cargo::rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header).unwrap_or_else(|e| {
        panic!(
            "greedy-sys: cannot read {}: {e}. Install libslurm-dev, or set SLURM_INCLUDE_DIR",
            header.display()
        )
    });
    let version = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("#define SLURM_VERSION_NUMBER"))
        .and_then(|v| u32::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| {
            panic!(
                "greedy-sys: no SLURM_VERSION_NUMBER in {}",
                header.display()
            )
        });
    let (major, minor, micro) = (version >> 16, (version >> 8) & 0xff, version & 0xff);
    let Some((_, _, cfg)) = SLURM_RELEASES
        .iter()
        .find(|(ma, mi, _)| (*ma, *mi) == (major, minor))
    else {
        let known: Vec<String> = SLURM_RELEASES
            .iter()
            .map(|(ma, mi, _)| format!("{ma}.{mi:02}"))
            .collect();
        panic!(
            "greedy-sys: Slurm {major}.{minor:02}.{micro} (from {}) is not supported; \
             supported releases: {}. Its internal plugin ABI must be declared first.",
            header.display(),
            known.join(", ")
        );
    };
    println!("cargo::rustc-cfg={cfg}");
    println!("cargo::rustc-env=GREEDY_SLURM_VERSION_NUMBER={version}");
    println!("cargo::rustc-env=GREEDY_SLURM_VERSION={major}.{minor:02}.{micro}");
}

#[cfg(feature = "pmix")]
mod pmix {
    use std::env;
    use std::path::PathBuf;

    /// Generates `$OUT_DIR/pmix.rs` from pmix.h and pmix_server.h; links libpmix dynamically.
    pub(super) fn bind() {
        let lib = pkg_config::Config::new()
            .atleast_version("4.2")
            .probe("pmix")
            .unwrap_or_else(|e| {
                panic!("greedy-sys: libpmix ≥ 4.2 not found ({e}); install libpmix-dev")
            });
        // Open MPI and the shim must load the same libpmix: keep its private directory.
        for dir in &lib.link_paths {
            println!("cargo::rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
        let mut builder = bindgen::Builder::default()
            // pmix.h has the value/info helpers, pmix_server.h the server API.
            .header_contents(
                "greedy_pmix.h",
                "#include <pmix.h>\n#include <pmix_server.h>\n",
            )
            .allowlist_function("PMIx_.*")
            .allowlist_type("pmix_.*")
            .allowlist_var("PMIX_.*")
            .derive_default(true)
            // C comments would become (failing) doctests.
            .generate_comments(false)
            .layout_tests(true)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for dir in &lib.include_paths {
            builder = builder.clang_arg(format!("-I{}", dir.display()));
        }
        let bindings = builder
            .generate()
            .unwrap_or_else(|e| panic!("greedy-sys: bindgen on pmix_server.h failed: {e}"));
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("pmix.rs");
        bindings
            .write_to_file(&out)
            .unwrap_or_else(|e| panic!("greedy-sys: writing {}: {e}", out.display()));
    }
}
