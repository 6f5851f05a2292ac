//! Data-stream preamble decoding (signature, version, framed
//! `ConnectRequest`) and its mapping to an HTTP request must never panic.
#![no_main]

use cftunnel_tunnel::stream;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = stream::framed_len(data);
    let _ = stream::decode_connect_response(data);
    if let Ok((req, used)) = stream::parse_request_preamble(data) {
        assert!(used <= data.len());
        let again = stream::encode_connect_request(&req);
        let (back, _) = stream::parse_request_preamble(&again).expect("re-encoded preamble parses");
        assert_eq!(back, req);
    }
});
