//! Node 0's job-wide services: the name table ([`crate::names`]) and the subset-collective coordinator ([`crate::group`]), each serving its overlay queue.
//!
//! Both the PMI and the PMIx server start them ([`spawn`]); whichever starts first takes the
//! queues ([`Overlay::incoming`] hands each out once), so a node serving both families runs
//! one table that both share. Requests a service holds on purpose (a waiting lookup, a
//! group short of nodes) are kept by ticket until answered or expired.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    JobSpec,
    frame::Service,
    group, names,
    names::Ticket,
    overlay::{Incoming, Overlay},
};

/// On node 0, starts the services whose queues nobody took yet; elsewhere, nothing.
pub(crate) fn spawn(
    job: &Arc<JobSpec>,
    overlay: &Overlay,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) {
    if job.node_idx != names::NAMES_NODE {
        return;
    }
    let span = info_span!("node0", job = %job.job_id);
    if let Some(incoming) = overlay.incoming(Service::Names) {
        let table = names::Table::default();
        tracker.spawn(serve(incoming, shutdown.clone(), table).instrument(span.clone()));
    }
    if let Some(incoming) = overlay.incoming(Service::Group) {
        let coordinator = group::Coordinator::over(overlay.served().clone());
        tracker.spawn(serve(incoming, shutdown.clone(), coordinator).instrument(span));
    }
}

/// On node 0, hands every name request of the job's ranks to `table` (kept outside the job)
/// instead of a table of its own; elsewhere, nothing. Call it before the servers start, which
/// then find the queue taken.
pub(crate) fn forward_names(job: &JobSpec, overlay: &Overlay, table: Arc<dyn names::SharedTable>) {
    if job.node_idx != names::NAMES_NODE {
        return;
    }
    let Some(mut incoming) = overlay.incoming(Service::Names) else {
        return;
    };
    let span = info_span!("node0", job = %job.job_id);
    tokio::spawn(
        async move {
            // Ends with the overlay, which drops the queue's sender.
            while let Some(req) = incoming.recv().await {
                let request = match names::decode_request(&req.body) {
                    Ok(r) => r,
                    Err(why) => {
                        req.respond(Err(why)).await;
                        continue;
                    }
                };
                debug!(from = req.from, ?request, "name service, shared table");
                // A lookup may wait for its keys: each request is answered on its own.
                let answer = table.ask(request);
                tokio::spawn(async move {
                    let response = answer.await;
                    req.respond(Ok(names::encode_response(&response))).await;
                });
            }
        }
        .instrument(span),
    );
}

/// A sans-I/O service answering tickets, some of them later.
trait Service0: Send + 'static {
    /// Carries out one request; the answers it completes.
    fn request(
        &mut self,
        ticket: Ticket,
        req: &Incoming,
        now: Instant,
    ) -> Vec<(Ticket, Result<bytes::Bytes, String>)>;
    /// The held requests whose time is up.
    fn expire(&mut self, now: Instant) -> Vec<(Ticket, Result<bytes::Bytes, String>)>;
    /// When [`Service0::expire`] has something to do next.
    fn next_deadline(&self) -> Option<Instant>;
}

impl Service0 for names::Table {
    fn request(
        &mut self,
        ticket: Ticket,
        req: &Incoming,
        now: Instant,
    ) -> Vec<(Ticket, Result<bytes::Bytes, String>)> {
        match names::decode_request(&req.body) {
            Err(why) => vec![(ticket, Err(why))],
            Ok(request) => {
                debug!(from = req.from, ?request, "name service");
                encoded(self.serve_at(ticket, request, now))
            }
        }
    }

    fn expire(&mut self, now: Instant) -> Vec<(Ticket, Result<bytes::Bytes, String>)> {
        encoded(names::Table::expire(self, now))
    }

    fn next_deadline(&self) -> Option<Instant> {
        names::Table::next_deadline(self)
    }
}

fn encoded(answers: Vec<(Ticket, names::Response)>) -> Vec<(Ticket, Result<bytes::Bytes, String>)> {
    answers
        .into_iter()
        .map(|(t, r)| (t, Ok(names::encode_response(&r))))
        .collect()
}

impl Service0 for group::Coordinator {
    fn request(
        &mut self,
        ticket: Ticket,
        req: &Incoming,
        now: Instant,
    ) -> Vec<(Ticket, Result<bytes::Bytes, String>)> {
        match group::decode(&req.body) {
            Err(why) => vec![(ticket, Err(why))],
            Ok(c) => {
                debug!(from = req.from, op = ?c.op, n = c.procs.len(), seq = c.seq, "group");
                self.contribute(ticket, req.from, c, now)
            }
        }
    }

    fn expire(&mut self, now: Instant) -> Vec<(Ticket, Result<bytes::Bytes, String>)> {
        let late = group::Coordinator::expire(self, now);
        for (_, why) in &late {
            if let Err(why) = why {
                warn!("{why}");
            }
        }
        late
    }

    fn next_deadline(&self) -> Option<Instant> {
        group::Coordinator::next_deadline(self)
    }
}

/// Serves `incoming` with `service` until shutdown, holding requests it answers later.
async fn serve<S: Service0>(
    mut incoming: mpsc::Receiver<Incoming>,
    shutdown: CancellationToken,
    mut service: S,
) {
    let mut held: HashMap<Ticket, Incoming> = HashMap::new();
    let mut next: Ticket = 0;
    loop {
        let deadline = service.next_deadline();
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        let answers = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sleep => service.expire(Instant::now()),
            r = incoming.recv() => match r {
                None => return,
                Some(req) => {
                    next += 1;
                    let answers = service.request(next, &req, Instant::now());
                    held.insert(next, req);
                    answers
                }
            },
        };
        for (ticket, answer) in answers {
            if let Some(req) = held.remove(&ticket) {
                req.respond(answer).await;
            }
        }
    }
}
