//! Slurm 22.05 plugin ABI, from `slurm/slurm.h` and
//! `src/common/slurm_mpi.h:61-78@slurm-22-05-8-1`; the asserts below are `sys/abi/offsets.c`
//! compiled against the release's installed slurm.h (Debian 12: 22.05.8).
//!
//! The structs are declared with every release's in `hooks.rs` (22.05's fields by its cfg,
//! its hook structs' names as aliases); here is what is 22.05's own: `slurm_kill_job_step`
//! without `flags`, and the asserts.

#![allow(non_camel_case_types)]

use std::ffi::c_int;

unsafe extern "C" {
    /// Asks slurmctld to send `signal` to every task of a step (public `slurm.h:3560`); 0 = sent.
    pub fn slurm_kill_job_step(job_id: u32, step_id: u32, signal: u16) -> c_int;
}

const _: () = {
    use super::{
        config_key_pair_t, mpi_plugin_client_info_t, mpi_plugin_task_info_t, slurm_step_id_t,
        slurm_step_layout_t,
    };
    use std::mem::{offset_of, size_of};
    // sys/abi/offsets.c against slurm.h of Slurm 22.05.8 (x86_64)
    assert!(size_of::<slurm_step_id_t>() == 12);
    assert!(offset_of!(slurm_step_id_t, job_id) == 0);
    assert!(offset_of!(slurm_step_id_t, step_het_comp) == 4);
    assert!(offset_of!(slurm_step_id_t, step_id) == 8);
    assert!(size_of::<slurm_step_layout_t>() == 56);
    assert!(offset_of!(slurm_step_layout_t, node_cnt) == 8);
    assert!(offset_of!(slurm_step_layout_t, node_list) == 16);
    assert!(offset_of!(slurm_step_layout_t, tasks) == 32);
    assert!(offset_of!(slurm_step_layout_t, task_cnt) == 40);
    assert!(offset_of!(slurm_step_layout_t, tids) == 48);
    assert!(size_of::<mpi_plugin_client_info_t>() == 32);
    assert!(offset_of!(mpi_plugin_client_info_t, step_id) == 8);
    assert!(offset_of!(mpi_plugin_client_info_t, step_layout) == 24);
    assert!(size_of::<mpi_plugin_task_info_t>() == 56);
    assert!(offset_of!(mpi_plugin_task_info_t, gtaskid) == 8);
    assert!(offset_of!(mpi_plugin_task_info_t, ltaskid) == 12);
    assert!(offset_of!(mpi_plugin_task_info_t, nodeid) == 24);
    assert!(offset_of!(mpi_plugin_task_info_t, ntasks) == 28);
    assert!(offset_of!(mpi_plugin_task_info_t, step_id) == 40);
    assert!(size_of::<config_key_pair_t>() == 16);
    assert!(offset_of!(config_key_pair_t, value) == 8);
};
