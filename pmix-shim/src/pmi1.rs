//! PMI-1 "simple" wire format: one `cmd=name key=value ...` line per message (research/pmix-pmi.md §3).
//!
//! Sans-I/O: [`parse`] turns one line (without its `\n`) into a [`Request`], [`Reply::encode`]
//! gives the line to send back. The session engine ([`crate::session`]) decides what to answer.

use std::fmt;

use crate::names;

/// Largest key/value/kvsname sizes we advertise in `cmd=maxes` (Slurm and hydra use the same).
pub const KVSNAME_MAX: usize = 256;
/// Longest key.
pub const KEYLEN_MAX: usize = 64;
/// Longest value.
pub const VALLEN_MAX: usize = 1024;
/// Longest line a client may send, including the newline: a `put` of the longest kvsname, key
/// and value `cmd=maxes` allows, with room for its words. Old MPICH clients stop at
/// `PMIU_MAXLINE` (1024) themselves, but MPICH 4.1 and later build lines of any length and
/// cut their PMI allgather into values of `vallen_max` bytes, so a put line reaches
/// 1024 + its words (PyPI MPICH 5.0.2, 5 ranks on a Slurm 26.05 root: `line of 1076 bytes`).
/// Past this a line means a broken or hostile client.
pub const MAX_LINE: usize = KVSNAME_MAX + KEYLEN_MAX + VALLEN_MAX + 64;

/// One parsed client line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `cmd=init pmi_version=V pmi_subversion=S`; V=2 switches the connection to PMI-2 framing.
    Init {
        /// Requested major version.
        version: u32,
        /// Requested minor version.
        subversion: u32,
    },
    /// `cmd=initack pmiid=N`: a `PMI_PORT` client introducing itself.
    InitAck {
        /// The `PMI_ID` the client was given (we use the rank).
        pmiid: u32,
    },
    /// `cmd=get_maxes`.
    GetMaxes,
    /// `cmd=get_appnum`.
    GetAppnum,
    /// `cmd=get_universe_size`.
    GetUniverseSize,
    /// `cmd=get_my_kvsname`.
    GetMyKvsname,
    /// `cmd=put kvsname=K key=k value=v`.
    Put {
        /// The kvs the client names.
        kvsname: String,
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// `cmd=get kvsname=K key=k`.
    Get {
        /// The kvs the client names.
        kvsname: String,
        /// The key.
        key: String,
    },
    /// `cmd=barrier_in`: a fence.
    BarrierIn,
    /// `cmd=finalize`.
    Finalize,
    /// `cmd=abort [exitcode=N] [message=TEXT]`.
    Abort {
        /// Exit code the client asks for.
        exitcode: i32,
        /// The client's reason (MPICH ≥ 4.2 sends `MPI_Abort`'s text, spaces and all).
        message: Option<String>,
    },
    /// `cmd=publish_name service=S port=P` (`MPI_Publish_name`).
    PublishName {
        /// The service name.
        service: String,
        /// The port.
        port: String,
    },
    /// `cmd=unpublish_name service=S`.
    UnpublishName {
        /// The service name.
        service: String,
    },
    /// `cmd=lookup_name service=S`.
    LookupName {
        /// The service name.
        service: String,
    },
    /// `mcmd=spawn`: the first line of a multi-line spawn request, read on by
    /// [`crate::spawn::Block`].
    SpawnStart,
    /// A well-formed line with a command we do not serve.
    Unsupported {
        /// The command name.
        cmd: String,
    },
}

/// Why a line could not be parsed. Expected on a hostile or broken client, so a plain value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Longer than [`MAX_LINE`].
    TooLong(usize),
    /// Not UTF-8.
    NotText,
    /// A token without `=`.
    NoEquals(String),
    /// The first token is not `cmd=` (or `mcmd=`).
    NoCmd,
    /// A required field is absent.
    Missing {
        /// The command.
        cmd: String,
        /// The missing field.
        field: &'static str,
    },
    /// A numeric field is not a number.
    BadNumber {
        /// The field.
        field: &'static str,
        /// Its text.
        text: String,
    },
    /// A key or value longer than advertised in `maxes`.
    FieldTooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::TooLong(n) => write!(f, "line of {n}+ bytes exceeds {MAX_LINE}"),
            ParseError::NotText => f.write_str("line is not UTF-8 text"),
            ParseError::NoEquals(t) => write!(f, "token {t:?} has no '='"),
            ParseError::NoCmd => f.write_str("line does not start with cmd="),
            ParseError::Missing { cmd, field } => write!(f, "cmd {cmd:?} lacks {field}="),
            ParseError::BadNumber { field, text } => write!(f, "{field}={text:?} is not a number"),
            ParseError::FieldTooLong { field, len } => {
                write!(f, "{field} of {len} bytes is too long")
            }
        }
    }
}

/// Parses one line (the trailing `\n`, and a `\r` before it, already removed or not).
pub fn parse(line: &[u8]) -> Result<Request, ParseError> {
    if line.len() > MAX_LINE {
        return Err(ParseError::TooLong(line.len()));
    }
    let line = std::str::from_utf8(line).map_err(|_| ParseError::NotText)?;
    let line = line.trim_end_matches(['\n', '\r']);
    // `message=` is the last field of an abort and runs to the end of the line: it is free
    // text ("application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1").
    let (line, message) = match line.find(" message=") {
        Some(at) if line.starts_with("cmd=abort ") => {
            (&line[..at], Some(&line[at + " message=".len()..]))
        }
        _ => (line, None),
    };
    let mut fields: Vec<(&str, &str)> = Vec::new();
    for token in line.split(' ').filter(|t| !t.is_empty()) {
        let kv = token
            .split_once('=')
            .ok_or_else(|| ParseError::NoEquals(token.into()))?;
        fields.push(kv);
    }
    let cmd = match fields.first() {
        Some(("cmd", cmd)) => *cmd,
        Some(("mcmd", "spawn")) if fields.len() == 1 => return Ok(Request::SpawnStart),
        Some(("mcmd", cmd)) => {
            return Ok(Request::Unsupported {
                cmd: format!("mcmd={cmd}"),
            });
        }
        _ => return Err(ParseError::NoCmd),
    };
    Fields {
        cmd,
        fields: &fields[1..],
    }
    .request(message)
}

/// The `key=value` fields after `cmd=`, read with the command's name for errors.
struct Fields<'a> {
    cmd: &'a str,
    fields: &'a [(&'a str, &'a str)],
}

impl Fields<'_> {
    /// The request the command names, its fields checked in the order the errors report them.
    fn request(&self, message: Option<&str>) -> Result<Request, ParseError> {
        Ok(match self.cmd {
            "init" => Request::Init {
                version: self.u32_of("pmi_version")?,
                subversion: self.u32_of("pmi_subversion")?,
            },
            "initack" => Request::InitAck {
                pmiid: self.u32_of("pmiid")?,
            },
            "get_maxes" => Request::GetMaxes,
            "get_appnum" => Request::GetAppnum,
            "get_universe_size" => Request::GetUniverseSize,
            "get_my_kvsname" => Request::GetMyKvsname,
            "put" => Request::Put {
                kvsname: self.bounded("kvsname", KVSNAME_MAX)?,
                key: self.bounded("key", KEYLEN_MAX)?,
                value: self.bounded("value", VALLEN_MAX)?,
            },
            "get" => Request::Get {
                kvsname: self.bounded("kvsname", KVSNAME_MAX)?,
                key: self.bounded("key", KEYLEN_MAX)?,
            },
            "barrier_in" => Request::BarrierIn,
            "finalize" => Request::Finalize,
            "publish_name" => Request::PublishName {
                service: self.bounded("service", names::NAME_MAX)?,
                port: self.bounded("port", names::PORT_MAX)?,
            },
            "unpublish_name" => Request::UnpublishName {
                service: self.bounded("service", names::NAME_MAX)?,
            },
            "lookup_name" => Request::LookupName {
                service: self.bounded("service", names::NAME_MAX)?,
            },
            "abort" => Request::Abort {
                exitcode: match self.get("exitcode") {
                    Ok(_) => {
                        let n = self.num("exitcode")?;
                        i32::try_from(n).map_err(|_| ParseError::BadNumber {
                            field: "exitcode",
                            text: n.to_string(),
                        })?
                    }
                    Err(_) => 1,
                },
                message: message.map(|m| m.chars().take(VALLEN_MAX).collect()),
            },
            other => Request::Unsupported { cmd: other.into() },
        })
    }

    fn get(&self, field: &'static str) -> Result<&str, ParseError> {
        self.fields
            .iter()
            .find(|(k, _)| *k == field)
            .map(|(_, v)| *v)
            .ok_or_else(|| ParseError::Missing {
                cmd: self.cmd.into(),
                field,
            })
    }

    fn num(&self, field: &'static str) -> Result<i64, ParseError> {
        let text = self.get(field)?;
        text.parse().map_err(|_| ParseError::BadNumber {
            field,
            text: text.into(),
        })
    }

    fn bounded(&self, field: &'static str, max: usize) -> Result<String, ParseError> {
        let v = self.get(field)?;
        if v.len() > max {
            return Err(ParseError::FieldTooLong {
                field,
                len: v.len(),
            });
        }
        Ok(v.to_owned())
    }

    fn u32_of(&self, field: &'static str) -> Result<u32, ParseError> {
        let n = self.num(field)?;
        u32::try_from(n).map_err(|_| ParseError::BadNumber {
            field,
            text: n.to_string(),
        })
    }
}

/// One line the server sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Answer to `init`.
    ResponseToInit {
        /// Version granted.
        version: u32,
        /// Subversion granted.
        subversion: u32,
        /// 0, or -1 when the version is not served.
        rc: i32,
    },
    /// Answer to `initack`.
    InitAck,
    /// `cmd=set key=value` after `initack` (size, rank, debug).
    Set {
        /// size, rank or debug.
        key: &'static str,
        /// Its value.
        value: i64,
    },
    /// Answer to `get_maxes`.
    Maxes,
    /// Answer to `get_appnum`.
    Appnum(i32),
    /// Answer to `get_universe_size`.
    UniverseSize(u32),
    /// Answer to `get_my_kvsname`.
    MyKvsname(String),
    /// Answer to `put`: `None` = success, else the error message (no spaces).
    PutResult(Option<&'static str>),
    /// Answer to `get`: the value, or `None` when the key is unknown.
    GetResult(Option<String>),
    /// Answer to `barrier_in` once the fence completed.
    BarrierOut,
    /// Answer to `finalize`.
    FinalizeAck,
    /// Answer to `publish_name`: `None` = success, else why not (spaces become `_`).
    PublishResult(Option<String>),
    /// Answer to `unpublish_name`: `None` = success, else why not.
    UnpublishResult(Option<String>),
    /// Answer to `lookup_name`: the port, or why there is none. MPICH reads `rc` first, so
    /// `rc=-1` makes `MPI_Lookup_name` fail with `MPI_ERR_NAME` (never a wait).
    LookupResult(Result<String, String>),
    /// Answer to a whole spawn request whose children run: `rc=0`, with one error code (0)
    /// per process when given (MPICH checks their count and takes none as all 0).
    Spawned(Option<String>),
    /// Answer to a whole spawn request that is refused: `rc=-1` and why, which MPICH's
    /// `PMI_Spawn_multiple` turns into an error of `MPI_Comm_spawn`.
    SpawnRefused(String),
    /// Answer to a command we do not serve: `cmd=<cmd>_result rc=-1 msg=...`.
    Unsupported(String),
}

/// A reason as one PMI-1 token: the line format splits on spaces and MPICH reads up to one.
fn token(reason: &str) -> String {
    reason
        .chars()
        .take(200)
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect()
}

/// `cmd=<cmd> rc=0 msg=success`, or `rc=-1 msg=<why>`.
fn outcome(cmd: &str, failure: Option<&String>) -> String {
    match failure {
        None => format!("cmd={cmd} rc=0 msg=success\n"),
        Some(why) => format!("cmd={cmd} rc=-1 msg={}\n", token(why)),
    }
}

impl Reply {
    /// The line to send, with its `\n`.
    pub fn encode(&self) -> String {
        match self {
            Reply::ResponseToInit {
                version,
                subversion,
                rc,
            } => format!(
                "cmd=response_to_init pmi_version={version} pmi_subversion={subversion} rc={rc}\n"
            ),
            Reply::InitAck => "cmd=initack rc=0\n".into(),
            Reply::Set { key, value } => format!("cmd=set {key}={value}\n"),
            Reply::Maxes => format!(
                "cmd=maxes rc=0 kvsname_max={KVSNAME_MAX} keylen_max={KEYLEN_MAX} vallen_max={VALLEN_MAX}\n"
            ),
            Reply::Appnum(n) => format!("cmd=appnum rc=0 appnum={n}\n"),
            Reply::UniverseSize(n) => format!("cmd=universe_size rc=0 size={n}\n"),
            Reply::MyKvsname(k) => format!("cmd=my_kvsname rc=0 kvsname={k}\n"),
            Reply::PutResult(None) => "cmd=put_result rc=0 msg=success\n".into(),
            Reply::PutResult(Some(msg)) => format!("cmd=put_result rc=-1 msg={msg}\n"),
            Reply::GetResult(Some(v)) => format!("cmd=get_result rc=0 msg=success value={v}\n"),
            Reply::GetResult(None) => "cmd=get_result rc=-1 msg=key_not_found\n".into(),
            Reply::BarrierOut => "cmd=barrier_out rc=0\n".into(),
            Reply::FinalizeAck => "cmd=finalize_ack rc=0\n".into(),
            Reply::PublishResult(failure) => outcome("publish_result", failure.as_ref()),
            Reply::UnpublishResult(failure) => outcome("unpublish_result", failure.as_ref()),
            // A port published over PMI-2 may hold spaces or newlines, which would split or end
            // this line: such a port cannot be told to a PMI-1 client.
            Reply::LookupResult(Ok(port))
                if port.chars().any(|c| c.is_whitespace() || c.is_control()) =>
            {
                outcome(
                    "lookup_result",
                    Some(&"port not expressible in PMI-1".into()),
                )
            }
            Reply::LookupResult(Ok(port)) => {
                format!("cmd=lookup_result rc=0 msg=success port={port}\n")
            }
            Reply::LookupResult(Err(why)) => outcome("lookup_result", Some(why)),
            Reply::Spawned(None) => "cmd=spawn_result rc=0\n".into(),
            Reply::Spawned(Some(codes)) => format!("cmd=spawn_result rc=0 errcodes={codes}\n"),
            Reply::SpawnRefused(why) => outcome("spawn_result", Some(why)),
            Reply::Unsupported(cmd) => {
                let name: String = cmd
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .take(64)
                    .collect();
                format!("cmd={name}_result rc=-1 msg=unsupported_command\n")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expect: &str) {
        let got = match parse(line.as_bytes()) {
            Ok(r) => format!("{r:?}"),
            Err(e) => format!("error: {e}"),
        };
        assert_eq!(got, expect, "line {line:?}");
    }

    #[test]
    fn parses_mpich_4_0_lines() {
        check(
            "cmd=init pmi_version=1 pmi_subversion=1\n",
            "Init { version: 1, subversion: 1 }",
        );
        check(
            "cmd=init pmi_version=2 pmi_subversion=0",
            "Init { version: 2, subversion: 0 }",
        );
        check("cmd=get_maxes", "GetMaxes");
        check("cmd=get_appnum\n", "GetAppnum");
        check("cmd=get_universe_size", "GetUniverseSize");
        check("cmd=get_my_kvsname", "GetMyKvsname");
        check(
            "cmd=put kvsname=j1 key=-allgather-shm-1-0 value=0a1b\n",
            r#"Put { kvsname: "j1", key: "-allgather-shm-1-0", value: "0a1b" }"#,
        );
        check(
            "cmd=put kvsname=j1 key=k value=",
            r#"Put { kvsname: "j1", key: "k", value: "" }"#,
        );
        check(
            "cmd=get kvsname=j1 key=PMI_process_mapping",
            r#"Get { kvsname: "j1", key: "PMI_process_mapping" }"#,
        );
        check("cmd=barrier_in", "BarrierIn");
        check("cmd=finalize", "Finalize");
        check(
            "cmd=abort exitcode=7",
            "Abort { exitcode: 7, message: None }",
        );
        check("cmd=abort", "Abort { exitcode: 1, message: None }");
        check(
            "cmd=abort exitcode=7 message=application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1",
            r#"Abort { exitcode: 7, message: Some("application called MPI_Abort(MPI_COMM_WORLD, 7) - process 1") }"#,
        );
        check("cmd=initack pmiid=3", "InitAck { pmiid: 3 }");
        check(
            "cmd=publish_name service=svc port=tag#0$connentry#0200A8C0$",
            r#"PublishName { service: "svc", port: "tag#0$connentry#0200A8C0$" }"#,
        );
        check(
            "cmd=unpublish_name service=svc\n",
            r#"UnpublishName { service: "svc" }"#,
        );
        check(
            "cmd=lookup_name service=svc",
            r#"LookupName { service: "svc" }"#,
        );
        check("mcmd=spawn\n", "SpawnStart");
        check(
            "mcmd=spawn nprocs=1",
            r#"Unsupported { cmd: "mcmd=spawn" }"#,
        );
        check("mcmd=other", r#"Unsupported { cmd: "mcmd=other" }"#);
        check("cmd=spawn", r#"Unsupported { cmd: "spawn" }"#);
    }

    #[test]
    fn refuses_bad_lines() {
        check("", "error: line does not start with cmd=");
        check("hello", r#"error: token "hello" has no '='"#);
        check("key=v cmd=get", "error: line does not start with cmd=");
        check(
            "cmd=put kvsname=j1 key=k",
            r#"error: cmd "put" lacks value="#,
        );
        check(
            "cmd=init pmi_version=x pmi_subversion=1",
            r#"error: pmi_version="x" is not a number"#,
        );
        check(
            "cmd=init pmi_version=-1 pmi_subversion=1",
            r#"error: pmi_version="-1" is not a number"#,
        );
        check(
            "cmd=abort exitcode=99999999999",
            r#"error: exitcode="99999999999" is not a number"#,
        );
        check(
            "cmd=publish_name service=svc",
            r#"error: cmd "publish_name" lacks port="#,
        );
        check(
            "cmd=lookup_name",
            r#"error: cmd "lookup_name" lacks service="#,
        );
        let long_name = format!("cmd=lookup_name service={}", "s".repeat(257));
        check(&long_name, "error: service of 257 bytes is too long");
        let long_key = format!("cmd=put kvsname=j key={} value=v", "k".repeat(65));
        check(&long_key, "error: key of 65 bytes is too long");
        let long_line = format!("cmd=put kvsname=j key=k value={}", "v".repeat(1400));
        check(&long_line, "error: line of 1430+ bytes exceeds 1408");
        // The longest put cmd=maxes allows is a line, whatever PMIU_MAXLINE old clients had.
        let longest = format!(
            "cmd=put kvsname={} key={} value={}",
            "j".repeat(KVSNAME_MAX),
            "k".repeat(KEYLEN_MAX),
            "v".repeat(VALLEN_MAX)
        );
        assert!(matches!(parse(longest.as_bytes()), Ok(Request::Put { .. })));
        assert_eq!(parse(&[0xff, 0xfe]), Err(ParseError::NotText));
    }

    #[test]
    fn encodes_replies() {
        let cases = [
            (
                Reply::ResponseToInit {
                    version: 1,
                    subversion: 1,
                    rc: 0,
                },
                "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
            ),
            (
                Reply::Maxes,
                "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n",
            ),
            (
                Reply::GetResult(Some("(vector,(0,2,4))".into())),
                "cmd=get_result rc=0 msg=success value=(vector,(0,2,4))\n",
            ),
            (
                Reply::GetResult(None),
                "cmd=get_result rc=-1 msg=key_not_found\n",
            ),
            (
                Reply::Unsupported("publish_name".into()),
                "cmd=publish_name_result rc=-1 msg=unsupported_command\n",
            ),
            (
                Reply::Unsupported("mcmd=spawn x".into()),
                "cmd=mcmdspawnx_result rc=-1 msg=unsupported_command\n",
            ),
            (
                Reply::SpawnRefused("spawn is not served yet".into()),
                "cmd=spawn_result rc=-1 msg=spawn_is_not_served_yet\n",
            ),
            (
                Reply::Spawned(Some("0,0".into())),
                "cmd=spawn_result rc=0 errcodes=0,0\n",
            ),
            (Reply::Spawned(None), "cmd=spawn_result rc=0\n"),
            (
                Reply::Set {
                    key: "size",
                    value: 16,
                },
                "cmd=set size=16\n",
            ),
            (
                Reply::PublishResult(None),
                "cmd=publish_result rc=0 msg=success\n",
            ),
            (
                Reply::PublishResult(Some("name already published".into())),
                "cmd=publish_result rc=-1 msg=name_already_published\n",
            ),
            (
                Reply::UnpublishResult(Some("name not published".into())),
                "cmd=unpublish_result rc=-1 msg=name_not_published\n",
            ),
            (
                Reply::LookupResult(Ok("tag#0$p$".into())),
                "cmd=lookup_result rc=0 msg=success port=tag#0$p$\n",
            ),
            (
                Reply::LookupResult(Ok("a\ncmd=barrier_out".into())),
                "cmd=lookup_result rc=-1 msg=port_not_expressible_in_PMI-1\n",
            ),
            (
                Reply::LookupResult(Err("name not published".into())),
                "cmd=lookup_result rc=-1 msg=name_not_published\n",
            ),
        ];
        for (reply, expect) in cases {
            assert_eq!(reply.encode(), expect);
        }
    }
}
