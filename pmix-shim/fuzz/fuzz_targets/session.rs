//! Fuzzes a whole rank session (PMI-1, the switch to PMI-2, PMI-2 frames) fed in arbitrary chunks.
#![no_main]

use std::collections::HashMap;

use bytes::BytesMut;
use greedy_pmix::session::{Action, Node, Session};
use libfuzzer_sys::fuzz_target;

#[derive(Default)]
struct FakeNode {
    kvs: HashMap<String, String>,
    attrs: HashMap<String, String>,
    claimed: Vec<u32>,
}

impl Node for FakeNode {
    fn job_id(&self) -> &str {
        "fuzz"
    }
    fn n_ranks(&self) -> u32 {
        4
    }
    fn get(&self, key: &str) -> Option<String> {
        self.kvs.get(key).cloned()
    }
    fn job_attr(&self, key: &str) -> Option<String> {
        (key == "PMI_process_mapping").then(|| "(vector,(0,1,4))".into())
    }
    fn node_attr(&self, key: &str) -> Option<String> {
        self.attrs.get(key).cloned()
    }
    fn put(&mut self, _rank: u32, key: String, value: String) {
        self.kvs.insert(key, value);
    }
    fn put_node_attr(&mut self, key: String, value: String) {
        self.attrs.insert(key, value);
    }
    fn claim(&mut self, rank: u32) -> bool {
        rank < 4 && !self.claimed.contains(&rank) && {
            self.claimed.push(rank);
            true
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // First byte: rank known (fd mode) or not (port mode); second: chunk size.
    let (Some(&mode), Some(&chunk)) = (data.first(), data.get(1)) else {
        return;
    };
    let data = &data[2..];
    let mut node = FakeNode::default();
    let mut session = Session::new((mode & 1 == 0).then_some(0));
    let mut buf = BytesMut::new();
    for piece in data.chunks(usize::from(chunk.max(1))) {
        buf.extend_from_slice(piece);
        loop {
            match session.poll(&mut buf, &mut node) {
                Ok(None) => break,
                Ok(Some(actions)) => {
                    for a in actions {
                        match a {
                            Action::Fence => {
                                session.fence_done();
                            }
                            Action::WaitNodeAttr(k) => {
                                session.node_attr_ready(&k, "v");
                            }
                            _ => {}
                        }
                    }
                }
                Err(_) => return,
            }
        }
        // The buffer stays bounded: a session never hoards more than one message's worth.
        assert!(buf.len() <= 70 * 1024, "buffer grew to {}", buf.len());
    }
});
