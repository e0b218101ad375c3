//! Build script: topology_greedy.so exists for the topology interfaces of Slurm 24.11 and 26.05
//! (`cfg(topo_v24_11)`, `cfg(topo_v26_05)`, from the release greedy-sys was built for). For
//! another release (22.05 has route/greedy instead) the library is built without its C entry
//! points, so the workspace still builds (packaging leaves it out there).

use std::env;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(topo_v24_11)");
    println!("cargo::rustc-check-cfg=cfg(topo_v26_05)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=DEP_GREEDY_SYS_VERSION");
    let version = env::var("DEP_GREEDY_SYS_VERSION").unwrap_or_default();
    match version.get(..5) {
        Some("24.11") => println!("cargo::rustc-cfg=topo_v24_11"),
        Some("26.05") => println!("cargo::rustc-cfg=topo_v26_05"),
        // Silently: this is every workspace build on 22.05, where route/greedy is the plugin.
        _ => {}
    }
}
