//! A job's frames on their way from the session's loop to its client, bounded for output.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::proto::Up;

/// Bytes of one job's output queued towards its client: past it the client is not reading
/// (or reads far slower than its ranks write), and its job is ended as a gone client's. The
/// session's loop never waits for a client, so this bounds its memory per job.
const JOB_BACKLOG: usize = 32 << 20;

/// A job's frames on their way from the session's loop to its client ([`super::serve::serve_job`]): never
/// waited on by the loop; its output bounded (32 MiB), past which output is dropped
/// and the job is marked for ending. Exits, byes and losses always pass: the job's end is
/// seen whatever its client does.
#[derive(Debug, Clone)]
pub struct JobQueue {
    tx: mpsc::UnboundedSender<Up>,
    held: Arc<std::sync::atomic::AtomicUsize>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

/// The client's side of a [`JobQueue`].
#[derive(Debug)]
pub(crate) struct JobFrames {
    pub(super) rx: mpsc::UnboundedReceiver<Up>,
    held: Arc<std::sync::atomic::AtomicUsize>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

/// A job's queue and its receiving end.
pub(super) fn job_queue() -> (JobQueue, JobFrames) {
    let (tx, rx) = mpsc::unbounded_channel();
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let over = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let frames = JobFrames {
        rx,
        held: held.clone(),
        over: over.clone(),
    };
    (JobQueue { tx, held, over }, frames)
}

/// The bytes of `up` that count against [`JOB_BACKLOG`]: its output.
fn output_len(up: &Up) -> usize {
    match up {
        Up::Output { data, .. } | Up::TaskOutput { data, .. } => data.len(),
        _ => 0,
    }
}

impl JobQueue {
    /// Queues `up` without waiting; output past the backlog is dropped and the job marked.
    pub fn push(&self, up: Up) {
        use std::sync::atomic::Ordering::Relaxed;
        let len = output_len(&up);
        if len > 0 && (self.over.load(Relaxed) || self.held.load(Relaxed) + len > JOB_BACKLOG) {
            self.over.store(true, Relaxed);
            return;
        }
        self.held.fetch_add(len, Relaxed);
        let _ = self.tx.send(up);
    }
}

impl JobFrames {
    /// The next frame; `None` once the job's entry is gone.
    ///
    /// # Cancel safety
    /// Cancel safe, as `mpsc::UnboundedReceiver::recv`.
    pub(super) async fn recv(&mut self) -> Option<Up> {
        let up = self.rx.recv().await?;
        self.held
            .fetch_sub(output_len(&up), std::sync::atomic::Ordering::Relaxed);
        Some(up)
    }

    /// Whether output had to be dropped: the client does not keep up.
    pub(super) fn overflowed(&self) -> bool {
        self.over.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn a_jobs_queue_drops_output_past_its_backlog_but_never_its_end() {
        let (q, mut frames) = job_queue();
        let chunk = Bytes::from(vec![b'x'; 1 << 20]);
        let output = |data: &Bytes| Up::Output {
            rank: 0,
            stream: crate::proto::Stream::Stdout,
            data: data.clone(),
        };
        for _ in 0..(JOB_BACKLOG >> 20) + 3 {
            q.push(output(&chunk));
        }
        q.push(Up::Bye { node: 0 });
        assert!(frames.overflowed());
        let mut n = 0;
        while let Ok(up) = frames.rx.try_recv() {
            n += 1;
            frames
                .held
                .fetch_sub(output_len(&up), std::sync::atomic::Ordering::Relaxed);
            if n == (JOB_BACKLOG >> 20) + 1 {
                assert_eq!(up, Up::Bye { node: 0 });
            }
        }
        assert_eq!(n, (JOB_BACKLOG >> 20) + 1);
    }
}
