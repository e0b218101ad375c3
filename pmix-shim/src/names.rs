//! The job's name service (`MPI_Publish_name`, `MPI_Lookup_name`, `MPI_Unpublish_name`, and PMIx's `PMIx_Publish`/`Lookup`/`Unpublish`): one table on node 0, reached by overlay requests.
//!
//! Sans-I/O: [`Table::serve_at`] carries out one [`Request`] and says which requests are
//! answered by it (a waiting lookup is answered later, when a publish completes it or
//! [`Table::expire`] finds its deadline passed); [`encode_request`] and friends are the bytes
//! of the overlay requests that carry them. Every node's PMI and PMIx servers send their
//! ranks' requests to [`NAMES_NODE`], its own ranks' included, so the table's rules live only
//! here. PMI and PMIx share the table: a PMIx string is a PMI port and back.
//!
//! Rules. PMI (MPICH's semantics): a lookup of an unknown name fails at once, a name is
//! published once until unpublished. PMIx (as PRRTE's data server, prrte v3.0.9
//! src/runtime/data_server/ds_publish.c, ds_lookup.c): a publish of several keys is refused
//! whole if one exists (`PMIX_EXISTS`); a lookup with `PMIX_WAIT` waits until every key is
//! published, at most its `PMIX_TIMEOUT` (or [`WAIT_DEFAULT`], never past [`WAIT_MAX`]) and
//! then fails naming the keys never published; a key published with
//! `PMIX_PERSIST_FIRST_READ` is deleted by the first lookup that returns it; only the rank
//! that published a key may unpublish it (PMI publishes have no owner). `PMIX_RANGE` is not
//! looked at: one job is one namespace, so every range the job can name is the job.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
pub use greedy_sys::pmix::pubsub::Datum;
use serde::{Deserialize, Serialize};

/// The node that holds the job's name table.
pub const NAMES_NODE: usize = 0;
/// Longest PMI service name (MPICH's `MPI_MAX_OBJECT_NAME` is 128; room to spare).
pub const NAME_MAX: usize = 256;
/// Longest PMIx key (`PMIX_MAX_KEYLEN`; Open MPI's connect/accept keys are its port name,
/// at most 1024 bytes, plus ":accept": longer ones are refused by libpmix before us).
pub const KEY_MAX: usize = 511;
/// Longest PMI port (MPICH's `MPI_MAX_PORT_NAME` is 256; the PMI value limit bounds it anyway).
pub const PORT_MAX: usize = 1024;
/// Largest PMIx value (Open MPI's connect/accept publishes its side's member list, about 25
/// bytes a rank: room for ten thousand ranks).
pub const VALUE_MAX: usize = 256 * 1024;
/// Most keys one PMIx request may carry.
pub const KEYS_MAX: usize = 64;
/// Most names one job may have published at once, so that ranks cannot grow node 0 without bound.
pub const NAMES_MAX: usize = 4096;
/// Most bytes of values the table holds at once.
pub const TABLE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Most lookups waiting at once.
pub const WAITING_MAX: usize = 1024;
/// How long a waiting lookup without `PMIX_TIMEOUT` waits.
pub const WAIT_DEFAULT: Duration = Duration::from_secs(120);
/// The longest a lookup waits, whatever its `PMIX_TIMEOUT` (Open MPI's connect/accept asks 600 s).
pub const WAIT_MAX: Duration = Duration::from_secs(900);

/// The rank that published a key (PMIx publishes; PMI ones have none).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// Its namespace.
    pub nspace: String,
    /// Its rank.
    pub rank: u32,
}

/// Bytes a value holds (for the table's bound).
fn weight(value: &Datum) -> usize {
    match value {
        Datum::Str(s) => s.len(),
        Datum::Bytes(b) => b.len(),
        _ => 8,
    }
}

/// What a rank asks the name service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// PMI: publish `port` under `name`.
    Publish {
        /// The service name.
        name: String,
        /// The port (an MPI port name).
        port: String,
    },
    /// PMI: withdraw `name`.
    Unpublish {
        /// The service name.
        name: String,
    },
    /// PMI: the port published under `name`.
    Lookup {
        /// The service name.
        name: String,
    },
    /// PMIx: publish every `(key, value)` of `data`, or none.
    Put {
        /// The publishing rank.
        owner: Owner,
        /// The keys and values.
        data: Vec<(String, Datum)>,
        /// `PMIX_PERSIST_FIRST_READ`: delete each key once a lookup returned it.
        first_read: bool,
    },
    /// PMIx: look `keys` up, waiting up to `wait` for those not published yet.
    Get {
        /// The keys.
        keys: Vec<String>,
        /// `PMIX_WAIT` with its bound (already capped by the asker); `None`: answer at once.
        wait: Option<Duration>,
    },
    /// PMIx: withdraw `keys` (every key `owner` published when empty).
    Withdraw {
        /// The asking rank, which must own them.
        owner: Owner,
        /// The keys.
        keys: Vec<String>,
    },
}

/// One key a lookup found: the key, its publisher (`None`: a PMI publish) and its value.
pub type FoundItem = (String, Option<Owner>, Datum);

/// The name service's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Published or unpublished.
    Done,
    /// The port a lookup found.
    Port(String),
    /// A publish of a name already published.
    AlreadyPublished,
    /// A lookup or unpublish of a name not published.
    Unknown,
    /// The table holds [`NAMES_MAX`] names (or [`TABLE_BYTES_MAX`] bytes, or
    /// [`WAITING_MAX`] waiting lookups).
    Full,
    /// The service could not be asked or answered nonsense (the reason).
    Failed(String),
    /// PMIx: what a lookup found, in the order asked.
    Found(Vec<FoundItem>),
    /// PMIx: these keys were not published (a lookup without wait, an unpublish).
    Missing(Vec<String>),
    /// PMIx: a waiting lookup's bound passed with these keys never published.
    NeverPublished {
        /// The keys still missing.
        keys: Vec<String>,
        /// How long the lookup waited.
        waited: Duration,
    },
    /// PMIx: this key exists already (a publish is refused whole).
    Exists(String),
    /// PMIx: `key` was published by `owner`, not the rank asking to unpublish it.
    NotOwner {
        /// The key.
        key: String,
        /// Its publisher (`None`: a PMI publish, which no PMIx rank owns).
        owner: Option<Owner>,
    },
}

impl Response {
    /// Why the request failed, in words; `None` on success.
    pub fn reason(&self) -> Option<String> {
        match self {
            Response::Done | Response::Port(_) | Response::Found(_) => None,
            Response::AlreadyPublished => Some("name already published".into()),
            Response::Unknown => Some("name not published".into()),
            Response::Full => Some(format!(
                "name table full ({NAMES_MAX} names, {TABLE_BYTES_MAX} bytes or {WAITING_MAX} waiting lookups)"
            )),
            Response::Failed(reason) => Some(reason.clone()),
            Response::Missing(keys) => Some(format!("not published: {keys:?}")),
            Response::NeverPublished { keys, waited } => Some(format!(
                "keys {keys:?} were never published within {waited:?}"
            )),
            Response::Exists(key) => Some(format!("key {key:?} already published")),
            Response::NotOwner { key, owner } => Some(match owner {
                Some(o) => format!("key {key:?} was published by {}:{}", o.nspace, o.rank),
                None => format!("key {key:?} was published through PMI"),
            }),
        }
    }
}

/// Names a request the caller must answer: node 0's server keeps the overlay request under it.
pub type Ticket = u64;

/// A name table kept outside the job for several jobs at once (a session's, so that separate
/// jobs find each other's names): node 0 hands it every request of its job's ranks instead of
/// keeping a table of its own.
pub trait SharedTable: std::fmt::Debug + Send + Sync + 'static {
    /// Carries out `request` (checked already); its answer, once there is one.
    fn ask(
        &self,
        request: Request,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send>>;
}

/// One published key.
#[derive(Debug)]
struct Entry {
    value: Datum,
    owner: Option<Owner>,
    first_read: bool,
}

/// A lookup waiting for keys.
#[derive(Debug)]
struct Waiting {
    ticket: Ticket,
    keys: Vec<String>,
    since: Instant,
    deadline: Instant,
}

/// The job's published names.
#[derive(Debug, Default)]
pub struct Table {
    entries: HashMap<String, Entry>,
    bytes: usize,
    waiting: Vec<Waiting>,
}

impl Table {
    /// Carries out a request that never waits (every PMI request) and returns its answer.
    pub fn serve(&mut self, request: Request) -> Response {
        let request = match request {
            Request::Get { keys, .. } => Request::Get { keys, wait: None },
            r => r,
        };
        let answers = self.serve_at(0, request, Instant::now());
        answers
            .into_iter()
            .find(|(t, _)| *t == 0)
            .map(|(_, r)| r)
            .unwrap_or_else(|| Response::Failed("unanswered".into()))
    }

    /// Carries out `request` (known as `ticket`) at `now`: the answers to send, this request's
    /// among them unless it waits, and those of waiting lookups it completed.
    pub fn serve_at(
        &mut self,
        ticket: Ticket,
        request: Request,
        now: Instant,
    ) -> Vec<(Ticket, Response)> {
        match request {
            Request::Publish { name, port } => {
                let r = self.put(None, vec![(name, Datum::Str(port))], false);
                let r = match r {
                    Response::Exists(_) => Response::AlreadyPublished,
                    r => r,
                };
                self.answered(ticket, r)
            }
            Request::Unpublish { name } => {
                let r = match self.entries.get(&name) {
                    Some(e) if e.owner.is_none() => {
                        self.remove(&name);
                        Response::Done
                    }
                    _ => Response::Unknown,
                };
                vec![(ticket, r)]
            }
            Request::Lookup { name } => {
                let r = match self.entries.get(&name) {
                    Some(Entry {
                        value: Datum::Str(port),
                        first_read: false,
                        ..
                    }) => Response::Port(port.clone()),
                    _ => Response::Unknown,
                };
                vec![(ticket, r)]
            }
            Request::Put {
                owner,
                data,
                first_read,
            } => {
                let r = self.put(Some(owner), data, first_read);
                self.answered(ticket, r)
            }
            Request::Get { keys, wait } => self.get(ticket, keys, wait, now),
            Request::Withdraw { owner, keys } => vec![(ticket, self.withdraw(&owner, keys))],
        }
    }

    /// This request's answer, then the waiting lookups a successful publish completed.
    fn answered(&mut self, ticket: Ticket, r: Response) -> Vec<(Ticket, Response)> {
        let published = r == Response::Done;
        let mut out = vec![(ticket, r)];
        if published {
            out.extend(self.wake());
        }
        out
    }

    fn put(
        &mut self,
        owner: Option<Owner>,
        data: Vec<(String, Datum)>,
        first_read: bool,
    ) -> Response {
        if let Some((k, _)) = data.iter().find(|(k, _)| self.entries.contains_key(k)) {
            return Response::Exists(k.clone());
        }
        let added: usize = data.iter().map(|(k, v)| k.len() + weight(v)).sum();
        if self.entries.len() + data.len() > NAMES_MAX || self.bytes + added > TABLE_BYTES_MAX {
            return Response::Full;
        }
        for (k, value) in data {
            // A key twice in one publish: the last one counts, weighed once.
            if let Some(old) = self.entries.insert(
                k.clone(),
                Entry {
                    value,
                    owner: owner.clone(),
                    first_read,
                },
            ) {
                self.bytes -= k.len() + weight(&old.value);
            }
        }
        self.bytes += added;
        Response::Done
    }

    fn remove(&mut self, key: &str) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        self.bytes = self.bytes.saturating_sub(key.len() + weight(&e.value));
        Some(e)
    }

    /// Every key of `keys` found now (first-read ones removed), or `Err` with those missing.
    fn take(&mut self, keys: &[String]) -> Result<Vec<FoundItem>, Vec<String>> {
        let missing: Vec<String> = keys
            .iter()
            .filter(|k| !self.entries.contains_key(*k))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        let mut found = Vec::with_capacity(keys.len());
        for k in keys {
            let e = &self.entries[k];
            let item = (k.clone(), e.owner.clone(), e.value.clone());
            if e.first_read {
                self.remove(k);
            }
            found.push(item);
        }
        Ok(found)
    }

    fn get(
        &mut self,
        ticket: Ticket,
        keys: Vec<String>,
        wait: Option<Duration>,
        now: Instant,
    ) -> Vec<(Ticket, Response)> {
        let r = match (self.take(&keys), wait) {
            (Ok(found), _) => Response::Found(found),
            (Err(missing), None) => Response::Missing(missing),
            (Err(_), Some(_)) if self.waiting.len() >= WAITING_MAX => Response::Full,
            (Err(_), Some(wait)) => {
                self.waiting.push(Waiting {
                    ticket,
                    keys,
                    since: now,
                    deadline: now + wait.min(WAIT_MAX),
                });
                return Vec::new();
            }
        };
        vec![(ticket, r)]
    }

    fn withdraw(&mut self, owner: &Owner, keys: Vec<String>) -> Response {
        let keys = if keys.is_empty() {
            let mine: Vec<String> = self
                .entries
                .iter()
                .filter(|(_, e)| e.owner.as_ref() == Some(owner))
                .map(|(k, _)| k.clone())
                .collect();
            if mine.is_empty() {
                return Response::Missing(Vec::new());
            }
            mine
        } else {
            keys
        };
        let missing: Vec<String> = keys
            .iter()
            .filter(|k| !self.entries.contains_key(*k))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Response::Missing(missing);
        }
        if let Some(k) = keys
            .iter()
            .find(|k| self.entries[*k].owner.as_ref() != Some(owner))
        {
            let owner = self.entries[k].owner.clone();
            return Response::NotOwner {
                key: k.clone(),
                owner,
            };
        }
        for k in &keys {
            self.remove(k);
        }
        Response::Done
    }

    /// The waiting lookups whose keys are all published now, answered in arrival order.
    fn wake(&mut self) -> Vec<(Ticket, Response)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            match self.take(&self.waiting[i].keys.clone()) {
                Ok(found) => {
                    let w = self.waiting.remove(i);
                    out.push((w.ticket, Response::Found(found)));
                }
                Err(_) => i += 1,
            }
        }
        out
    }

    /// Removes every key published by an owner `gone` says has ended (on a table shared by
    /// several jobs, the keys of a job that ended, as its own table would have gone with it).
    pub fn forget_owners(&mut self, gone: impl Fn(&Owner) -> bool) {
        let keys: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.owner.as_ref().is_some_and(&gone))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.remove(&key);
        }
    }

    /// The waiting lookups whose deadline has passed at `now`, answered with the keys never
    /// published.
    pub fn expire(&mut self, now: Instant) -> Vec<(Ticket, Response)> {
        let (late, keep): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|w| w.deadline <= now);
        self.waiting = keep;
        late.into_iter()
            .map(|w| {
                let keys = w
                    .keys
                    .into_iter()
                    .filter(|k| !self.entries.contains_key(k))
                    .collect();
                let waited = now.saturating_duration_since(w.since);
                (w.ticket, Response::NeverPublished { keys, waited })
            })
            .collect()
    }

    /// When the next waiting lookup expires.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.iter().map(|w| w.deadline).min()
    }
}

/// The body of the overlay request carrying `request`.
pub fn encode_request(request: &Request) -> Bytes {
    // Encoding a plain enum of strings into a Vec cannot fail.
    Bytes::from(postcard::to_stdvec(request).unwrap_or_default())
}

/// The request in an overlay body from another node, its lengths checked; the error is the
/// answer to send back.
pub fn decode_request(body: &[u8]) -> Result<Request, String> {
    let request: Request =
        postcard::from_bytes(body).map_err(|e| format!("bad name-service request: {e}"))?;
    check_request(&request)?;
    Ok(request)
}

/// The limits a request must keep (names, values, key counts), as a reason to answer.
pub fn check_request(request: &Request) -> Result<(), String> {
    let bounded = |k: &String, max: usize| {
        if k.len() > max {
            Err(format!(
                "name-service request: name or key of {} bytes (at most {max})",
                k.len()
            ))
        } else {
            Ok(())
        }
    };
    let key = |k: &String| bounded(k, KEY_MAX);
    let count = |n: usize| {
        if n > KEYS_MAX {
            Err(format!(
                "name-service request: {n} keys in one request (at most {KEYS_MAX})"
            ))
        } else {
            Ok(())
        }
    };
    match request {
        Request::Publish { name, port } => {
            bounded(name, NAME_MAX)?;
            if port.len() > PORT_MAX {
                return Err(format!(
                    "name-service request: port of {} bytes (at most {PORT_MAX})",
                    port.len()
                ));
            }
        }
        Request::Unpublish { name } | Request::Lookup { name } => bounded(name, NAME_MAX)?,
        Request::Put { data, .. } => {
            count(data.len())?;
            for (k, v) in data {
                key(k)?;
                if weight(v) > VALUE_MAX {
                    return Err(format!(
                        "name-service request: value of {k:?} holds {} bytes (at most {VALUE_MAX})",
                        weight(v)
                    ));
                }
            }
        }
        Request::Get { keys, .. } | Request::Withdraw { keys, .. } => {
            count(keys.len())?;
            keys.iter().try_for_each(key)?;
        }
    }
    Ok(())
}

/// The body of the answer to a name-service request.
pub fn encode_response(response: &Response) -> Bytes {
    Bytes::from(postcard::to_stdvec(response).unwrap_or_default())
}

/// The answer node 0 sent; undecodable bytes become [`Response::Failed`].
pub fn decode_response(body: &[u8]) -> Response {
    postcard::from_bytes(body)
        .unwrap_or_else(|e| Response::Failed(format!("bad name-service answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(name: &str, port: &str) -> Request {
        Request::Publish {
            name: name.into(),
            port: port.into(),
        }
    }

    fn lookup(name: &str) -> Request {
        Request::Lookup { name: name.into() }
    }

    fn unpublish(name: &str) -> Request {
        Request::Unpublish { name: name.into() }
    }

    #[test]
    fn table_follows_mpi_semantics() {
        let mut t = Table::default();
        let cases = [
            (lookup("svc"), Response::Unknown),
            (publish("svc", "tag#0$port"), Response::Done),
            (lookup("svc"), Response::Port("tag#0$port".into())),
            (publish("svc", "other"), Response::AlreadyPublished),
            (lookup("svc"), Response::Port("tag#0$port".into())),
            (unpublish("nope"), Response::Unknown),
            (unpublish("svc"), Response::Done),
            (lookup("svc"), Response::Unknown),
            (unpublish("svc"), Response::Unknown),
            (publish("svc", "again"), Response::Done),
            (lookup("svc"), Response::Port("again".into())),
        ];
        for (i, (request, expect)) in cases.into_iter().enumerate() {
            assert_eq!(t.serve(request), expect, "step {i}");
        }
    }

    #[test]
    fn table_is_bounded() {
        let mut t = Table::default();
        for i in 0..NAMES_MAX {
            assert_eq!(t.serve(publish(&i.to_string(), "p")), Response::Done);
        }
        assert_eq!(t.serve(publish("one more", "p")), Response::Full);
        assert_eq!(t.serve(unpublish("0")), Response::Done);
        assert_eq!(t.serve(publish("one more", "p")), Response::Done);
    }

    #[test]
    fn requests_and_responses_round_trip() {
        for request in [publish("a b", "p;q=r"), lookup("x"), unpublish("")] {
            let body = encode_request(&request);
            assert_eq!(decode_request(&body), Ok(request));
        }
        for response in [
            Response::Done,
            Response::Port("p".into()),
            Response::AlreadyPublished,
            Response::Unknown,
            Response::Full,
            Response::Failed("node 0 gone".into()),
        ] {
            assert_eq!(decode_response(&encode_response(&response)), response);
        }
        assert!(matches!(decode_response(b"\xff\xff"), Response::Failed(_)));
    }

    #[test]
    fn refuses_bad_requests() {
        for garbage in [&b""[..], b"\x07cmd"] {
            assert!(
                decode_request(garbage)
                    .unwrap_err()
                    .starts_with("bad name-service request")
            );
        }
        let long = encode_request(&lookup(&"n".repeat(NAME_MAX + 1)));
        assert_eq!(
            decode_request(&long),
            Err("name-service request: name or key of 257 bytes (at most 256)".into())
        );
        let many = Request::Get {
            keys: vec!["k".into(); KEYS_MAX + 1],
            wait: None,
        };
        assert!(
            decode_request(&encode_request(&many))
                .unwrap_err()
                .contains("65 keys")
        );
        let big = Request::Put {
            owner: owner(0),
            data: vec![("k".into(), Datum::Bytes(vec![0; VALUE_MAX + 1]))],
            first_read: false,
        };
        assert!(
            decode_request(&encode_request(&big))
                .unwrap_err()
                .contains("value of \"k\"")
        );
        let long = encode_request(&publish("n", &"p".repeat(PORT_MAX + 1)));
        assert!(decode_request(&long).is_err());
    }

    fn owner(rank: u32) -> Owner {
        Owner {
            nspace: "job".into(),
            rank,
        }
    }

    fn put(rank: u32, data: &[(&str, &str)], first_read: bool) -> Request {
        Request::Put {
            owner: owner(rank),
            data: data
                .iter()
                .map(|(k, v)| (k.to_string(), Datum::Str(v.to_string())))
                .collect(),
            first_read,
        }
    }

    fn get(keys: &[&str], wait: Option<u64>) -> Request {
        Request::Get {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            wait: wait.map(Duration::from_secs),
        }
    }

    fn found(items: &[(&str, u32, &str)]) -> Response {
        Response::Found(
            items
                .iter()
                .map(|(k, r, v)| (k.to_string(), Some(owner(*r)), Datum::Str(v.to_string())))
                .collect(),
        )
    }

    #[test]
    fn pmix_publish_is_whole_and_owned() {
        let mut t = Table::default();
        let now = Instant::now();
        assert_eq!(
            t.serve_at(1, put(0, &[("a", "1"), ("b", "2")], false), now),
            vec![(1, Response::Done)]
        );
        assert_eq!(
            t.serve_at(2, put(1, &[("c", "3"), ("a", "x")], false), now),
            vec![(2, Response::Exists("a".into()))]
        );
        // Nothing of the refused publish stayed.
        assert_eq!(
            t.serve(get(&["c"], None)),
            Response::Missing(vec!["c".into()])
        );
        assert_eq!(
            t.serve(get(&["b", "a"], None)),
            found(&[("b", 0, "2"), ("a", 0, "1")])
        );
        // A PMI client sees PMIx strings as ports, and PMIx clients see PMI ports.
        assert_eq!(t.serve(lookup("a")), Response::Port("1".into()));
        assert_eq!(t.serve(publish("p", "port")), Response::Done);
        assert_eq!(
            t.serve(get(&["p"], None)),
            Response::Found(vec![("p".into(), None, Datum::Str("port".into()))])
        );
        // Only the owner unpublishes; a refused unpublish removes nothing.
        let withdraw = |rank, keys: &[&str]| Request::Withdraw {
            owner: owner(rank),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        };
        assert_eq!(
            t.serve(withdraw(1, &["a"])),
            Response::NotOwner {
                key: "a".into(),
                owner: Some(owner(0))
            }
        );
        assert_eq!(
            t.serve(withdraw(1, &["p"])),
            Response::NotOwner {
                key: "p".into(),
                owner: None
            }
        );
        assert_eq!(t.serve(unpublish("a")), Response::Unknown);
        assert_eq!(
            t.serve(withdraw(0, &["zz"])),
            Response::Missing(vec!["zz".into()])
        );
        // No keys: every key of the caller's.
        assert_eq!(t.serve(withdraw(0, &[])), Response::Done);
        assert_eq!(
            t.serve(get(&["a"], None)),
            Response::Missing(vec!["a".into()])
        );
        assert_eq!(t.serve(lookup("p")), Response::Port("port".into()));
        assert_eq!(t.serve(withdraw(0, &[])), Response::Missing(vec![]));
    }

    #[test]
    fn waiting_lookups_complete_on_publish_or_expire_naming_keys() {
        let mut t = Table::default();
        let t0 = Instant::now();
        assert_eq!(t.serve_at(1, get(&["x", "y"], Some(10)), t0), vec![]);
        assert_eq!(t.serve_at(2, get(&["y"], Some(100)), t0), vec![]);
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_secs(10)));
        // Half of lookup 1's keys: nobody is answered but lookup 2.
        assert_eq!(
            t.serve_at(3, put(4, &[("y", "Y")], false), t0),
            vec![(3, Response::Done), (2, found(&[("y", 4, "Y")]))]
        );
        assert_eq!(t.expire(t0 + Duration::from_secs(9)), vec![]);
        assert_eq!(
            t.expire(t0 + Duration::from_secs(10)),
            vec![(
                1,
                Response::NeverPublished {
                    keys: vec!["x".into()],
                    waited: Duration::from_secs(10)
                }
            )]
        );
        assert_eq!(t.next_deadline(), None);
        // A wait is capped.
        t.serve_at(5, get(&["z"], Some(100_000)), t0);
        assert_eq!(t.next_deadline(), Some(t0 + WAIT_MAX));
    }

    #[test]
    fn first_read_keys_go_to_one_reader() {
        let mut t = Table::default();
        let t0 = Instant::now();
        assert!(t.serve_at(1, get(&["k"], Some(5)), t0).is_empty());
        assert!(t.serve_at(2, get(&["k"], Some(5)), t0).is_empty());
        assert_eq!(
            t.serve_at(3, put(0, &[("k", "v")], true), t0),
            vec![(3, Response::Done), (1, found(&[("k", 0, "v")]))]
        );
        // Read, hence gone; the second reader still waits.
        assert_eq!(
            t.serve(get(&["k"], None)),
            Response::Missing(vec!["k".into()])
        );
        assert_eq!(
            t.serve_at(4, put(0, &[("k", "w")], true), t0),
            vec![(4, Response::Done), (2, found(&[("k", 0, "w")]))]
        );
        assert_eq!(t.bytes, 0);
    }

    #[test]
    fn table_bytes_and_waiters_are_bounded() {
        let mut t = Table::default();
        let t0 = Instant::now();
        let big = Datum::Bytes(vec![0; VALUE_MAX]);
        let mut i = 0;
        let full = loop {
            let r = t.serve(Request::Put {
                owner: owner(0),
                data: vec![(i.to_string(), big.clone())],
                first_read: false,
            });
            if r != Response::Done {
                break r;
            }
            i += 1;
        };
        assert_eq!(full, Response::Full);
        assert!(t.bytes <= TABLE_BYTES_MAX);
        for n in 0..WAITING_MAX as u64 {
            assert!(t.serve_at(n, get(&["never"], Some(1)), t0).is_empty());
        }
        assert_eq!(
            t.serve_at(9999, get(&["never"], Some(1)), t0),
            vec![(9999, Response::Full)]
        );
    }
}
