//! The C entry points Slurm's plugin loader looks up: the `syms[]` of src/interfaces/topology.c
//! at slurm-24-11-5-1 (14) or slurm-26-05-3-1 (26), each with that release's prototype.
//! `topology_p_split_hostlist` plans with [`crate::split`]; every other hook is a trampoline to
//! the same hook of the delegate ([`crate::delegate`]), arguments unchanged. The split catches
//! panics ([`greedy_slurm::guard::catch`]) and falls back to the delegate's own split, because
//! it runs in slurmd, slurmstepd, slurmctld and (24.11) srun on every forwarded RPC.
//!
//! Split contract (forward.c, topology.c): `hl` must be empty on return; `*sp_hl` becomes an
//! xmalloc'd array of `*count` hostlists the caller destroys and `xfree`s; the return value is
//! the depth of the tree below the caller (forward.c scales its timeout by it), negative on
//! error, which makes the caller drop the message: so a fault never returns one.

// The exports are found by name (dlsym), not by Rust paths; `pub` keeps that obvious.
#![allow(unreachable_pub)]

use crate::config::{self, TopologyConfig};
use crate::delegate::{self, Delegate};
use crate::split;
use greedy_slurm::guard;
use greedy_sys::raw::slurm::{SLURM_ERROR, SLURM_SUCCESS, VERSION_NUMBER, hostlist_t};
use greedy_sys::slurm::{HostlistArray, drain_hostlist, hostlist_count, log};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

/// `plugin_name`: free text shown in logs.
#[unsafe(no_mangle)]
pub static plugin_name: [u8; 38] = *b"topology greedy (optimal launch tree)\0";

/// `plugin_type`: `TopologyPlugin=topology/greedy` selects it.
#[unsafe(no_mangle)]
pub static plugin_type: [u8; 16] = *b"topology/greedy\0";

/// `plugin_version`: must equal the loader's SLURM_VERSION_NUMBER exactly (plugin.c).
#[unsafe(no_mangle)]
pub static plugin_version: u32 = VERSION_NUMBER;
greedy_sys::refuse_other_release!("topology/greedy", plugin_version);

/// `plugin_id`: the delegate's once loaded (topoinfo is stamped and looked up by it); until
/// then flat/default's 100. An atomic has the layout of the `uint32_t` Slurm reads.
#[unsafe(no_mangle)]
pub static plugin_id: AtomicU32 = AtomicU32::new(100);

/// `supports_exclusive_topo` (26.05): the delegate's. An atomic has the layout of `bool`.
#[cfg(topo_v26_05)]
#[unsafe(no_mangle)]
pub static supports_exclusive_topo: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Reads greedy.conf, loads the delegate and takes its identity. Fails (Slurm then refuses the
/// plugin, naming it) only when neither the named delegate nor the release's default loads.
#[unsafe(no_mangle)]
pub extern "C" fn init() -> c_int {
    guard::catch("topology/greedy init", SLURM_ERROR, log::error, || {
        let release = ((VERSION_NUMBER >> 16) & 0xff, (VERSION_NUMBER >> 8) & 0xff);
        let default = config::default_delegate(release);
        let (cfg, topo_fault) = TopologyConfig::load(&greedy_slurm::conf::path_from_env(), default);
        let (route_fault, in_force) = route_greedy::state::reload();
        // One line per fault of the file: a malformed line is both loaders' fault.
        match (route_fault, topo_fault) {
            (Some(line), _) => log::error(&format!(
                "topology/greedy: {line}; the delegate splits every host list"
            )),
            (None, Some(line)) => log::error(&line),
            (None, None) => {}
        }
        let slurm_conf = std::env::var("SLURM_CONF").ok();
        let dirs = delegate::plugin_dirs(slurm_conf.as_deref(), delegate::own_dir().as_deref());
        let loaded = Delegate::load(&cfg.delegate, &dirs, HOOKS).or_else(|e| {
            if cfg.delegate == default {
                return Err(e);
            }
            log::error(&format!(
                "topology/greedy: {e}; delegating to topology/{default}"
            ));
            Delegate::load(default, &dirs, HOOKS)
        });
        match loaded {
            Ok(d) => {
                plugin_id.store(d.plugin_id, Ordering::SeqCst);
                #[cfg(topo_v26_05)]
                supports_exclusive_topo
                    .store(d.supports_exclusive_topo.unwrap_or(false), Ordering::SeqCst);
                log::verbose(&format!(
                    "topology/greedy: splits along the greedy tree ({in_force}); everything else is topology/{} ({})",
                    d.name,
                    d.path.display()
                ));
                delegate::install(d);
                SLURM_SUCCESS
            }
            Err(e) => {
                log::error(&format!(
                    "topology/greedy: cannot load a delegate topology: {e}"
                ));
                SLURM_ERROR
            }
        }
    })
}

/// Calls the delegate's `fini`.
#[unsafe(no_mangle)]
pub extern "C" fn fini() -> c_int {
    guard::catch("topology/greedy fini", SLURM_SUCCESS, log::error, || {
        if let Some(d) = delegate::take() {
            d.fini();
        }
        SLURM_SUCCESS
    })
}

/// Trampolines: each hook calls the delegate's with the same arguments; without a delegate
/// (never after a successful `init`) it returns the given value.
macro_rules! forward {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $none:expr;)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: the delegate's.")]
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($($arg: $ty),*) -> $ret {
                match delegate::current().and_then(|d| d.symbol(stringify!($name))) {
                    Some(addr) => {
                        type Hook = unsafe extern "C" fn($($ty),*) -> $ret;
                        // SAFETY: `addr` is the delegate's symbol of this name, resolved at
                        // load; the release's interface gives it exactly this prototype.
                        let f = unsafe { std::mem::transmute::<usize, Hook>(addr) };
                        // SAFETY: Slurm's arguments, passed on unchanged.
                        unsafe { f($($arg),*) }
                    }
                    None => $none,
                }
            }
        )*
        /// Every hook the delegate must have: the forwarded ones and the split.
        const HOOKS: &[&str] = &[$(stringify!($name),)* "topology_p_split_hostlist"];
    };
}

type Ptr = *mut c_void;

#[cfg(topo_v24_11)]
forward! {
    fn topology_p_build_config() -> c_int = SLURM_ERROR;
    fn topology_p_eval_nodes(topo_eval: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_whole_topo(node_mask: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_get_bitmap(name: *mut c_char) -> Ptr = std::ptr::null_mut();
    fn topology_p_generate_node_ranking() -> bool = false;
    fn topology_p_get_node_addr(node_name: *mut c_char, addr: *mut *mut c_char, pattern: *mut *mut c_char) -> c_int = SLURM_ERROR;
    fn topology_p_topology_free(topoinfo: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_get(kind: c_int, data: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_topology_pack(topoinfo: Ptr, buffer: Ptr, protocol_version: u16) -> c_int = SLURM_ERROR;
    fn topology_p_topology_print(topoinfo: Ptr, nodes_list: *mut c_char, out: *mut *mut c_char) -> c_int = SLURM_ERROR;
    fn topology_p_topology_unpack(topoinfo: *mut Ptr, buffer: Ptr, protocol_version: u16) -> c_int = SLURM_ERROR;
    fn topology_p_get_fragmentation(node_mask: Ptr) -> u32 = 0;
}

#[cfg(topo_v26_05)]
forward! {
    fn topology_p_add_rm_node(node: Ptr, addr: *mut c_char, tctx: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_allow_one_node(tctx: Ptr) -> bool = false;
    fn topology_p_build_config(tctx: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_destroy_config(tctx: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_eval_node(topo_eval: Ptr, node_inx: c_int) -> c_int = SLURM_ERROR;
    fn topology_p_eval_nodes(topo_eval: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_whole_topo(node_mask: Ptr, tctx: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_get_bitmap(name: *mut c_char, tctx: Ptr) -> Ptr = std::ptr::null_mut();
    fn topology_p_generate_node_ranking(tctx: Ptr) -> bool = false;
    fn topology_p_get_node_addr(node_name: *mut c_char, addr: *mut *mut c_char, pattern: *mut *mut c_char, tctx: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_get(kind: c_int, data: Ptr, tctx: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_topoinfo_free(topoinfo: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_topoinfo_pack(topoinfo: Ptr, buffer: Ptr, protocol_version: u16) -> c_int = SLURM_ERROR;
    fn topology_p_topoinfo_print(topoinfo: Ptr, nodes_list: *mut c_char, unit: *mut c_char, out: *mut *mut c_char) -> c_int = SLURM_ERROR;
    fn topology_p_topoinfo_unpack(topoinfo: *mut Ptr, buffer: Ptr, protocol_version: u16) -> c_int = SLURM_ERROR;
    fn topology_p_jobinfo_free(jobinfo: Ptr) -> () = ();
    fn topology_p_jobinfo_pack(jobinfo: Ptr, buffer: Ptr, protocol_version: u16) -> () = ();
    fn topology_p_jobinfo_unpack(jobinfo: *mut Ptr, buffer: Ptr, protocol_version: u16) -> c_int = SLURM_ERROR;
    fn topology_p_jobinfo_get(kind: c_int, jobinfo: Ptr, data: Ptr) -> c_int = SLURM_ERROR;
    fn topology_p_get_fragmentation(node_mask: Ptr, tctx: Ptr) -> u32 = 0;
    fn topology_p_get_topology_str(node: Ptr, out: *mut *mut c_char, tctx: Ptr) -> () = ();
    fn topology_p_get_rank(node_bitmap: Ptr, node_rank: *mut *mut u32, size: *mut u32, tctx: Ptr) -> c_int = SLURM_ERROR;
}

/// The delegate's own split (Slurm's TreeWidth split for flat/default/tree), for a fault.
///
/// # Safety
/// Slurm's split arguments, unchanged and untouched so far.
unsafe fn delegate_split(
    hl: hostlist_t,
    sp_hl: *mut *mut hostlist_t,
    count: *mut c_int,
    tree_width: u16,
    tctx: Ptr,
) -> c_int {
    let Some(addr) = delegate::current().and_then(|d| d.symbol("topology_p_split_hostlist")) else {
        log::error("topology/greedy: no delegate to split with");
        return SLURM_ERROR;
    };
    #[cfg(topo_v24_11)]
    {
        let _ = tctx;
        type Split =
            unsafe extern "C" fn(hostlist_t, *mut *mut hostlist_t, *mut c_int, u16) -> c_int;
        // SAFETY: the delegate's split, resolved at load, with 24.11's prototype.
        let f: Split = unsafe { std::mem::transmute::<usize, Split>(addr) };
        // SAFETY: the caller's contract.
        unsafe { f(hl, sp_hl, count, tree_width) }
    }
    #[cfg(topo_v26_05)]
    {
        type Split =
            unsafe extern "C" fn(hostlist_t, *mut *mut hostlist_t, *mut c_int, u16, Ptr) -> c_int;
        // SAFETY: the delegate's split, resolved at load, with 26.05's prototype.
        let f: Split = unsafe { std::mem::transmute::<usize, Split>(addr) };
        // SAFETY: the caller's contract.
        unsafe { f(hl, sp_hl, count, tree_width, tctx) }
    }
}

/// Splits `hl` along the greedy tree; on any fault, the delegate splits it.
fn split_hostlist(
    hl: hostlist_t,
    sp_hl: *mut *mut hostlist_t,
    count: *mut c_int,
    tree_width: u16,
    tctx: Ptr,
) -> c_int {
    if hl.is_null() || sp_hl.is_null() || count.is_null() {
        log::error("topology/greedy: split called with a NULL argument");
        return SLURM_ERROR;
    }
    // SAFETY: hl is the caller's live list, used by no other thread during the split.
    let n = unsafe { hostlist_count(hl) };
    // Plan on the count first, so that a fault leaves `hl` untouched for the delegate.
    let planned = guard::catch("topology/greedy split", None, log::error, || {
        split::plan(n, tree_width, log::error)
            .map_err(|why| why.map(|w| log::error(&w)))
            .ok()
    });
    let Some(planned) = planned else {
        // SAFETY: Slurm's arguments, untouched.
        return unsafe { delegate_split(hl, sp_hl, count, tree_width, tctx) };
    };
    // SAFETY: hl is live and ours for the call; it must be empty on return.
    let hosts = unsafe { drain_hostlist(hl) };
    if hosts.len() != n {
        log::error("topology/greedy: the host list changed while it was split");
        return SLURM_ERROR;
    }
    let array = guard::catch("topology/greedy split", None, log::error, || {
        let names: Vec<_> = hosts.iter().map(|h| h.to_string_lossy()).collect();
        if let Some(line) = split::describe(&names, tree_width, &planned) {
            log::info(&line);
        }
        HostlistArray::from_ranges(&hosts, &planned.ranges)
    });
    let Some(array) = array else {
        log::error("topology/greedy: could not allocate the sub-lists");
        return SLURM_ERROR;
    };
    let (lists, n_lists) = array.into_raw();
    // SAFETY: both pointers were checked non-NULL and point to the caller's out-variables.
    unsafe {
        *sp_hl = lists;
        *count = n_lists;
    }
    c_int::try_from(planned.depth).unwrap_or(c_int::MAX)
}

/// `topology_p_split_hostlist` (24.11): the greedy split, or the delegate's on a fault.
#[cfg(topo_v24_11)]
#[unsafe(no_mangle)]
pub extern "C" fn topology_p_split_hostlist(
    hl: hostlist_t,
    sp_hl: *mut *mut hostlist_t,
    count: *mut c_int,
    tree_width: u16,
) -> c_int {
    split_hostlist(hl, sp_hl, count, tree_width, std::ptr::null_mut())
}

/// `topology_p_split_hostlist` (26.05): the greedy split, or the delegate's on a fault.
#[cfg(topo_v26_05)]
#[unsafe(no_mangle)]
pub extern "C" fn topology_p_split_hostlist(
    hl: hostlist_t,
    sp_hl: *mut *mut hostlist_t,
    count: *mut c_int,
    tree_width: u16,
    tctx: Ptr,
) -> c_int {
    split_hostlist(hl, sp_hl, count, tree_width, tctx)
}
