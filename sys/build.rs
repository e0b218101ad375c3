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
    use std::path::{Path, PathBuf};

    /// Where libpmix's headers are, and the path the built objects load libpmix from at run
    /// time (`dlopen`, on first use: a process that serves no PMIx never maps it).
    struct Pmix {
        include_paths: Vec<PathBuf>,
        library: PathBuf,
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
        let (include_paths, lib_dir) = match (include, lib) {
            (Some(include), Some(lib)) => {
                let include_paths: Vec<PathBuf> = env::split_paths(&include).collect();
                for dir in &include_paths {
                    println!("cargo::rerun-if-changed={}", dir.display());
                }
                (include_paths, lib)
            }
            (None, None) => {
                let (lib, dir) = probe("pmix", "4.2", "libpmix-dev");
                (lib.include_paths, dir)
            }
            _ => panic!("greedy-sys: set both PMIX_INCLUDE_DIR and PMIX_LIB_DIR, or neither"),
        };
        // Open MPI and the shim must load the same libpmix: keep its private directory.
        let run_dir = rpath.unwrap_or_else(|| lib_dir.clone());
        Pmix {
            include_paths,
            library: run_dir.join(soname(&lib_dir, "pmix")),
        }
    }

    /// pkg-config's answer for `name` ≥ `version`, without link flags (the library is opened
    /// at run time, not linked), and the library's directory: its `-L`, else the package's
    /// `libdir` (pkg-config leaves the system directories out of `-L`).
    fn probe(name: &str, version: &str, package: &str) -> (pkg_config::Library, PathBuf) {
        let lib = pkg_config::Config::new()
            .atleast_version(version)
            .cargo_metadata(false)
            .probe(name)
            .unwrap_or_else(|e| {
                panic!("greedy-sys: lib{name} ≥ {version} not found ({e}); install {package}")
            });
        let dir = lib.link_paths.first().cloned().unwrap_or_else(|| {
            pkg_config::get_variable(name, "libdir")
                .map(PathBuf::from)
                .unwrap_or_else(|e| panic!("greedy-sys: no library directory for {name}: {e}"))
        });
        (lib, dir)
    }

    /// The name `dir/lib<name>.so` is loaded by at run time: its development link's target cut
    /// after the major version (libtool's soname, `libpmix.so.2.6.2` → `libpmix.so.2`), so an
    /// update of the runtime package keeps working.
    fn soname(dir: &Path, name: &str) -> String {
        let link = dir.join(format!("lib{name}.so"));
        println!("cargo::rerun-if-changed={}", link.display());
        let target = std::fs::read_link(&link).unwrap_or_else(|e| {
            panic!(
                "greedy-sys: {}: {e} (the development link of lib{name})",
                link.display()
            )
        });
        let file = target
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_else(|| {
                panic!(
                    "greedy-sys: {} points at {}",
                    link.display(),
                    target.display()
                )
            });
        let stem = format!("lib{name}.so.");
        let major = file
            .strip_prefix(&stem)
            .and_then(|v| v.split('.').next())
            .filter(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
            .unwrap_or_else(|| {
                panic!(
                    "greedy-sys: {} points at {file}: no major version",
                    link.display()
                )
            });
        format!("{stem}{major}")
    }

    /// Generates `$OUT_DIR/pmix.rs` from pmix.h and pmix_server.h and `$OUT_DIR/hwloc.rs` with
    /// the hwloc calls that load the topology the server is given and list its cores and
    /// packages (libpmix itself depends on hwloc 2.x, whose ABI these calls have kept since
    /// 2.1). Neither library is linked: each binding is a struct of function pointers that
    /// `pmix::library` fills by `dlopen` on first use, from the paths this exports
    /// (`GREEDY_PMIX_LIBRARY`, `GREEDY_HWLOC_LIBRARY`).
    pub(super) fn bind() {
        let pmix = locate();
        let (_, hwloc_dir) = probe("hwloc", "2.1", "libhwloc-dev");
        let hwloc = hwloc_dir.join(soname(&hwloc_dir, "hwloc"));
        println!(
            "cargo::rustc-env=GREEDY_PMIX_LIBRARY={}",
            pmix.library.display()
        );
        println!("cargo::rustc-env=GREEDY_HWLOC_LIBRARY={}", hwloc.display());
        let pmix_functions = [
            "PMIx_Data_type_string",
            "PMIx_Error_string",
            "PMIx_Get",
            "PMIx_Get_version",
            "PMIx_Info_load",
            "PMIx_Resolve_nodes",
            "PMIx_Value_destruct",
            "PMIx_Value_load",
            "PMIx_generate_ppn",
            "PMIx_generate_regex",
            "PMIx_server_deregister_client",
            "PMIx_server_deregister_nspace",
            "PMIx_server_dmodex_request",
            "PMIx_server_finalize",
            "PMIx_server_generate_cpuset_string",
            "PMIx_server_generate_locality_string",
            "PMIx_server_init",
            "PMIx_server_register_client",
            "PMIx_server_register_nspace",
            "PMIx_server_setup_fork",
        ];
        let builder = bindgen::Builder::default()
            // pmix.h has the value/info helpers, pmix_server.h the server API.
            .header_contents(
                "greedy_pmix.h",
                "#include <pmix.h>\n#include <pmix_server.h>\n",
            )
            .allowlist_function(format!("({})", pmix_functions.join("|")))
            .allowlist_type("pmix_.*")
            .allowlist_var("PMIX_.*")
            .dynamic_library_name("Pmix");
        generate(builder, &pmix.include_paths, "pmix.rs");
        let builder = bindgen::Builder::default()
            .header_contents("greedy_hwloc.h", "#include <hwloc.h>\n")
            .allowlist_function(
                "hwloc_topology_(init|load|destroy|set_io_types_filter|set_components|export_xml)",
            )
            .allowlist_function("hwloc_get_(type_depth|nbobjs_by_depth|obj_by_depth)")
            .allowlist_function("hwloc_bitmap_(first|next|alloc|free|set)")
            .allowlist_type("hwloc_type_filter_e")
            .allowlist_type("hwloc_obj_type_e")
            .allowlist_type("hwloc_topology_components_flag_e")
            .dynamic_library_name("Hwloc");
        generate(builder, &[], "hwloc.rs");
    }

    /// Writes `builder`'s bindings to `$OUT_DIR/out`; a library's struct holds a pointer for
    /// every function (missing one fails the load, not a later call).
    fn generate(builder: bindgen::Builder, include_paths: &[PathBuf], out: &str) {
        let mut builder = builder
            .dynamic_link_require_all(true)
            .wrap_unsafe_ops(true)
            .derive_default(true)
            // C comments would become (failing) doctests.
            .generate_comments(false)
            .layout_tests(true)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for dir in include_paths {
            builder = builder.clang_arg(format!("-I{}", dir.display()));
        }
        let bindings = builder
            .generate()
            .unwrap_or_else(|e| panic!("greedy-sys: bindgen for {out} failed: {e}"));
        let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join(out);
        bindings
            .write_to_file(&out)
            .unwrap_or_else(|e| panic!("greedy-sys: writing {}: {e}", out.display()));
    }
}
