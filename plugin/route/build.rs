//! Build script: route_greedy.so exists only for Slurm releases with a route plugin interface
//! (22.05, 23.02; removed in 23.11). greedy-sys says which release it was built for
//! (`DEP_GREEDY_SYS_ROUTE_INTERFACE`); for a newer one the library is built without its C
//! entry points (`cfg(route_interface)` off), so the workspace still builds, and the build
//! says so once. Nothing then loads it: such a Slurm has no `RoutePlugin`.

use std::env;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(route_interface)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=DEP_GREEDY_SYS_ROUTE_INTERFACE");
    if env::var("DEP_GREEDY_SYS_ROUTE_INTERFACE").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=route_interface");
    } else {
        let version = env::var("DEP_GREEDY_SYS_VERSION").unwrap_or_else(|_| "?".into());
        println!(
            "cargo::warning=route_greedy.so is built without entry points: Slurm {version} has \
             no route plugin interface (removed in 23.11); do not install it"
        );
    }
}
