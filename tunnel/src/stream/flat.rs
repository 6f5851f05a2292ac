//! The request and response heads as edge and connector send them (one segment, no far
//! pointers, ASCII texts), read straight from the frame's bytes and written straight into them:
//! a few dozen instructions per text where the generic Cap'n Proto reader and builder spend a
//! few hundred. Any other message is left to `capnp`, and both read and write the same bytes.
//! See docs/design/stream-head-codec.md.

/// Pointer kinds and list element sizes of the encoding.
const STRUCT: u64 = 0;
const LIST: u64 = 1;
const BYTE_ELEMENTS: u64 = 2;
const COMPOSITE_ELEMENTS: u64 = 7;

/// A frame's single segment, with what is left of its traversal budget.
pub(super) struct Flat<'a> {
    segment: &'a [u8],
    budget: u64,
}

/// A struct's place in the segment: its data words and pointer words.
#[derive(Clone, Copy)]
pub(super) struct Struct {
    data: usize,
    data_words: usize,
    pointers: usize,
    pointer_count: usize,
}

impl<'a> Flat<'a> {
    /// The segment of a single-segment frame (segment table included) that
    /// holds at least its root pointer; `budget` is the traversal limit in words.
    pub(super) fn new(frame: &'a [u8], budget: u64) -> Option<Self> {
        let count = u32::from_le_bytes(frame.get(..4)?.try_into().ok()?);
        if count != 0 {
            return None;
        }
        let words = u32::from_le_bytes(frame.get(4..8)?.try_into().ok()?) as usize;
        Self::segment(
            frame.get(8..8usize.checked_add(words.checked_mul(8)?)?)?,
            budget,
        )
    }

    /// A single-segment frame's segment without its segment table.
    pub(super) fn segment(segment: &'a [u8], budget: u64) -> Option<Self> {
        if segment.is_empty() || !segment.len().is_multiple_of(8) {
            return None;
        }
        Some(Self { segment, budget })
    }

    fn word(&self, index: usize) -> Option<u64> {
        let start = index.checked_mul(8)?;
        let bytes = self.segment.get(start..start.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    /// Where a pointer at word `at` points (from the word after it), if that
    /// is inside the segment.
    fn target(&self, at: usize, pointer: u64) -> Option<usize> {
        // Bits 2..32: a signed word offset.
        let offset = i64::from((pointer as u32 as i32) >> 2);
        usize::try_from(
            i64::try_from(at)
                .ok()?
                .checked_add(1)?
                .checked_add(offset)?,
        )
        .ok()
    }

    /// Takes `words` off the traversal budget; `None` once it is spent.
    fn read(&mut self, words: usize) -> Option<()> {
        self.budget = self.budget.checked_sub(u64::try_from(words).ok()?)?;
        Some(())
    }

    /// Whether `words` words from `start` lie inside the segment.
    fn contains(&self, start: usize, words: usize) -> bool {
        start
            .checked_add(words)
            .and_then(|end| end.checked_mul(8))
            .is_some_and(|end| end <= self.segment.len())
    }

    /// The root struct. `None` for a null or far root pointer.
    pub(super) fn root(&mut self) -> Option<Struct> {
        self.struct_at(0)
    }

    fn struct_at(&mut self, at: usize) -> Option<Struct> {
        let pointer = self.word(at)?;
        if pointer == 0 || pointer & 3 != STRUCT {
            return None;
        }
        let data = self.target(at, pointer)?;
        let data_words = ((pointer >> 32) & 0xffff) as usize;
        let pointer_count = (pointer >> 48) as usize;
        let words = data_words + pointer_count;
        if !self.contains(data, words) {
            return None;
        }
        self.read(words)?;
        Some(Struct {
            data,
            data_words,
            pointers: data + data_words,
            pointer_count,
        })
    }

    /// The first 16 bits of a struct's data section (0 when it has none).
    pub(super) fn u16_field(&self, s: Struct) -> Option<u16> {
        if s.data_words == 0 {
            return Some(0);
        }
        Some(self.word(s.data)? as u16)
    }

    /// Pointer field `index` of `s`, as ASCII text. A missing or null
    /// pointer is the empty text, as `capnp` reads it.
    pub(super) fn text(&mut self, s: Struct, index: usize) -> Option<&'a [u8]> {
        if index >= s.pointer_count {
            return Some(b"");
        }
        let at = s.pointers + index;
        let pointer = self.word(at)?;
        if pointer == 0 {
            return Some(b"");
        }
        if pointer & 3 != LIST || (pointer >> 32) & 7 != BYTE_ELEMENTS {
            return None;
        }
        let start = self.target(at, pointer)?;
        let len = (pointer >> 35) as usize;
        let words = len.div_ceil(8);
        if len == 0 || !self.contains(start, words) {
            return None;
        }
        self.read(words)?;
        let segment: &'a [u8] = self.segment;
        let bytes = segment.get(start * 8..start * 8 + len)?;
        let (text, nul) = bytes.split_at(len - 1);
        (nul == [0] && text.is_ascii()).then_some(text)
    }

    /// Pointer field `index` of `s` as a list of structs with at least two
    /// pointers each: the structs. A missing or null pointer is the empty list.
    pub(super) fn struct_list(&mut self, s: Struct, index: usize) -> Option<StructList> {
        let empty = StructList {
            first: 0,
            len: 0,
            stride: 0,
            data_words: 0,
            pointer_count: 2,
        };
        if index >= s.pointer_count {
            return Some(empty);
        }
        let at = s.pointers + index;
        let pointer = self.word(at)?;
        if pointer == 0 {
            return Some(empty);
        }
        if pointer & 3 != LIST || (pointer >> 32) & 7 != COMPOSITE_ELEMENTS {
            return None;
        }
        let tag_at = self.target(at, pointer)?;
        let words = (pointer >> 35) as usize;
        if !self.contains(tag_at, words.checked_add(1)?) {
            return None;
        }
        let tag = self.word(tag_at)?;
        if tag & 3 != STRUCT {
            return None;
        }
        // A tag's offset bits hold the element count.
        let len = ((tag as u32) >> 2) as usize;
        let data_words = ((tag >> 32) & 0xffff) as usize;
        let pointer_count = (tag >> 48) as usize;
        let stride = data_words + pointer_count;
        if pointer_count < 2 || len.checked_mul(stride)? > words {
            return None;
        }
        self.read(words + 1)?;
        Some(StructList {
            first: tag_at + 1,
            len,
            stride,
            data_words,
            pointer_count,
        })
    }
}

/// An inline-composite list of structs.
#[derive(Clone, Copy)]
pub(super) struct StructList {
    first: usize,
    len: usize,
    stride: usize,
    data_words: usize,
    pointer_count: usize,
}

impl StructList {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, i: usize) -> Struct {
        let data = self.first + i * self.stride;
        Struct {
            data,
            data_words: self.data_words,
            pointers: data + self.data_words,
            pointer_count: self.pointer_count,
        }
    }
}

/// Every `(key, val)` of a metadata list, or `None` if any is not plain.
pub(super) fn metadata<'a>(
    flat: &mut Flat<'a>,
    list: StructList,
) -> Option<Vec<(&'a [u8], &'a [u8])>> {
    let mut entries = Vec::with_capacity(list.len());
    for i in 0..list.len() {
        let entry = list.get(i);
        entries.push((flat.text(entry, 0)?, flat.text(entry, 1)?));
    }
    Some(entries)
}

/// Words a text of `len` bytes takes: its bytes and a NUL, padded.
pub(super) fn text_words(len: usize) -> usize {
    (len + 1).div_ceil(8)
}

/// Builds one single-segment message after a fixed prefix (the stream
/// preamble and the segment table, filled in by [`Writer::finish`]).
pub(super) struct Writer {
    /// Preamble, segment table and the segment, zeroed ahead of use.
    buf: Vec<u8>,
    /// Where the segment starts in `buf`.
    base: usize,
    /// Words of the segment allocated so far.
    used: usize,
}

impl Writer {
    /// A message after `preamble`, with room for `words` words.
    pub(super) fn new(preamble: &[u8], words: usize) -> Self {
        let base = preamble.len() + 8;
        let mut buf = vec![0; base + words * 8];
        buf[..preamble.len()].copy_from_slice(preamble);
        Self { buf, base, used: 0 }
    }

    /// Allocates `words` zeroed words; returns the first one's index.
    fn alloc(&mut self, words: usize) -> usize {
        let at = self.used;
        self.used += words;
        let end = self.base + self.used * 8;
        if end > self.buf.len() {
            self.buf.resize(end, 0);
        }
        at
    }

    fn set_word(&mut self, at: usize, word: u64) {
        let start = self.base + at * 8;
        if let Some(slot) = self.buf.get_mut(start..start + 8) {
            slot.copy_from_slice(&word.to_le_bytes());
        }
    }

    /// Bits 0..32 of a pointer at word `at` to word `target`.
    fn offset_bits(at: usize, target: usize, kind: u64) -> u64 {
        // Offsets are counted from the word after the pointer.
        let offset = target as i64 - at as i64 - 1;
        u64::from(((offset as i32) << 2) as u32) | kind
    }

    /// The root struct, the message's first object: its data words and
    /// pointer words follow the root pointer.
    pub(super) fn root(&mut self, data_words: u16, pointers: u16) -> Struct {
        let root = self.alloc(1);
        let data = self.alloc(usize::from(data_words) + usize::from(pointers));
        self.set_word(
            root,
            Self::offset_bits(root, data, STRUCT)
                | u64::from(data_words) << 32
                | u64::from(pointers) << 48,
        );
        Struct {
            data,
            data_words: usize::from(data_words),
            pointers: data + usize::from(data_words),
            pointer_count: usize::from(pointers),
        }
    }

    /// Sets the first 16 bits of `s`'s data section.
    pub(super) fn set_u16(&mut self, s: Struct, value: u16) {
        if s.data_words > 0 {
            self.set_word(s.data, u64::from(value));
        }
    }

    /// Sets pointer field `index` of `s` to a new text made of `parts`, and
    /// returns the text's bytes (to be rewritten in place, if need be).
    pub(super) fn text(&mut self, s: Struct, index: usize, parts: &[&[u8]]) -> &mut [u8] {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let at = s.pointers + index;
        let target = self.alloc(text_words(len));
        self.set_word(
            at,
            Self::offset_bits(at, target, LIST) | BYTE_ELEMENTS << 32 | ((len as u64 + 1) << 35),
        );
        let start = self.base + target * 8;
        let mut pos = start;
        for part in parts {
            if let Some(dst) = self.buf.get_mut(pos..pos + part.len()) {
                dst.copy_from_slice(part);
            }
            pos += part.len();
        }
        self.buf.get_mut(start..start + len).unwrap_or_default()
    }

    /// Sets pointer field `index` of `s` to a new list of `len` structs with
    /// no data and two pointers each, and returns it.
    pub(super) fn pair_list(&mut self, s: Struct, index: usize, len: usize) -> StructList {
        let at = s.pointers + index;
        let tag = self.alloc(1 + 2 * len);
        self.set_word(
            at,
            Self::offset_bits(at, tag, LIST) | COMPOSITE_ELEMENTS << 32 | ((2 * len as u64) << 35),
        );
        // A tag's offset bits hold the element count.
        self.set_word(tag, (len as u64) << 2 | STRUCT | 2 << 48);
        StructList {
            first: tag + 1,
            len,
            stride: 2,
            data_words: 0,
            pointer_count: 2,
        }
    }

    /// The framed message: preamble, segment table, segment.
    pub(super) fn finish(mut self) -> Vec<u8> {
        self.buf.truncate(self.base + self.used * 8);
        if let Some(slot) = self.buf.get_mut(self.base - 4..self.base) {
            slot.copy_from_slice(&(self.used as u32).to_le_bytes());
        }
        self.buf
    }
}
