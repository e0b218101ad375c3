//! A spawn request (`MPI_Comm_spawn`, `MPI_Comm_spawn_multiple`) as PMI clients send it, typed.
//!
//! PMI-1 sends one multi-line block per command (`mcmd=spawn`, one `key=value` per line,
//! `endcmd`), the blocks of one request back to back and one reply after the last
//! ([`Block`]); PMI-2 sends one frame with the commands' fields in order ([`from_pmi2`]).
//! Both give the same [`Request`]. Sans-I/O; the session hands it to the server, which asks
//! the embedder to start it ([`crate::child`]).

use std::fmt;

use crate::pmi2;

/// Most commands in one request (`MPI_Comm_spawn_multiple`'s count).
pub const MAX_COMMANDS: usize = 256;
/// Most arguments, info entries or preput entries one command or request may carry.
pub const MAX_ITEMS: usize = 1024;
/// Most lines of one PMI-1 request, all its blocks together.
pub const MAX_LINES: usize = 8192;
/// Most bytes of one PMI-1 request, all its blocks together.
pub const MAX_BYTES: usize = 256 * 1024;
/// Most processes a reply gives an error code for (Slurm's PMI-2 client reads `errcodes`
/// into a 1 KiB buffer, "-1," per process; MPICH's PMI-1 line is at most 1 KiB).
pub const ERRCODES_MAX: u64 = 256;

/// What the ranks of a job ask to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The commands, in the order the client gave them.
    pub commands: Vec<Command>,
    /// Keys the children must find in their job's KVS (MPICH: `PARENT_ROOT_PORT_NAME`).
    pub preput: Vec<(String, String)>,
}

impl Request {
    /// How many processes the request asks for in all.
    pub fn total_procs(&self) -> u64 {
        self.commands.iter().map(|c| u64::from(c.maxprocs)).sum()
    }
}

/// One program of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The program, as the client named it.
    pub program: String,
    /// How many copies.
    pub maxprocs: u32,
    /// Its arguments (without the program).
    pub args: Vec<String>,
    /// The `MPI_Info` entries the client passed on (`host`, `wdir`, `path`, …).
    pub info: Vec<(String, String)>,
}

/// Why a spawn request is malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// A line of a PMI-1 block without `=`.
    NoEquals(String),
    /// A required field is absent.
    Missing(String),
    /// A number field is not a number.
    BadNumber {
        /// The field.
        field: String,
        /// Its text.
        text: String,
    },
    /// A count past this module's limits.
    TooMany {
        /// The count's field.
        field: String,
        /// Its value.
        n: u32,
        /// The limit.
        max: usize,
    },
    /// A PMI-1 request longer than [`MAX_LINES`] or [`MAX_BYTES`].
    TooLong,
    /// A PMI-1 block's first line is not `mcmd=spawn`.
    NotSpawn(String),
    /// A PMI-2 request's `ncmds` differs from the number of `subcmd`s it holds.
    CommandCount {
        /// `ncmds`.
        said: usize,
        /// `subcmd`s.
        given: usize,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::NoEquals(t) => write!(f, "spawn line {t:?} has no '='"),
            ParseError::Missing(field) => write!(f, "spawn request lacks {field}="),
            ParseError::BadNumber { field, text } => {
                write!(f, "spawn {field}={text:?} is not a number")
            }
            ParseError::TooMany { field, n, max } => {
                write!(f, "spawn {field}={n} is over the limit of {max}")
            }
            ParseError::TooLong => write!(
                f,
                "spawn request longer than {MAX_LINES} lines or {MAX_BYTES} bytes"
            ),
            ParseError::NotSpawn(t) => write!(f, "spawn block starts with {t:?}, not mcmd=spawn"),
            ParseError::CommandCount { said, given } => {
                write!(f, "spawn request says ncmds={said} but has {given} subcmd")
            }
        }
    }
}

/// Ordered `key=value` fields of one command, looked up by name.
struct Fields<'a>(&'a [(String, String)]);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn require(&self, key: &str) -> Result<String, ParseError> {
        self.get(key)
            .map(str::to_owned)
            .ok_or_else(|| ParseError::Missing(key.into()))
    }

    /// A count or size: absent is `default`, else a non-negative number within `max`.
    fn count(&self, key: &str, default: Option<u32>, max: usize) -> Result<u32, ParseError> {
        let n = match (self.get(key), default) {
            (None, Some(d)) => d,
            (None, None) => return Err(ParseError::Missing(key.into())),
            (Some(text), _) => text.parse().map_err(|_| ParseError::BadNumber {
                field: key.into(),
                text: text.chars().take(32).collect(),
            })?,
        };
        if n as usize > max {
            return Err(ParseError::TooMany {
                field: key.into(),
                n,
                max,
            });
        }
        Ok(n)
    }

    /// `n` numbered entries `key{first}`, `key{first+1}`, ….
    fn list(&self, key: &str, first: u32, n: u32) -> Result<Vec<String>, ParseError> {
        (first..first + n)
            .map(|i| self.require(&format!("{key}{i}")))
            .collect()
    }

    /// `n` numbered pairs `keys{i}`/`vals{i}` from 0.
    fn pairs(&self, keys: &str, vals: &str, n: u32) -> Result<Vec<(String, String)>, ParseError> {
        let keys = self.list(keys, 0, n)?;
        Ok(keys.into_iter().zip(self.list(vals, 0, n)?).collect())
    }
}

/// The PMI-1 request being read: the blocks so far and the one being read.
#[derive(Debug, Default)]
pub struct Block {
    done: Vec<Vec<(String, String)>>,
    current: Option<Vec<(String, String)>>,
    lines: usize,
    bytes: usize,
}

impl Block {
    /// A request whose first line (`mcmd=spawn`) was just read.
    pub fn start() -> Self {
        Block {
            current: Some(Vec::new()),
            lines: 1,
            bytes: "mcmd=spawn\n".len(),
            ..Block::default()
        }
    }

    /// Feeds the next line (its `\n` removed or not): the request once its last block ended.
    pub fn line(&mut self, line: &str) -> Result<Option<Request>, ParseError> {
        self.lines += 1;
        self.bytes += line.len();
        if self.lines > MAX_LINES || self.bytes > MAX_BYTES {
            return Err(ParseError::TooLong);
        }
        let line = line.trim_end_matches(['\n', '\r']);
        let Some(current) = self.current.as_mut() else {
            // Between blocks: only the next block's first line may come.
            if line != "mcmd=spawn" {
                return Err(ParseError::NotSpawn(line.chars().take(80).collect()));
            }
            self.current = Some(Vec::new());
            return Ok(None);
        };
        if line != "endcmd" {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| ParseError::NoEquals(line.chars().take(80).collect()))?;
            current.push((k.to_owned(), v.to_owned()));
            return Ok(None);
        }
        let block = self.current.take().unwrap_or_default();
        self.done.push(block);
        let first = Fields(&self.done[0]);
        let total = first.count("totspawns", Some(1), MAX_COMMANDS)?.max(1) as usize;
        if self.done.len() < total {
            return Ok(None);
        }
        let preput_n = first.count("preput_num", Some(0), MAX_ITEMS)?;
        let preput = first.pairs("preput_key_", "preput_val_", preput_n)?;
        let commands = self
            .done
            .iter()
            .map(|b| pmi1_command(&Fields(b)))
            .collect::<Result<_, _>>()?;
        Ok(Some(Request { commands, preput }))
    }
}

/// One PMI-1 block's command (`execname`, `nprocs`, `argcnt`/`argN` from 1, `info_num`).
fn pmi1_command(f: &Fields) -> Result<Command, ParseError> {
    let argc = f.count("argcnt", Some(0), MAX_ITEMS)?;
    // MPICH's spec says `infonum`, its code and hydra say `info_num`.
    let info_n = match f.get("info_num") {
        Some(_) => f.count("info_num", None, MAX_ITEMS)?,
        None => f.count("infonum", Some(0), MAX_ITEMS)?,
    };
    Ok(Command {
        program: f.require("execname")?,
        maxprocs: f.count("nprocs", None, u32::MAX as usize)?,
        args: f.list("arg", 1, argc)?,
        info: f.pairs("info_key_", "info_val_", info_n)?,
    })
}

/// A PMI-2 `spawn` command: `ncmds`, `preputcount`, `ppkeyN`/`ppvalN`, then per command
/// `subcmd`, `maxprocs`, `argc`, `argvN` (from 0), `infokeycount`, `infokeyN`/`infovalN`.
pub fn from_pmi2(c: &pmi2::Command) -> Result<Request, ParseError> {
    // The fields up to the first `subcmd` are the request's, each `subcmd` starts a command.
    let mut parts: Vec<&[(String, String)]> = Vec::new();
    let mut start = 0;
    for (i, (k, _)) in c.fields.iter().enumerate() {
        if k == "subcmd" {
            parts.push(&c.fields[start..i]);
            start = i;
        }
    }
    parts.push(&c.fields[start..]);
    let head = Fields(parts[0]);
    let ncmds = head.count("ncmds", None, MAX_COMMANDS)? as usize;
    if parts.len() - 1 != ncmds {
        return Err(ParseError::CommandCount {
            said: ncmds,
            given: parts.len() - 1,
        });
    }
    let preput_n = head.count("preputcount", Some(0), MAX_ITEMS)?;
    let preput = head.pairs("ppkey", "ppval", preput_n)?;
    let commands = parts[1..]
        .iter()
        .map(|p| {
            let f = Fields(p);
            let argc = f.count("argc", Some(0), MAX_ITEMS)?;
            let info_n = f.count("infokeycount", Some(0), MAX_ITEMS)?;
            Ok(Command {
                program: f.require("subcmd")?,
                maxprocs: f.count("maxprocs", None, u32::MAX as usize)?,
                args: f.list("argv", 0, argc)?,
                info: f.pairs("infokey", "infoval", info_n)?,
            })
        })
        .collect::<Result<_, ParseError>>()?;
    Ok(Request { commands, preput })
}

/// `code,code,…`: one error code for each of `procs` processes (`0` when they started, `-1`
/// when refused), or `None` past [`ERRCODES_MAX`] or for none (then the reply carries `rc`
/// only; MPICH's PMI-1 client then takes every code for 0).
pub fn codes(procs: u64, code: i32) -> Option<String> {
    (1..=ERRCODES_MAX)
        .contains(&procs)
        .then(|| vec![code.to_string(); procs as usize].join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(lines: &[&str]) -> Result<Option<Request>, ParseError> {
        let mut b = Block::start();
        let mut last = Ok(None);
        for l in lines {
            last = b.line(l);
            if !matches!(last, Ok(None)) {
                break;
            }
        }
        last
    }

    /// What MPICH 5's `PMI_Spawn_multiple` sends for `MPI_Comm_spawn_multiple` of two commands
    /// (pmodels/mpich src/pmi/src/pmi_wire.c `PMIU_msg_set_query_spawn`).
    const MPICH5_TWO: &[&str] = &[
        "nprocs=2",
        "execname=./a.out",
        "totspawns=2",
        "spawnssofar=1",
        "argcnt=2",
        "arg1=-x",
        "arg2=two words",
        "preput_num=1",
        "preput_key_0=PARENT_ROOT_PORT_NAME",
        "preput_val_0=tag#0$connentry#0200A8C0$",
        "info_num=1",
        "info_key_0=wdir",
        "info_val_0=/tmp",
        "endcmd",
        "mcmd=spawn",
        "nprocs=1",
        "execname=b",
        "totspawns=2",
        "spawnssofar=2",
        "argcnt=0",
        "info_num=0",
        "endcmd\n",
    ];

    #[test]
    fn reads_mpich_pmi1_blocks() {
        let r = block(MPICH5_TWO).unwrap().unwrap();
        assert_eq!(r.total_procs(), 3);
        assert_eq!(
            r.preput,
            [(
                "PARENT_ROOT_PORT_NAME".into(),
                "tag#0$connentry#0200A8C0$".into()
            )]
        );
        assert_eq!(
            r.commands[0],
            Command {
                program: "./a.out".into(),
                maxprocs: 2,
                args: vec!["-x".into(), "two words".into()],
                info: vec![("wdir".into(), "/tmp".into())],
            }
        );
        assert_eq!(r.commands[1].program, "b");
        assert_eq!(codes(r.total_procs(), -1).as_deref(), Some("-1,-1,-1"));
        // The first block alone is not the request yet.
        assert_eq!(block(&MPICH5_TWO[..14]), Ok(None));
    }

    #[test]
    fn refuses_bad_pmi1_blocks() {
        let err = |lines: &[&str]| block(lines).unwrap_err().to_string();
        assert_eq!(
            err(&["nprocs=1", "endcmd"]),
            "spawn request lacks execname="
        );
        assert_eq!(
            err(&["execname=a", "nprocs=x", "endcmd"]),
            r#"spawn nprocs="x" is not a number"#
        );
        assert_eq!(err(&["nprocs"]), r#"spawn line "nprocs" has no '='"#);
        assert_eq!(
            err(&["execname=a", "nprocs=1", "argcnt=1", "endcmd"]),
            "spawn request lacks arg1="
        );
        assert_eq!(
            err(&["totspawns=2", "execname=a", "nprocs=1", "endcmd", "cmd=get"]),
            r#"spawn block starts with "cmd=get", not mcmd=spawn"#
        );
        assert_eq!(
            err(&["totspawns=100000", "endcmd"]),
            "spawn totspawns=100000 is over the limit of 256"
        );
        // A block that never ends is cut off at the limits.
        let mut b = Block::start();
        let line = format!("k={}", "v".repeat(1000));
        let cut = (0..MAX_LINES).find_map(|_| b.line(&line).err());
        assert_eq!(cut, Some(ParseError::TooLong));
    }

    #[test]
    fn reads_pmi2_spawn() {
        let body = "cmd=spawn;ncmds=2;preputcount=1;ppkey0=PARENT_ROOT_PORT_NAME;ppval0=p;\
                    subcmd=./a;maxprocs=2;argc=1;argv0=-v;infokeycount=0;\
                    subcmd=./b;maxprocs=1;argc=0;infokeycount=1;infokey0=host;infoval0=n1;";
        let c = pmi2::parse_body(body.as_bytes()).unwrap();
        let r = from_pmi2(&c).unwrap();
        assert_eq!(r.preput, [("PARENT_ROOT_PORT_NAME".into(), "p".into())]);
        assert_eq!(r.commands[0].args, ["-v"]);
        assert_eq!(r.commands[1].info, [("host".into(), "n1".into())]);
        assert_eq!(r.total_procs(), 3);
        let c = pmi2::parse_body(b"cmd=spawn;ncmds=2;subcmd=a;maxprocs=1;").unwrap();
        assert_eq!(
            from_pmi2(&c).unwrap_err().to_string(),
            "spawn request says ncmds=2 but has 1 subcmd"
        );
    }

    #[test]
    fn error_codes_are_bounded() {
        let r = |n| Request {
            commands: vec![Command {
                program: "a".into(),
                maxprocs: n,
                args: vec![],
                info: vec![],
            }],
            preput: vec![],
        };
        assert_eq!(codes(r(1).total_procs(), -1).as_deref(), Some("-1"));
        assert_eq!(codes(r(2).total_procs(), 0).as_deref(), Some("0,0"));
        assert_eq!(codes(r(0).total_procs(), 0), None);
        assert_eq!(codes(r(257).total_procs(), -1), None);
    }
}
