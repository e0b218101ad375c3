//! The step and MPI-hook structs of every supported release, declared once: a field only some
//! releases have is gated by their cfg (as in `stepd.rs`). From `slurm/slurm.h` and the
//! internal MPI-plugin header (`src/common/slurm_mpi.h:61-78@slurm-22-05-8-1`,
//! `src/interfaces/mpi.h:61-77@slurm-24-11-5-1`, `mpi.h:62-78@slurm-26-05-3-1`). Each
//! release's module (`v22_05.rs`, `v24_11.rs`, `v26_05.rs`) keeps what is its own and the
//! asserts that pin these layouts to its headers.
//!
//! What changed since 22.05 (and what the safe wrappers in `crate::slurm` hide):
//! - 23.02 renamed `mpi_plugin_client_info_t`/`mpi_plugin_task_info_t` to
//!   [`mpi_step_info_t`]/[`mpi_task_info_t`] (`src/interfaces/mpi.h@slurm-23-02-0-1`; every
//!   release is declared with the new names, 22.05 keeps the old ones as aliases);
//! - 23.11 removed `slurm_addr_t *self` from `mpi_task_info_t` (`mpi.h@slurm-23-11-0-1`), and
//!   put `cpt_compact_*` and `alias_addrs` into `slurm_step_layout_t`;
//! - 24.11 gave `slurm_step_id_t` a leading `uint64_t sluid`
//!   (`slurm.h:2069-2074@slurm-24-11-5-1`), which moves `step_layout` in the step info;
//! - 25.05 removed `front_end` from `slurm_step_layout_t` (`slurm.h:2150-2174@slurm-26-05-3-1`).

#![allow(non_camel_case_types)]

use std::ffi::c_char;

/// `slurm_addr_t`.
pub type slurm_addr_t = libc::sockaddr_storage;

/// `slurm_step_id_t` (`struct slurm_step_id_msg`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct slurm_step_id_t {
    /// Slurm lineage unique id of the step (0 when unknown), since 24.11.
    #[cfg(not(slurm_22_05))]
    pub sluid: u64,
    /// Job id.
    pub job_id: u32,
    /// Heterogeneous component, NO_VAL when not a het step.
    pub step_het_comp: u32,
    /// Step id.
    pub step_id: u32,
}

/// `slurm_step_layout_t`: where the step's tasks run (`slurm.h:2040-2067@slurm-24-11-5-1`,
/// `slurm.h:2150-2174@slurm-26-05-3-1`).
#[repr(C)]
#[derive(Debug)]
pub struct slurm_step_layout_t {
    /// Compressed per-node cpus_per_task (since 23.11).
    #[cfg(not(slurm_22_05))]
    pub cpt_compact_array: *mut u16,
    /// Entries in the `cpt_compact_*` arrays (since 23.11).
    #[cfg(not(slurm_22_05))]
    pub cpt_compact_cnt: u32,
    /// Repetitions of each `cpt_compact_array` value (since 23.11).
    #[cfg(not(slurm_22_05))]
    pub cpt_compact_reps: *mut u32,
    /// Front-end node name, or NULL (removed in 25.05).
    #[cfg(not(slurm_26_05))]
    pub front_end: *mut c_char,
    /// `slurm_node_alias_addrs_t *` (cloud nodes' addresses), not read (since 23.11).
    #[cfg(not(slurm_22_05))]
    pub alias_addrs: *mut std::ffi::c_void,
    /// Number of nodes.
    pub node_cnt: u32,
    /// Node names, a hostlist expression.
    pub node_list: *mut c_char,
    /// Plane size for plane distribution.
    pub plane_size: u16,
    /// Lowest protocol version of the step's nodes.
    pub start_protocol_ver: u16,
    /// Tasks on each node (`node_cnt` entries).
    pub tasks: *mut u16,
    /// Total tasks.
    pub task_cnt: u32,
    /// Task distribution.
    pub task_dist: u32,
    /// Global task ids per node: `tids[node][i]`.
    pub tids: *mut *mut u32,
}

/// `mpi_step_info_t` (22.05: `mpi_plugin_client_info_t`), given to `mpi_p_client_prelaunch`
/// in srun.
#[repr(C)]
#[derive(Debug)]
pub struct mpi_step_info_t {
    /// Het job id, NO_VAL when not het.
    pub het_job_id: u32,
    /// Task offset of this component, NO_VAL when not het.
    pub het_job_task_offset: u32,
    /// The step.
    pub step_id: slurm_step_id_t,
    /// Its layout.
    pub step_layout: *mut slurm_step_layout_t,
}

/// `mpi_task_info_t` (22.05: `mpi_plugin_task_info_t`), given to `mpi_p_slurmstepd_task` in
/// each task.
#[repr(C)]
#[derive(Debug)]
pub struct mpi_task_info_t {
    /// srun's address.
    pub client: *mut slurm_addr_t,
    /// Global rank.
    pub gtaskid: u32,
    /// Rank on this node.
    pub ltaskid: i32,
    /// Ranks on this node.
    pub ltasks: u32,
    /// Nodes of the step.
    pub nnodes: u32,
    /// This node's index in the step.
    pub nodeid: u32,
    /// Ranks of the step.
    pub ntasks: u32,
    /// This node's address (removed in 23.11).
    #[cfg(slurm_22_05)]
    pub self_: *mut slurm_addr_t,
    /// The step.
    pub step_id: slurm_step_id_t,
}

/// 22.05's name of [`mpi_step_info_t`] (the same layout).
#[cfg(slurm_22_05)]
pub type mpi_plugin_client_info_t = mpi_step_info_t;
/// 22.05's name of [`mpi_task_info_t`] (with `self`, which 23.11 removed).
#[cfg(slurm_22_05)]
pub type mpi_plugin_task_info_t = mpi_task_info_t;

// sys/abi/offsets.c against slurm.h of Slurm 24.11.5 and of 26.05.5 (x86_64): the same
// numbers for both; the step layout's, which differ, and 22.05's are in the release modules.
#[cfg(not(slurm_22_05))]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<slurm_step_id_t>() == 24);
    assert!(offset_of!(slurm_step_id_t, job_id) == 8);
    assert!(offset_of!(slurm_step_id_t, step_het_comp) == 12);
    assert!(offset_of!(slurm_step_id_t, step_id) == 16);
    assert!(size_of::<mpi_step_info_t>() == 40);
    assert!(offset_of!(mpi_step_info_t, step_id) == 8);
    assert!(offset_of!(mpi_step_info_t, step_layout) == 32);
    assert!(size_of::<mpi_task_info_t>() == 56);
    assert!(offset_of!(mpi_task_info_t, gtaskid) == 8);
    assert!(offset_of!(mpi_task_info_t, ltaskid) == 12);
    assert!(offset_of!(mpi_task_info_t, nodeid) == 24);
    assert!(offset_of!(mpi_task_info_t, ntasks) == 28);
    assert!(offset_of!(mpi_task_info_t, step_id) == 32);
};
