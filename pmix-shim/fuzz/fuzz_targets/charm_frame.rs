//! Fuzzes the netlrts frame decoder and session: no panic, frames re-encode to the bytes consumed.
#![no_main]

use bytes::BytesMut;
use greedy_pmix::charm::{self, Session};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let mut session = Session::new();
    loop {
        let before = buf.len();
        match charm::decode(&mut buf) {
            Ok(Some(frame)) => {
                let again = charm::encode(&frame.kind, &frame.payload);
                assert_eq!(again.len(), before - buf.len());
                match session.handle(&frame) {
                    Ok(actions) => {
                        for a in actions {
                            if let charm::Action::Init(i) = a {
                                session.accept(i.node_no.unsigned_abs());
                            }
                        }
                    }
                    Err(_) => break,
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
});
