//! Build script: route_greedy.so exists only for Slurm releases with a route plugin interface
//! (22.05, 23.02; removed in 23.11). greedy-sys says which release it was built for
//! (`DEP_GREEDY_SYS_ROUTE_INTERFACE`); for a newer one the library is built without its C
//! entry points (`cfg(route_interface)` off), so the workspace still builds, and topology/greedy
//! (which takes route/greedy's place there) links its split. Nothing then loads it as a plugin:
//! such a Slurm has no `RoutePlugin`, and packaging leaves it out.

use std::env;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(route_interface)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=DEP_GREEDY_SYS_ROUTE_INTERFACE");
    if env::var("DEP_GREEDY_SYS_ROUTE_INTERFACE").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=route_interface");
    }
}
