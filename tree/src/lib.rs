//! Optimal process-launch trees (placeholder, being written).
