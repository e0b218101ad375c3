//! The event queue: a binary min-heap of (time, node, kind), 16 bytes an event.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Pending events, earliest first; ties go by node index, then kind, so a run is deterministic.
///
/// Times are non-negative `f64` seconds stored as their bit patterns: for non-negative floats
/// the bit order is the numeric order, which keeps the key a plain integer tuple.
#[derive(Debug, Default)]
pub(crate) struct EventQueue {
    heap: BinaryHeap<Reverse<(u64, u32, u8)>>,
}

impl EventQueue {
    /// An empty queue with room for `capacity` events.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(capacity),
        }
    }

    /// Schedules event `kind` for `node` at `time` (≥ 0).
    pub(crate) fn push(&mut self, time: f64, node: usize, kind: u8) {
        debug_assert!(time >= 0.0 && time.is_finite(), "event time {time}");
        self.heap
            .push(Reverse(((time + 0.0).to_bits(), node as u32, kind)));
    }

    /// The earliest event: (time, node, kind).
    pub(crate) fn pop(&mut self) -> Option<(f64, usize, u8)> {
        self.heap
            .pop()
            .map(|Reverse((t, node, kind))| (f64::from_bits(t), node as usize, kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_node_order() {
        let mut q = EventQueue::with_capacity(4);
        q.push(2.5, 1, 0);
        q.push(0.125, 9, 1);
        q.push(2.5, 0, 1);
        q.push(1e-9, 3, 0);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            [(1e-9, 3, 0), (0.125, 9, 1), (2.5, 0, 1), (2.5, 1, 0)]
        );
    }
}
