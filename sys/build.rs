//! Build script: binds libpmix from the installed headers, and pins the Slurm release whose
//! plugin ABI is compiled in (the loader demands the exact SLURM_VERSION_NUMBER).

use std::env;
use std::path::PathBuf;

/// One Slurm release (major, minor) whose internal plugin ABI is declared in `src/raw/slurm/`.
struct Release {
    major: u32,
    minor: u32,
    /// The cfg its module is gated by.
    cfg: &'static str,
    /// Whether it has the route plugin interface (removed in 23.11).
    route: bool,
}

/// Adding a release is one more module in `src/raw/slurm/` and one more line here.
const SLURM_RELEASES: &[Release] = &[
    Release {
        major: 22,
        minor: 5,
        cfg: "slurm_22_05",
        route: true,
    },
    Release {
        major: 24,
        minor: 11,
        cfg: "slurm_24_11",
        route: false,
    },
    Release {
        major: 26,
        minor: 5,
        cfg: "slurm_26_05",
        route: false,
    },
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for release in SLURM_RELEASES {
        println!("cargo::rustc-check-cfg=cfg({})", release.cfg);
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
/// /usr/include/slurm), exports it to the crate, and enables the cfg of its release. Crates
/// that depend on greedy-sys read `DEP_GREEDY_SYS_ROUTE_INTERFACE` (1 or 0) in their build
/// script: whether this release has the route plugin interface.
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
    let Some(release) = SLURM_RELEASES
        .iter()
        .find(|r| (r.major, r.minor) == (major, minor))
    else {
        let known: Vec<String> = SLURM_RELEASES
            .iter()
            .map(|r| format!("{}.{:02}", r.major, r.minor))
            .collect();
        panic!(
            "greedy-sys: Slurm {major}.{minor:02}.{micro} (from {}) is not supported; \
             supported releases: {}. Its internal plugin ABI must be declared first.",
            header.display(),
            known.join(", ")
        );
    };
    println!("cargo::rustc-cfg={}", release.cfg);
    println!("cargo::rustc-env=GREEDY_SLURM_VERSION_NUMBER={version}");
    println!("cargo::rustc-env=GREEDY_SLURM_VERSION={major}.{minor:02}.{micro}");
    println!(
        "cargo::metadata=route_interface={}",
        u8::from(release.route)
    );
    println!("cargo::metadata=version={major}.{minor:02}.{micro}");
}

#[cfg(feature = "pmix")]
mod pmix {
    use std::env;
    use std::path::PathBuf;

    /// Where libpmix's headers and library are, and the directory the built objects look for
    /// `libpmix.so.2` in at run time.
    struct Pmix {
        include_paths: Vec<PathBuf>,
        rpaths: Vec<PathBuf>,
    }

    /// `PMIX_INCLUDE_DIR` (a `:`-separated list) and `PMIX_LIB_DIR` (both, e.g. a release
    /// root's `usr/lib/x86_64-linux-gnu/pmix2/{include,lib}`) override pkg-config; `PMIX_RPATH` is
    /// the library directory on the machine that will run the result (default: `PMIX_LIB_DIR`;
    /// for a root, Debian's `/usr/lib/x86_64-linux-gnu/pmix2/lib`).
    fn locate() -> Pmix {
        for var in ["PMIX_INCLUDE_DIR", "PMIX_LIB_DIR", "PMIX_RPATH"] {
            println!("cargo::rerun-if-env-changed={var}");
        }
        let include = env::var_os("PMIX_INCLUDE_DIR");
        let lib = env::var_os("PMIX_LIB_DIR").map(PathBuf::from);
        let rpath = env::var_os("PMIX_RPATH").map(PathBuf::from);
        match (include, lib) {
            (Some(include), Some(lib)) => {
                println!("cargo::rustc-link-search=native={}", lib.display());
                println!("cargo::rustc-link-lib=dylib=pmix");
                let include_paths: Vec<PathBuf> = env::split_paths(&include).collect();
                for dir in &include_paths {
                    println!("cargo::rerun-if-changed={}", dir.display());
                }
                Pmix {
                    include_paths,
                    rpaths: vec![rpath.unwrap_or(lib)],
                }
            }
            (None, None) => {
                let lib = pkg_config::Config::new()
                    .atleast_version("4.2")
                    .probe("pmix")
                    .unwrap_or_else(|e| {
                        panic!("greedy-sys: libpmix ≥ 4.2 not found ({e}); install libpmix-dev")
                    });
                Pmix {
                    include_paths: lib.include_paths,
                    rpaths: rpath.map_or(lib.link_paths, |r| vec![r]),
                }
            }
            _ => panic!("greedy-sys: set both PMIX_INCLUDE_DIR and PMIX_LIB_DIR, or neither"),
        }
    }

    /// Generates `$OUT_DIR/pmix.rs` from pmix.h and pmix_server.h, with the hwloc calls that
    /// load the topology the server is given and list its cores and packages (libpmix itself
    /// depends on hwloc 2.x, whose ABI these calls have kept since 2.1); links libpmix and
    /// libhwloc dynamically.
    pub(super) fn bind() {
        let lib = locate();
        println!("cargo::rustc-link-lib=dylib=hwloc");
        // Open MPI and the shim must load the same libpmix: keep its private directory.
        for dir in &lib.rpaths {
            println!("cargo::rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
        let mut builder = bindgen::Builder::default()
            // pmix.h has the value/info helpers, pmix_server.h the server API.
            .header_contents(
                "greedy_pmix.h",
                "#include <pmix.h>\n#include <pmix_server.h>\n#include <hwloc.h>\n",
            )
            .allowlist_function("PMIx_.*")
            .allowlist_function(
                "hwloc_topology_(init|load|destroy|set_io_types_filter|set_components|export_xml)",
            )
            .allowlist_function("hwloc_get_(type_depth|nbobjs_by_depth|obj_by_depth)")
            .allowlist_function("hwloc_bitmap_(first|next|alloc|free|set)")
            .allowlist_type("hwloc_type_filter_e")
            .allowlist_type("hwloc_obj_type_e")
            .allowlist_type("hwloc_topology_components_flag_e")
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
