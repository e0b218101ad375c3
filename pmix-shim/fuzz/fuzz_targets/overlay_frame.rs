//! Fuzzes the overlay frame decoder: garbage and hostile lengths are refused, never a panic.
#![no_main]

use bytes::BytesMut;
use greedy_pmix::frame::FrameCodec;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::{Decoder, Encoder};

fuzz_target!(|data: &[u8]| {
    let mut codec = FrameCodec { max_body: 1 << 16 };
    let mut buf = BytesMut::from(data);
    while let Ok(Some(msg)) = codec.decode(&mut buf) {
        // Whatever decodes re-encodes to something that decodes to the same message.
        let mut out = BytesMut::new();
        codec.encode(msg.clone(), &mut out).expect("re-encode");
        assert_eq!(codec.decode(&mut out).expect("decode").expect("whole"), msg);
    }
});
