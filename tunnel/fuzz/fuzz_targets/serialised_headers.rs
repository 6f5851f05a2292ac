//! The HTTP/2 transport's serialised-header decoder must never panic, and
//! whatever it accepts must survive a serialise/decode round trip.
#![no_main]

use cftunnel_tunnel::stream::headers;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(pairs) = headers::deserialise(text) {
        let mut map = http::HeaderMap::new();
        for (n, v) in pairs {
            map.append(n, v);
        }
        let again = headers::serialise(&map, true);
        let back = headers::deserialise(&again).expect("serialised headers decode");
        assert_eq!(back.len(), map.iter().filter(|(n, _)| headers::is_serialised(n, true)).count());
    }
});
