//! The node's hardware topology, loaded once per process without I/O devices: for the PMIx
//! server, and for binding ranks to cores or packages.
//!
//! Given none, `PMIx_server_init` discovers the topology itself with hwloc, I/O devices
//! included (`pmix_hwloc_setup_topology`, `HWLOC_TYPE_FILTER_KEEP_IMPORTANT`, in
//! src/hwloc/pmix_hwloc.c@v4.2.2): every PCI device read from /sys, the PCI name database and
//! udev. That was about two thirds of the server's start here (≈ 20 of 30 ms on this VM, more on
//! nodes with many PCI devices), paid by every job and step. What the server does with the
//! topology (locality strings, cpusets of the local ranks) needs cores and caches only, so it
//! is handed one (`PMIX_TOPOLOGY2`) loaded with I/O devices filtered out.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::raw::pmix as raw;

/// A loaded hwloc topology that lives as long as the process and is never changed: PMIx keeps
/// a pointer to it from `PMIx_server_init` on (`pmix_globals.external_topology`), and nobody
/// destroys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology(NonNull<c_void>);

// SAFETY: the topology is loaded once, then only read (by libpmix, whose own topology it is
// from then on); hwloc allows concurrent reads of a loaded topology.
unsafe impl Send for Topology {}
// SAFETY: as above: no mutation after load.
unsafe impl Sync for Topology {}

impl Topology {
    /// The hwloc topology pointer, as `pmix_topology_t.topology` takes it.
    pub(crate) fn as_ptr(self) -> *mut c_void {
        self.0.as_ptr()
    }

    /// This machine's topology without I/O devices, loaded on first use; `None` if hwloc
    /// failed (the server then discovers its own, as it would anyway).
    pub fn this_machine() -> Option<Topology> {
        static LOADED: OnceLock<Option<Topology>> = OnceLock::new();
        *LOADED.get_or_init(load_without_io)
    }
}

/// What a rank is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grain {
    /// A core (all its hardware threads).
    Core,
    /// A package (socket).
    Package,
}

impl Topology {
    /// The operating system's CPU numbers of each core or package, in hwloc's logical order
    /// (an empty list if the topology has none of that kind).
    pub fn cpus_by(self, grain: Grain) -> Vec<Vec<u32>> {
        let kind = match grain {
            Grain::Core => raw::hwloc_obj_type_t_HWLOC_OBJ_CORE,
            Grain::Package => raw::hwloc_obj_type_t_HWLOC_OBJ_PACKAGE,
        };
        let topo: raw::hwloc_topology_t = self.as_ptr().cast();
        // SAFETY: `topo` is a loaded topology that lives for ever (Topology's invariant);
        // these calls only read it.
        let depth = unsafe { raw::hwloc_get_type_depth(topo, kind) };
        if depth < 0 {
            // Unknown, or spread over several depths: nothing to bind to reliably.
            return Vec::new();
        }
        // SAFETY: as above, with a depth hwloc just gave.
        let n = unsafe { raw::hwloc_get_nbobjs_by_depth(topo, depth) };
        (0..n)
            .filter_map(|i| {
                // SAFETY: `i` < the number of objects at `depth`; only read.
                let obj = unsafe { raw::hwloc_get_obj_by_depth(topo, depth, i) };
                // SAFETY: NULL or an object that lives with the topology, which lives for ever;
                // its cpuset (possibly NULL) is only read.
                let set = unsafe { obj.as_ref() }?.cpuset;
                if set.is_null() {
                    return None;
                }
                let mut cpus = Vec::new();
                // SAFETY: `set` is the object's own bitmap, valid while the topology lives.
                let mut cpu = unsafe { raw::hwloc_bitmap_first(set) };
                while let Ok(c) = u32::try_from(cpu) {
                    cpus.push(c);
                    // SAFETY: as above; -1 ends the walk.
                    cpu = unsafe { raw::hwloc_bitmap_next(set, cpu) };
                }
                Some(cpus)
            })
            .collect()
    }
}

fn load_without_io() -> Option<Topology> {
    let mut topo: raw::hwloc_topology_t = std::ptr::null_mut();
    // SAFETY: `topo` is an out-parameter hwloc fills on success.
    if unsafe { raw::hwloc_topology_init(&mut topo) } != 0 || topo.is_null() {
        return None;
    }
    let filter = raw::hwloc_type_filter_e_HWLOC_TYPE_FILTER_KEEP_NONE;
    // SAFETY: `topo` was initialised above and is not loaded yet, as both calls require.
    let loaded = unsafe {
        raw::hwloc_topology_set_io_types_filter(topo, filter) == 0
            && raw::hwloc_topology_load(topo) == 0
    };
    if !loaded {
        // SAFETY: initialised above, never handed out.
        unsafe { raw::hwloc_topology_destroy(topo) };
        return None;
    }
    NonNull::new(topo.cast()).map(Topology)
}

#[cfg(test)]
mod tests {
    use super::Topology;

    #[test]
    fn the_machine_topology_loads_once() {
        let first = Topology::this_machine().expect("hwloc loads this machine's topology");
        assert_eq!(
            Topology::this_machine(),
            Some(first),
            "the same one, loaded once"
        );
    }

    #[test]
    fn cores_and_packages_cover_the_cpus_this_process_may_use() {
        let topo = Topology::this_machine().expect("hwloc loads");
        let cores = topo.cpus_by(super::Grain::Core);
        let packages = topo.cpus_by(super::Grain::Package);
        assert!(
            !cores.is_empty() && !packages.is_empty(),
            "{cores:?} {packages:?}"
        );
        let mut by_core: Vec<u32> = cores.concat();
        let mut by_package: Vec<u32> = packages.concat();
        by_core.sort_unstable();
        by_package.sort_unstable();
        assert_eq!(by_core, by_package, "the same CPUs, grouped two ways");
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(by_core.len() >= n, "{by_core:?} for {n} usable CPUs");
    }
}
