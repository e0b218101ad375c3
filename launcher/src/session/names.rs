//! The session's one name table, so that separate jobs on a session find each other's names
//! (`MPI_Publish_name` in one, `MPI_Lookup_name` in another), as on PRRTE's DVM.
//!
//! Two sides: each session agent's [`AskSession`] is greedy-pmix's [`SharedTable`] for the
//! jobs it runs (their node 0 hands it every name request of the job's ranks), which sends the
//! request up as [`Up::Names`] and waits for its [`crate::proto::Cmd::Names`]; the session's
//! [`NameDesk`] (sans-I/O, on the [`super::JobBoard`]) keeps the table and says which host
//! each answer goes to. A job's PMIx keys go with it when it ends, as its own table would
//! have; PMI names (no owner) stay until unpublished, as with Hydra's name server.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Instant,
};

use greedy_pmix::names::{self, Request, Response, SharedTable};
use tokio::sync::{mpsc, oneshot};

use crate::proto::Up;

/// An answer for host `node`'s request `ticket`.
pub(crate) type Answer = (u32, u64, Response);

/// The session's name table and the requests it holds (waiting lookups), by asking host.
#[derive(Debug, Default)]
pub(crate) struct NameDesk {
    table: names::Table,
    next: names::Ticket,
    /// Each request not answered yet: the host that asked and its number there.
    asked: HashMap<names::Ticket, (u32, u64)>,
}

impl NameDesk {
    /// Carries out host `node`'s request `ticket` at `now`: the answers to send (this one,
    /// unless it waits, and those of waiting lookups it completed).
    pub(crate) fn ask(
        &mut self,
        node: u32,
        ticket: u64,
        request: Request,
        now: Instant,
    ) -> Vec<Answer> {
        if let Err(why) = names::check_request(&request) {
            return vec![(node, ticket, Response::Failed(why))];
        }
        self.next += 1;
        self.asked.insert(self.next, (node, ticket));
        let answers = self.table.serve_at(self.next, request, now);
        self.addressed(answers)
    }

    /// The waiting lookups whose time is up at `now`, answered.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Answer> {
        let answers = self.table.expire(now);
        self.addressed(answers)
    }

    /// The job whose namespace is `nspace` ended: the keys it and the jobs it spawned
    /// published go (`<nspace>@<k>` are its children's namespaces).
    pub(crate) fn job_ended(&mut self, nspace: &str) {
        let child = format!("{nspace}@");
        self.table
            .forget_owners(|o| o.nspace == nspace || o.nspace.starts_with(&child));
    }

    fn addressed(&mut self, answers: Vec<(names::Ticket, Response)>) -> Vec<Answer> {
        answers
            .into_iter()
            .filter_map(|(t, r)| {
                self.asked
                    .remove(&t)
                    .map(|(node, ticket)| (node, ticket, r))
            })
            .collect()
    }
}

/// Requests a session agent sent up and not yet answered.
#[derive(Debug, Default)]
struct Pending {
    next: u64,
    answers: HashMap<u64, oneshot::Sender<Response>>,
}

/// A session agent's way to the session's name table, for every job it runs; cheap to clone.
#[derive(Debug, Clone)]
pub struct AskSession {
    node: u32,
    up: mpsc::Sender<Up>,
    pending: Arc<Mutex<Pending>>,
}

impl AskSession {
    /// Requests of session host `node`, sent on `up`.
    pub fn new(node: u32, up: mpsc::Sender<Up>) -> AskSession {
        AskSession {
            node,
            up,
            pending: Arc::default(),
        }
    }

    /// The session answered `ticket`.
    pub fn answered(&self, ticket: u64, response: Response) {
        if let Some(tx) = self.lock().answers.remove(&ticket) {
            let _ = tx.send(response);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SharedTable for AskSession {
    fn ask(&self, request: Request) -> Pin<Box<dyn Future<Output = Response> + Send>> {
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut p = self.lock();
            p.next += 1;
            let ticket = p.next;
            p.answers.insert(ticket, tx);
            ticket
        };
        let me = self.clone();
        Box::pin(async move {
            let node = me.node;
            if me
                .up
                .send(Up::Names {
                    node,
                    ticket,
                    request,
                })
                .await
                .is_err()
            {
                me.lock().answers.remove(&ticket);
                return Response::Failed("the session's agent is ending".into());
            }
            rx.await.unwrap_or_else(|_| {
                Response::Failed("the session's agent ended before the session answered".into())
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use greedy_pmix::names::{Datum, Owner};
    use std::time::Duration;

    fn put(nspace: &str, key: &str) -> Request {
        Request::Put {
            owner: Owner {
                nspace: nspace.into(),
                rank: 0,
            },
            data: vec![(key.into(), Datum::Str("port".into()))],
            first_read: false,
        }
    }

    fn get(key: &str, wait: Option<Duration>) -> Request {
        Request::Get {
            keys: vec![key.into()],
            wait,
        }
    }

    #[test]
    fn a_waiting_lookup_of_one_job_is_answered_on_its_host_by_another_jobs_publish() {
        let mut desk = NameDesk::default();
        let now = Instant::now();
        let waits = desk.ask(3, 7, get("svc", Some(Duration::from_secs(5))), now);
        assert!(waits.is_empty(), "{waits:?}");
        let answers = desk.ask(1, 2, put("jobA", "svc"), now);
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert!(answers.contains(&(1, 2, Response::Done)));
        assert!(
            answers
                .iter()
                .any(|(n, t, r)| (*n, *t) == (3, 7) && matches!(r, Response::Found(_))),
            "{answers:?}"
        );
    }

    #[test]
    fn a_jobs_keys_and_its_childrens_go_when_it_ends_and_no_others() {
        let mut desk = NameDesk::default();
        let now = Instant::now();
        for (ns, key) in [
            ("jobA", "a"),
            ("jobA@1", "a1"),
            ("jobAB", "ab"),
            ("jobB", "b"),
        ] {
            assert_eq!(desk.ask(0, 1, put(ns, key), now), [(0, 1, Response::Done)]);
        }
        desk.job_ended("jobA");
        let found = |desk: &mut NameDesk, key: &str| {
            matches!(desk.ask(0, 9, get(key, None), now)[0].2, Response::Found(_))
        };
        assert!(!found(&mut desk, "a"));
        assert!(!found(&mut desk, "a1"));
        assert!(found(&mut desk, "ab"));
        assert!(found(&mut desk, "b"));
    }

    #[test]
    fn a_waiting_lookup_that_times_out_is_answered_to_its_host() {
        let mut desk = NameDesk::default();
        let now = Instant::now();
        assert!(
            desk.ask(2, 5, get("never", Some(Duration::from_millis(10))), now)
                .is_empty()
        );
        let late = desk.expire(now + Duration::from_secs(1));
        assert!(
            matches!(late.as_slice(), [(2, 5, Response::NeverPublished { .. })]),
            "{late:?}"
        );
    }
}
