//! Fuzzes the PMI-2 frame decoder: no panic, and a decoded frame never claims more bytes than given.
#![no_main]

use greedy_pmix::pmi2;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((command, used))) = pmi2::decode(data) {
        assert!(used <= data.len());
        // Replies echo values; the framing must stay self-consistent.
        let mut reply = pmi2::Reply::new("x-response", 0, Some(&command));
        for (k, v) in &command.fields {
            reply = reply.field(k, v);
        }
        let bytes = reply.encode();
        let (again, n) = pmi2::decode(&bytes)
            .expect("own reply decodes")
            .expect("whole");
        assert_eq!(n, bytes.len());
        assert_eq!(again.cmd, "x-response");
    }
});
