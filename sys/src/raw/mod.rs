//! Raw C declarations, exactly as the C headers define them.

#[cfg(feature = "pmix")]
pub mod pmix;
#[cfg(feature = "slurm")]
pub mod slurm;
