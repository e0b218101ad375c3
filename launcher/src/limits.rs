//! Bounds that greedyrun's loops share: the frames they queue and how long an ending may take.

use std::time::Duration;

/// Frames from the whole tree into greedyrun's loop.
pub(crate) const UP_CAPACITY: usize = 4096;
/// After the grace period, how long greedyrun waits for agents to confirm their teardown
/// before it kills its own remote shells (which makes each agent see EOF and clean up).
pub(crate) const TEARDOWN_LINGER: Duration = Duration::from_secs(5);
/// How long a normal shutdown may take before the remote shells are killed.
pub(crate) const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
