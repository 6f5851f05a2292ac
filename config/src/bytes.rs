//! Sets of bytes, as tables indexed by byte: what a path or a `Host` header may carry as it is.

/// ASCII letters and digits, and the bytes of `extra`.
pub const fn alphanumeric_and(extra: &[u8]) -> [bool; 256] {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 128 {
        table[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let mut i = 0;
    while i < extra.len() {
        table[extra[i] as usize] = true;
        i += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_set_holds_letters_digits_and_the_extra_bytes_only() {
        let set = super::alphanumeric_and(b"-~");
        let held: Vec<u8> = (0..=255u8).filter(|&b| set[usize::from(b)]).collect();
        let mut expected: Vec<u8> = (b'0'..=b'9')
            .chain(b'A'..=b'Z')
            .chain(b'a'..=b'z')
            .collect();
        expected.extend_from_slice(b"-~");
        expected.sort_unstable();
        assert_eq!(held, expected);
    }
}
