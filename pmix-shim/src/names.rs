//! The job's name service (`MPI_Publish_name`, `MPI_Lookup_name`, `MPI_Unpublish_name`): one table on node 0, reached by overlay requests.
//!
//! Sans-I/O: [`Table::serve`] answers one [`Request`]; [`encode_request`] and friends are the
//! bytes of the overlay requests that carry them. Every node's PMI server sends its ranks'
//! requests to [`NAMES_NODE`], its own ranks' included, so the table's rules live only in
//! [`Table::serve`]. MPI's semantics: a lookup of an unknown name fails at once (it does not wait
//! for a publish), a name is published once until unpublished.

use std::collections::HashMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The node that holds the job's name table.
pub const NAMES_NODE: usize = 0;
/// Longest service name (MPICH's `MPI_MAX_OBJECT_NAME` is 128; room to spare).
pub const NAME_MAX: usize = 256;
/// Longest port (MPICH's `MPI_MAX_PORT_NAME` is 256; the PMI value limit bounds it anyway).
pub const PORT_MAX: usize = 1024;
/// Most names one job may have published at once, so that ranks cannot grow node 0 without bound.
pub const NAMES_MAX: usize = 4096;

/// What a rank asks the name service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Publish `port` under `name`.
    Publish {
        /// The service name.
        name: String,
        /// The port (an MPI port name).
        port: String,
    },
    /// Withdraw `name`.
    Unpublish {
        /// The service name.
        name: String,
    },
    /// The port published under `name`.
    Lookup {
        /// The service name.
        name: String,
    },
}

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
    /// The table holds [`NAMES_MAX`] names.
    Full,
    /// The service could not be asked or answered nonsense (the reason).
    Failed(String),
}

impl Response {
    /// Why the request failed, in words; `None` on success.
    pub fn reason(&self) -> Option<String> {
        match self {
            Response::Done | Response::Port(_) => None,
            Response::AlreadyPublished => Some("name already published".into()),
            Response::Unknown => Some("name not published".into()),
            Response::Full => Some(format!("name table full ({NAMES_MAX} names)")),
            Response::Failed(reason) => Some(reason.clone()),
        }
    }
}

/// The job's published names.
#[derive(Debug, Default)]
pub struct Table {
    ports: HashMap<String, String>,
}

impl Table {
    /// Carries out one request.
    pub fn serve(&mut self, request: Request) -> Response {
        match request {
            Request::Publish { name, port } => {
                if self.ports.contains_key(&name) {
                    Response::AlreadyPublished
                } else if self.ports.len() >= NAMES_MAX {
                    Response::Full
                } else {
                    self.ports.insert(name, port);
                    Response::Done
                }
            }
            Request::Unpublish { name } => match self.ports.remove(&name) {
                Some(_) => Response::Done,
                None => Response::Unknown,
            },
            Request::Lookup { name } => match self.ports.get(&name) {
                Some(port) => Response::Port(port.clone()),
                None => Response::Unknown,
            },
        }
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
    let (name, port) = match &request {
        Request::Publish { name, port } => (name, Some(port)),
        Request::Unpublish { name } | Request::Lookup { name } => (name, None),
    };
    if name.len() > NAME_MAX || port.is_some_and(|p| p.len() > PORT_MAX) {
        return Err("name-service request: name or port too long".into());
    }
    Ok(request)
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
            Err("name-service request: name or port too long".into())
        );
        let long = encode_request(&publish("n", &"p".repeat(PORT_MAX + 1)));
        assert!(decode_request(&long).is_err());
    }
}
