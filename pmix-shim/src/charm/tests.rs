//! Unit tests of the netlrts engine: frames, sessions, the table and argument handling, without sockets.

use bytes::BytesMut;

use super::*;

fn frame(kind: &str, payload: &[u8]) -> Frame {
    let mut buf = BytesMut::from(&encode(kind, payload)[..]);
    let f = decode(&mut buf).unwrap().unwrap();
    assert!(buf.is_empty());
    f
}

#[test]
fn header_is_be_length_then_nul_padded_type() {
    let bytes = encode("barrier", b"\0");
    assert_eq!(&bytes[..4], &[0, 0, 0, 1]);
    assert_eq!(&bytes[4..16], b"barrier\0\0\0\0\0");
    assert_eq!(bytes.len(), 17);
}

#[test]
fn decode_waits_for_whole_frames_and_rejects_garbage() {
    let whole = encode("print", b"hi\0");
    for cut in 0..whole.len() {
        let mut buf = BytesMut::from(&whole[..cut]);
        assert_eq!(decode(&mut buf), Ok(None), "cut at {cut}");
    }
    let mut two = BytesMut::from(&[encode("ping", b""), encode("print", b"x\0")].concat()[..]);
    assert_eq!(decode(&mut two).unwrap().unwrap().kind, "ping");
    assert_eq!(decode(&mut two).unwrap().unwrap().payload.as_ref(), b"x\0");
    let mut long = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, b'p'][..]);
    long.extend_from_slice(&[0; 11]);
    assert!(matches!(decode(&mut long), Err(WireError::TooLong(_))));
    let mut bad = BytesMut::from(&[0u8; 16][..]);
    assert!(matches!(decode(&mut bad), Err(WireError::BadType(_))));
}

#[test]
fn initnode_parses_and_checks() {
    let p = initnode_payload(3, 4242, [10, 123, 0, 2]);
    assert_eq!(
        parse_initnode(&p),
        Ok(InitNode {
            node_no: 3,
            dataport: 4242,
            mach_id: 0,
            ip: [10, 123, 0, 2]
        })
    );
    assert_eq!(parse_initnode(&p[..39]), Err(WireError::InitnodeLength(39)));
    assert_eq!(
        parse_initnode(&initnode_payload(1, 0, [0; 4])),
        Err(WireError::NoDataPort(1))
    );
}

/// Feeds frames to a fresh session (accepted as rank 0 after initnode); renders the actions.
fn check(frames: &[(&str, &[u8])], expect: &str) {
    let mut s = Session::new();
    let mut out = Vec::new();
    for (kind, payload) in frames {
        match s.handle(&frame(kind, payload)) {
            Ok(actions) => {
                for a in actions {
                    if let Action::Init(i) = &a {
                        s.accept(i.node_no as u32);
                    }
                    out.push(match a {
                        Action::Init(i) => format!("init {}:{}", i.node_no, i.dataport),
                        Action::Output { stderr, text } => {
                            format!(
                                "out{} {}",
                                if stderr { "err" } else { "" },
                                String::from_utf8_lossy(&text)
                            )
                        }
                        Action::Send(b) => format!("send {}", frame_kind(&b)),
                        Action::Scanf(f) => format!("scanf {f}"),
                        Action::Barrier => "barrier".into(),
                        Action::Barrier0 => "barrier0".into(),
                        Action::Ending(c) => format!("ending {c}"),
                        Action::Abort(m) => format!("abort {m}"),
                    });
                }
            }
            Err(e) => {
                out.push(format!("error {e}"));
                break;
            }
        }
    }
    assert_eq!(out.join("; "), expect);
}

fn frame_kind(bytes: &[u8]) -> String {
    let mut b = BytesMut::from(bytes);
    decode(&mut b).unwrap().unwrap().kind
}

#[test]
fn sessions() {
    let init = initnode_payload(0, 5000, [127, 0, 0, 1]);
    check(
        &[
            ("initnode", &init),
            ("ping", b""),
            ("print", b"hello\n\0warn\0"),
            ("printerr", b"oops\0"),
        ],
        "init 0:5000; out hello\n; outerr oops",
    );
    check(
        &[
            ("initnode", &init),
            ("printsyn", b"s\0"),
            ("barrier", b""),
            ("barrier0", b"0\0"),
        ],
        "init 0:5000; out s; send printdone; barrier; barrier0",
    );
    check(
        &[
            ("initnode", &init),
            ("ending", b"3\0"),
            ("ending", b"3\0"),
            ("print", b"late\0"),
        ],
        "init 0:5000; ending 3; out late",
    );
    check(
        &[("initnode", &init), ("ending", b"x\0")],
        "init 0:5000; error ending with unreadable code \"x\"",
    );
    check(
        &[("initnode", &init), ("ending", b"0\0"), ("barrier", b"")],
        "init 0:5000; ending 0; error \"barrier\" is not expected after ending",
    );
    check(
        &[("print", b"x\0")],
        "error \"print\" is not expected before initnode",
    );
    check(
        &[("initnode", &init), ("initnode", &init)],
        "init 0:5000; error \"initnode\" is not expected after initnode",
    );
    check(
        &[
            ("initnode", &init),
            ("abort", b"Fatal error on PE 0> boom\0"),
        ],
        "init 0:5000; abort Fatal error on PE 0> boom",
    );
    check(
        &[("initnode", &init), ("bogus", b"")],
        "init 0:5000; error unknown message type \"bogus\"",
    );
    check(
        &[("initnode", &init), ("scanf", b"%d\0")],
        "init 0:5000; scanf %d",
    );
}

fn report(rank: u32, port: u32) -> Report {
    Report {
        rank,
        dataport: port,
        mach_id: 0,
        ip: [10, 0, 0, rank as u8],
    }
}

#[test]
fn node_table_is_in_rank_order_with_host_counts() {
    let table = node_table(&[vec![report(1, 11), report(0, 10)], vec![report(2, 12)]]).unwrap();
    let frame = nodetab_frame(&table, 2);
    let mut b = BytesMut::from(&frame[..]);
    let f = decode(&mut b).unwrap().unwrap();
    assert_eq!(f.kind, "initnodetab");
    let p = f.payload;
    assert_eq!(p.len(), 8 + 24 * 3);
    let int = |off: usize| u32::from_be_bytes([p[off], p[off + 1], p[off + 2], p[off + 3]]);
    assert_eq!((int(0), int(4)), (3, 2));
    // entry k: nodeno, procs on its host, nPE, dataport, mach_id, IP
    assert_eq!(
        [int(8), int(12), int(16), int(20), int(24)],
        [0, 2, 1, 10, 0]
    );
    assert_eq!(&p[28..32], &[10, 0, 0, 0]);
    assert_eq!([int(56), int(60), int(64), int(68)], [2, 1, 1, 12]);
    assert_eq!(
        node_table(&[vec![report(0, 1)], vec![report(0, 2)]]),
        Err("rank 0 is reported twice (node 1)".into())
    );
    assert_eq!(
        node_table(&[vec![report(1, 1)], vec![report(2, 2)]]),
        Err("node 1 reports rank 2, beyond 2 ranks".into())
    );
}

fn args(argv: &str, n: u32) -> Result<String, String> {
    let v: Vec<String> = argv.split(' ').map(String::from).collect();
    launcher_args(&v, n).map(|a| a.join(" "))
}

#[test]
fn charmrun_arguments() {
    assert_eq!(
        args("python3 prog.py +p8 x", 8),
        Ok("python3 prog.py x".into())
    );
    assert_eq!(
        args("python3 prog.py ++n 8 ++p8", 8),
        Ok("python3 prog.py".into())
    );
    assert_eq!(
        args("python3 prog.py +ppn 2 +balancer x", 8),
        Ok("python3 prog.py +ppn 2 +balancer x".into())
    );
    assert!(
        args("python3 prog.py +p2", 8)
            .unwrap_err()
            .starts_with("+p 2: greedy starts 8 processes")
    );
    assert!(
        args("python3 prog.py ++local", 8)
            .unwrap_err()
            .contains("charmrun option")
    );
    assert!(
        args("python3 prog.py ++n", 8)
            .unwrap_err()
            .contains("needs a value")
    );
}

#[test]
fn netmagic_is_stable_and_small() {
    assert_eq!(netmagic("job.1"), netmagic("job.1"));
    assert_ne!(netmagic("job.1"), netmagic("job.2"));
    assert!(netmagic("x") <= 0x7fff);
}

#[test]
fn scanf_counts_conversions_and_takes_whole_lines() {
    assert_eq!(scanf_conversions("%d"), 1);
    assert_eq!(scanf_conversions("x=%d %s %%%lf %*d"), 3);
    assert_eq!(scanf_conversions("no conversion %"), 0);
    let take = |input: &str, n: usize| {
        let mut buf = input.to_string();
        let got = scanf_take(&mut buf, n);
        (got, buf)
    };
    // One line for one value; the rest stays for the next scanf.
    assert_eq!(take("42\n7 8\n", 1), (Some("42 ".into()), "7 8\n".into()));
    // Values spread over lines: as many lines as needed.
    assert_eq!(
        take("1\n\n2 3\nrest", 3),
        (Some("1  2 3 ".into()), "rest".into())
    );
    // Not enough complete lines yet (an unterminated last line waits).
    assert_eq!(take("1 2", 1), (None, "1 2".into()));
    assert_eq!(take("1\n", 2), (None, "1\n".into()));
    // A format without values still consumes a line, as fscanf consumes its input.
    assert_eq!(take("\nx\n", 0), (Some(" ".into()), "x\n".into()));
    assert_eq!(frame_kind(&scanf_frame("42 ")), "scanf-data");
}
