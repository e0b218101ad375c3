//! How an agent learns its parent's overlay address: a pluggable [`Rendezvous`].
//!
//! The launcher knows addresses (it starts each agent and can pass the parent's address on the
//! command line: [`Fixed`]); in-process tests and benchmarks share a [`Memory`] board; the
//! Slurm plugin will bring its own (Slurm's PMI/KVS or slurmd forwarding). Only the parent's
//! address is ever looked up: the rest of the address book is gathered over the tree itself.

use std::{
    collections::HashMap,
    future::Future,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use tokio::sync::Notify;

/// Publishes this agent's overlay address and finds another's.
///
/// The overlay bounds both calls by `OverlayConfig::join_timeout`, so an implementation may
/// wait as long as it likes.
pub trait Rendezvous: Send + Sync {
    /// Makes `addr` known as the address of node `node_idx`.
    fn publish(
        &self,
        node_idx: usize,
        addr: SocketAddr,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// The address of node `node_idx`, waiting until it is published.
    ///
    /// # Cancel safety
    /// Must be cancel-safe: the overlay drops it when `join_timeout` passes.
    fn lookup(&self, node_idx: usize) -> impl Future<Output = Result<SocketAddr, String>> + Send;
}

/// An in-process board: agents running as tasks of one process publish and look up here.
#[derive(Debug, Clone, Default)]
pub struct Memory {
    inner: Arc<(Mutex<HashMap<usize, SocketAddr>>, Notify)>,
}

impl Rendezvous for Memory {
    async fn publish(&self, node_idx: usize, addr: SocketAddr) -> Result<(), String> {
        self.inner
            .0
            .lock()
            .map_err(|_| "rendezvous board poisoned".to_string())?
            .insert(node_idx, addr);
        self.inner.1.notify_waiters();
        Ok(())
    }

    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        loop {
            // Register interest before checking, so a publish in between is not missed.
            let notified = self.inner.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(addr) = self
                .inner
                .0
                .lock()
                .map_err(|_| "rendezvous board poisoned".to_string())?
                .get(&node_idx)
            {
                return Ok(*addr);
            }
            notified.await;
        }
    }
}

/// Addresses known up front (for example the parent's, passed by the launcher); publishing is a no-op.
#[derive(Debug, Clone, Default)]
pub struct Fixed(pub HashMap<usize, SocketAddr>);

impl Rendezvous for Fixed {
    async fn publish(&self, _node_idx: usize, _addr: SocketAddr) -> Result<(), String> {
        Ok(())
    }

    async fn lookup(&self, node_idx: usize) -> Result<SocketAddr, String> {
        self.0
            .get(&node_idx)
            .copied()
            .ok_or_else(|| format!("no address known for node {node_idx}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_lookup_waits_for_publish() {
        let board = Memory::default();
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let waiter = tokio::spawn({
            let board = board.clone();
            async move { board.lookup(3).await }
        });
        tokio::task::yield_now().await;
        board.publish(3, addr).await.unwrap();
        assert_eq!(waiter.await.unwrap(), Ok(addr));
        assert_eq!(
            Fixed::default().lookup(1).await,
            Err("no address known for node 1".into())
        );
    }
}
