//! Slurm 26.05 plugin ABI (Debian forky: 26.05.5), from `slurm/slurm.h@slurm-26-05-3-1` and
//! `src/interfaces/mpi.h:62-78@slurm-26-05-3-1`; the asserts below are `sys/abi/offsets.c`
//! compiled against the release's installed slurm.h (26.05.5: the mirror's newest tag is
//! 26.05.3, whose `slurm.h` and `mpi.h` declare the same layouts).
//!
//! What changed since 24.11 (see `v24_11.rs` for 22.05 → 24.11), hidden by `crate::slurm`:
//! - 25.05 removed `front_end` from `slurm_step_layout_t` (`slurm.h:2150-2174@slurm-26-05-3-1`);
//! - 25.11 made `slurm_kill_job_step` take the step as a `slurm_step_id_t *`
//!   (`slurm.h:3952-3953@slurm-26-05-3-1`; `slurm_pmi.c:398-409` fills it with `sluid` 0
//!   and `step_het_comp` NO_VAL).
//!
//! The MPI hook structs are those of 24.11 (`mpi.h` unchanged but for line numbers).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// `slurm_addr_t`.
pub type slurm_addr_t = libc::sockaddr_storage;

/// `slurm_step_id_t`, with `sluid` (since 24.11).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct slurm_step_id_t {
    /// Slurm lineage unique id of the step (0 when unknown).
    pub sluid: u64,
    /// Job id.
    pub job_id: u32,
    /// Heterogeneous component, NO_VAL when not a het step.
    pub step_het_comp: u32,
    /// Step id.
    pub step_id: u32,
}

/// `slurm_step_layout_t`: where the step's tasks run (`slurm.h:2150-2174@slurm-26-05-3-1`).
#[repr(C)]
#[derive(Debug)]
pub struct slurm_step_layout_t {
    /// Compressed per-node cpus_per_task.
    pub cpt_compact_array: *mut u16,
    /// Entries in the `cpt_compact_*` arrays.
    pub cpt_compact_cnt: u32,
    /// Repetitions of each `cpt_compact_array` value.
    pub cpt_compact_reps: *mut u32,
    /// `slurm_node_alias_addrs_t *` (cloud nodes' addresses), not read.
    pub alias_addrs: *mut c_void,
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

/// `mpi_step_info_t`, given to `mpi_p_client_prelaunch` in srun.
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

/// `mpi_task_info_t`, given to `mpi_p_slurmstepd_task` in each task (no `self` since 23.11).
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
    /// The step.
    pub step_id: slurm_step_id_t,
}

unsafe extern "C" {
    /// Asks slurmctld to send `signal` to every task of a step (public `slurm.h:3952`);
    /// `flags` are `KILL_*`, 0 for none. 0 = sent. `step_id` is only read.
    pub fn slurm_kill_job_step(step_id: *mut slurm_step_id_t, signal: u16, flags: u16) -> c_int;
}

const _: () = {
    use super::config_key_pair_t;
    use std::mem::{offset_of, size_of};
    // sys/abi/offsets.c against slurm.h of Slurm 26.05.5 (x86_64)
    assert!(size_of::<slurm_step_id_t>() == 24);
    assert!(offset_of!(slurm_step_id_t, job_id) == 8);
    assert!(offset_of!(slurm_step_id_t, step_het_comp) == 12);
    assert!(offset_of!(slurm_step_id_t, step_id) == 16);
    assert!(size_of::<slurm_step_layout_t>() == 80);
    assert!(offset_of!(slurm_step_layout_t, node_cnt) == 32);
    assert!(offset_of!(slurm_step_layout_t, node_list) == 40);
    assert!(offset_of!(slurm_step_layout_t, tasks) == 56);
    assert!(offset_of!(slurm_step_layout_t, task_cnt) == 64);
    assert!(offset_of!(slurm_step_layout_t, tids) == 72);
    assert!(size_of::<mpi_step_info_t>() == 40);
    assert!(offset_of!(mpi_step_info_t, step_id) == 8);
    assert!(offset_of!(mpi_step_info_t, step_layout) == 32);
    assert!(size_of::<mpi_task_info_t>() == 56);
    assert!(offset_of!(mpi_task_info_t, gtaskid) == 8);
    assert!(offset_of!(mpi_task_info_t, ltaskid) == 12);
    assert!(offset_of!(mpi_task_info_t, nodeid) == 24);
    assert!(offset_of!(mpi_task_info_t, ntasks) == 28);
    assert!(offset_of!(mpi_task_info_t, step_id) == 32);
    assert!(size_of::<config_key_pair_t>() == 16);
    assert!(offset_of!(config_key_pair_t, value) == 8);
};
