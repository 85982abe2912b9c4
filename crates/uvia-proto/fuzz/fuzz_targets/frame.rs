//! Any byte string through the frame parser: it never panics, and a frame
//! that parses emits back to the same bytes and parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uvia_proto::wire;

fuzz_target!(|data: &[u8]| {
    let Ok((dst, src, repr)) = wire::parse(data) else {
        return;
    };
    let mut out = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut out, dst, src);
    let (d2, s2, back) = wire::parse(&out[..n]).expect("an emitted frame parses");
    assert_eq!((d2, s2), (dst, src));
    // A frame parses only as the kind its bytes name.
    assert_eq!(out[1], data[1], "kind byte");
    assert_eq!(back, repr);
});
