use super::*;

fn sample() -> ConnectRequest {
    ConnectRequest {
        dest: "https://app.example.com/a?b=c".into(),
        kind: ConnectionType::Websocket,
        metadata: vec![
            Metadata::new("HttpMethod", "GET"),
            Metadata::new("HttpHost", "app.example.com"),
            Metadata::new("HttpHeader:Sec-Websocket-Key", "abc"),
        ],
    }
}

#[test]
fn request_preamble_round_trips() {
    let bytes = encode_connect_request(&sample());
    assert_eq!(&bytes[..6], &DATA_SIGNATURE);
    assert_eq!(&bytes[6..8], b"01");
    let mut with_body = bytes.clone();
    with_body.extend_from_slice(b"body");
    let (req, used) = parse_request_preamble(&with_body).unwrap();
    assert_eq!(req, sample());
    assert_eq!(used, bytes.len());
}

#[test]
fn response_round_trips_through_async_reader() {
    let resp = ConnectResponse {
        error: String::new(),
        metadata: vec![Metadata::new("HttpStatus", "200")],
    };
    let bytes = encode_connect_response(&resp);
    let got = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(async { read_response_preamble(&mut &bytes[..]).await })
        .unwrap();
    assert_eq!(got, resp);
}

#[test]
fn data_preamble_reader_takes_single_and_multi_segment_frames() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let read = |bytes: &[u8]| {
        let mut r = bytes;
        let got = rt.block_on(async {
            read_signature(&mut r).await?;
            decode_connect_request(&read_data_preamble(&mut r).await?)
        });
        (got, bytes.len() - r.len())
    };
    let mut bytes = encode_connect_request(&sample());
    let len = bytes.len();
    bytes.extend_from_slice(b"body");
    assert_eq!(read(&bytes), (Ok(sample()), len));

    // Two segments: the second segment table entry and the padding word are
    // read after the first ten bytes.
    let one = &encode_connect_request(&sample())[8..];
    let words = (one.len() - 8) / 8;
    let mut two = preamble().to_vec();
    two.extend_from_slice(&1u32.to_le_bytes());
    two.extend_from_slice(&(words as u32).to_le_bytes());
    two.extend_from_slice(&0u32.to_le_bytes());
    two.extend_from_slice(&[0; 4]);
    two.extend_from_slice(&one[8..]);
    assert_eq!(read(&two), (Ok(sample()), two.len()));

    let mut wrong = encode_connect_request(&sample());
    wrong[7] = b'2';
    assert_eq!(read(&wrong).0, Err(FrameError::UnsupportedVersion));
    assert_eq!(read(&bytes[..len - 1]).0, Err(FrameError::Truncated));
}

#[test]
fn framing_is_single_segment_with_header_padding() {
    let bytes = encode_connect_request(&sample());
    let frame = &bytes[8..];
    assert_eq!(&frame[..4], &[0, 0, 0, 0]);
    assert_eq!(framed_len(frame).unwrap(), Some(frame.len()));
    assert_eq!(framed_len(&frame[..6]).unwrap(), None);
}

#[test]
fn bad_preambles_are_rejected() {
    assert_eq!(classify(&RPC_SIGNATURE), Ok(StreamKind::Rpc));
    assert_eq!(classify(&[0; 6]), Err(FrameError::UnknownSignature));
    let mut bytes = encode_connect_request(&sample());
    bytes[7] = b'2';
    assert_eq!(
        parse_request_preamble(&bytes),
        Err(FrameError::UnsupportedVersion)
    );
    let huge = [0u8, 0, 0, 0, 0xff, 0xff, 0xff, 0x0f];
    assert_eq!(framed_len(&huge), Err(FrameError::TooLarge));
    let many = [0xffu8, 0, 0, 0];
    assert_eq!(framed_len(&many), Err(FrameError::Framing));
    let bytes = encode_connect_request(&sample());
    assert_eq!(
        parse_request_preamble(&bytes[..bytes.len() - 1]),
        Err(FrameError::Truncated)
    );
}

#[test]
fn mutated_preambles_and_header_lists_never_panic() {
    use rand::{Rng as _, SeedableRng as _};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let good = encode_connect_request(&sample());
    for _ in 0..20_000 {
        let mut bytes = good.clone();
        for _ in 0..rng.random_range(1..6) {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = rng.random();
        }
        bytes.truncate(rng.random_range(0..=bytes.len()));
        let _ = parse_request_preamble(&bytes);
        let _ = decode_connect_response(&bytes[8.min(bytes.len())..]);
        let text = String::from_utf8_lossy(&bytes);
        let _ = headers::deserialise(&text);
    }
}

#[test]
fn decoding_does_not_depend_on_buffer_alignment() {
    let req = encode_connect_request(&sample());
    let resp = ConnectResponse {
        error: String::new(),
        metadata: vec![Metadata::new("HttpStatus", "204")],
    };
    let resp_bytes = encode_connect_response(&resp);
    for offset in 0..8 {
        let mut buf = vec![0u8; offset];
        buf.extend_from_slice(&req);
        assert_eq!(
            parse_request_preamble(&buf[offset..]),
            Ok((sample(), req.len())),
            "request at offset {offset}"
        );
        let mut buf = vec![0u8; offset];
        buf.extend_from_slice(&resp_bytes[8..]);
        assert_eq!(
            decode_connect_response(&buf[offset..]),
            Ok(resp.clone()),
            "response at offset {offset}"
        );
    }
}

#[test]
fn empty_segment_fails_the_same_from_a_slice_and_a_stream() {
    // Minimised fuzz input: a framing header announcing one empty segment,
    // one byte into the input buffer.
    let input = [0u8; 9];
    let frame = &input[1..];
    assert_eq!(framed_len(frame), Ok(Some(8)));
    let mut stream = preamble().to_vec();
    stream.extend_from_slice(frame);
    let read = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(async { read_response_preamble(&mut &stream[..]).await });
    let direct = decode_connect_response(frame);
    assert!(matches!(direct, Err(FrameError::Decode(_))), "{direct:?}");
    assert_eq!(read, direct);
}

#[test]
fn large_messages_are_written_as_one_segment() {
    let mut req = sample();
    for i in 0..5_000 {
        req.metadata.push(Metadata::new(
            format!("HttpHeader:X-{i}"),
            "v".repeat(i % 40),
        ));
    }
    let bytes = encode_connect_request(&req);
    let frame = &bytes[8..];
    assert_eq!(&frame[..4], &[0, 0, 0, 0], "one segment");
    assert_eq!(framed_len(frame), Ok(Some(frame.len())));
    assert_eq!(parse_request_preamble(&bytes), Ok((req, bytes.len())));
}

/// The segment table of a single-segment message announcing `words` words.
fn announced(words: u32) -> Vec<u8> {
    let mut bytes = 0u32.to_le_bytes().to_vec();
    bytes.extend_from_slice(&words.to_le_bytes());
    bytes
}

#[test]
fn frames_read_within_a_budget_hold_their_announced_size_until_dropped() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let budget = PreambleBudget::new(MAX_MESSAGE_BYTES);
        assert_eq!(budget.available(), MAX_MESSAGE_BYTES);

        // A large head arriving slowly: 600 KiB announced, 200 KiB sent so far. It holds
        // its announced size of the budget.
        let slow_len = 8 + 600 * 1024;
        let (mut slow_tx, mut slow_rx) = tokio::io::duplex(64 * 1024);
        let slow_budget = budget.clone();
        let slow = tokio::spawn(async move {
            let table = announced((600 * 1024 / 8) as u32);
            read_frame_rest(&mut slow_rx, table, Some(&slow_budget)).await
        });
        slow_tx.write_all(&vec![0u8; 200 * 1024]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(budget.available(), MAX_MESSAGE_BYTES - slow_len);

        // A second head of the largest size, all of it sent, waits for the slow one's share
        // instead of going past the budget.
        let (mut big_tx, mut big_rx) = tokio::io::duplex(2 * MAX_MESSAGE_BYTES);
        big_tx
            .write_all(&vec![0u8; MAX_MESSAGE_BYTES - 8])
            .await
            .unwrap();
        let big_budget = budget.clone();
        let mut big = tokio::spawn(async move {
            let table = announced(((MAX_MESSAGE_BYTES - 8) / 8) as u32);
            read_frame_rest(&mut big_rx, table, Some(&big_budget)).await
        });
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut big)
                .await
                .is_err(),
            "a preamble went past the connection's budget"
        );

        // The slow head completes (it needed nothing more); once it is decoded and its
        // share dropped, the big one gets the budget and completes too.
        slow_tx.write_all(&vec![0u8; 400 * 1024]).await.unwrap();
        let (frame, share) = tokio::time::timeout(Duration::from_secs(5), slow)
            .await
            .expect("the slow head completes while another waits")
            .unwrap()
            .unwrap();
        assert_eq!(frame.len(), slow_len);
        drop(share);
        let (frame, share) = tokio::time::timeout(Duration::from_secs(5), big)
            .await
            .expect("the budget came back")
            .unwrap()
            .unwrap();
        assert_eq!(frame.len(), MAX_MESSAGE_BYTES);
        assert_eq!(budget.available(), 0);
        drop(share);
        assert_eq!(budget.available(), MAX_MESSAGE_BYTES);
    });
}

#[test]
fn a_data_preamble_is_complete_once_its_frame_is() {
    // Signature, version, one segment of one word.
    let mut preamble = DATA_SIGNATURE.to_vec();
    preamble.extend_from_slice(&DATA_VERSION);
    preamble.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0]);
    preamble.extend_from_slice(&[0; 8]);
    let end = preamble.len();
    for cut in 0..end {
        assert_eq!(data_preamble_len(&preamble[..cut]), Ok(None), "{cut} bytes");
    }
    assert_eq!(data_preamble_len(&preamble), Ok(Some(end)));
    preamble.extend_from_slice(b"body");
    assert_eq!(data_preamble_len(&preamble), Ok(Some(end)));
}

#[test]
fn a_wrong_signature_or_version_fails_as_soon_as_it_is_seen() {
    assert_eq!(
        data_preamble_len(&[0x0A, 0x37]),
        Err(FrameError::UnknownSignature)
    );
    let mut bytes = DATA_SIGNATURE.to_vec();
    bytes.extend_from_slice(b"02");
    assert_eq!(
        data_preamble_len(&bytes),
        Err(FrameError::UnsupportedVersion)
    );
}
