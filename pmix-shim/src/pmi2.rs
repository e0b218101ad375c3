//! PMI-2 wire format: a 6-byte ASCII length, then `cmd=name;key=value;...;` with `;` escaped as `;;`.
//!
//! Sans-I/O: [`decode`] takes bytes from the front of a buffer and yields one [`Command`]
//! when a whole frame is there; [`Reply`] renders the framed answer (research/pmix-pmi.md §3).

use std::fmt;

/// Largest frame body a client may send: MPICH's PMI-2 client buffer is 64 KiB.
pub const MAX_FRAME: usize = 64 * 1024;
/// Longest key.
pub const KEYLEN_MAX: usize = 64;
/// Longest value (MPICH's `PMI2_MAX_VALLEN`).
pub const VALLEN_MAX: usize = 1024;

/// One decoded client message: its command name and its other fields, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The `cmd=` value.
    pub cmd: String,
    /// The other `key=value` pairs, unescaped.
    pub fields: Vec<(String, String)>,
}

impl Command {
    /// The value of a field.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of a required field.
    pub fn require(&self, key: &'static str) -> Result<&str, ParseError> {
        let v = self.get(key).ok_or_else(|| ParseError::Missing {
            cmd: self.cmd.clone(),
            field: key,
        })?;
        let max = match key {
            "key" => KEYLEN_MAX,
            "name" => crate::names::NAME_MAX,
            _ => VALLEN_MAX,
        };
        if v.len() > max {
            return Err(ParseError::FieldTooLong {
                field: key,
                len: v.len(),
            });
        }
        Ok(v)
    }
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The 6-byte header is not a decimal length.
    BadLength(String),
    /// The announced length exceeds [`MAX_FRAME`].
    TooLong(usize),
    /// Not UTF-8.
    NotText,
    /// A `key=value` item without `=`.
    NoEquals(String),
    /// The body does not start with `cmd=`.
    NoCmd,
    /// A required field is absent.
    Missing {
        /// The command.
        cmd: String,
        /// The missing field.
        field: &'static str,
    },
    /// A key or value is longer than allowed.
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
            ParseError::BadLength(h) => write!(f, "frame header {h:?} is not a length"),
            ParseError::TooLong(n) => write!(f, "frame of {n} bytes exceeds {MAX_FRAME}"),
            ParseError::NotText => f.write_str("frame is not UTF-8 text"),
            ParseError::NoEquals(t) => write!(f, "item {t:?} has no '='"),
            ParseError::NoCmd => f.write_str("frame does not start with cmd="),
            ParseError::Missing { cmd, field } => write!(f, "cmd {cmd:?} lacks {field}="),
            ParseError::FieldTooLong { field, len } => {
                write!(f, "{field} of {len} bytes is too long")
            }
        }
    }
}

/// Decodes one frame from the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, or the command and how many bytes it used.
pub fn decode(buf: &[u8]) -> Result<Option<(Command, usize)>, ParseError> {
    let Some(header) = buf.get(..6) else {
        return Ok(None);
    };
    let header_text = String::from_utf8_lossy(header);
    let len: usize = header_text
        .trim_matches(|c: char| c == ' ' || c == '\0')
        .parse()
        .map_err(|_| ParseError::BadLength(header_text.clone().into_owned()))?;
    if len > MAX_FRAME {
        return Err(ParseError::TooLong(len));
    }
    let Some(body) = buf.get(6..6 + len) else {
        return Ok(None);
    };
    Ok(Some((parse_body(body)?, 6 + len)))
}

/// Parses a frame body: `cmd=name;k=v;...;` with `;;` standing for a literal `;`.
pub fn parse_body(body: &[u8]) -> Result<Command, ParseError> {
    let body = std::str::from_utf8(body).map_err(|_| ParseError::NotText)?;
    let mut items: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ';' {
            if chars.peek() == Some(&';') {
                chars.next();
                current.push(';');
            } else {
                items.push(std::mem::take(&mut current));
            }
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        items.push(current);
    }
    let mut fields = Vec::with_capacity(items.len());
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| ParseError::NoEquals(item.clone()))?;
        fields.push((k.to_owned(), v.to_owned()));
    }
    if fields.first().map(|(k, _)| k.as_str()) != Some("cmd") {
        return Err(ParseError::NoCmd);
    }
    let cmd = fields.remove(0).1;
    Ok(Command { cmd, fields })
}

/// A framed server message under construction: `cmd=<name>;` then fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    body: String,
}

impl Reply {
    /// Starts a reply `cmd=<cmd>;rc=<rc>;`, echoing the request's `thrid` when it had one.
    pub fn new(cmd: &str, rc: i32, request: Option<&Command>) -> Self {
        let mut r = Reply {
            body: String::new(),
        };
        r = r.field("cmd", cmd);
        if let Some(thrid) = request.and_then(|c| c.get("thrid")) {
            r = r.field("thrid", thrid);
        }
        r.field("rc", &rc.to_string())
    }

    /// Appends `key=value;`, escaping `;` in both (a key echoed from a client may hold one).
    pub fn field(mut self, key: &str, value: &str) -> Self {
        self.body.push_str(&key.replace(';', ";;"));
        self.body.push('=');
        self.body.push_str(&value.replace(';', ";;"));
        self.body.push(';');
        self
    }

    /// The bytes to send: 6-byte left-justified length, then the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!("{:<6}", self.body.len()).into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &str) -> Vec<u8> {
        let mut v = format!("{:<6}", body.len()).into_bytes();
        v.extend_from_slice(body.as_bytes());
        v
    }

    fn check(input: &[u8], expect: &str) {
        let got = match decode(input) {
            Ok(Some((c, used))) => format!("{used} {}{:?}", c.cmd, c.fields),
            Ok(None) => "need more".into(),
            Err(e) => format!("error: {e}"),
        };
        assert_eq!(got, expect);
    }

    #[test]
    fn decodes_frames() {
        check(
            &frame("cmd=fullinit;pmirank=3;threaded=FALSE;"),
            r#"44 fullinit[("pmirank", "3"), ("threaded", "FALSE")]"#,
        );
        check(
            &frame("cmd=kvs-put;key=a;value=x;;y;"),
            r#"35 kvs-put[("key", "a"), ("value", "x;y")]"#,
        );
        check(&frame("cmd=kvs-fence;"), "20 kvs-fence[]");
        check(&frame("cmd=job-getid"), "19 job-getid[]");
        check(b"12", "need more");
        check(&frame("cmd=finalize;")[..10], "need more");
        check(
            b"abcdefcmd=x;",
            r#"error: frame header "abcdef" is not a length"#,
        );
        check(b"999999", "error: frame of 999999 bytes exceeds 65536");
        check(
            &frame("key=v;cmd=x;"),
            "error: frame does not start with cmd=",
        );
        check(
            &frame("cmd=x;novalue;"),
            r#"error: item "novalue" has no '='"#,
        );
        check(
            &[b'2', b' ', b' ', b' ', b' ', b' ', 0xff, 0xfe],
            "error: frame is not UTF-8 text",
        );
    }

    #[test]
    fn encodes_replies() {
        let req = parse_body(b"cmd=kvs-get;thrid=7;key=k;").unwrap();
        let r = Reply::new("kvs-get-response", 0, Some(&req))
            .field("found", "TRUE")
            .field("value", "a;b");
        assert_eq!(
            r.encode(),
            frame("cmd=kvs-get-response;thrid=7;rc=0;found=TRUE;value=a;;b;")
        );
        assert_eq!(
            Reply::new("kvs-fence-response", 0, None).encode(),
            b"28    cmd=kvs-fence-response;rc=0;".to_vec()
        );
    }

    /// Found by fuzz target pmi2_decode: an escaped `;` in a key broke the echoed reply's framing.
    #[test]
    fn reply_escapes_semicolons_in_keys() {
        let req = parse_body(b"cmd=x;a;;b=c;").unwrap();
        assert_eq!(req.fields, vec![("a;b".to_string(), "c".to_string())]);
        let (k, v) = &req.fields[0];
        let bytes = Reply::new("x-response", 0, None).field(k, v).encode();
        let (again, used) = decode(&bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(
            again.fields,
            vec![
                ("rc".to_string(), "0".to_string()),
                ("a;b".to_string(), "c".to_string())
            ]
        );
    }

    #[test]
    fn field_limits() {
        let c =
            parse_body(format!("cmd=kvs-put;key={};value=v;", "k".repeat(65)).as_bytes()).unwrap();
        assert_eq!(
            c.require("key"),
            Err(ParseError::FieldTooLong {
                field: "key",
                len: 65
            })
        );
        assert_eq!(
            c.require("nope"),
            Err(ParseError::Missing {
                cmd: "kvs-put".into(),
                field: "nope"
            })
        );
    }
}
