//! The C entry points Slurm's plugin loader looks up (src/common/slurm_route.c@slurm-22-05-8-1):
//! thin trampolines from the C ABI into [`crate::split`] and [`crate::state`], through
//! greedy-sys. Each catches panics ([`greedy_slurm::guard::catch`]), because the plugin runs
//! inside srun, slurmd, slurmctld and sbcast and affects every forwarded RPC.
//!
//! `route_p_split_hostlist` contract (forward.c and slurm_route.c@slurm-22-05-8-1): `hl` is
//! sorted (`hostlist_uniq`) and must be empty on return; `*sp_hl` becomes an xmalloc'd array
//! of `*count` hostlists that the caller destroys and `xfree`s; 0 is success, -1 makes the
//! caller drop the message with "unable to split forward hostlist".

// The exports are found by name (dlsym), not by Rust paths; `pub` keeps that obvious.
#![allow(unreachable_pub)]

use crate::split::{self, Shape, Split};
use crate::state;
use greedy_slurm::guard;
use greedy_sys::raw::slurm::{SLURM_ERROR, SLURM_SUCCESS, VERSION_NUMBER, hostlist_t};
use greedy_sys::slurm::{HostlistArray, drain_hostlist, log, split_hostlist_treewidth};
use std::ffi::{CString, c_int};

/// `plugin_name`: free text shown in logs.
#[unsafe(no_mangle)]
pub static plugin_name: [u8; 35] = *b"route greedy (optimal launch tree)\0";

/// `plugin_type`: `route/NAME` selects it with `RoutePlugin=route/greedy`.
#[unsafe(no_mangle)]
pub static plugin_type: [u8; 13] = *b"route/greedy\0";

/// `plugin_version`: must equal the loader's SLURM_VERSION_NUMBER exactly (plugin.c).
#[unsafe(no_mangle)]
pub static plugin_version: u32 = VERSION_NUMBER;
greedy_sys::refuse_other_release!("route/greedy", plugin_version);

/// Loads greedy.conf. Never fails: a bad file means defaults and one error line.
#[unsafe(no_mangle)]
pub extern "C" fn init() -> c_int {
    guard::catch("route/greedy init", SLURM_SUCCESS, log::error, || {
        let (fault, in_force) = state::reload();
        if let Some(line) = fault {
            log::error(&format!("route/greedy: {line}"));
        }
        log::verbose(&format!("route/greedy: {in_force}"));
        SLURM_SUCCESS
    })
}

/// Nothing to release: the configuration is plain memory.
#[unsafe(no_mangle)]
pub extern "C" fn fini() -> c_int {
    SLURM_SUCCESS
}

/// `scontrol reconfigure`: rereads greedy.conf.
#[unsafe(no_mangle)]
pub extern "C" fn route_p_reconfigure() -> c_int {
    init()
}

/// Splits the sorted `hl` along the greedy tree (TreeWidth split on any internal error).
#[unsafe(no_mangle)]
pub extern "C" fn route_p_split_hostlist(
    hl: hostlist_t,
    sp_hl: *mut *mut hostlist_t,
    count: *mut c_int,
    tree_width: u16,
) -> c_int {
    if hl.is_null() || sp_hl.is_null() || count.is_null() {
        log::error("route/greedy: split called with a NULL argument");
        return SLURM_ERROR;
    }
    let hosts = guard::catch("route/greedy split", None, log::error, || {
        // SAFETY: hl is the caller's live, sorted list, used by no other thread during the
        // split (forward.c builds it per message); it must be empty on return, which draining
        // ensures.
        Some(unsafe { drain_hostlist(hl) })
    });
    let Some(hosts) = hosts else {
        // Draining failed part-way: let Slurm split whatever is left its own way.
        // SAFETY: the arguments are Slurm's own, unchanged.
        return unsafe { split_hostlist_treewidth(hl, sp_hl, count, tree_width) };
    };
    let planned = guard::catch("route/greedy split", None, log::error, || {
        Some(plan(&hosts, tree_width))
    });
    let planned = planned.unwrap_or_else(|| Split {
        ranges: split::kary_ranges(hosts.len(), tree_width),
        shape: Shape::TreeWidth,
    });
    let array = guard::catch("route/greedy split", None, log::error, || {
        HostlistArray::from_ranges(&hosts, &planned.ranges)
    });
    let Some(array) = array else {
        log::error("route/greedy: could not allocate the sub-lists");
        return SLURM_ERROR;
    };
    let (lists, n_lists) = array.into_raw();
    // SAFETY: both pointers were checked non-NULL and point to the caller's out-variables.
    unsafe {
        *sp_hl = lists;
        *count = n_lists;
    }
    SLURM_SUCCESS
}

/// The split for `hosts`, logging a fallback (one line) and, if configured, the split.
fn plan(hosts: &[CString], tree_width: u16) -> Split {
    let (cfg, fault) = state::current();
    if let Some(line) = fault {
        log::error(&format!("route/greedy: {line}"));
    }
    let (planned, why) = split::split(hosts.len(), Ok(cfg.model), tree_width);
    if let Some(why) = why {
        log::error(&format!(
            "route/greedy: {why}; using the TreeWidth split for {} hosts",
            hosts.len()
        ));
    }
    if cfg.log_splits {
        let names: Vec<_> = hosts.iter().map(|h| h.to_string_lossy()).collect();
        log::info(&split::render("route/greedy", &names, tree_width, &planned));
    }
    planned
}
