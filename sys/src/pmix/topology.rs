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
//!
//! Two more things hwloc does by default cost more than the load itself, and are skipped:
//! - At its first `hwloc_topology_init` in a process, hwloc dlopens every plugin it finds
//!   (Debian's libhwloc-plugins: PCI, OpenCL, GL and libxml2 XML, which pull in libpciaccess,
//!   libOpenCL, libX11, libxml2, libicu and libstdc++): ≈ 4.5 ms and ≈ 2.8 MB of resident pages
//!   here, for I/O discovery that is filtered out anyway. Plugins are found only through the
//!   environment (`HWLOC_PLUGINS_PATH`, read once by `hwloc_plugins_init`), so
//!   [`Topology::this_machine`] points it at no directory for the duration of that first init.
//!   Without its libxml2 plugin hwloc writes XML (which libpmix hands to clients) with its own
//!   built-in exporter.
//! - The `x86` backend reads cpuid on every processor (binding the calling thread to each in
//!   turn); the `linux` backend already gives cores, caches and NUMA nodes from sysfs, which is
//!   all that binding and PMIx locality need. Blacklisting it halves the load (≈ 2.3 → 1.1 ms).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::OnceLock;

use super::library;
use crate::raw::pmix::hwloc as raw;

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
    ///
    /// Unless `HWLOC_PLUGINS_PATH` is set (by the user, or for the whole process by
    /// [`super::server::prepare_environment`], as greedyd does before its runtime starts), the
    /// first call sets it while hwloc initialises and removes it again: make that call where
    /// no other thread reads or writes the environment. In slurmstepd it is made by the mpi
    /// plugin's prefork, where Slurm's own mpi/pmix sets its variables too (`pmixp_info.c`,
    /// `setenv` of `PMIX_*`/`UCX_*`), and there the variable must not outlive it: Slurm's own
    /// plugins in that process may want hwloc's.
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
        let hwloc = library::hwloc_loaded();
        let topo: raw::hwloc_topology_t = self.as_ptr().cast();
        // SAFETY: `topo` is a loaded topology that lives for ever (Topology's invariant);
        // these calls only read it.
        let depth = unsafe { hwloc.hwloc_get_type_depth(topo, kind) };
        if depth < 0 {
            // Unknown, or spread over several depths: nothing to bind to reliably.
            return Vec::new();
        }
        // SAFETY: as above, with a depth hwloc just gave.
        let n = unsafe { hwloc.hwloc_get_nbobjs_by_depth(topo, depth) };
        (0..n)
            .filter_map(|i| {
                // SAFETY: `i` < the number of objects at `depth`; only read.
                let obj = unsafe { hwloc.hwloc_get_obj_by_depth(topo, depth, i) };
                // SAFETY: NULL or an object that lives with the topology, which lives for ever;
                // its cpuset (possibly NULL) is only read.
                let set = unsafe { obj.as_ref() }?.cpuset;
                if set.is_null() {
                    return None;
                }
                let mut cpus = Vec::new();
                // SAFETY: `set` is the object's own bitmap, valid while the topology lives.
                let mut cpu = unsafe { hwloc.hwloc_bitmap_first(set) };
                while let Ok(c) = u32::try_from(cpu) {
                    cpus.push(c);
                    // SAFETY: as above; -1 ends the walk.
                    cpu = unsafe { hwloc.hwloc_bitmap_next(set, cpu) };
                }
                Some(cpus)
            })
            .collect()
    }
}

impl Topology {
    /// Writes the topology to `path` as hwloc XML (hwloc's built-in exporter: no plugin is
    /// loaded), what MPICH reads as its launcher's `PMI_hwloc_xmlfile` instead of probing the
    /// hardware in every rank.
    pub fn export_xml(self, path: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let hwloc = library::hwloc_loaded();
        let topo: raw::hwloc_topology_t = self.as_ptr().cast();
        // SAFETY: `topo` is a loaded topology that lives for ever and is only read; `c_path` is
        // a NUL-terminated string that outlives the call.
        let rc = unsafe { hwloc.hwloc_topology_export_xml(topo, c_path.as_ptr(), 0) };
        match rc {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

/// Where hwloc looks for plugins while [`Topology::this_machine`] initialises it: nowhere.
pub(crate) const NO_PLUGINS: (&str, &str) = (
    "HWLOC_PLUGINS_PATH",
    "/nonexistent/greedy-loads-no-hwloc-plugins",
);

fn load_without_io() -> Option<Topology> {
    let hwloc = library::hwloc().ok()?;
    let mut topo: raw::hwloc_topology_t = std::ptr::null_mut();
    let (name, nowhere) = NO_PLUGINS;
    let users_choice = std::env::var_os(name);
    if users_choice.is_none() {
        // SAFETY: see `this_machine`: its first call runs where no other thread touches the
        // environment (hwloc reads this variable during the init below, and only then).
        unsafe { std::env::set_var(name, nowhere) };
    }
    // SAFETY: `topo` is an out-parameter hwloc fills on success.
    let init = unsafe { hwloc.hwloc_topology_init(&mut topo) };
    if users_choice.is_none() {
        // SAFETY: as above.
        unsafe { std::env::remove_var(name) };
    }
    if init != 0 || topo.is_null() {
        return None;
    }
    let filter = raw::hwloc_type_filter_e_HWLOC_TYPE_FILTER_KEEP_NONE;
    // SAFETY: `topo` was initialised above and is not loaded yet, as these calls require; the
    // component name is a NUL-terminated literal. Blacklisting may fail on an hwloc without an
    // `x86` component, which changes nothing.
    let loaded = unsafe {
        hwloc.hwloc_topology_set_components(
            topo,
            raw::hwloc_topology_components_flag_e_HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST as _,
            c"x86".as_ptr(),
        );
        hwloc.hwloc_topology_set_io_types_filter(topo, filter) == 0
            && hwloc.hwloc_topology_load(topo) == 0
    };
    if !loaded {
        // SAFETY: initialised above, never handed out.
        unsafe { hwloc.hwloc_topology_destroy(topo) };
        return None;
    }
    NonNull::new(topo.cast()).map(Topology)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_topology_exports_as_xml_with_its_cores() {
        let topo = super::Topology::this_machine().expect("hwloc loads");
        let dir = std::env::temp_dir().join(format!("greedy-topo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("topo.xml");
        topo.export_xml(&path).expect("exported");
        let xml = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(xml.contains("<topology"), "{xml}");
        assert!(xml.contains("type=\"Core\""), "{xml}");
        let missing = std::path::Path::new("/nonexistent/greedy/topo.xml");
        assert!(topo.export_xml(missing).is_err());
    }

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
    fn no_hwloc_plugin_is_loaded_and_the_environment_is_left_as_it_was() {
        Topology::this_machine().expect("hwloc loads");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let plugins: Vec<&str> = maps
            .lines()
            .filter(|l| l.contains("/hwloc/hwloc_"))
            .collect();
        assert!(plugins.is_empty(), "{plugins:?}");
        assert_eq!(std::env::var_os(super::NO_PLUGINS.0), None);
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
